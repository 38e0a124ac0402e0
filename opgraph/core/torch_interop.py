"""Moving buffers between NumPy and PyTorch with their exact strides (bfloat16 and fp8 included).
Imports torch when called."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .dtypes import DataType, as_data_type
from .tensor import storage_extent

_CARRIER = {DataType.BFLOAT16: "int16", DataType.FP8_E4M3: "uint8", DataType.FP8_E5M2: "uint8"}


def numpy_to_torch(arr: np.ndarray, device: str = "cpu") -> Any:
    """A torch tensor on `device` with arr's dims, element strides and values."""
    import torch

    dt = as_data_type(arr.dtype)
    logical = np.ascontiguousarray(arr)
    carrier = _CARRIER.get(dt)
    src = torch.from_numpy(logical.view(carrier) if carrier else logical)
    if carrier:
        src = src.view(dt.to_torch())
    strides = [s // arr.dtype.itemsize for s in arr.strides]
    out = torch.empty_strided(arr.shape, strides, dtype=src.dtype, device=device)
    out.copy_(src)
    return out


def torch_to_numpy(t: Any) -> np.ndarray:
    """A host NumPy array with t's values, dims and strides."""
    dt = as_data_type(t.dtype)
    logical = t.detach().contiguous().cpu()
    carrier = _CARRIER.get(dt)
    values = (logical.view(getattr(__import__("torch"), carrier)).numpy().view(dt.numpy) if carrier
              else logical.numpy())
    itemsize = dt.itemsize
    base = np.empty(max(storage_extent(t.shape, t.stride()), 1), dtype=dt.numpy)
    out = np.lib.stride_tricks.as_strided(base, shape=tuple(t.shape), strides=[s * itemsize for s in t.stride()])
    out[...] = values
    return out


def pack_to_device(pack: Mapping[int, Any], device: str) -> dict[int, Any]:
    """Arrays -> device tensors with the same strides; numbers (pass-by-value) unchanged."""
    return {k: numpy_to_torch(v, device) if isinstance(v, np.ndarray) else v for k, v in pack.items()}
