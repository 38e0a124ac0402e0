"""Emitting Triton code for pointwise math: every template (elementwise, reductions, norms, GEMM
epilogues) calls `Emitter` to turn pointwise nodes into straight-line statements.

Conventions of generated code: every value is held in the compute type (fp32 unless the op asks for
fp64: DOUBLE, INT32 or INT64 values in the piece), whatever its storage type; `v{uid}` is the value of
tensor `uid`; an intermediate whose declared type is narrower than the compute type is rounded to it
(casts.py: the reference engine's rounding), so fused kernels agree with the unfused graph;
comparisons yield 1.0/0.0. Functions that lose accuracy in their textbook form use accurate forms:
expm1 for elu, log1p for softplus, tanh through expm1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from ...core.dtypes import DataType
from ...core.errors import InternalError
from ...core.ir import Const, Node
from ...core.piece import Piece
from ...core.symbolic import bounds
from ...core.tensor import TensorDesc
from ...ops.custom import Custom
from ...ops.pointwise import MODES, Pointwise, PointwiseMode
from .casts import CAST_HELPERS, INT_RANGE, TL_DTYPE, from_storage, round_in_compute, to_storage  # noqa: F401
from .compile_worker import function_bodies, reached

_WIDE = frozenset({DataType.DOUBLE, DataType.INT32, DataType.INT64})
_INTS = frozenset({DataType.INT32, DataType.INT64})
_INT_TYPES = frozenset({"tl.int32", "tl.int64"})
_COMPARISONS = frozenset(
    {
        PointwiseMode.CMP_EQ,
        PointwiseMode.CMP_NEQ,
        PointwiseMode.CMP_GT,
        PointwiseMode.CMP_GE,
        PointwiseMode.CMP_LT,
        PointwiseMode.CMP_LE,
    }
)


def compute_type(node_types: list[DataType]) -> str:
    """fp64 where a value of the piece is DOUBLE, INT32 or INT64 (integers stay exact, as in the float64
    reference), else fp32."""
    return "tl.float64" if any(t in _WIDE for t in node_types) else "tl.float32"


def node_compute_type(node: Node, tensors: Mapping[int, TensorDesc]) -> str:
    """The type one node computes in: fp64 where its compute type or one of its tensors is DOUBLE,
    INT32 or INT64, else fp32 (the precision the fuzzer's oracle grants it: tests/fuzz/oracle.py
    node_delta). An fp64 piece (compute_type) computes its other nodes in fp32: a gen_index and an
    INT64 target in a cross-entropy kernel must not make its exp over 400M logits fp64."""
    types = [node.compute_data_type, *(tensors[u].data_type for u in (*node.input_uids(), *node.output_uids()))]
    return compute_type(types)


def node_type(node: Node, tensors: Mapping[int, TensorDesc], compute: str) -> str:
    """The type `node` computes in within a piece of compute type `compute`: its own
    (node_compute_type) in an fp64 piece, fp32 throughout an fp32 one."""
    return node_compute_type(node, tensors) if compute == "tl.float64" else compute


def piece_types(piece: Piece) -> list[DataType]:
    """Every data type of a piece (its tensors, internal ones included) and its ops' compute types."""
    types = [n.compute_data_type for n in piece.nodes]
    for n in piece.nodes:
        types += [piece.tensor(u).data_type for u in (*n.input_uids(), *n.output_uids())]
    return types


# -0.0 from its bits: Triton 3.6 turns a float constant equal to 0 into +0.0 (and computes -x as 0 - x),
# so neither `-0.0` nor `tl.full([], -0.0, ...)` keeps the sign; generated code negates by * -1.0
NEG_ZERO = "tl.full([], -2147483648, tl.int32).to(tl.float32, bitcast=True)"


def literal(value: float | int | bool) -> str:
    v = float(value)
    if v != v:
        return "float('nan')"
    if v in (float("inf"), float("-inf")):
        return f"float('{'-' if v < 0 else ''}inf')"
    if v == 0 and math.copysign(1.0, v) < 0:
        return NEG_ZERO
    return repr(v)


# (a generated module carries the HELPERS functions its kernels reach, comments included (helpers_for): a
# change to one's text changes the source of every kernel calling it, and plan files check the source
# they were saved with; its one dated line stays until then)
HELPERS = (
    CAST_HELPERS
    + """

def _og_expm1(x):
    # exp(x) - 1 without the cancellation near 0 (Kahan: the rounding error of u = exp(x) is undone
    # by x / log(u))
    u = tl.exp(x)
    d = u - 1.0
    r = tl.where(u == 1.0, x, d * (x / tl.log(u)))
    r = tl.where(d == -1.0, -1.0, r)
    return tl.where(u == float("inf"), u, r)


def _og_log1p(x):
    # log(1 + x) keeping relative accuracy for small x (Kahan)
    u = 1.0 + x
    r = tl.where(u == 1.0, x, tl.log(u) * (x / (u - 1.0)))
    return tl.where(u == float("inf"), u, r)


def _og_tanh(x):
    # -expm1(-2|x|) / (2 + expm1(-2|x|)): relative accuracy near 0 too (1 - exp(-2|x|) cancels there)
    m = _og_expm1(-2.0 * _og_abs(x))
    y = _og_neg(m) / (2.0 + m)
    return tl.where(x < 0, _og_neg(y), y)


def _og_tanh_fast(x):
    # tanh where it runs once per score element of an attention tile loop: libdevice's tanhf (2 ulp;
    # fp32 subnormal inputs flush to zero, which a softmax cannot see); np.tanh under the interpreter
    if x.dtype == tl.float32:
        return libdevice.tanh(x)
    else:
        return _og_tanh(x)


def _og_sech2_fast(x):
    # 1 - tanh(x)**2 from _og_tanh_fast's tanh: absolute error ~eps (no relative accuracy past |x| ~ 4,
    # where _og_sech2 keeps it); the compiler may share the call with a recomputed forward's tanh
    t = _og_tanh_fast(x)
    return 1.0 - t * t


def _og_signbit(a):
    # the sign bit, read from the bits (-0 and -nan included): a compiler folded (a == 0) & (1 / a < 0)
    # to false (bench/results/constants.md#sign-bit)
    if a.dtype == tl.float64:
        return a.to(tl.int64, bitcast=True) < 0
    else:
        return a.to(tl.float32).to(tl.int32, bitcast=True) < 0


def _og_pow(a, b):
    # C99 pow (Annex F.9.4.4, IEEE 754 pow), as the reference (ops.pointwise._pow): exp(b * log|a|) is the
    # magnitude everywhere except |a| == 1 (1 ** inf is 1, not exp(nan)); the sign is a's (its sign
    # bit: -0 too) for an odd integer b; a finite a < 0 with a finite non-integer b is NaN; 1 ** y and
    # x ** 0 are 1 even for NaN. a is a tensor (see _mode_expr); no `&` between a's and b's booleans
    # (their shapes may differ: one a scalar, which Triton's interpreter turns into int32)
    mag = tl.where(_og_abs(a) == 1.0, 1.0, tl.exp(b * tl.log(_og_abs(a))))
    b_int = tl.floor(b) == b  # true for +-inf
    b_odd = b_int & (b != float("inf")) & (b != float("-inf")) & (b - 2.0 * tl.floor(b * 0.5) != 0.0)
    negative = _og_signbit(a)
    r = tl.where(b_odd, tl.where(negative, _og_neg(mag), mag), mag)
    r = tl.where(b_int, r, tl.where((a < 0) & (a != float("-inf")), float("nan"), r))
    r = tl.where(a == 1.0, 1.0, r)
    return tl.where(b == 0, 1.0, r)


def _og_neg(x):
    # -x by neg.f32 / neg.f64 (see _og_abs; the helpers above use it and _og_abs for the same reason: the
    # sigmoid gradient's exp(-|x|) of a conv_dgrad accumulator was wrong on an H100, fuzz seed
    # 20261126603140); x * -1.0 under the interpreter
    if x.dtype == tl.float32:
        return tl.inline_asm_elementwise("neg.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    elif x.dtype == tl.float64:
        return tl.inline_asm_elementwise("neg.f64 $0, $1;", "=d,d", [x], dtype=tl.float64, is_pure=True, pack=1)
    else:
        return x * -1.0


def _og_abs(x):
    # |x| by abs.f32 / abs.f64: LLVM turns fneg / fabs of a value that is then moved as bits (a tile
    # staged through shared memory) into an xor / and of the sign bit, and ptxas (CUDA 12.8 and 12.9,
    # sm_90a) compiled those on a wgmma accumulator to 0 everywhere (fuzz seed 20261125508880, a conv
    # followed by NEG, on an H100: scripts/conv_ptx_probe.sh); tl.abs under the interpreter
    if x.dtype == tl.float32:
        return tl.inline_asm_elementwise("abs.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    elif x.dtype == tl.float64:
        return tl.inline_asm_elementwise("abs.f64 $0, $1;", "=d,d", [x], dtype=tl.float64, is_pure=True, pack=1)
    else:
        return tl.abs(x)


def _og_fmod(a, b):
    # exact, as C's fmod (x - trunc(x / y) * y is not); NumPy's fmod under the interpreter (interpreted_casts.py).
    # fp32 in float64: Triton links libdevice flushing fp32 subnormals (fmodf(1e-45, 1) would be 0)
    if a.dtype == tl.float32:
        return libdevice.fmod(a.to(tl.float64), b.to(tl.float64)).to(tl.float32)
    else:
        return libdevice.fmod(a, b)


def _og_ceil(x):
    # cvt.rpi without .ftz: tl.ceil of fp32 is cvt.rpi.ftz (Triton's libdevice flushes subnormals:
    # ceil(1e-45) was 0, not 1, on an H100: fuzz seed 20261126308167); np.ceil under the interpreter
    if x.dtype == tl.float32:
        return tl.inline_asm_elementwise("cvt.rpi.f32.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return tl.ceil(x)


def _og_floor(x):
    # cvt.rmi without .ftz (see _og_ceil)
    if x.dtype == tl.float32:
        return tl.inline_asm_elementwise("cvt.rmi.f32.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return tl.floor(x)


def _og_softplus(x, beta):
    z = beta * x
    return (tl.maximum(z, 0.0) + _og_log1p(tl.exp(_og_neg(_og_abs(z))))) / beta


def _og_gelu_tanh(x):
    # constants inline: a float assigned to a variable becomes an fp32 value in a compiled Triton
    # function (a float64 kernel would compute with an fp32 sqrt(2/pi))
    return x * _og_half_1p_tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))


def _og_half_1p_tanh(u):
    # (1 + tanh(u)) / 2 = sigmoid(2u), without the cancellation of 1 + tanh(u) for u << 0
    e = tl.exp(-2.0 * _og_abs(u))
    r = 1.0 / (1.0 + e)  # (one division an element: both sides of the where are computed)
    return tl.where(u >= 0, r, e * r)


def _og_sech2(x):
    # 1 - tanh(x)**2 as 4e / (1 + e)**2, e = exp(-2|x|): no cancellation for large |x|
    e = tl.exp(-2.0 * _og_abs(x))
    return 4.0 * e / ((1.0 + e) * (1.0 + e))


def _og_sigmoid_grad(x):
    # s * (1 - s) as e / (1 + e)**2, e = exp(-|x|)
    e = tl.exp(_og_neg(_og_abs(x)))
    return e / ((1.0 + e) * (1.0 + e))


def _og_gelu_tanh_grad(x):
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return _og_half_1p_tanh(inner) + 0.5 * x * _og_sech2(inner) * 0.7978845608028654 * (1.0 + 0.134145 * x * x)
"""
)


_LITERAL = re.compile(r"float\('-?(inf|nan)'\)|-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")  # what literal() writes


def _tensor_of(value: str, like: str) -> str:
    """`value` as a 0-d tensor of `like`'s type where it is a literal and `like` is not (a Python float
    is no tensor: a helper that tests its sign bit by division needs one), else `value` itself."""
    if _LITERAL.fullmatch(value) and not _LITERAL.fullmatch(like):
        return f"tl.full([], {value}, ({like}).dtype)"
    return value


def _pow_expr(x: str, y: str) -> str:
    if _LITERAL.fullmatch(x) and _LITERAL.fullmatch(y):  # folded, as the reference computes it
        with np.errstate(all="ignore"):
            a, b = (np.float64(float(v.removeprefix("float('").removesuffix("')"))) for v in (x, y))
            return literal(float(MODES[PointwiseMode.POW].fn(a, b)))
    return f"_og_pow({_tensor_of(x, y)}, {y})"


def _mod_expr(x: str, y: str) -> str:
    if _LITERAL.fullmatch(x) and _LITERAL.fullmatch(y):  # folded (a literal has no dtype for _og_fmod)
        with np.errstate(all="ignore"):
            a, b = (np.float64(float(v.removeprefix("float('").removesuffix("')"))) for v in (x, y))
            return literal(float(MODES[PointwiseMode.MOD].fn(a, b)))
    return f"_og_fmod({_tensor_of(x, y)}, {y} + 0.0 * {x})"


def _scaled_expr(x: str, y: str, op: str) -> str:
    """x * y or x / y; a product or quotient by a literal -1 is `_og_neg`: LLVM folds it to a sign-bit
    flip, which ptxas miscompiles on a wgmma accumulator (see _og_abs; issue 38's conv_dgrad * -1)."""
    pairs = ((x, y), (y, x)) if op == "*" else ((x, y),)
    for value, factor in pairs:
        if factor in ("-1.0", "-1") and not _LITERAL.fullmatch(value):
            return f"_og_neg({value})"
    return f"{x} {op} {y}"


def _select_expr(x: str, y: str, mask: str) -> str:
    """BINARY_SELECT: the chosen operand itself where the mask is a literal and that operand is not one
    (the other operand's load then has no use: a compute copy's update reads the old copy only so that
    the graph orders it after that copy's readers, opgraph.training.step_graph)."""
    if _LITERAL.fullmatch(mask) and "float" not in mask:
        chosen = x if float(mask) != 0 else y
        if not _LITERAL.fullmatch(chosen):
            return chosen
    return f"tl.where({mask} != 0, {x}, {y})"


def _mode_expr(mode: PointwiseMode, a: list[str], p: Mapping[str, str]) -> str:
    """The compute-type expression of one pointwise mode over operand expressions `a`."""
    M = PointwiseMode
    x = a[0] if a else ""
    y = a[1] if len(a) > 1 else ""
    simple = {
        M.ADD: f"{x} + {y}",
        M.SUB: f"{x} - {y}",
        M.MUL: _scaled_expr(x, y, "*"),
        M.DIV: _scaled_expr(x, y, "/"),
        M.MAX: f"tl.maximum({x}, {y}, propagate_nan=tl.PropagateNan.ALL)",
        M.MIN: f"tl.minimum({x}, {y}, propagate_nan=tl.PropagateNan.ALL)",
        # (y + 0 * x: y in x's type and shape for the library call; NaN only where fmod is NaN anyway)
        M.POW: _pow_expr(x, y),
        M.MOD: _mod_expr(x, y),
        M.ADD_SQUARE: f"{x} + {y} * {y}",
        M.CMP_EQ: f"({x} == {y})",
        M.CMP_NEQ: f"({x} != {y})",
        M.CMP_GT: f"({x} > {y})",
        M.CMP_GE: f"({x} >= {y})",
        M.CMP_LT: f"({x} < {y})",
        M.CMP_LE: f"({x} <= {y})",
        # as products of 0/1 values: `&`/`|` of a scalar and a block boolean fail in Triton's interpreter
        M.LOGICAL_AND: f"(({x} != 0).to(tl.float32) * ({y} != 0).to(tl.float32))",
        M.LOGICAL_OR: f"tl.maximum(({x} != 0).to(tl.float32), ({y} != 0).to(tl.float32))",
        M.LOGICAL_NOT: f"({x} == 0)",
        M.BINARY_SELECT: _select_expr(x, y, a[2] if len(a) > 2 else ""),
        M.IDENTITY: x,
        M.SQRT: f"tl.sqrt({x})",
        M.RSQRT: f"(1.0 / tl.sqrt({x}))",
        M.EXP: f"tl.exp({x})",
        M.LOG: f"tl.log({x})",
        M.CEIL: f"tl.ceil({x})" if _LITERAL.fullmatch(x) else f"_og_ceil({x})",
        M.NEG: f"({x} * -1.0)" if _LITERAL.fullmatch(x) else f"_og_neg({x})",
        M.ABS: f"tl.abs({x})" if _LITERAL.fullmatch(x) else f"_og_abs({x})",
        M.FLOOR: f"tl.floor({x})" if _LITERAL.fullmatch(x) else f"_og_floor({x})",
        M.RECIPROCAL: f"(1.0 / {x})",
        M.SIN: f"tl.sin({x})",
        M.COS: f"tl.cos({x})",
        M.TAN: f"(tl.sin({x}) / tl.cos({x}))",
        M.ERF: f"tl.erf({x})",
        M.TANH_FWD: f"_og_tanh({x})",
        M.SIGMOID_FWD: f"tl.sigmoid({x})",
        M.GELU_FWD: f"({x} * 0.5 * (1.0 + tl.erf({x} * 0.7071067811865476)))",
        M.GELU_APPROX_TANH_FWD: f"_og_gelu_tanh({x})",
        M.TANH_BWD: f"({x} * _og_sech2({y}))",
        M.SIGMOID_BWD: f"({x} * _og_sigmoid_grad({y}))",
        M.GELU_BWD: f"({x} * (0.5 * (1.0 + tl.erf({y} * 0.7071067811865476)) + {y} * "
        f"tl.exp(-0.5 * {y} * {y}) * 0.3989422804014327))",
        M.GELU_APPROX_TANH_BWD: f"({x} * _og_gelu_tanh_grad({y}))",
    }
    if mode in simple:
        return simple[mode]
    if mode is M.ELU_FWD:
        return f"tl.where({x} > 0, {x}, {p['alpha']} * _og_expm1({x}))"
    if mode is M.ELU_BWD:
        return f"({x} * tl.where({y} > 0, 1.0, {p['alpha']} * tl.exp({y})))"
    if mode is M.SOFTPLUS_FWD:
        return f"_og_softplus({x}, {p['beta']})"
    if mode is M.SOFTPLUS_BWD:
        return f"({x} * tl.sigmoid({p['beta']} * {y}))"
    if mode is M.SWISH_FWD:
        return f"({x} * tl.sigmoid({p['swish_beta']} * {x}))"
    if mode is M.SWISH_BWD:
        s = f"tl.sigmoid({p['swish_beta']} * {y})"
        return f"({x} * ({s} + {p['swish_beta']} * {y} * {s} * (1.0 - {s})))"
    if mode is M.RELU_FWD:
        lo, hi, k = p["lower_clip"], p["upper_clip"], p["negative_slope"]
        clipped = x if hi == "float('inf')" else f"tl.minimum({x}, {hi}, propagate_nan=tl.PropagateNan.ALL)"
        below = lo if k == "0.0" else f"tl.where({k} == 0, {lo}, {lo} + {k} * ({x} - {lo}))"
        return f"tl.where({x} < {lo}, {below}, {clipped})"
    if mode is M.RELU_BWD:
        lo, hi, k = p["lower_clip"], p["upper_clip"], p["negative_slope"]
        return f"({x} * tl.where({y} <= {lo}, {k}, tl.where({y} >= {hi}, 0.0, 1.0)))"
    raise NotImplementedError(mode)


def scalar_value(param: str, compute: str) -> str:
    """A pass-by-value kernel argument as a value of the compute type. (`tl.full` keeps a float64
    argument's precision in Triton's interpreter too, where the argument is a Python float.)"""
    return f"tl.full([], {param}, {compute})"


class Indexer(Protocol):
    """How a template addresses tensors: loads/stores in its tile shape, coordinates for gen_index."""

    def load(self, desc: TensorDesc, ptr: str) -> str: ...

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str: ...

    def coord(self, axis: int, desc: TensorDesc) -> str: ...


CUSTOM_PREFIX = "_og_custom_"  # a custom op's Triton function, imported into generated modules as this + name


def fused_custom(node: Node) -> tuple[str, str] | str:
    """(module, name) of the @triton.jit function that generated kernels call for custom op `node`,
    or why the op cannot be fused."""
    op = node.op
    if not isinstance(op, Custom):
        return f"{node.label()} is not a custom op"
    d = op.definition
    if d.triton is None or not d.pointwise:
        return (
            f"custom op '{d.name}' has no Triton function: register it with pointwise=True and "
            "triton=<an @triton.jit elementwise function> to fuse it"
        )
    if d.num_outputs != 1:
        return f"custom op '{d.name}' has {d.num_outputs} outputs; fused custom ops have one"
    fn = getattr(d.triton, "fn", d.triton)
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or not name.isidentifier():
        return (
            f"custom op '{d.name}': its Triton function {name or fn!r} is not importable by name; define "
            "the @triton.jit function at the top level of a module"
        )
    if any(not isinstance(v, (int, float, bool)) for _, v in op.params):
        return f"custom op '{d.name}': a fused call takes numeric parameters only"
    return module, name


def elementwise(node: Node) -> bool:
    """Whether the emitter computes `node` per element: a pointwise op, or a fusable custom op."""
    return isinstance(node.op, Pointwise) or (isinstance(node.op, Custom) and not isinstance(fused_custom(node), str))


# HELPERS' functions by name, each its text (comments included), in HELPERS' order
_HELPER_BLOCKS = {name: text.strip("\n") for name, text in function_bodies(HELPERS).items()}
# (HELPERS holds nothing but these functions: anything else at its top level would be lost from modules)
assert "\n\n\n".join(_HELPER_BLOCKS.values()).split() == HELPERS.split(), "HELPERS: only top-level defs"


def helpers_for(source: str) -> str:
    """The HELPERS functions `source` calls, and those they call, in HELPERS' order: what a generated
    module holds of them (the rest, most of the few hundred lines, would only be compiled by Python at
    every load: a quarter of a kernel's load time)."""
    needed = reached(_HELPER_BLOCKS, source)
    return "\n\n\n".join(text for name, text in _HELPER_BLOCKS.items() if name in needed)


def custom_imports(source: str) -> list[str]:
    """Import lines for the custom ops' Triton functions that `source` calls."""
    from ...ops.custom import CUSTOM_OPS

    lines = []
    for name in sorted(set(re.findall(CUSTOM_PREFIX + r"(\w+)\(", source))):
        d = CUSTOM_OPS[name]
        fn = getattr(d.triton, "fn", d.triton)
        lines.append(f"from {fn.__module__} import {fn.__qualname__} as {CUSTOM_PREFIX}{name}")
    return lines


def _integral(tensors: Mapping[int, TensorDesc], v: int | Const | None) -> bool:
    """Whether comparison operand `v` is an INT32/INT64 tensor or an integral constant that int64
    holds exactly as the float64 reference does (|c| <= 2**53)."""
    if isinstance(v, Const):
        c = float(v.value)
        return c == c and abs(c) <= 2**53 and c == math.floor(c)
    return isinstance(v, int) and tensors[v].data_type in _INTS


class Emitter:
    """Straight-line code for a set of pointwise nodes over one indexing scheme.

    `ptr(uid)` names the kernel argument of an external tensor; `scalar(uid)` names the kernel
    argument of a pass-by-value scalar. Values already computed elsewhere can be preset in `values`.
    """

    def __init__(
        self,
        tensors: Mapping[int, TensorDesc],
        compute: str,
        indexer: Indexer,
        ptr: Callable[[int], str],
        scalar: Callable[[int], str],
        suffix: str = "",
    ) -> None:
        self.tensors = tensors
        self.suffix = suffix  # of value names: v{uid}{suffix} (a concatenation's operands, _concat.py)
        self.compute = compute
        self.indexer = indexer
        self.ptr = ptr
        self.scalar = scalar
        self.lines: list[str] = []
        # each value as the piece's compute type (what templates read), and as computed (name, type)
        self.values: dict[int, str] = {}
        self.native: dict[int, tuple[str, str]] = {}
        # fp32 values v{uid} rounded to BFLOAT16 by assign: stored by their bits, not rounded again
        self.exact_bf16: set[int] = set()
        # tensors a template loads by itself (uid -> the tile's load expression given the tensor: a TMA-loaded
        # tile's shared-memory buffer, gemm/epilogue.py); the others through `indexer`
        self.loaders: dict[int, Callable[[TensorDesc], str]] = {}

    def operand(self, v: int | Const | None) -> str:
        if v is None:
            return ""
        if isinstance(v, Const):
            return literal(v.value)
        if v not in self.values:
            desc = self.tensors[v]
            name = f"v{v}{self.suffix}"
            home = compute_type([desc.data_type]) if self.compute == "tl.float64" else self.compute
            if desc.is_pass_by_value:  # a float64 argument (see annotate_scalars), in the compute type
                self.lines.append(f"{name} = {scalar_value(self.scalar(v), home)}")
            elif desc.data_type in _INTS and self.compute == "tl.float64":  # as stored: cast where used
                self.lines.append(f"{name} = {self._load(v, desc)}")
                home = TL_DTYPE[desc.data_type]
            else:
                self.lines.append(f"{name} = {from_storage(self._load(v, desc), desc.data_type, home)}")
            self._named(v, name, home)
        return self.values[v]

    def _load(self, uid: int, desc: TensorDesc) -> str:
        loader = self.loaders.get(uid)
        return loader(desc) if loader is not None else self.indexer.load(desc, self.ptr(uid))

    def _named(self, uid: int, name: str, typ: str) -> None:
        self.native[uid] = (name, typ)
        self.values[uid] = name if typ == self.compute else f"{name}.to({self.compute})"

    def typed(self, v: int | Const | None, typ: str) -> str:
        """Operand `v` as type `typ` (values a template preset are in the compute type)."""
        if v is None or isinstance(v, Const):
            return self.operand(v)
        value = self.operand(v)
        name, have = self._native(v, value)
        return name if have == typ else f"{name}.to({typ})"

    def _native(self, uid: int, value: str) -> tuple[str, str]:
        name, typ = self.native.get(uid, (value, self.compute))
        if value not in (name, f"{name}.to({self.compute})"):  # a template set values[uid] itself
            return value, self.compute
        return name, typ

    def emit(self, node: Node) -> None:
        op = node.op
        if isinstance(op, Custom):
            self._emit_custom(node, op)
            return
        assert isinstance(op, Pointwise)
        if op.mode is PointwiseMode.IDENTITY and self._alias(node):
            return
        info = MODES[op.mode]
        typ = node_type(node, self.tensors, self.compute)
        ins = [self.typed(v, typ) for v in node.inputs]
        operands = ins[: info.arity]
        params = {name: (ins[info.arity + i] or literal(default)) for i, (name, default) in enumerate(info.params)}
        out = node.outputs[0]
        assert out is not None
        if op.mode is PointwiseMode.GEN_INDEX:
            desc = self.tensors[out]
            if (
                self.compute == "tl.float64"
                and desc.data_type in _INTS
                and (bounds(desc.dim[op.axis or 0])[1] <= INT_RANGE[desc.data_type][1])
            ):
                typ = TL_DTYPE[desc.data_type]  # a coordinate is exact in its integer type
            coord = self.indexer.coord(op.axis or 0, desc)
            # a constant coordinate (an axis of size 1) is a Python int, not a tensor
            expr = f"tl.full([], {coord}, {typ})" if coord.isdigit() else f"({coord}).to({typ})"
        elif op.mode in _COMPARISONS and self.compute == "tl.float64":
            # integers compare as integers: no fp64 conversion per element (a one-hot of class ids);
            # the 0/1 result is made in the output's own type (an INT32/INT64 output exactly, a
            # FLOAT one in fp32: no fp64 value where only the compared integers needed it)
            args = node.inputs[: info.arity]
            if all(_integral(self.tensors, v) for v in args) and any(isinstance(v, int) for v in args):
                operands = [str(int(v.value)) if isinstance(v, Const) else self.typed(v, "tl.int64") for v in args]
            dt = self.tensors[out].data_type
            typ = TL_DTYPE[dt] if dt in _INTS else compute_type([dt])
            expr = f"({_mode_expr(op.mode, operands, params)}).to({typ})"
        else:
            expr = f"({_mode_expr(op.mode, operands, params)}).to({typ})"
        self.assign(out, expr, typ)

    def _alias(self, node: Node) -> bool:
        """An identity to its input's own type (a reshape or transpose made pointwise over a GEMM's output space:
        _matmul_split_cols.py, _matmul_regroup.py) names the input's value: it is already of that type, so no
        copy and no rounding again (six bf16 roundings an element of a fused rotary embedding). False where it is
        not such an identity or the input is not yet a value."""
        src, out = node.inputs[0], node.outputs[0]
        if not isinstance(src, int) or out is None or src not in self.values:
            return False
        if self.tensors[src].data_type is not self.tensors[out].data_type:
            return False
        self.values[out] = self.values[src]
        if src in self.native:
            self.native[out] = self.native[src]
        if src in self.exact_bf16:
            self.exact_bf16.add(out)
        return True

    def moved(self, uid: int, value: str, sources: tuple[int, ...]) -> None:
        """Make `value`, which only moves the values of `sources` (a slice of one, two joined), the value of
        tensor uid: rounded again only where uid's type is not theirs (each value is already of its type)."""
        if any(self.tensors[u].data_type is not self.tensors[uid].data_type for u in sources):
            self.assign(uid, value)
            return
        name = f"v{uid}{self.suffix}"
        self.lines.append(f"{name} = {value}")
        self.values[uid] = name
        if all(u in self.exact_bf16 for u in sources):
            self.exact_bf16.add(uid)

    def assign(self, uid: int, value: str, typ: str | None = None) -> None:
        """Make `value` (of type `typ`, default the compute type) the value v{uid} of tensor uid,
        rounded to the tensor's declared type."""
        typ = typ or self.compute
        name = f"v{uid}{self.suffix}"
        self.lines.append(f"{name} = {value}")
        dt = self.tensors[uid].data_type
        rounded = round_in_compute(name, dt, typ)
        if rounded is not None:
            self.lines.append(f"{name} = {rounded}")
        if rounded is not None and dt is DataType.BFLOAT16 and typ == "tl.float32":
            self.exact_bf16.add(uid)
        self._named(uid, name, typ)

    def _emit_custom(self, node: Node, op: Custom) -> None:
        """A fused custom op: its Triton function called on compute-type values (see fused_custom)."""
        typ = node_type(node, self.tensors, self.compute)
        args = [self.typed(v, typ) for v in node.inputs]
        for k, v in op.params:
            if isinstance(v, str):  # fused_custom admits numeric parameters only
                raise InternalError(
                    f"fused custom op parameter {k!r} is a string",
                    op=node.label(),
                    rule="internal.invariant",
                    hint="this is an opgraph bug: please report it",
                )
            args.append(f"{k}={literal(v)}")
        out = node.outputs[0]
        assert out is not None
        self.assign(out, f"({CUSTOM_PREFIX}{op.op_name}({', '.join(args)})).to({typ})", typ)

    def store(self, uid: int, indexer: Any = None) -> None:
        """Store tensor uid's value through `indexer` (the emitter's own by default; another one addresses
        the tensor by itself: a TMA descriptor's store, gemm/epilogue.py)."""
        desc = self.tensors[uid]
        name, typ = self._native(uid, self.values[uid])
        if typ in _INT_TYPES:  # (a gen_index coordinate)
            name, typ = (name, typ) if typ == TL_DTYPE[desc.data_type] else (f"{name}.to(tl.float64)", "tl.float64")
        value = name if typ == TL_DTYPE[desc.data_type] else to_storage(name, desc.data_type, typ)
        if (
            uid in self.exact_bf16
            and name == f"v{uid}{self.suffix}"
            and typ == "tl.float32"
            and desc.data_type is DataType.BFLOAT16
        ):
            value = f"_og_bf16_exact({name})"
        if indexer is not None:
            self.lines.append(indexer.store(desc, "", value))
        else:
            self.lines.append(self.indexer.store(desc, self.ptr(uid), value))
