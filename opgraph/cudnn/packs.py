"""Binding a cuDNN program's variant pack: by address, as cuDNN does: buffers read with their tensors'
declared dims, strides and type where that is what the program means (`as_declared`)."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import numpy as np

from ..core.device import Device
from ..core.dtypes import DataType
from ..core.errors import GraphError
from ..core.tensor import TensorDesc, storage_extent, strided_view
from ..graph.finalize import _self_overlapping
from ..memory.buffers import BufferInfo, buffer_info
from ..runtime.bindings import check_buffer  # the pack's own checks: the same errors


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


def as_declared(desc: TensorDesc, value: Any, check: Device | None = None) -> Any:
    """cuDNN binds by address: a dense buffer whose shape or strides differ from the tensor's (a [N, H, W]
    result for a [N, 1, H, W] tensor) is read and written with the tensor's dims and strides, as cuDNN
    would, when it holds enough elements of the tensor's type; a floating buffer of another type of the
    same size is read as the tensor's type. With `check` (the plan's device), a
    buffer of the tensor's logical dims (size-1 axes aside) must have its strides too: its layout is
    known, and reading it with other strides would compute on scrambled data ([rule pack.strides]).
    Anything else is bound as given (and checked as opgraph checks every buffer)."""
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
        info.shape == desc.dim and all(a == b for d, a, b in zip(desc.dim, info.strides, desc.stride) if d > 1)
    ):
        return value
    if check is not None:
        _check_layout(info, desc, check)
    numel = int(np.prod(info.shape))
    dense = (
        storage_extent(info.shape, [abs(s) for s in info.strides]) == numel
        and min(info.strides, default=0) >= 0
        and not _self_overlapping(tuple(info.shape), tuple(info.strides))
    )
    if not dense or storage_extent(desc.dim, desc.stride) > numel:
        return value
    if isinstance(value, np.ndarray):
        return strided_view(strided_view(value, (numel,), (1,)), desc.dim, desc.stride)
    return value.as_strided(desc.dim, desc.stride)


def _check_layout(info: BufferInfo, desc: TensorDesc, device: Device) -> None:
    """Raise the pack's [rule pack.strides] error where the buffer has the tensor's dims (size-1 axes
    aside: a [N, H, W] buffer for a [N, 1, H, W] tensor) and other strides on an axis longer than 1."""
    mine = [(d, s) for d, s in zip(info.shape, info.strides) if d != 1]
    if [d for d, _ in mine] != [d for d in desc.dim if d != 1]:
        return  # another logical shape (a flat buffer): only the address says what it holds
    given = iter(s for _, s in mine)
    strides = tuple(next(given) if d != 1 else s for d, s in zip(desc.dim, desc.stride))
    check_buffer(dataclasses.replace(info, shape=desc.dim, strides=strides), desc, device)
