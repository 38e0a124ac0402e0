"""The cast helpers of generated kernels (casts.py) as single NumPy steps, for Triton's interpreter.

Under the interpreter every `tl` operation costs tens of microseconds of Python, and the Triton
versions of the helpers take a dozen operations each; these compute the same bits (opgraph.rounding,
the reference engine's own rounding) in one. The loader installs them in interpreted modules only;
tests/engines/test_triton_casts.py runs the Triton versions in the interpreter against them, except those
that are asm statements (the interpreter runs none): bfloat16's cvt instructions there are held to their
integer-arithmetic definition (_og_to_bf16_bits) by a GPU test, tests/engines/test_triton_casts_gpu.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...core.dtypes import DataType
from ...core.rounding import round_to


def _tensor(data: np.ndarray, like: Any, tl_dtype: Any) -> Any:
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    ty = like.type.with_element_ty(tl_dtype) if like.type.is_block() else tl_dtype
    return tl.core.tensor(TensorHandle(np.ascontiguousarray(data).reshape(like.handle.data.shape), tl_dtype), ty)


def _values(x: Any) -> np.ndarray:
    return np.asarray(x.handle.data)


def _encoder(dt: DataType, tl_name: str) -> Callable[[Any], Any]:
    def encode(x: Any) -> Any:
        import triton.language as tl

        f32 = _values(x).astype(np.float32).astype(np.float64)  # through float32, as the reference
        bits = round_to(f32, dt).view(np.uint16 if dt is DataType.BFLOAT16 else np.uint8)
        return _tensor(bits, x, getattr(tl, tl_name))

    return encode


def _decoder(dt: DataType) -> Callable[[Any], Any]:
    def decode(x: Any) -> Any:
        import triton.language as tl

        raw = _values(x)
        carrier = np.uint16 if dt is DataType.BFLOAT16 else np.uint8
        values = raw.astype(carrier, copy=False).view(dt.numpy).astype(np.float32)
        return _tensor(values, x, tl.float32)

    return decode


def _to_int(x: Any, lo: Any, hi: Any, dtype: Any, lo_i: Any, hi_i: Any) -> Any:
    import triton.language as tl

    dtype = getattr(dtype, "value", dtype)
    dt = {tl.int8: DataType.INT8, tl.uint8: DataType.UINT8, tl.int32: DataType.INT32, tl.int64: DataType.INT64}[dtype]
    with np.errstate(all="ignore"):
        return _tensor(round_to(_values(x).astype(np.float64), dt), x, dtype)


def _fmod(a: Any, b: Any) -> Any:
    import triton.language as tl

    like = a if isinstance(a, tl.core.tensor) else b
    with np.errstate(all="ignore"):
        out = np.fmod(
            _values(a) if isinstance(a, tl.core.tensor) else a, _values(b) if isinstance(b, tl.core.tensor) else b
        )
    dtype = like.dtype
    out = np.asarray(out).astype(_values(like).dtype)
    # a block where either operand is one (a scalar dividend, a block divisor: the block's shape, as
    # libdevice's elementwise call broadcasts them; fuzz seed 20261202000337)
    block = any(isinstance(v, tl.core.tensor) and v.type.is_block() for v in (a, b))
    ty = tl.core.block_type(dtype, list(out.shape)) if out.ndim and block else dtype
    from triton.runtime.interpreter import TensorHandle

    return tl.core.tensor(TensorHandle(out, dtype), ty)


def _tanh(x: Any) -> Any:
    """tanh of a float tensor in its own type (NumPy's: what libdevice's tanhf computes, to 2 ulp)."""
    if not hasattr(x, "handle"):  # a Python number
        return float(np.tanh(x))
    v = _values(x)
    if v.dtype.kind != "f":  # (bf16 is held as bits: the generated code passes fp32 here)
        raise TypeError(f"_og_tanh_fast of {x.dtype} under the interpreter: it takes fp16/fp32/fp64")
    with np.errstate(all="ignore"):
        return _tensor(np.tanh(v).astype(v.dtype), x, x.dtype)


def _neg(x: Any) -> Any:
    """-x, as x * -1.0 computes it: floats keep their type, integers become float32 (Triton's promotion)."""
    import triton.language as tl

    if not hasattr(x, "handle"):  # a Python number
        return x * -1.0
    if x.dtype.is_floating():
        v = _values(x)
        return _tensor(v ^ np.uint16(0x8000) if v.dtype == np.uint16 else -v, x, x.dtype)  # (bf16 held as bits)
    return _tensor(_values(x).astype(np.float32) * np.float32(-1.0), x, tl.float32)


def _abs(x: Any) -> Any:
    """|x|, as tl.abs computes it (integers wrap at their minimum, as NumPy's)."""
    if not hasattr(x, "handle"):
        return abs(x)
    v = _values(x)
    return _tensor(v & np.uint16(0x7FFF) if v.dtype == np.uint16 and x.dtype.is_floating() else np.abs(v), x, x.dtype)


def _rounding(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[Any], Any]:
    """np.ceil / np.floor of a float (integers are their own ceiling), keeping its type."""

    def rounded(x: Any) -> Any:
        if not hasattr(x, "handle"):
            return float(fn(x))
        v = _values(x)
        return _tensor(fn(v), x, x.dtype) if v.dtype.kind == "f" else x

    return rounded


def _rounder(np_type: Any) -> Callable[[Any], Any]:
    """x rounded to `np_type` and back, keeping x's type (NumPy rounds to nearest even)."""

    def rounded(x: Any) -> Any:
        v = _values(x)
        return _tensor(v.astype(np_type).astype(v.dtype), x, x.dtype)

    return rounded


FAST: dict[str, Callable[..., Any]] = {
    "_og_abs": _abs,
    "_og_ceil": _rounding(np.ceil),
    "_og_floor": _rounding(np.floor),
    "_og_fmod": _fmod,
    "_og_neg": _neg,
    "_og_tanh_fast": _tanh,
    "_og_round_f16": _rounder(np.float16),
    "_og_round_f16_d": _rounder(np.float16),
    "_og_round_f32_d": _rounder(np.float32),
    "_og_to_bf16": _encoder(DataType.BFLOAT16, "bfloat16"),
    "_og_to_e4m3": _encoder(DataType.FP8_E4M3, "float8e4nv"),
    "_og_to_e5m2": _encoder(DataType.FP8_E5M2, "float8e5"),
    "_og_from_bf16": _decoder(DataType.BFLOAT16),
    "_og_round_bf16": lambda x: _decoder(DataType.BFLOAT16)(_encoder(DataType.BFLOAT16, "bfloat16")(x)),
    "_og_from_e4m3": _decoder(DataType.FP8_E4M3),
    "_og_from_e5m2": _decoder(DataType.FP8_E5M2),
    "_og_to_int": _to_int,
}
