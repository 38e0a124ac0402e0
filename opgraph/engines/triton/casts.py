"""Conversions between the compute type and storage types in generated kernels, with the reference
engine's rounding (opgraph/rounding.py) on the GPU and in Triton's interpreter alike.

- integers: truncate toward zero (as C and PyTorch's `x.to(torch.long)`), saturate to the type's
  range (+-inf included), NaN -> 0; the bounds are applied to the integer result, so 2**31 - 1 or
  2**63 - 1 are never first rounded to a float that overflows the cast;
- bfloat16 and fp8: through float32 (as the reference, PyTorch and ml_dtypes do), round to nearest
  even: bfloat16 by the cvt instruction in an asm statement (on the GPU; its definition in integer
  arithmetic on the bits, _og_to_bf16_bits, is what the interpreter tests hold it to), fp8 in integer
  arithmetic on the bits, then a bit cast, except E4M3 on the GPU: the cvt.rn.satfinite instruction in an
  asm statement (sm_89+), whose rounding is the definition's (`_og_to_e4m3_bits`, held to it by the GPU
  tests). FP8 E4M3 saturates to +-448 (infinities included) and keeps NaN; E5M2 overflows to +-inf (no
  such instruction: satfinite is the only fp8 conversion PTX has). Neither Triton's interpreter (which
  truncates fp32 -> bf16, and decodes and rounds fp8 wrongly) nor Triton's own conversions are relied on;
- decoding bfloat16 and fp8 is a bit operation too (exact), also for float64 compute, which the
  interpreter would otherwise read as integers.
"""

from __future__ import annotations

import re

from ...core.dtypes import DataType

TL_DTYPE = {
    DataType.FLOAT: "tl.float32",
    DataType.DOUBLE: "tl.float64",
    DataType.HALF: "tl.float16",
    DataType.BFLOAT16: "tl.bfloat16",
    DataType.INT8: "tl.int8",
    DataType.UINT8: "tl.uint8",
    DataType.INT32: "tl.int32",
    DataType.INT64: "tl.int64",
    DataType.BOOLEAN: "tl.int1",
    DataType.FP8_E4M3: "tl.float8e4nv",
    DataType.FP8_E5M2: "tl.float8e5",
}
INT_RANGE = {
    DataType.INT8: (-128, 127),
    DataType.UINT8: (0, 255),
    DataType.INT32: (-(2**31), 2**31 - 1),
    DataType.INT64: (-(2**63), 2**63 - 1),
}
_ENCODE = {DataType.BFLOAT16: "_og_to_bf16", DataType.FP8_E4M3: "_og_to_e4m3", DataType.FP8_E5M2: "_og_to_e5m2"}
_DECODE = {DataType.BFLOAT16: "_og_from_bf16", DataType.FP8_E4M3: "_og_from_e4m3", DataType.FP8_E5M2: "_og_from_e5m2"}

CAST_HELPERS = """
def _og_round_f16(x):
    # x (float32) rounded to fp16 and back by cvt instructions. With x.to(tl.float16).to(tl.float32)
    # LLVM narrows the fp32 ops between such pairs to fp16 and contracts a - fp16(b * c) into one
    # fma.rn.f16, the product unrounded (fuzz seed 20261125910499 on an H100; the PTX of Triton 3.9
    # for sm_90 shows it); NumPy's rounding under the interpreter. The argument is converted first: the
    # asm reads its operand's bits (a Python float or an integer would be reinterpreted, not converted)
    return tl.inline_asm_elementwise("{ .reg .b16 h; cvt.rn.f16.f32 h, $1; cvt.f32.f16 $0, h; }", "=f,f",
                                     [x.to(tl.float32)],
                                     dtype=tl.float32, is_pure=True, pack=1)


def _og_round_f16_d(x):
    # x (float64) rounded to fp16 and back, as _og_round_f16 (one rounding, as cuda_fp16's __double2half)
    return tl.inline_asm_elementwise("{ .reg .b16 h; cvt.rn.f16.f64 h, $1; cvt.f64.f16 $0, h; }", "=d,d",
                                     [x.to(tl.float64)],
                                     dtype=tl.float64, is_pure=True, pack=1)


def _og_round_f32_d(x):
    # x (float64) rounded to fp32 and back, as _og_round_f16
    return tl.inline_asm_elementwise("{ .reg .f32 s; cvt.rn.f32.f64 s, $1; cvt.f64.f32 $0, s; }", "=d,d",
                                     [x.to(tl.float64)],
                                     dtype=tl.float64, is_pure=True, pack=1)


def _og_mag(x):
    # |x| by a select and a subtraction, not a bit operation on the sign: ptxas miscompiles those on
    # wgmma accumulators (fuzz seeds 20261125508880, 20261126603140); -0.0 stays -0.0 (a magnitude for
    # comparisons and the fp8 encoders, which take the sign apart)
    return tl.where(x < 0, 0.0 - x, x)


def _og_trunc(x):
    # toward zero: floor and ceil are exact (the conversion itself is not used out of range)
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


def _og_to_int(x, lo, hi, dtype: tl.constexpr, lo_i: tl.constexpr, hi_i: tl.constexpr):
    r = _og_trunc(x)
    r = tl.where(x != x, 0.0, r)
    inside = (r > lo) & (r < hi)
    v = tl.where(inside, r, 0.0).to(dtype)
    v = tl.where(r >= hi, tl.full(v.shape, hi_i, dtype), v)
    return tl.where(r <= lo, tl.full(v.shape, lo_i, dtype), v)


def _og_pow2(e):
    # 2**e as float32 for an int32 e in [-126, 127], built from its bits
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


def _og_to_bf16(x):
    # float32 -> bfloat16 by the cvt instruction (round to nearest even, subnormals kept, overflow to
    # +-inf, NaN to a NaN): one instruction where _og_to_bf16_bits, the same rounding, takes ~7 integer
    # ops an element; an asm statement, so that LLVM cannot narrow or contract the fp32 ops around it
    return tl.inline_asm_elementwise("cvt.rn.bf16.f32 $0, $1;", "=h,f", [x.to(tl.float32)],
                                     dtype=tl.bfloat16, is_pure=True, pack=1)


def _og_round_bf16(x):
    # x (float32) rounded to bfloat16 and back (its bits in the high half), as _og_round_f16: the paired
    # cvt rounds x into both halves of a word (cvt.rn.bf16.f32's rounding), the high one kept as the float32
    # it is; two instructions an element where cvt.rn.bf16.f32, a 16-bit move and a shift took three, in
    # every bf16 epilogue (bench/results/constants.md#bf16-rounding)
    return tl.inline_asm_elementwise(
        "{ .reg .b32 p; cvt.rn.bf16x2.f32 p, $1, $1; and.b32 $0, p, 0xFFFF0000; }", "=f,f",
        [x.to(tl.float32)], dtype=tl.float32, is_pure=True, pack=1)


def _og_to_bf16_bits(x):
    # _og_to_bf16 in integer arithmetic on the bits (the definition the instruction is tested against)
    x = x.to(tl.float32)
    b = x.to(tl.uint32, bitcast=True)
    r = b + 0x7FFF + ((b >> 16) & 1)
    r = tl.where(x != x, 0x7FC00000, r)
    return (r >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


def _og_from_bf16(x):
    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


def _og_bf16_exact(x):
    # a float32 value that bfloat16 holds exactly (one _og_from_bf16 made): its bits' high half, no
    # second rounding
    return (x.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


def _og_fp8_bits(x, a, mant: tl.constexpr, emin: tl.constexpr, bias: tl.constexpr, sub: tl.constexpr):
    # the magnitude a (float32, finite, in range) rounded to nearest even with `mant` mantissa bits
    # and normals from 2**emin, as the 7 low bits of the fp8 code (sub = 2**(mant - emin) scales a
    # subnormal to its code); the sign from x
    e = ((a.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32) - 127
    e = tl.maximum(e, emin)
    step = _og_pow2(e - mant)
    q = a / step
    q = (q + 8388608.0) - 8388608.0
    v = q * step
    ve = ((v.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32) - 127
    frac = ((v.to(tl.uint32, bitcast=True) >> (23 - mant)) & ((1 << mant) - 1)).to(tl.int32)
    code = tl.where(ve >= emin, ((ve + bias) << mant) | frac, (v * sub).to(tl.int32))
    code = tl.where(v == 0.0, 0, code)
    sign = ((x.to(tl.uint32, bitcast=True) >> 24) & 0x80).to(tl.int32)
    return code | sign


def _og_to_e4m3(x):
    # float32 -> E4M3 by cvt.rn.satfinite (sm_89+: round to nearest even, +-448 beyond, infinities
    # included, NaN to NaN), four elements an asm statement: what _og_to_e4m3_bits defines in ~40 integer
    # and float ops an element (an fp8 GEMM's epilogue encoding its output: bench/results/constants.md).
    # Triton packs an asm statement's elements by 4 only in blocks of a multiple of 4 (a reduction's block
    # of 1 or 2 results takes the definition)
    if x.numel % 4 == 0:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; "
            "mov.b32 $0, {lo, hi}; }", "=r,f,f,f,f", [x.to(tl.float32)],
            dtype=tl.uint8, is_pure=True, pack=4).to(tl.float8e4nv, bitcast=True)
    else:
        return _og_to_e4m3_bits(x)


def _og_to_e4m3_bits(x):
    x = x.to(tl.float32)
    a = tl.where(x != x, 0.0, tl.minimum(_og_mag(x), 448.0))
    code = _og_fp8_bits(x, a, 3, -6, 7, 512.0)
    code = tl.where(x != x, 0x7F, code)
    return code.to(tl.uint8).to(tl.float8e4nv, bitcast=True)


def _og_to_e5m2(x):
    x = x.to(tl.float32)
    a = tl.where((x != x) | (_og_mag(x) >= 61440.0), 0.0, _og_mag(x))
    code = _og_fp8_bits(x, a, 2, -14, 15, 65536.0)
    sign = ((x.to(tl.uint32, bitcast=True) >> 24) & 0x80).to(tl.int32)
    code = tl.where(_og_mag(x) >= 61440.0, 0x7C | sign, code)
    code = tl.where(x != x, 0x7F, code)
    return code.to(tl.uint8).to(tl.float8e5, bitcast=True)


def _og_from_e4m3(x):
    b = x.to(tl.uint8, bitcast=True).to(tl.int32)
    e = (b >> 3) & 15
    m = b & 7
    mag = tl.where(e == 0, m, m + 8).to(tl.float32) * _og_pow2(tl.maximum(e, 1) - 10)
    mag = tl.where((e == 15) & (m == 7), float("nan"), mag)
    return tl.where((b & 0x80) != 0, mag * -1.0, mag)


def _og_from_e5m2(x):
    return (x.to(tl.uint8, bitcast=True).to(tl.uint16) << 8).to(tl.float16, bitcast=True).to(tl.float32)
"""


def _float(v: int) -> str:
    return repr(float(v))


_NAME = re.compile(r"[A-Za-z_][\w.]*")


def _closes_at_end(text: str, start: int) -> bool:
    """Whether the bracket opened at text[start] is closed by the last character."""
    depth = 0
    for i in range(start, len(text)):
        depth += text[i] in "(["
        depth -= text[i] in ")]"
        if depth == 0:
            return i == len(text) - 1
    return False


def operand(value: str) -> str:
    """`value` as the operand of a method call (`.to(...)`): a name, or a call or parenthesized group
    spanning all of it, as it is; anything else in parentheses (`a * b.to(t)` would convert b alone)."""
    text = value.strip()
    if _NAME.fullmatch(text):
        return text
    head = _NAME.match(text)
    start = head.end() if head else 0
    if text[start : start + 1] == "(" and _closes_at_end(text, start):
        return text
    return f"({text})"


def from_storage(value: str, dt: DataType, compute: str) -> str:
    """Expression of `value`, held in storage type `dt`, as type `compute` (exact)."""
    if dt in _DECODE:
        f32 = f"{_DECODE[dt]}({value})"
        return f32 if compute == "tl.float32" else f"{f32}.to({compute})"
    if TL_DTYPE[dt] == compute:
        return value
    return f"{operand(value)}.to({compute})"


def to_storage(value: str, dt: DataType, compute: str) -> str:
    """Expression converting a compute-type value to storage type `dt` with the reference engine's
    rounding (see the module docstring)."""
    if dt is DataType.BOOLEAN:
        return f"({value} != 0)"
    if dt in INT_RANGE:
        lo, hi = INT_RANGE[dt]
        return f"_og_to_int({value}, {_float(lo)}, {_float(hi)}, {TL_DTYPE[dt]}, {lo}, {hi})"
    if dt in _ENCODE:
        return f"{_ENCODE[dt]}({value})"
    if TL_DTYPE[dt] == compute:
        return value
    return f"{operand(value)}.to({TL_DTYPE[dt]})"


def cast_to(value: str, target: str) -> str:
    """`value` (a float type) converted to the Triton type named `target`, rounding as to_storage."""
    for dt, name in TL_DTYPE.items():
        if name == target and (dt in _ENCODE or dt in INT_RANGE):
            return to_storage(value, dt, "tl.float32")
    return f"{operand(value)}.to({target})"


# a value rounded to a narrower float type and back, by instructions the compiler cannot fold
_ROUNDERS = {
    (DataType.HALF, "tl.float32"): "_og_round_f16",
    (DataType.HALF, "tl.float64"): "_og_round_f16_d",
    (DataType.FLOAT, "tl.float64"): "_og_round_f32_d",
    (DataType.BFLOAT16, "tl.float32"): "_og_round_bf16",
}


def round_in_compute(value: str, dt: DataType, compute: str) -> str | None:
    """Rounding of an intermediate to its declared type, staying in the compute type; None if exact."""
    if dt is DataType.DOUBLE or TL_DTYPE[dt] == compute:
        return None
    if dt is DataType.FLOAT and compute == "tl.float32":
        return None
    rounder = _ROUNDERS.get((dt, compute))
    if rounder is not None:
        return f"{rounder}({value})"
    return from_storage(to_storage(value, dt, compute), dt, compute)
