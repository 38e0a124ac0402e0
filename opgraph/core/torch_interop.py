"""Moving buffers between NumPy and PyTorch with their exact strides (bfloat16 and fp8 included).
Imports torch when called."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .dtypes import DataType, as_data_type
from .errors import VariantPackError
from .tensor import TensorDesc, storage_extent, strided_view

_CARRIER = {DataType.BFLOAT16: "int16", DataType.FP8_E4M3: "uint8", DataType.FP8_E5M2: "uint8"}


def numpy_to_torch(arr: np.ndarray, device: str = "cpu") -> Any:
    """A torch tensor on `device` with arr's dims, element strides and values (strides that overlap,
    such as a broadcast's 0, included: the storage is filled on the host, then viewed)."""
    import torch

    dt = as_data_type(arr.dtype)
    itemsize = arr.dtype.itemsize
    if any(s < 0 or s % itemsize for s in arr.strides):
        raise VariantPackError(
            f"an array with byte strides {arr.strides} (negative, or not whole elements of "
            f"{itemsize} bytes) has no torch tensor of the same strides",
            rule="pack.strides",
            hint="pass np.ascontiguousarray(array)",
        )
    strides = [s // itemsize for s in arr.strides]
    base = np.empty(max(storage_extent(arr.shape, strides), 1), dtype=arr.dtype)
    if arr.size:
        strided_view(base, arr.shape, strides)[...] = arr
    carrier = _CARRIER.get(dt)
    storage = torch.from_numpy(base.view(carrier) if carrier else base).to(device)
    if carrier:
        storage = storage.view(dt.to_torch())
    return storage.as_strided(arr.shape, strides)


def torch_to_numpy(t: Any) -> np.ndarray:
    """A host NumPy array with t's values, dims and strides."""
    dt = as_data_type(t.dtype)
    logical = t.detach().contiguous().cpu()
    carrier = _CARRIER.get(dt)
    values = logical.view(getattr(__import__("torch"), carrier)).numpy().view(dt.numpy) if carrier else logical.numpy()
    base = np.empty(max(storage_extent(t.shape, t.stride()), 1), dtype=dt.numpy)
    out = strided_view(base, t.shape, t.stride())
    out[...] = values
    return out


def is_dense(t: Any, as_int: Callable[[Any], int] = int) -> bool:
    """Whether torch tensor `t`'s elements fill its storage span once each (its strides a permutation
    of a packed layout's: contiguous, channels_last and the like). `as_int`: a size's value (symbolic
    sizes: their hints)."""
    expected = 1
    sizes = [(as_int(s), as_int(d)) for d, s in zip(t.shape, t.stride())]
    for stride, size in sorted((s, d) for s, d in sizes if d != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def pack_to_device(pack: Mapping[int, Any], device: str) -> dict[int, Any]:
    """Arrays -> device tensors with the same strides; numbers (pass-by-value) unchanged."""
    return {k: numpy_to_torch(v, device) if isinstance(v, np.ndarray) else v for k, v in pack.items()}


def as_torch(value: Any, desc: TensorDesc, device: Any) -> Any:
    """A bound buffer as a torch tensor on `device`, zero-copy (NumPy arrays via torch.from_numpy,
    bfloat16/fp8 through an integer view; __cuda_array_interface__ objects through torch.as_tensor).
    Pass-by-value numbers stay Python numbers."""
    import torch

    if isinstance(value, torch.Tensor) or desc.is_pass_by_value:
        return value
    if isinstance(value, np.ndarray):
        dt = as_data_type(value.dtype)
        carrier = _CARRIER.get(dt)
        with warnings.catch_warnings():  # read-only inputs: we never write them
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(value.view(carrier) if carrier is not None else value)
        return t.view(dt.to_torch()) if carrier is not None else t
    return torch.as_tensor(value, device=device)
