"""Data types of the product: which tl.dot (or FMA stencil) computes a main op's operands, and its precision knobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ....core.config import NumericalNote, Support
from ....core.dtypes import DataType
from ....core.errors import AttributeValueError
from .analysis import GemmPiece


@dataclass(frozen=True)
class DotKind:
    """How tl.dot multiplies: the operand type tiles are converted to, the accumulator type and
    the input precision of fp32 operands."""

    operand: str  # a tl dtype
    acc: str
    precision: str | None = None
    notes: frozenset[NumericalNote] = frozenset()
    fp8: bool = False  # fp8 tiles multiplied as they are loaded (Hopper's fp8 tensor cores)
    # with fp8: K elements summed in the tensor cores before each fp32 add (None: a main-loop step, BLOCK_K;
    # 0: the whole loop, fast accumulation)
    fp8_acc: int | None = None

    @property
    def is_int(self) -> bool:
        return self.acc == "tl.int32"

    def target(self, dtype: DataType) -> str:
        """The tl type a tile of `dtype` is converted to before the product: `operand`, or an fp8 tile's
        own type where the product takes fp8 as it is (E4M3 and E5M2 mix)."""
        return _FP8_TL[dtype] if self.fp8 and dtype in _FP8_TL else self.operand

    def call(self, a: str, b: str, acc: str) -> str:
        if self.is_int:
            return f"tl.dot({a}, {b}, {acc}, out_dtype=tl.int32)"
        if self.precision is not None:
            return f'tl.dot({a}, {b}, {acc}, input_precision="{self.precision}")'
        if self.fp8 and self.fp8_acc != 0:
            return f"tl.dot({a}, {b}, {acc}, max_num_imprecise_acc={self.fp8_acc or 'BLOCK_K'})"
        return f"tl.dot({a}, {b}, {acc})"


FP8_TYPES = (DataType.FP8_E4M3, DataType.FP8_E5M2)
_FP8_TL = {DataType.FP8_E4M3: "tl.float8e4nv", DataType.FP8_E5M2: "tl.float8e5"}


def dot_kind(
    a: DataType,
    b: DataType,
    *,
    interpret: bool,
    fp32_precision: str = "tf32",
    native_fp8: bool = False,
    fp8_acc: int | None = None,
) -> DotKind | str:
    """The product of operand types `a` and `b`, or why the template cannot multiply them.

    fp16 x fp16 and bf16 x bf16 run on tensor cores as they are (bf16 upcast to fp32 under the
    interpreter, whose bf16 arithmetic is wrong); fp8 x fp8 with `native_fp8` (a template whose fp8
    tiles come straight from memory, on the GPU) runs on the fp8 tensor cores, summed in fp32 as
    `fp8_acc` (TileKnobs.FP8_ACC) says: its 0, the fast accumulation, is noted
    REDUCED_PRECISION_REDUCTION (the tensor cores keep fewer bits than fp32 in their own sums); other
    fp8 is widened to fp16 exactly; mixed 16-bit types run as tf32, which holds fp16 and bf16 values
    exactly; any fp32 operand runs as tf32 (a numerical note) unless fp32_precision="ieee"; int8 x int8
    accumulates in int32."""
    ints = (a.is_integer, b.is_integer)
    if any(ints):
        if a is DataType.INT8 and b is DataType.INT8:
            return DotKind("tl.int8", "tl.int32")
        return f"integer GEMM operands must both be INT8 (got {a.name} x {b.name})"
    if DataType.DOUBLE in (a, b):
        return "DOUBLE GEMM operands are not supported by the Triton templates"
    if native_fp8 and not interpret and a in FP8_TYPES and b in FP8_TYPES:
        notes = frozenset({NumericalNote.REDUCED_PRECISION_REDUCTION}) if fp8_acc == 0 else frozenset()
        return DotKind(_FP8_TL[a], "tl.float32", notes=notes, fp8=True, fp8_acc=fp8_acc)
    narrow = {a if a not in FP8_TYPES else DataType.HALF, b if b not in FP8_TYPES else DataType.HALF}
    if narrow == {DataType.HALF}:
        return DotKind("tl.float16", "tl.float32")
    if DataType.FLOAT not in narrow:
        if narrow == {DataType.BFLOAT16} and not interpret:
            return DotKind("tl.bfloat16", "tl.float32")
        # fp16/bf16 mixes (and bf16 in the interpreter): exact in tf32 on the GPU
        return DotKind("tl.float32", "tl.float32", "ieee" if interpret else "tf32")
    if fp32_precision not in ("tf32", "ieee"):
        raise AttributeValueError(
            f"fp32_precision={fp32_precision!r} is not 'tf32' or 'ieee'",
            rule="triton.gemm.fp32_precision",
            hint="use 'tf32' (tensor cores, 10-bit mantissa inputs) or 'ieee' (full fp32)",
        )
    if fp32_precision == "ieee" or interpret:
        return DotKind("tl.float32", "tl.float32", "ieee")
    return DotKind("tl.float32", "tl.float32", "tf32", frozenset({NumericalNote.DOWN_CONVERT_INPUTS}))


def uses_fp32(a: DataType, b: DataType) -> bool:
    return DataType.FLOAT in (a, b)


def fp32_knobs(a: DataType, b: DataType) -> dict[str, Any]:
    """What every config of operand types `a` x `b` carries: fp32 operands multiply as tf32 unless
    fp32_precision="ieee" (`finish_candidates` adds that alternative)."""
    return {"fp32_precision": "tf32"} if uses_fp32(a, b) else {}


def stencil_support(gp: GemmPiece, roles: tuple[str, str], ints: str, doubles: str) -> Support:
    """Whether a stencil main loop (products without tl.dot, accumulated in fp32, or int32 for int8)
    multiplies the operands of `roles`: integers only as INT8 x INT8 (else Support.no(`ints`)), and
    no DOUBLE (else Support.no(`doubles`))."""
    a, b = (gp.operand(role).data_type for role in roles)
    if (a.is_integer or b.is_integer) and (a is not DataType.INT8 or b is not DataType.INT8):
        return Support.no(ints, gp.main)
    if DataType.DOUBLE in (a, b):
        return Support.no(doubles, gp.main)
    return Support.yes()


def stencil_dot(a: DataType) -> DotKind:
    """A stencil's products (no tl.dot) of operands of type `a` (see `stencil_support`)."""
    return DotKind("tl.int32", "tl.int32") if a.is_integer else DotKind("tl.float32", "tl.float32")


def operand_bytes(a: DataType, b: DataType, *, native_fp8: bool = False) -> int:
    """Bytes per element of the tiles tl.dot multiplies (fp8 is widened to fp16 unless `native_fp8`
    (see dot_kind), mixed 16-bit types and fp32 run as 32-bit): what shared memory holds per stage."""
    if a is DataType.INT8 and b is DataType.INT8:
        return 1
    if native_fp8 and a in FP8_TYPES and b in FP8_TYPES:
        return 1
    narrow = {DataType.HALF if t in FP8_TYPES else t for t in (a, b)}
    return 2 if narrow in ({DataType.HALF}, {DataType.BFLOAT16}) else 4
