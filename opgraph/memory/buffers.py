"""What a user buffer looks like, whatever it is: NumPy arrays, PyTorch tensors, DLPack objects and
`__cuda_array_interface__` objects all become a `BufferInfo` (dims, element strides, type, device).

PyTorch is imported only when the object is a PyTorch tensor (its module is already loaded then).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.dtypes import DataType, as_data_type
from ..core.errors import VariantPackError


@dataclass(frozen=True)
class BufferInfo:
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    data_type: DataType
    device: str  # "cpu" or "cuda:N"
    ptr: int
    obj: Any  # the object to compute on: a NumPy array (cpu) or a torch tensor


def _is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _torch_to_numpy(t: Any) -> np.ndarray:
    """Zero-copy NumPy view of a CPU torch tensor, bfloat16 and fp8 included."""
    dt = as_data_type(t.dtype)
    if dt in (DataType.BFLOAT16, DataType.FP8_E4M3, DataType.FP8_E5M2):
        import torch

        carrier = torch.int16 if dt is DataType.BFLOAT16 else torch.uint8
        return t.detach().view(carrier).numpy().view(dt.numpy)
    return t.detach().numpy()


def _check_torch_layout(t: Any) -> None:
    """Sparse, nested and other non-strided tensors have no element strides to bind."""
    import torch

    kind = "nested" if getattr(t, "is_nested", False) else None if t.layout is torch.strided else str(t.layout)
    if kind is not None:
        raise VariantPackError(
            f"a {kind.removeprefix('torch.')} tensor has no dense, strided storage to bind",
            rule="pack.layout",
            hint="bind a dense tensor (e.g. t.to_dense(), or torch.nested.to_padded_tensor for a nested one)",
        )


_TYPESTR = {
    "f2": "half",
    "f4": "float",
    "f8": "double",
    "i1": "int8",
    "u1": "uint8",
    "i4": "int32",
    "i8": "int64",
    "b1": "boolean",
}


def buffer_info(obj: Any) -> BufferInfo:
    """Describe any supported buffer; raise VariantPackError for anything else."""
    if isinstance(obj, np.ndarray):
        itemsize = obj.dtype.itemsize
        if any(s % itemsize for s, d in zip(obj.strides, obj.shape) if d > 1):
            raise VariantPackError(
                f"the array's byte strides {list(obj.strides)} are not multiples of its element size {itemsize}",
                rule="pack.strides",
                hint="bind an array whose elements are aligned (e.g. np.ascontiguousarray)",
            )
        return BufferInfo(
            tuple(obj.shape),
            tuple(s // itemsize for s in obj.strides),
            as_data_type(obj.dtype),
            "cpu",
            obj.__array_interface__["data"][0],
            obj,
        )
    if _is_torch_tensor(obj):
        _check_torch_layout(obj)
        device = "cpu" if obj.device.type == "cpu" else f"{obj.device.type}:{obj.device.index or 0}"
        return BufferInfo(
            tuple(obj.shape),
            tuple(obj.stride()),
            as_data_type(obj.dtype),
            device,
            obj.data_ptr(),
            obj if device != "cpu" else _torch_to_numpy(obj),
        )
    if hasattr(obj, "__cuda_array_interface__"):
        cai = obj.__cuda_array_interface__
        typestr = cai["typestr"].lstrip("<>|=")
        if typestr not in _TYPESTR:
            raise VariantPackError(
                f"__cuda_array_interface__ typestr {cai['typestr']!r} is not supported",
                rule="pack.dtype",
                hint="pass a float16/32/64, int8/32/64, uint8 or bool buffer",
            )
        torch = sys.modules.get("torch")
        if torch is not None:  # a zero-copy torch view, so every engine can use it
            return buffer_info(torch.as_tensor(obj, device="cuda"))
        dt = as_data_type(_TYPESTR[typestr])
        shape = tuple(cai["shape"])
        strides = cai.get("strides")
        if strides is None:
            from ..core.tensor import packed_strides

            elem = packed_strides(shape)
        else:
            elem = tuple(s // dt.itemsize for s in strides)
        return BufferInfo(shape, elem, dt, "cuda:0", int(cai["data"][0]), obj)
    if hasattr(obj, "__dlpack__"):
        torch = sys.modules.get("torch")
        if torch is not None:
            return buffer_info(torch.from_dlpack(obj))
        return buffer_info(np.from_dlpack(obj))
    raise VariantPackError(
        f"a {type(obj).__name__} is not a buffer opgraph can use",
        rule="pack.type",
        hint="bind a NumPy array, a PyTorch tensor, a DLPack or __cuda_array_interface__ object "
        "(or, on CUDA, a raw device pointer as an int)",
    )


_CARRIER_TYPESTR = {1: "|u1", 2: "<u2", 4: "<u4", 8: "<u8"}


class _PointerView:
    """A raw device pointer presented through __cuda_array_interface__ (as unsigned carriers of the
    element size), so PyTorch can wrap it without a copy."""

    def __init__(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "strides": tuple(s * itemsize for s in strides),
            "typestr": _CARRIER_TYPESTR[itemsize],
            "data": (int(ptr), False),
            "version": 3,
        }


def tensor_from_pointer(
    ptr: int, dim: tuple[int, ...], stride: tuple[int, ...], data_type: DataType, device_index: int
) -> Any:
    """A torch tensor over device memory at `ptr` with the given dims, strides and type. opgraph
    cannot check that the memory is there: a raw pointer is the caller's promise."""
    import torch

    view = _PointerView(ptr, dim, stride, data_type.itemsize)
    carrier = torch.as_tensor(view, device=f"cuda:{device_index}")
    return carrier.view(data_type.to_torch())


def address_of(buffer: Any) -> int:
    """The address of a bound buffer's first element: a torch tensor's data_ptr(), a NumPy array's data."""
    if hasattr(buffer, "data_ptr"):
        return int(buffer.data_ptr())
    return int(buffer.__array_interface__["data"][0])
