"""cuDNN's backend vocabulary, spelled as cuDNN spells it: descriptor types, attribute names, attribute
types, statuses and the enumerated values attributes take, each an Enum whose members carry the C
names (`AttributeName.CUDNN_ATTR_TENSOR_DIMENSIONS`). `opgraph.backend` also exports every member at
module level, so C code ports line by line (`CUDNN_ATTR_TENSOR_DIMENSIONS` works as written).
The enums themselves are classes in `enums.py`; this module adds which enum each value-typed attribute
type takes and the mappings that turn values into opgraph's (data types, pointwise and reduction modes, ...).
"""

from __future__ import annotations

from ..core.config import BehaviorNote, HeurMode, NumericalNote
from ..core.dtypes import DataType
from ..ops.conv import ConvolutionMode
from ..ops.norm_common import NormForwardPhase
from ..ops.pointwise import PointwiseMode
from ..ops.pooling import ResampleMode
from ..ops.reduction import ReductionMode
from .enums import (
    AttributeName,
    AttributeType,
    CEnum,
    DescriptorType,
    Status,
    cudnnBackendBehaviorNote_t,
    cudnnBackendHeurMode_t,
    cudnnBackendKnobType_t,
    cudnnBackendNormFwdPhase_t,
    cudnnBackendNormMode_t,
    cudnnBackendNumericalNote_t,
    cudnnBackendTensorReordering_t,
    cudnnConvolutionMode_t,
    cudnnDataType_t,
    cudnnGenStatsMode_t,
    cudnnNanPropagation_t,
    cudnnPaddingMode_t,
    cudnnPointwiseMode_t,
    cudnnReduceTensorOp_t,
    cudnnResampleMode_t,
)

# the enum each value-typed attribute type takes
VALUE_ENUMS: dict[AttributeType, type[CEnum]] = {
    AttributeType.CUDNN_TYPE_DATA_TYPE: cudnnDataType_t,
    AttributeType.CUDNN_TYPE_CONVOLUTION_MODE: cudnnConvolutionMode_t,
    AttributeType.CUDNN_TYPE_HEUR_MODE: cudnnBackendHeurMode_t,
    AttributeType.CUDNN_TYPE_KNOB_TYPE: cudnnBackendKnobType_t,
    AttributeType.CUDNN_TYPE_NAN_PROPOGATION: cudnnNanPropagation_t,
    AttributeType.CUDNN_TYPE_NUMERICAL_NOTE: cudnnBackendNumericalNote_t,
    AttributeType.CUDNN_TYPE_POINTWISE_MODE: cudnnPointwiseMode_t,
    AttributeType.CUDNN_TYPE_GENSTATS_MODE: cudnnGenStatsMode_t,
    AttributeType.CUDNN_TYPE_REDUCTION_OPERATOR_TYPE: cudnnReduceTensorOp_t,
    AttributeType.CUDNN_TYPE_BEHAVIOR_NOTE: cudnnBackendBehaviorNote_t,
    AttributeType.CUDNN_TYPE_TENSOR_REORDERING_MODE: cudnnBackendTensorReordering_t,
    AttributeType.CUDNN_TYPE_RESAMPLE_MODE: cudnnResampleMode_t,
    AttributeType.CUDNN_TYPE_PADDING_MODE: cudnnPaddingMode_t,
    AttributeType.CUDNN_TYPE_NORM_MODE: cudnnBackendNormMode_t,
    AttributeType.CUDNN_TYPE_NORM_FWD_PHASE: cudnnBackendNormFwdPhase_t,
}

# -- to opgraph ---------------------------------------------------------------------------------------
DATA_TYPES = {
    v: DataType[v.name.removeprefix("CUDNN_DATA_")]
    for v in cudnnDataType_t
    if v.name.removeprefix("CUDNN_DATA_") in DataType.__members__
}
POINTWISE_MODES = {v: PointwiseMode[v.name.removeprefix("CUDNN_POINTWISE_")] for v in cudnnPointwiseMode_t}
REDUCTION_MODES = {v: ReductionMode[v.name.removeprefix("CUDNN_REDUCE_TENSOR_")] for v in cudnnReduceTensorOp_t}
CONV_MODES = {
    cudnnConvolutionMode_t.CUDNN_CONVOLUTION: ConvolutionMode.CONVOLUTION,
    cudnnConvolutionMode_t.CUDNN_CROSS_CORRELATION: ConvolutionMode.CROSS_CORRELATION,
}
HEUR_MODES = {v: HeurMode[v.name.removeprefix("CUDNN_HEUR_MODE_")] for v in cudnnBackendHeurMode_t}
NORM_PHASES = {
    cudnnBackendNormFwdPhase_t.CUDNN_NORM_FWD_INFERENCE: NormForwardPhase.INFERENCE,
    cudnnBackendNormFwdPhase_t.CUDNN_NORM_FWD_TRAINING: NormForwardPhase.TRAINING,
}
RESAMPLE_MODES = {
    cudnnResampleMode_t.CUDNN_RESAMPLE_MAXPOOL: ResampleMode.MAX,
    cudnnResampleMode_t.CUDNN_RESAMPLE_AVGPOOL: ResampleMode.AVG_INCLUDE_PADDING,
    cudnnResampleMode_t.CUDNN_RESAMPLE_AVGPOOL_INCLUDE_PADDING: ResampleMode.AVG_INCLUDE_PADDING,
    cudnnResampleMode_t.CUDNN_RESAMPLE_AVGPOOL_EXCLUDE_PADDING: ResampleMode.AVG_EXCLUDE_PADDING,
}
NUMERICAL_NOTES = {n: cudnnBackendNumericalNote_t["CUDNN_NUMERICAL_NOTE_" + n.name] for n in NumericalNote}
BEHAVIOR_NOTES = {n: cudnnBackendBehaviorNote_t["CUDNN_BEHAVIOR_NOTE_" + n.name] for n in BehaviorNote}

ENUMS: tuple[type[CEnum], ...] = (DescriptorType, AttributeName, AttributeType, Status, *VALUE_ENUMS.values())


def exported() -> dict[str, CEnum]:
    """Every member under its C name, for `from opgraph.backend import *`-style ports."""
    return {m.name: m for kind in ENUMS for m in kind}
