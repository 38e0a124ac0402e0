"""Host buffers with a tensor's exact layout: empty, random non-zero, copied, poisoned. Tuning fills its
timing buffers with these; `opgraph.testing` builds its checks on them."""

from __future__ import annotations

import numpy as np

from ..core.dtypes import DataType
from ..core.tensor import TensorDesc, storage_extent, strided_view


def empty_like_desc(desc: TensorDesc) -> np.ndarray:
    """An uninitialised NumPy array with exactly the descriptor's dims and strides."""
    base = np.empty(max(storage_extent(desc.dim, desc.stride), 1), dtype=desc.data_type.numpy)
    return strided_view(base, desc.dim, desc.stride)


def clone(arr: np.ndarray) -> np.ndarray:
    """A copy with the same dims and strides (ndarray.copy() would make it C-contiguous)."""
    itemsize = arr.dtype.itemsize
    strides = [s // itemsize for s in arr.strides]
    base = np.empty(max(storage_extent(arr.shape, strides), 1), dtype=arr.dtype)
    out = strided_view(base, arr.shape, strides)
    out[...] = arr
    return out


def poison(arr: np.ndarray) -> np.ndarray:
    """Fill with a value no correct kernel writes: NaN for floats, the max for ints, True for bools."""
    dt = arr.dtype
    if dt == np.bool_:
        arr[...] = True
    elif np.issubdtype(dt, np.integer):
        arr[...] = np.iinfo(dt).max
    else:
        arr[...] = np.nan
    return arr


def random_values(
    desc: TensorDesc, rng: np.random.Generator, *, low: float = -2.0, high: float = 2.0, integers: bool = False
) -> np.ndarray:
    """Random non-zero data of the tensor's type and layout. `integers` draws small integers, which
    every float type holds exactly (so low-precision results can be compared exactly)."""
    arr = empty_like_desc(desc)
    dt = desc.data_type
    if dt is DataType.BOOLEAN:
        arr[...] = rng.random(desc.dim) < 0.5
    elif dt.is_integer:
        lo, hi = (1, 8) if dt is DataType.UINT8 else (-8, 8)
        vals = rng.integers(lo, hi, size=desc.dim)
        arr[...] = np.where(vals == 0, 1, vals)
    else:
        if integers:
            fvals = rng.integers(int(low), int(high) + 1, size=desc.dim).astype(np.float64)
            fvals[fvals == 0] = 1.0
        else:
            fvals = rng.uniform(low, high, size=desc.dim)
            fvals = np.where(np.abs(fvals) < 1e-3, 0.5, fvals)
        arr[...] = fvals.astype(dt.numpy)
    return arr
