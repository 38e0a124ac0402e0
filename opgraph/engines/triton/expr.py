"""Emitting Triton code for pointwise math: every template (elementwise, reductions, norms, GEMM
epilogues) calls `Emitter` to turn pointwise nodes into straight-line statements.

Conventions of generated code: every value is held in the compute type (fp32 unless the op asks for
fp64), whatever its storage type; `v{uid}` is the value of tensor `uid`; an intermediate whose
declared type is narrower than the compute type is rounded to it (`.to(f16).to(f32)`), so fused
kernels agree with the unfused graph; comparisons yield 1.0/0.0.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Protocol

from ...core.dtypes import DataType
from ...core.ir import Const, Node
from ...core.tensor import TensorDesc
from ...ops.custom import Custom
from ...ops.pointwise import MODES, Pointwise, PointwiseMode

TL_DTYPE = {
    DataType.FLOAT: "tl.float32", DataType.DOUBLE: "tl.float64", DataType.HALF: "tl.float16",
    DataType.BFLOAT16: "tl.bfloat16", DataType.INT8: "tl.int8", DataType.UINT8: "tl.uint8",
    DataType.INT32: "tl.int32", DataType.INT64: "tl.int64", DataType.BOOLEAN: "tl.int1",
    DataType.FP8_E4M3: "tl.float8e4nv", DataType.FP8_E5M2: "tl.float8e5",
}
_INT_RANGE = {
    DataType.INT8: (-128, 127), DataType.UINT8: (0, 255), DataType.INT32: (-(2**31), 2**31 - 1),
    DataType.INT64: (-(2**63), 2**63 - 1),
}


def compute_type(node_types: list[DataType]) -> str:
    return "tl.float64" if DataType.DOUBLE in node_types else "tl.float32"


def literal(value: float | int | bool) -> str:
    v = float(value)
    if v != v:
        return "float('nan')"
    if v in (float("inf"), float("-inf")):
        return f"float('{'-' if v < 0 else ''}inf')"
    return repr(v)


def to_storage(value: str, dt: DataType, compute: str) -> str:
    """Expression converting a compute-type value to storage type `dt` (with the reference engine's
    rounding: nearest-even, integer saturation, NaN -> 0, bool = nonzero)."""
    if dt is DataType.BOOLEAN:
        return f"({value} != 0)"
    if dt in _INT_RANGE:
        lo, hi = _INT_RANGE[dt]
        return f"_og_round_int({value}, {float(lo)!r}, {float(hi)!r}).to({TL_DTYPE[dt]})"
    if TL_DTYPE[dt] == compute:
        return value
    return f"{value}.to({TL_DTYPE[dt]})"


def round_in_compute(value: str, dt: DataType, compute: str) -> str | None:
    """Rounding of an intermediate to its declared type, staying in the compute type; None if exact."""
    if dt is DataType.DOUBLE or TL_DTYPE[dt] == compute:
        return None
    return f"{to_storage(value, dt, compute)}.to({compute})"


HELPERS = '''
def _og_round_int(x, lo, hi):
    r = tl.floor(x + 0.5)
    r = tl.where((r - x == 0.5) & (r - 2.0 * tl.floor(r * 0.5) != 0.0), r - 1.0, r)
    r = tl.where(x != x, 0.0, r)
    return tl.minimum(tl.maximum(r, lo), hi)


def _og_tanh(x):
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0, -y, y)


def _og_pow(a, b):
    mag = tl.exp(b * tl.log(tl.abs(a)))
    b_int = tl.floor(b) == b
    b_odd = b_int & (b - 2.0 * tl.floor(b * 0.5) != 0.0)
    r = tl.where(a < 0, tl.where(b_int, tl.where(b_odd, -mag, mag), float("nan")), mag)
    r = tl.where(a == 0, tl.where(b > 0, 0.0, tl.where(b == 0, 1.0, float("inf"))), r)
    return tl.where(b == 0, 1.0, r)


def _og_fmod(a, b):
    q = a / b
    q = tl.where(q < 0, tl.ceil(q), tl.floor(q))
    return a - q * b


def _og_softplus(x, beta):
    z = beta * x
    return (tl.maximum(z, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(z)))) / beta


def _og_gelu_tanh(x):
    k = 0.7978845608028654
    return 0.5 * x * (1.0 + _og_tanh(k * (x + 0.044715 * x * x * x)))


def _og_gelu_tanh_grad(x):
    k = 0.7978845608028654
    t = _og_tanh(k * (x + 0.044715 * x * x * x))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 0.134145 * x * x)
'''


def _mode_expr(mode: PointwiseMode, a: list[str], p: Mapping[str, str]) -> str:
    """The compute-type expression of one pointwise mode over operand expressions `a`."""
    M = PointwiseMode
    x = a[0] if a else ""
    y = a[1] if len(a) > 1 else ""
    simple = {
        M.ADD: f"{x} + {y}", M.SUB: f"{x} - {y}", M.MUL: f"{x} * {y}", M.DIV: f"{x} / {y}",
        M.MAX: f"tl.maximum({x}, {y}, propagate_nan=tl.PropagateNan.ALL)",
        M.MIN: f"tl.minimum({x}, {y}, propagate_nan=tl.PropagateNan.ALL)",
        M.POW: f"_og_pow({x}, {y})", M.MOD: f"_og_fmod({x}, {y})", M.ADD_SQUARE: f"{x} + {y} * {y}",
        M.CMP_EQ: f"({x} == {y})", M.CMP_NEQ: f"({x} != {y})", M.CMP_GT: f"({x} > {y})",
        M.CMP_GE: f"({x} >= {y})", M.CMP_LT: f"({x} < {y})", M.CMP_LE: f"({x} <= {y})",
        M.LOGICAL_AND: f"(({x} != 0) & ({y} != 0))", M.LOGICAL_OR: f"(({x} != 0) | ({y} != 0))",
        M.LOGICAL_NOT: f"({x} == 0)",
        M.BINARY_SELECT: f"tl.where({a[2] if len(a) > 2 else ''} != 0, {x}, {y})",
        M.IDENTITY: x, M.SQRT: f"tl.sqrt({x})", M.RSQRT: f"(1.0 / tl.sqrt({x}))", M.EXP: f"tl.exp({x})",
        M.LOG: f"tl.log({x})", M.NEG: f"(-{x})", M.ABS: f"tl.abs({x})", M.CEIL: f"tl.ceil({x})",
        M.FLOOR: f"tl.floor({x})", M.RECIPROCAL: f"(1.0 / {x})", M.SIN: f"tl.sin({x})",
        M.COS: f"tl.cos({x})", M.TAN: f"(tl.sin({x}) / tl.cos({x}))", M.ERF: f"tl.erf({x})",
        M.TANH_FWD: f"_og_tanh({x})", M.SIGMOID_FWD: f"tl.sigmoid({x})",
        M.GELU_FWD: f"({x} * 0.5 * (1.0 + tl.erf({x} * 0.7071067811865476)))",
        M.GELU_APPROX_TANH_FWD: f"_og_gelu_tanh({x})",
        M.TANH_BWD: f"({x} * (1.0 - _og_tanh({y}) * _og_tanh({y})))",
        M.SIGMOID_BWD: f"({x} * tl.sigmoid({y}) * (1.0 - tl.sigmoid({y})))",
        M.GELU_BWD: f"({x} * (0.5 * (1.0 + tl.erf({y} * 0.7071067811865476)) + {y} * "
                    f"tl.exp(-0.5 * {y} * {y}) * 0.3989422804014327))",
        M.GELU_APPROX_TANH_BWD: f"({x} * _og_gelu_tanh_grad({y}))",
    }
    if mode in simple:
        return simple[mode]
    if mode is M.ELU_FWD:
        return f"tl.where({x} > 0, {x}, {p['alpha']} * (tl.exp({x}) - 1.0))"
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
        clipped = x if hi == "float('inf')" else f"tl.minimum({x}, {hi})"
        below = lo if k == "0.0" else f"tl.where({k} == 0, {lo}, {lo} + {k} * ({x} - {lo}))"
        return f"tl.where({x} < {lo}, {below}, {clipped})"
    if mode is M.RELU_BWD:
        lo, hi, k = p["lower_clip"], p["upper_clip"], p["negative_slope"]
        return f"({x} * tl.where({y} <= {lo}, {k}, tl.where({y} >= {hi}, 0.0, 1.0)))"
    raise NotImplementedError(mode)


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
        return (f"custom op '{d.name}' has no Triton function: register it with pointwise=True and "
                "triton=<an @triton.jit elementwise function> to fuse it")
    if d.num_outputs != 1:
        return f"custom op '{d.name}' has {d.num_outputs} outputs; fused custom ops have one"
    fn = getattr(d.triton, "fn", d.triton)
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or not name.isidentifier():
        return (f"custom op '{d.name}': its Triton function {name or fn!r} is not importable by name; define "
                "the @triton.jit function at the top level of a module")
    if any(not isinstance(v, (int, float, bool)) for _, v in op.params):
        return f"custom op '{d.name}': a fused call takes numeric parameters only"
    return module, name


def elementwise(node: Node) -> bool:
    """Whether the emitter computes `node` per element: a pointwise op, or a fusable custom op."""
    return isinstance(node.op, Pointwise) or (isinstance(node.op, Custom) and not isinstance(fused_custom(node), str))


def custom_imports(source: str) -> list[str]:
    """Import lines for the custom ops' Triton functions that `source` calls."""
    from ...ops.custom import CUSTOM_OPS

    lines = []
    for name in sorted(set(re.findall(CUSTOM_PREFIX + r"(\w+)\(", source))):
        d = CUSTOM_OPS[name]
        fn = getattr(d.triton, "fn", d.triton)
        lines.append(f"from {fn.__module__} import {fn.__qualname__} as {CUSTOM_PREFIX}{name}")
    return lines


class Emitter:
    """Straight-line code for a set of pointwise nodes over one indexing scheme.

    `ptr(uid)` names the kernel argument of an external tensor; `scalar(uid)` names the kernel
    argument of a pass-by-value scalar. Values already computed elsewhere can be preset in `values`.
    """

    def __init__(
        self, tensors: Mapping[int, TensorDesc], compute: str, indexer: Indexer,
        ptr: Callable[[int], str], scalar: Callable[[int], str],
    ) -> None:
        self.tensors = tensors
        self.compute = compute
        self.indexer = indexer
        self.ptr = ptr
        self.scalar = scalar
        self.lines: list[str] = []
        self.values: dict[int, str] = {}

    def operand(self, v: int | Const | None) -> str:
        if v is None:
            return ""
        if isinstance(v, Const):
            return literal(v.value)
        if v not in self.values:
            desc = self.tensors[v]
            name = f"v{v}"
            if desc.is_pass_by_value:
                self.lines.append(f"{name} = {self.scalar(v)}")  # a float argument, fp32 on the GPU
            else:
                self.lines.append(f"{name} = {self.indexer.load(desc, self.ptr(v))}.to({self.compute})")
            self.values[v] = name
        return self.values[v]

    def emit(self, node: Node) -> None:
        op = node.op
        if isinstance(op, Custom):
            self._emit_custom(node, op)
            return
        assert isinstance(op, Pointwise)
        info = MODES[op.mode]
        ins = [self.operand(v) for v in node.inputs]
        operands = ins[: info.arity]
        params = {name: (ins[info.arity + i] or literal(default)) for i, (name, default) in enumerate(info.params)}
        out = node.outputs[0]
        assert out is not None
        if op.mode is PointwiseMode.GEN_INDEX:
            expr = f"({self.indexer.coord(op.axis or 0, self.tensors[out])}).to({self.compute})"
        else:
            expr = f"({_mode_expr(op.mode, operands, params)}).to({self.compute})"
        self.assign(out, expr)

    def assign(self, uid: int, value: str) -> None:
        """Make `value` the value v{uid} of tensor uid, rounded to the tensor's declared type."""
        name = f"v{uid}"
        self.lines.append(f"{name} = {value}")
        rounded = round_in_compute(name, self.tensors[uid].data_type, self.compute)
        if rounded is not None:
            self.lines.append(f"{name} = {rounded}")
        self.values[uid] = name

    def _emit_custom(self, node: Node, op: Custom) -> None:
        """A fused custom op: its Triton function called on compute-type values (see fused_custom)."""
        args = [self.operand(v) for v in node.inputs] + [f"{k}={literal(v)}" for k, v in op.params]
        out = node.outputs[0]
        assert out is not None
        self.assign(out, f"({CUSTOM_PREFIX}{op.op_name}({', '.join(args)})).to({self.compute})")

    def store(self, uid: int) -> None:
        desc = self.tensors[uid]
        value = to_storage(self.values[uid], desc.data_type, self.compute)
        self.lines.append(self.indexer.store(desc, self.ptr(uid), value))
