"""`opgraph.backend`: cuDNN's backend descriptor API in Python, for porting C code line by line.

    x = create_descriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR)
    set_attribute(x, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_HALF)
    set_attribute(x, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, [n, c, h, w])
    ...
    finalize(x)                       # opgraph's validation: errors name descriptor, attribute, rule, fix
    ...
    execute(handle, plan, variant_pack)

Every cudnnBackend* call has its function (create_descriptor, set_attribute, get_attribute, finalize,
destroy_descriptor, execute, populate_cuda_graph, update_cuda_graph); every descriptor type, attribute
name, attribute type and value is exported under its C name. Implemented descriptor types: tensor,
convolution, pointwise, matmul, reduction, resample, their operations, genstats, norm forward and
backward, operation graph, engine heuristics, engine, engine config, knob choice and info, execution
plan and variant pack. Calls return CUDNN_STATUS_SUCCESS or raise BackendError (`err.status` is the
cudnnStatus_t). Plans run on the handle's device: a CUDA GPU (data pointers are device addresses or
tensors) or the CPU reference engine (data "pointers" are the NumPy arrays or CPU tensors themselves).
Extensions: ALPHA/BETA as a 1-element tensor descriptor or a device pointer, read at run time.
"""

from __future__ import annotations

from ..cudnn.handles import Handle, create_handle, destroy_handle, get_stream, set_stream
from . import descriptor_checks as _descriptor_checks  # noqa: F401 (importing them registers the finalizers)
from . import lowering as _lowering  # noqa: F401
from . import plans as _plans  # noqa: F401
from .descriptors import (
    BackendError,
    Descriptor,
    create_descriptor,
    destroy_descriptor,
    finalize,
    get_attribute,
    set_attribute,
)
from .names import (
    AttributeName,
    AttributeType,
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
    exported,
)
from .plans import execute, populate_cuda_graph, update_cuda_graph

globals().update(exported())  # CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_..., CUDNN_TYPE_..., CUDNN_DATA_...

__all__ = [
    "AttributeName",
    "AttributeType",
    "BackendError",
    "Descriptor",
    "DescriptorType",
    "Handle",
    "Status",
    "create_descriptor",
    "create_handle",
    "destroy_descriptor",
    "destroy_handle",
    "execute",
    "finalize",
    "get_attribute",
    "get_stream",
    "populate_cuda_graph",
    "set_attribute",
    "set_stream",
    "update_cuda_graph",
    "cudnnBackendBehaviorNote_t",
    "cudnnBackendHeurMode_t",
    "cudnnBackendKnobType_t",
    "cudnnBackendNormFwdPhase_t",
    "cudnnBackendNormMode_t",
    "cudnnBackendNumericalNote_t",
    "cudnnBackendTensorReordering_t",
    "cudnnConvolutionMode_t",
    "cudnnDataType_t",
    "cudnnGenStatsMode_t",
    "cudnnNanPropagation_t",
    "cudnnPaddingMode_t",
    "cudnnPointwiseMode_t",
    "cudnnReduceTensorOp_t",
    "cudnnResampleMode_t",
    *exported(),
]
