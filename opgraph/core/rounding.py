"""Rounding float64 results to a declared data type, the way every engine must agree on.

Floats round to nearest even (overflow gives inf, NaN stays NaN; fp8 E4M3 has no inf and saturates
to +-448, infinities included, as PyTorch's conversion and the GPU's satfinite conversion do, where
ml_dtypes alone would give NaN).

Integers truncate toward zero, as C's conversion and PyTorch's `x.to(torch.long)` do ([-2.7, -0.5,
0.5, 2.7, 3.5] -> [-2, 0, 0, 2, 3]). Where those leave the result undefined, the reference defines
it as a CUDA GPU's conversion instruction (cvt.rzi, which PyTorch's CUDA casts to int32/int64 run)
does: values beyond the type's range saturate to its bounds (+-inf included) and NaN gives 0; int8
and uint8 saturate the same way (PyTorch wraps or clamps there, depending on the device).

Booleans are `value != 0` (NaN is True), as PyTorch's `x.to(torch.bool)`.
"""

from __future__ import annotations

import numpy as np

from .dtypes import DataType

_E4M3_MAX = 448.0


def round_to(values: np.ndarray, data_type: DataType) -> np.ndarray:
    """float64 (or bool) array -> array of `data_type`'s NumPy dtype."""
    values = np.asarray(values)
    if data_type is DataType.BOOLEAN:
        return values != 0
    if data_type.is_integer:
        info = np.iinfo(data_type.numpy)
        with np.errstate(invalid="ignore"):
            r = np.clip(np.trunc(np.nan_to_num(values.astype(np.float64), nan=0.0)), info.min, info.max)
        # float(INT64 max) rounds up to 2**63, which does not cast back: saturate those by hand.
        top = r >= float(info.max)
        out = np.where(top, 0.0, r).astype(data_type.numpy)
        out[top] = info.max
        return out
    # bfloat16/fp8: ml_dtypes rounds float64 through float32, as PyTorch does and as a GPU kernel
    # computing in fp32 does; engines agree on that.
    if data_type is DataType.FP8_E4M3:
        values = np.clip(values, -_E4M3_MAX, _E4M3_MAX)  # NaN stays NaN
    with np.errstate(over="ignore"):
        return values.astype(data_type.numpy)


def to_f64(values: np.ndarray) -> np.ndarray:
    return np.asarray(values).astype(np.float64)
