"""Finalize-time checks of the descriptors an operation graph is made of: tensors (a finalized tensor
descriptor's state is its `TensorInfo`), the op attribute descriptors (convolution, resample, matmul)
and the tensors a pointwise operation needs. lowering.py turns an operation graph of them into an
opgraph Graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.dtypes import DataType
from ..ops.pointwise import MODES, PointwiseMode
from . import names as N
from .descriptors import FINALIZERS, BackendError, Descriptor
from .names import AttributeName as A
from .names import DescriptorType as D
from .names import Status

NOT_SUPPORTED = Status.CUDNN_STATUS_NOT_SUPPORTED


@dataclass(frozen=True)
class TensorInfo:
    uid: int
    dim: tuple[int, ...]
    stride: tuple[int, ...]
    data_type: DataType
    is_virtual: bool
    is_by_value: bool


def _dtype(desc: Descriptor, name: A, default: DataType | None = None) -> DataType | None:
    v = desc.value(name)
    if v is None:
        return default
    if v not in N.DATA_TYPES:
        raise BackendError(
            f"{v.name} is not a data type opgraph computes in",
            descriptor=desc,
            attribute=name,
            status=Status.CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE,
            rule="backend.data_type",
            hint="use CUDNN_DATA_FLOAT, HALF, BFLOAT16, DOUBLE, INT8, UINT8, INT32, INT64, BOOLEAN or an FP8 type",
        )
    return N.DATA_TYPES[v]


def _tensor(desc: Descriptor) -> TensorInfo:
    dims, strides = desc.values(A.CUDNN_ATTR_TENSOR_DIMENSIONS), desc.values(A.CUDNN_ATTR_TENSOR_STRIDES)
    if len(dims) != len(strides):
        raise BackendError(
            f"{len(dims)} dimensions but {len(strides)} strides",
            descriptor=desc,
            attribute=A.CUDNN_ATTR_TENSOR_STRIDES,
            rule="tensor.stride_rank",
            hint="set one stride per dimension",
        )
    if any(d < 1 for d in dims):
        raise BackendError(
            f"dimensions {dims} must all be >= 1",
            descriptor=desc,
            attribute=A.CUDNN_ATTR_TENSOR_DIMENSIONS,
            rule="tensor.dim",
            hint="use positive sizes",
        )
    if any(s < 0 for s in strides):
        raise BackendError(
            f"strides {strides} must all be >= 0",
            descriptor=desc,
            attribute=A.CUDNN_ATTR_TENSOR_STRIDES,
            rule="tensor.stride",
            hint="use non-negative strides (in elements)",
        )
    uid = desc.value(A.CUDNN_ATTR_TENSOR_UNIQUE_ID)
    if uid < 0:
        raise BackendError(
            f"UID {uid} is negative",
            descriptor=desc,
            attribute=A.CUDNN_ATTR_TENSOR_UNIQUE_ID,
            rule="tensor.uid",
            hint="pick a non-negative int64 UID",
        )
    dt = _dtype(desc, A.CUDNN_ATTR_TENSOR_DATA_TYPE)
    if dt is None:
        raise BackendError(
            "the data type is not set",
            descriptor=desc,
            attribute=A.CUDNN_ATTR_TENSOR_DATA_TYPE,
            rule="backend.required",
            hint="set CUDNN_ATTR_TENSOR_DATA_TYPE",
        )
    align = desc.value(A.CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT)
    if align < 1 or align & (align - 1) or (align % dt.itemsize and align < dt.itemsize):
        raise BackendError(
            f"byte alignment {align} is not a power of two of at least the element size",
            descriptor=desc,
            attribute=A.CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
            rule="tensor.alignment",
            hint=f"set the alignment of the buffers you will bind, e.g. {max(16, dt.itemsize)}",
        )
    for name, ok in ((A.CUDNN_ATTR_TENSOR_VECTOR_COUNT, (1,)), (A.CUDNN_ATTR_TENSOR_VECTORIZED_DIMENSION, (-1, 0, 1))):
        if desc.has(name) and desc.value(name) not in ok:
            raise BackendError(
                f"vectorized layouts ({name.name}={desc.value(name)}) are not supported",
                descriptor=desc,
                attribute=name,
                status=Status.CUDNN_STATUS_NOT_SUPPORTED_LAYOUT,
                rule="tensor.vectorized",
                hint="describe the layout with plain strides",
            )
    reorder = desc.value(A.CUDNN_ATTR_TENSOR_REORDERING_MODE)
    if reorder not in (None, N.cudnnBackendTensorReordering_t.CUDNN_TENSOR_REORDERING_NONE):
        raise BackendError(
            f"reordering {reorder.name} is not supported",
            descriptor=desc,
            attribute=A.CUDNN_ATTR_TENSOR_REORDERING_MODE,
            status=Status.CUDNN_STATUS_NOT_SUPPORTED_LAYOUT,
            rule="tensor.reordering",
            hint="use CUDNN_TENSOR_REORDERING_NONE",
        )
    by_value = bool(desc.value(A.CUDNN_ATTR_TENSOR_IS_BY_VALUE, False))
    if by_value and math.prod(dims) != 1:
        raise BackendError(
            f"a by-value tensor holds one value, this one has dimensions {dims}",
            descriptor=desc,
            attribute=A.CUDNN_ATTR_TENSOR_IS_BY_VALUE,
            rule="tensor.pass_by_value",
            hint="give by-value scalars dimensions [1, 1, ...]",
        )
    return TensorInfo(
        uid, tuple(dims), tuple(strides), dt, bool(desc.value(A.CUDNN_ATTR_TENSOR_IS_VIRTUAL, False)), by_value
    )


def _lengths(desc: Descriptor, count_attr: A, attrs: tuple[A, ...]) -> None:
    n = desc.value(count_attr)
    for name in attrs:
        if len(desc.values(name)) != n:
            raise BackendError(
                f"{len(desc.values(name))} values for {n} spatial dimensions",
                descriptor=desc,
                attribute=name,
                rule="backend.spatial_dims",
                hint=f"set {n} values (one per spatial dimension, {count_attr.name})",
            )


def _convolution(desc: Descriptor) -> None:
    _dtype(desc, A.CUDNN_ATTR_CONVOLUTION_COMP_TYPE)
    _lengths(
        desc,
        A.CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS,
        (
            A.CUDNN_ATTR_CONVOLUTION_DILATIONS,
            A.CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
            A.CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
            A.CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
        ),
    )


def _resample(desc: Descriptor) -> None:
    mode = desc.value(A.CUDNN_ATTR_RESAMPLE_MODE)
    if mode not in N.RESAMPLE_MODES:
        raise BackendError(
            f"{mode.name} is not supported",
            descriptor=desc,
            attribute=A.CUDNN_ATTR_RESAMPLE_MODE,
            status=NOT_SUPPORTED,
            rule="resample.mode",
            hint="use CUDNN_RESAMPLE_MAXPOOL or an AVGPOOL mode",
        )
    pad = desc.value(A.CUDNN_ATTR_RESAMPLE_PADDING_MODE)
    if pad is N.cudnnPaddingMode_t.CUDNN_EDGE_VAL_PAD:
        raise BackendError(
            "edge-value padding is not supported",
            descriptor=desc,
            attribute=A.CUDNN_ATTR_RESAMPLE_PADDING_MODE,
            status=NOT_SUPPORTED,
            rule="resample.padding",
            hint="use CUDNN_ZERO_PAD (average) or CUDNN_NEG_INF_PAD (max)",
        )
    _lengths(
        desc,
        A.CUDNN_ATTR_RESAMPLE_SPATIAL_DIMS,
        (
            A.CUDNN_ATTR_RESAMPLE_WINDOW_DIMS,
            A.CUDNN_ATTR_RESAMPLE_STRIDES,
            A.CUDNN_ATTR_RESAMPLE_PRE_PADDINGS,
            A.CUDNN_ATTR_RESAMPLE_POST_PADDINGS,
        ),
    )


def _matmul(desc: Descriptor) -> None:
    _dtype(desc, A.CUDNN_ATTR_MATMUL_COMP_TYPE)
    if desc.value(A.CUDNN_ATTR_MATMUL_PADDING_VALUE, 0.0) != 0.0:
        raise BackendError(
            "a padding value is not supported",
            descriptor=desc,
            attribute=A.CUDNN_ATTR_MATMUL_PADDING_VALUE,
            status=NOT_SUPPORTED,
            rule="matmul.padding",
            hint="leave it at 0",
        )


def _pointwise_op(desc: Descriptor) -> None:
    mode = N.POINTWISE_MODES[
        desc.value(A.CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR).value(A.CUDNN_ATTR_POINTWISE_MODE)
    ]
    need = (
        [A.CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, A.CUDNN_ATTR_OPERATION_POINTWISE_DXDESC]
        if _backward(mode)
        else [
            A.CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
            A.CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
            A.CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
        ][: MODES[mode].arity]
    )
    for name in need:
        if not desc.has(name):
            raise BackendError(
                f"{mode.name} needs {name.name}",
                descriptor=desc,
                attribute=name,
                rule="backend.required",
                hint=f"set {name.name} to a tensor descriptor",
            )


def _backward(mode: PointwiseMode) -> bool:
    return mode.name.endswith("_BWD")


FINALIZERS.update(
    {
        D.CUDNN_BACKEND_TENSOR_DESCRIPTOR: _tensor,
        D.CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: _convolution,
        D.CUDNN_BACKEND_RESAMPLE_DESCRIPTOR: _resample,
        D.CUDNN_BACKEND_MATMUL_DESCRIPTOR: _matmul,
        D.CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: _pointwise_op,
    }
)

__all__ = ["NOT_SUPPORTED", "TensorInfo"]
