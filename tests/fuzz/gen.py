"""Random valid graphs for the differential fuzzer.

`make_case(seed)` builds one small graph through the public builders (every op family, every data
type, strided / gapped / stride-0 inputs, literal / pass-by-value / device scalars, in-place updates)
and returns a `Case`: the graph as JSON plus what the runner needs to feed it (a value profile per
input, pass-by-value values, the by-reference option). A case is plain data, so a failing one is
kept as a regression file and replayed anywhere.

The generator tracks, per value, whether every engine must compute it bit for bit as the reference
does ("exact": loads, data movement, +, -, *, min, max, abs, casts of exact values...). Ops whose
result jumps with a last-bit change of their operands (comparisons, floor, casts to integers, select
masks, pooling indices, fmod) only ever read exact values, so a failure is a bug, not a rounding
accident; everything else is compared under a tolerance (see oracle.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

import opgraph as og
from opgraph.ops.pointwise import MODES, PointwiseMode

DT = og.DataType
M = PointwiseMode
WIDE_INTS = (DT.INT32, DT.INT64)
FP8 = (DT.FP8_E4M3, DT.FP8_E5M2)
ALL_TYPES = (DT.FLOAT, DT.HALF, DT.BFLOAT16, DT.DOUBLE, DT.INT32, DT.INT64, DT.INT8, DT.BOOLEAN, *FP8)

# pointwise modes by how they treat last-bit differences of their operands
EXACT_BINARY = (M.ADD, M.SUB, M.MUL, M.MAX, M.MIN)
SMOOTH_BINARY = (
    M.DIV,
    M.ADD_SQUARE,
    M.POW,
    M.TANH_BWD,
    M.SIGMOID_BWD,
    M.GELU_BWD,
    M.GELU_APPROX_TANH_BWD,
    M.SOFTPLUS_BWD,
    M.SWISH_BWD,
    M.ELU_BWD,
)
JUMPY_BINARY = (
    M.CMP_EQ,
    M.CMP_NEQ,
    M.CMP_GT,
    M.CMP_GE,
    M.CMP_LT,
    M.CMP_LE,
    M.LOGICAL_AND,
    M.LOGICAL_OR,
    M.MOD,
    M.RELU_BWD,
)
EXACT_UNARY = (M.NEG, M.ABS, M.IDENTITY, M.FLOOR, M.CEIL)
SMOOTH_UNARY = (
    M.SQRT,
    M.RSQRT,
    M.EXP,
    M.LOG,
    M.SIN,
    M.COS,
    M.TAN,
    M.ERF,
    M.TANH_FWD,
    M.SIGMOID_FWD,
    M.ELU_FWD,
    M.GELU_FWD,
    M.GELU_APPROX_TANH_FWD,
    M.SOFTPLUS_FWD,
    M.SWISH_FWD,
    M.RECIPROCAL,
    M.RELU_FWD,
)


@dataclass
class Case:
    """One fuzz case: the graph (graph JSON, parsed) and how to feed it."""

    seed: int
    graph: dict[str, Any]
    profiles: dict[str, str] = field(default_factory=dict)  # input UID (as text) -> value profile
    scalars: dict[str, float] = field(default_factory=dict)  # pass-by-value UID (as text) -> value
    by_reference: bool = False
    families: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "families": self.families,
            "by_reference": self.by_reference,
            "profiles": self.profiles,
            "scalars": self.scalars,
            "graph": self.graph,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Case:
        return Case(
            int(d["seed"]),
            d["graph"],
            dict(d.get("profiles", {})),
            dict(d.get("scalars", {})),
            bool(d.get("by_reference", False)),
            list(d.get("families", [])),
        )


@dataclass(eq=False)
class V:
    """A value of the graph under construction."""

    t: Any  # an opgraph Tensor handle
    dim: tuple[int, ...]
    dt: og.DataType
    exact: bool = True
    used: bool = False
    is_input: bool = False
    fixed: bool = False  # its type is the op's to choose (a pooling index, an integer GEMM's output)


def _bf16(x: float) -> float:
    """x rounded to bfloat16: a literal every engine holds exactly (fp32, fp16 and fp64 alike)."""
    return float(np.float32(x).astype(ml_dtypes.bfloat16))


class Gen:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.double = self.chance(0.15)
        io = DT.DOUBLE if self.double else self.pick((DT.FLOAT, DT.FLOAT, DT.HALF, DT.BFLOAT16))
        inter = DT.DOUBLE if self.double else self.pick((DT.FLOAT, DT.FLOAT, DT.FLOAT, DT.HALF, DT.BFLOAT16))
        self.g = og.Graph(
            f"fuzz{seed}",
            io_data_type=io,
            intermediate_data_type=inter,
            compute_data_type=DT.DOUBLE if self.double else DT.FLOAT,
        )
        self.profiles: dict[Any, str] = {}  # tensor handle -> value profile
        self.scalars: dict[Any, float] = {}  # pass-by-value tensor handle -> value
        self.n = 0
        self.results: list[V] = []
        # the "extreme" profile too (huge values, signed zeros, infinities: the accumulating families)
        self.extreme = False

    # -- randomness ----------------------------------------------------------------------------------
    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def fdt(self) -> og.DataType:
        """A floating type for a new tensor (DOUBLE graphs stay double)."""
        return DT.DOUBLE if self.double else self.pick((DT.FLOAT, DT.FLOAT, DT.HALF, DT.BFLOAT16))

    def space(self, rank: int | None = None, max_numel: int = 96, lo: int = 1) -> tuple[int, ...]:
        rank = int(self.rng.integers(1, 5)) if rank is None else rank
        while True:
            dim = tuple(int(self.rng.integers(lo, 6)) for _ in range(rank))
            if math.prod(dim) <= max_numel:
                return dim

    def strides(self, dim: tuple[int, ...], *, allow_zero: bool = True) -> tuple[int, ...]:
        """Packed row-major, another axis order, gapped, or broadcast (stride 0 on some axes)."""
        rank = len(dim)
        order = list(range(rank))
        kinds = ("packed", "packed", "order", "gapped") + (("zero",) if allow_zero else ())
        kind = self.pick(kinds)
        if kind != "packed":
            self.rng.shuffle(order)
        zero = {a for a in range(rank) if dim[a] > 1 and self.chance(0.6)} if kind == "zero" else set()
        stride = [0] * rank
        step = 1
        for axis in reversed(order):
            if axis in zero:
                continue
            stride[axis] = step
            step *= dim[axis]
            if kind == "gapped" and self.chance(0.5):
                step += int(self.rng.integers(1, 4))
        return tuple(stride)

    # -- tensors --------------------------------------------------------------------------------------
    def input(self, dim: tuple[int, ...], dt: og.DataType, *, profile: str | None = None, allow_zero: bool = True) -> V:
        name = self.name("in")
        t = self.g.tensor(
            dim=list(dim),
            stride=list(self.strides(dim, allow_zero=allow_zero)),
            data_type=dt,
            name=name,
            is_by_reference=self.chance(0.1),
        )
        if profile is None:
            profile = (
                self.pick(("normal", "normal", "wide"))
                if dt.is_integer
                else self.pick(
                    ("normal",) * 16
                    + ("tiny", "tiny", "large", "large", "nonfinite")
                    + (("extreme",) if self.extreme else ())
                )
            )
        self.profiles[t] = profile
        return V(t, tuple(dim), dt, True, False, True)

    def scalar(self, dt: og.DataType, lo: float, hi: float, *, positive: bool = False) -> Any:
        """A scalar operand: a literal (bf16-exact), a pass-by-value tensor (any float64 value: the
        plan rounds it to its type) or a 1-element tensor in memory."""
        value = float(self.rng.uniform(lo, hi))
        how = self.pick(("literal", "literal", "by_value", "device"))
        if how == "literal":
            v = _bf16(value)
            return abs(v) if positive else v
        name = self.name("s")
        if how == "by_value":
            t = self.g.tensor(dim=[1], stride=[1], data_type=dt, name=name, is_pass_by_value=True)
            self.scalars[t] = value
            return t
        t = self.g.tensor(dim=[1], stride=[1], data_type=dt, name=name)
        self.profiles[t] = f"const:{value!r}"
        return t

    def result(self, t: Any, dim: tuple[int, ...], dt: og.DataType, exact: bool) -> V:
        v = V(t, tuple(dim), dt, exact)
        self.results.append(v)
        return v

    def use(self, *vs: V | None) -> None:
        for v in vs:
            if v is not None:
                v.used = True

    def typed(self, v: V, dt: og.DataType) -> V:
        v.t.set_data_type(dt)
        v.dt = dt
        return v

    def result_type(self, exact: bool) -> og.DataType:
        """A type for an op result: any type for exact values, a floating one otherwise."""
        if self.double:
            return DT.DOUBLE if not exact or self.chance(0.7) else self.pick(WIDE_INTS)
        if exact and self.chance(0.3):
            return self.pick((*WIDE_INTS, DT.INT8, DT.BOOLEAN, *FP8))
        return self.pick((DT.FLOAT, DT.FLOAT, DT.HALF, DT.BFLOAT16, DT.DOUBLE))

    def cdt(self) -> og.DataType | None:
        return None if self.double else self.pick((None, None, None, DT.FLOAT, DT.DOUBLE))

    def scalar_type(self) -> og.DataType:
        return DT.DOUBLE if self.double else self.pick((DT.FLOAT, DT.FLOAT, DT.DOUBLE, DT.HALF))

    def finish(self) -> None:
        """Every value nothing reads becomes a graph output, with an explicit type (any type for an
        exact value, a floating one otherwise) and maybe strides of its own."""
        for v in self.results:
            if v.used:
                continue
            v.t.set_output(True).set_name(self.name("out"))
            if not v.fixed:
                keep = v.dt if (v.exact or (v.dt.is_floating and v.dt not in FP8)) else self.fdt()
                self.typed(v, self.result_type(v.exact) if self.chance(0.4) else keep)
            if self.chance(0.3):
                v.t.set_stride(list(self.strides(v.dim, allow_zero=False)))

    # -- pointwise --------------------------------------------------------------------------------------
    def operand(
        self, pool: list[V], space: tuple[int, ...], dt: og.DataType, *, exact: bool = False, full: bool = False
    ) -> V:
        """An existing value of the pool that broadcasts to `space` (has dims `space` if `full`), or a
        new input."""
        fits = [
            v
            for v in pool
            if len(v.dim) == len(space)
            and all(a in (1, b) for a, b in zip(v.dim, space))
            and (v.exact or not exact)
            and (not full or v.dim == space)
        ]
        if fits and self.chance(0.6):
            return self.pick(fits)
        dim = space if full or self.chance(0.7) else tuple(1 if self.chance(0.5) else d for d in space)
        if exact and self.chance(0.25):
            dt = self.pick((DT.INT32, DT.INT64, DT.BOOLEAN, DT.INT8, *FP8))
        elif self.chance(0.15):
            dt = self.pick(ALL_TYPES)
        v = self.input(dim, dt)
        pool.append(v)
        return v

    def params(self, mode: PointwiseMode) -> dict[str, Any]:
        t = self.scalar_type()
        s = self.scalar
        if mode in (M.RELU_FWD, M.RELU_BWD):
            out = {}
            if self.chance(0.5):
                out["negative_slope"] = s(t, 0.0, 0.5)
            if self.chance(0.3):
                out["lower_clip"] = s(t, -1.0, 0.0)
            if self.chance(0.3):
                out["upper_clip"] = s(t, 0.5, 2.0)
            return out
        key = {
            M.ELU_FWD: "alpha",
            M.ELU_BWD: "alpha",
            M.SOFTPLUS_FWD: "beta",
            M.SOFTPLUS_BWD: "beta",
            M.SWISH_FWD: "swish_beta",
            M.SWISH_BWD: "swish_beta",
        }.get(mode)
        return {key: s(t, 0.5, 2.0)} if key and self.chance(0.5) else {}

    def pointwise_op(self, pool: list[V], space: tuple[int, ...], dt: og.DataType) -> V:
        r = self.rng.random()
        g = self.g
        if r < 0.3:
            mode = self.pick(EXACT_BINARY)
            a = self.operand(pool, space, dt, full=True)
            if self.chance(0.7):
                b = self.operand(pool, space, dt)
                self.use(a, b)
                out = g.pointwise(a.t, b.t, mode=mode, compute_data_type=self.cdt())
                return self.result(out, space, a.dt, a.exact and b.exact)
            self.use(a)
            out = g.pointwise(a.t, self.scalar(self.scalar_type(), -2, 2), mode=mode, compute_data_type=self.cdt())
            return self.result(out, space, a.dt, a.exact)
        if r < 0.5:
            mode = self.pick(SMOOTH_UNARY)
            a = self.operand(pool, space, dt, full=True)
            self.use(a)
            return self.result(
                g.pointwise(a.t, mode=mode, compute_data_type=self.cdt(), **self.params(mode)), space, a.dt, False
            )
        if r < 0.65:
            mode = self.pick(SMOOTH_BINARY)
            a = self.operand(pool, space, dt, full=True)
            b = self.operand(pool, space, dt, exact=mode is M.POW)  # the exponent decides the sign
            self.use(a, b)
            return self.result(
                g.pointwise(a.t, b.t, mode=mode, compute_data_type=self.cdt(), **self.params(mode)), space, a.dt, False
            )
        if r < 0.85:
            mode = self.pick(JUMPY_BINARY + (M.LOGICAL_NOT, M.BINARY_SELECT, M.GEN_INDEX))
            a = self.operand(pool, space, dt, exact=True, full=True)
            self.use(a)
            if mode is M.LOGICAL_NOT:
                return self.result(g.logical_not(a.t), space, DT.BOOLEAN, True)
            if mode is M.GEN_INDEX:
                return self.result(g.gen_index(a.t, axis=int(self.rng.integers(len(space)))), space, DT.INT32, True)
            if mode is M.BINARY_SELECT:
                x, y = self.operand(pool, space, dt), self.operand(pool, space, dt)
                self.use(x, y)
                return self.result(g.binary_select(x.t, y.t, a.t), space, x.dt, x.exact and y.exact)
            b = self.operand(pool, space, dt, exact=True)
            self.use(b)
            out = g.pointwise(
                b.t if mode is M.RELU_BWD else a.t,
                a.t if mode is M.RELU_BWD else b.t,
                mode=mode,
                compute_data_type=self.cdt(),
                **self.params(mode),
            )
            bool_out = MODES[mode].bool_out
            return self.result(out, space, DT.BOOLEAN if bool_out else a.dt, mode is not M.MOD)
        mode = self.pick(EXACT_UNARY)
        a = self.operand(pool, space, dt, exact=mode in (M.FLOOR, M.CEIL), full=True)
        self.use(a)
        return self.result(g.pointwise(a.t, mode=mode, compute_data_type=self.cdt()), space, a.dt, a.exact)

    def chain(
        self,
        pool: list[V],
        space: tuple[int, ...],
        steps: int,
        dt: og.DataType | None = None,
        *,
        floating: bool = False,
    ) -> V:
        """`steps` random pointwise ops over `pool` (grown with new inputs; the first op reads pool[0]
        when it is given); returns the last value (of a floating type if `floating`)."""
        dt = dt or self.fdt()
        last = None
        for i in range(steps):
            last = self.pointwise_op(pool[:1] if i == 0 and pool else pool, space, dt)
            if i == 0 and pool and not pool[0].used:
                self.use(pool[0])
                last = self.result(self.g.add(pool[0].t, last.t), space, last.dt, last.exact and pool[0].exact)
            if self.chance(0.35):  # a declared type for the intermediate
                self.typed(last, self.result_type(last.exact))
            elif last.dt is not DT.BOOLEAN and last.dt is not DT.INT32:
                last.dt = self.g.intermediate_data_type
            pool.append(last)
        assert last is not None
        return self.floating(last) if floating else last

    def floating(self, v: V) -> V:
        """v, or a cast of it to a floating type (for ops that take floats only)."""
        if v.dt.is_floating and v.dt not in FP8:
            return v
        self.use(v)
        dt = self.fdt()
        return self.result(self.g.identity(v.t).set_data_type(dt), v.dim, dt, v.exact)

    def source(self, prev: V | None, rank: int | None, dt: og.DataType, lo: int = 1) -> V:
        """The previous family's value when it has the rank asked for, else a new input; maybe with a
        pointwise prologue."""
        if prev is not None and (rank is None or len(prev.dim) == rank) and min(prev.dim) >= lo:
            v = prev
        else:
            v = self.input(self.space(rank, lo=lo), dt)
        if self.chance(0.4):
            v = self.chain([v], v.dim, int(self.rng.integers(1, 3)), dt, floating=dt.is_floating)
        return v

    def epilogue(self, v: V) -> V:
        if self.chance(0.5):
            return self.chain([v], v.dim, int(self.rng.integers(1, 3)), v.dt if v.dt.is_floating else None)
        return v
