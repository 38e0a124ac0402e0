"""How `cudnn.pygraph.execute` binds the buffers of a variant pack: by address, as cuDNN does."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ..core.dtypes import DataType
from ..core.errors import GraphError
from ..core.tensor import TensorDesc, storage_extent, strided_view
from ..graph.finalize import _self_overlapping
from ..memory.buffers import buffer_info


def hashable(key: Any) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


def _as_type(value: Any, data_type: DataType) -> Any:
    """A PyTorch buffer of another type of the same size, read as `data_type`: cuDNN reads the bytes at
    the address (a bfloat16 buffer bound to a HALF tensor is read as half, a uint8 one as BOOLEAN)."""
    if not hasattr(value, "data_ptr") or not hasattr(value, "element_size"):
        return value
    try:
        want = data_type.to_torch()
    except (KeyError, ValueError, TypeError, AttributeError):
        return value
    if value.dtype == want or value.element_size() != data_type.itemsize:
        return value
    return value.view(want)


def as_declared(desc: TensorDesc, value: Any) -> Any:
    """cuDNN binds by address: a dense buffer whose shape or strides differ from the tensor's (a [N, H, W]
    result for a [N, 1, H, W] tensor) is read and written with the tensor's dims and strides, as cuDNN
    would, when it holds enough elements of the tensor's type; a floating buffer of another type of the
    same size is read as the tensor's type. Anything else is bound as given (and checked as opgraph
    checks every buffer)."""
    if desc.is_pass_by_value or isinstance(value, (numbers.Number, np.generic)):
        return value
    value = _as_type(value, desc.data_type)
    if hasattr(value, "data_ptr") and value.shape == desc.dim and value.stride() == desc.stride:
        return value  # the common case, decided without a BufferInfo
    if not (isinstance(value, np.ndarray) or hasattr(value, "data_ptr")):
        return value
    try:
        info = buffer_info(value)
    except GraphError:
        return value  # bind() names the problem
    if info.data_type is not desc.data_type or (
            info.shape == desc.dim and all(a == b for d, a, b in zip(desc.dim, info.strides, desc.stride) if d > 1)):
        return value
    numel = int(np.prod(info.shape))
    dense = storage_extent(info.shape, [abs(s) for s in info.strides]) == numel and min(info.strides, default=0) >= 0 \
        and not _self_overlapping(tuple(info.shape), tuple(info.strides))
    if not dense or storage_extent(desc.dim, desc.stride) > numel:
        return value
    if isinstance(value, np.ndarray):
        return strided_view(strided_view(value, (numel,), (1,)), desc.dim, desc.stride)
    return value.as_strided(desc.dim, desc.stride)


