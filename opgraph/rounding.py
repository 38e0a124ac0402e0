"""Rounding float64 results to a declared data type, the way every engine must agree on.

Floats round to nearest even (overflow gives inf, NaN stays NaN; fp8 E4M3 has no inf and saturates
to NaN as ml_dtypes does). Integers round half to even and saturate to the type's range (NaN -> 0).
Booleans are `value != 0`.
"""

from __future__ import annotations

import numpy as np

from .dtypes import DataType


def round_to(values: np.ndarray, data_type: DataType) -> np.ndarray:
    """float64 (or bool) array -> array of `data_type`'s NumPy dtype."""
    values = np.asarray(values)
    if data_type is DataType.BOOLEAN:
        return values != 0
    if data_type.is_integer:
        info = np.iinfo(data_type.numpy)
        with np.errstate(invalid="ignore"):
            r = np.rint(np.nan_to_num(values.astype(np.float64), nan=0.0))
        return np.clip(r, info.min, info.max).astype(data_type.numpy)
    # bfloat16/fp8: ml_dtypes rounds float64 through float32, as PyTorch does and as a GPU kernel
    # computing in fp32 does; engines agree on that.
    with np.errstate(over="ignore"):
        return values.astype(data_type.numpy)


def to_f64(values: np.ndarray) -> np.ndarray:
    return np.asarray(values).astype(np.float64)
