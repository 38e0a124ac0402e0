"""NumPy <-> torch buffer transfers keep dims, element strides and values: bf16 and fp8, broadcast
(stride-0) and gapped layouts; layouts torch cannot hold are refused with a typed error."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from opgraph.core.errors import VariantPackError
from opgraph.core.tensor import strided_view
from opgraph.core.torch_interop import numpy_to_torch, torch_to_numpy

torch = pytest.importorskip("torch")


def _strided(base: np.ndarray, shape, strides) -> np.ndarray:
    return strided_view(base, shape, strides)  # (as_strided cannot take every ml_dtypes type)


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, np.int32]
)
@pytest.mark.parametrize("layout", ["packed", "transposed", "gapped", "broadcast"])
def test_round_trip_keeps_strides_and_values(dtype, layout, rng):
    base = rng.uniform(-3, 3, 64).astype(dtype)
    arr = {
        "packed": lambda: base[:24].reshape(2, 3, 4),
        "transposed": lambda: base[:24].reshape(2, 3, 4).transpose(2, 0, 1),
        "gapped": lambda: base.reshape(4, 16)[:, ::3],
        "broadcast": lambda: _strided(base, (2, 3, 5), (0, 0, 1)),
    }[layout]()
    t = numpy_to_torch(arr)
    assert tuple(t.shape) == arr.shape
    assert [s * arr.itemsize for s in t.stride()] == list(arr.strides)
    np.testing.assert_array_equal(t.float().numpy(), arr.astype(np.float32))
    back = torch_to_numpy(t)
    assert back.dtype == arr.dtype and back.strides == arr.strides
    np.testing.assert_array_equal(back.astype(np.float32), arr.astype(np.float32))


@pytest.mark.parametrize(
    "arr", [np.arange(6.0).reshape(2, 3)[:, ::-1], np.arange(6.0)[::-2]], ids=["negative-inner", "negative-outer"]
)
def test_negative_strides_are_refused(arr):
    with pytest.raises(VariantPackError, match="ascontiguousarray"):
        numpy_to_torch(arr)
