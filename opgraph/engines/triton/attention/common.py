"""Pieces of generated attention code shared by the forward and backward kernels: the kernel text
builder, operand addressing, the score pipeline (scale, bias, ALiBi, score modifier, masks), the
dropout draw and the key/query block ranges that skip fully masked tiles.

A tile is oriented "rows" ([queries, keys]: forward and dQ kernels) or "cols" ([keys, queries]: the
dK/dV kernel); `Orient` holds the coordinate expressions of each orientation, so one emitter serves
both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ....core.symbolic import evaluate
from ..templates.base import Arg, Launch, Params
from .sized import nonzero, symint, upper
from .spec import LOG2E, AttnSpec, Coords, MaskDropout, Operand, PhiloxDropout, Scalar

INT32_MAX = 2**31 - 1


class KernelText:
    """One generated kernel: its parameters (the engine's `Params`, in first-use order: p{uid} buffers,
    s{uid} scalars, and the `scratch` buffers by name) and body lines. With `sizes` (a bucket kernel:
    sized.py), the size parameters its text used come last and its grid is an expression."""

    def __init__(self, name: str, scratch: Mapping[str, Arg] | None = None, sizes: Any = None) -> None:
        self.name = name
        self.params = Params()
        self.scratch = scratch or {}
        self.sizes = sizes
        self.lines: list[str] = []

    def param(self, name: str, dtype: str = "float32") -> str:
        """Parameter `name` (a pass-by-value s{uid} of `dtype`: Params.scalar)."""
        return self.params.named(name, self.scratch, dtype)

    def add(self, *lines: str, depth: int = 0) -> None:
        self.lines += ["    " * depth + line for line in lines]

    def source(self) -> str:
        if self.sizes is not None:
            self.sizes.add_params(self.params)
        return self.params.source(self.name, (), self.lines)

    def launch(self, grid: tuple[Any, ...], warps: int, stages: int) -> Launch:
        """The kernel's launch (after `source`): a bucket kernel's grid evaluated at the plan's shape,
        its expression kept for the others."""
        meta = (("num_warps", warps), ("num_stages", stages))
        if self.sizes is None:
            return Launch(self.name, grid, tuple(self.params.args), meta)
        exprs = tuple(symint(g) for g in grid)
        at = tuple(evaluate(g, self.sizes.env) for g in exprs)
        return Launch(self.name, at, tuple(self.params.args), meta, grid_expr=exprs)


def pow2(n: int, lo: int = 16) -> int:
    p = lo
    while p < n:
        p *= 2
    return p


def wide(*extents: int) -> bool:
    """Whether offsets up to the sum of `extents` need int64 (a bucket kernel's: at the bucket's largest)."""
    return upper(sum(extents)) > INT32_MAX


def extent(op: Operand, dims: tuple[int, ...]) -> int:
    return op.offset + sum((d - 1) * s for d, s in zip(dims, op.strides))


def base_expr(op: Operand, b: str, h: str) -> str:
    """The element offset of (b, h) in `op`, in int64."""
    terms = [str(op.offset)] if nonzero(op.offset) else []
    for coord, stride in ((b, op.strides[0]), (h, op.strides[1])):
        if nonzero(stride):
            terms.append(f"{coord}.to(tl.int64) * {stride}")
    return " + ".join(terms) or "0"


def dot_dtype(spec: AttnSpec) -> str:
    """The operand type of the kernels' tl.dot calls."""
    dt = spec.q.dtype
    if dt == "tl.bfloat16" and spec.interpret:
        return "tl.float32"
    return dt


def dot(spec: AttnSpec, a: str, b: str, acc: str | None = None) -> str:
    extra = (
        f', input_precision="{"ieee" if spec.interpret else spec.fp32_precision}"'
        if dot_dtype(spec) == "tl.float32"
        else ""
    )
    return f"tl.dot({a}, {b}{', ' + acc if acc else ''}{extra})"


def scale_lines(spec: AttnSpec, k: KernelText) -> list[str]:
    """`sm` = the attention scale (fp32), `sm2` = sm * log2(e)."""
    s = spec.scale
    if isinstance(s, Scalar):
        k.param(s.name)
        value = s.name if s.kind == "arg" else f"tl.load({s.name}).to(tl.float32)"
    else:
        value = repr(float(s))
    return [f"sm = {value}", f"sm2 = sm * {LOG2E!r}"]


def seqlen_lines(spec: AttnSpec, k: KernelText) -> list[str]:
    """`q_len`, `kv_len`: the valid lengths of batch entry off_b clamped to [0, S] (loop bounds),
    and `diag`, the causal diagonal's key offset (from the lengths as given)."""
    lines = []
    for name, op, full in (("q_len", spec.seq_len_q, spec.Sq), ("kv_len", spec.seq_len_kv, spec.Skv)):
        if op is None:
            lines += [f"{name}_raw = {full}", f"{name} = {full}"]
        else:
            k.param(op.name)
            off = f"{op.offset} + " if op.offset else ""
            lines += [
                f"{name}_raw = tl.load({op.name} + {off}off_b * {op.strides[0]}).to(tl.int32)",
                f"{name} = tl.minimum(tl.maximum({name}_raw, 0), {full})",
            ]
    lines.append("diag = kv_len_raw - q_len_raw" if spec.diag_from_lengths else "diag = 0")
    return lines


@dataclass(frozen=True)
class Orient:
    """Coordinates of a score tile's elements: `i`/`j` (query/key positions broadcast to the tile),
    the query/key vectors' names, how a per-query vector broadcasts (`row`), and memory-validity
    predicates of i and j in this loop (None where always in bounds)."""

    i: str
    j: str
    row: str  # e.g. "[:, None]": a per-query vector broadcast over the tile
    i_ok: str | None
    j_ok: str | None

    def coords(self) -> Coords:
        mask = " & ".join(m for m in (self.i_ok, self.j_ok) if m) or None
        return Coords("off_b", "off_h", self.i, self.j, mask)

    @property
    def mem_mask(self) -> str | None:
        return self.coords().mask

    def reduce_axis(self) -> int:
        return 1 if self.row == "[:, None]" else 0


def rows_orient(i_ok: str | None, j_ok: str | None) -> Orient:
    return Orient(
        "offs_m[:, None]",
        "offs_n[None, :]",
        "[:, None]",
        f"(offs_m[:, None] < {i_ok})" if i_ok else None,
        f"(offs_n[None, :] < {j_ok})" if j_ok else None,
    )


def cols_orient(i_ok: str | None, j_ok: str | None) -> Orient:
    return Orient(
        "offs_m[None, :]",
        "offs_n[:, None]",
        "[None, :]",
        f"(offs_m[None, :] < {i_ok})" if i_ok else None,
        f"(offs_n[:, None] < {j_ok})" if j_ok else None,
    )


def mask_expr(spec: AttnSpec, o: Orient) -> str | None:
    """The tile predicate of the built-in masks (padding, the band's right bound: causal, and its left
    bound: the sliding window) and of the tile's memory bounds (keys or queries past the tensors'
    ends, where the loop reaches them)."""
    terms = [t for t in (o.i_ok, o.j_ok) if t]
    if spec.seq_len_kv is not None:
        terms.append(f"({o.j} < kv_len)")
    if spec.seq_len_q is not None:
        terms.append(f"({o.i} < q_len)")
    r = spec.right_bound
    if r is not None:
        terms.append(f"({o.j} <= {o.i} + diag{f' + {r}' if r else ''})")
    if spec.window is not None:
        terms.append(f"({o.i} + diag - {o.j} < {spec.window})")
    bm = spec.block_mask
    if bm is not None:  # the bit of the 128 x 128 tile of (i, j)
        axes = ((f"({o.i} // 128)", bm.strides[2], o.i_ok), (f"({o.j} // 1024)", bm.strides[3], o.j_ok))
        byte = tile_load(f"{bm.name} + bmask_base", axes, "0")
        terms.append(f"((({byte}.to(tl.int32) >> (({o.j} // 128) % 8)) & 1) != 0)")
    return " & ".join(terms) or None


def alibi_expr(spec: AttnSpec, o: Orient) -> str:
    """ALiBi: slope_h * (j - i)."""
    return f"alibi_slope * ({o.j} - {o.i}).to(tl.float32)"


def alibi_lines(spec: AttnSpec) -> list[str]:
    """`alibi_slope` of head off_h: 2^(-8 (h+1) / n) for the first n = the largest power of two <= Hq
    heads, 2^(-4 (2 (h-n) + 1) / n) for the others (docs/attention.md)."""
    if not spec.alibi:
        return []
    n = 1 << (spec.Hq.bit_length() - 1)
    hf = "off_h.to(tl.float32)"
    first = f"tl.math.exp2(-8.0 * ({hf} + 1.0) / {float(n)!r})"
    if n == spec.Hq:
        return [f"alibi_slope = {first}"]
    rest = f"tl.math.exp2(-4.0 * (2.0 * ({hf} - {float(n)!r}) + 1.0) / {float(n)!r})"
    return [f"alibi_slope = tl.where(off_h < {n}, {first}, {rest})"]


def tile_load(base: str, axes: tuple[tuple[str, Any, str | None], ...], other: str) -> str:
    """A load at `base` plus, for each (coordinate, stride, memory predicate) of `axes` whose stride
    steps, coordinate * stride, masked by those axes' predicates only: an operand that broadcasts over
    an axis of the tile loads a row, a column or a scalar (the add that takes it broadcasts it), so
    neither is its pointer a tile nor its mask one where the pointer is not (Triton rejects a block
    mask on a scalar pointer)."""
    terms, oks = [base], []
    for coord, stride, ok in axes:
        if nonzero(stride):
            terms.append(coord if isinstance(stride, int) and stride == 1 else f"{coord} * {stride}")
            if ok:
                oks.append(ok)
    m = f", mask={' & '.join(oks)}, other={other}" if oks else ""
    return f"tl.load({' + '.join(terms)}{m})"


def bias_load(spec: AttnSpec, o: Orient) -> str:
    """The bias at the tile's elements (fp32): a tile, a row, a column or a scalar, as it broadcasts."""
    b = spec.bias
    assert b is not None
    axes = ((o.i, b.strides[2], o.i_ok), (o.j, b.strides[3], o.j_ok))
    return f"{tile_load(f'{b.name} + bias_base', axes, '0.0')}.to(tl.float32)"


def exp2_factor(spec: AttnSpec) -> str | None:
    """The positive constant factor left out of `s2` (score_lines' `raw`) and applied inside exp2's
    argument instead, `exp2(s2 * f - m)`: one fused multiply-add a score where a multiply and a
    subtraction were (on Hopper the softmax's per-score ALU work, not the tensor cores, bounds these
    kernels), the forward's row maximum taken on the unscaled score. `sm2` for the plain product with a
    positive constant scale; log2(e) after a score modifier (its value in natural units); None where
    nothing is saved (a bias or ALiBi without a modifier: the scale's multiply fuses into their add) or
    the scale may be negative or is read at run time (the maximum of the unscaled score would be wrong)."""
    if spec.score_mod is not None:
        return repr(LOG2E)
    if spec.bias is None and not spec.alibi and not isinstance(spec.scale, Scalar) and float(spec.scale) > 0:
        return "sm2"
    return None


def times(factor: str | None) -> str:
    """` * factor`, or nothing: `exp2_factor`'s factor where an expression takes it."""
    return f" * {factor}" if factor else ""


def score_lines(spec: AttnSpec, k: KernelText, o: Orient, masked: bool | str, raw: bool = False) -> list[str]:
    """From the raw product `qk` (fp32) to `s2`, the final score in log2 units (masked entries -inf).
    With a score modifier, `s_pre` (natural units) is the score it took (for its backward). `masked`:
    whether to apply the masks, or a run-time condition of applying them (one loop over every block).
    `raw` (where `exp2_factor` gives one): `s2` is the score without that factor (masked entries -inf)."""
    assert not raw or exp2_factor(spec) is not None
    lines = []
    extra = []
    if spec.bias is not None:
        k.param(spec.bias.name)
        extra.append(bias_load(spec, o))
    if spec.alibi:
        extra.append(alibi_expr(spec, o))
    if spec.score_mod is None and raw:
        lines.append("s2 = qk")
    elif spec.score_mod is None:
        value = "qk * sm2"
        if extra:
            value += " + (" + " + ".join(extra) + f") * {LOG2E!r}"
        lines.append(f"s2 = {value}")
    else:
        for p in spec.score_mod.params():
            k.param(p)
        lines.append("s_pre = " + " + ".join(["qk * sm", *extra]))
        mod_lines, value = spec.score_mod.forward("s_pre", o.coords())
        lines += mod_lines
        lines.append(f"s2 = {value}" if raw else f"s2 = ({value}) * {LOG2E!r}")
    if masked:
        m = mask_expr(spec, o)
        if m is not None:
            apply = f's2 = tl.where({m}, s2, float("-inf"))'
            lines += [f"if {masked}:", "    " + apply] if isinstance(masked, str) else [apply]
    return lines


def score_mod_grad(spec: AttnSpec, o: Orient, grad: str) -> list[str]:
    """`grad` (the gradient of the modified score) replaced by that of the unmodified score."""
    if spec.score_mod is None:
        return []
    lines, value = spec.score_mod.backward("s_pre", grad, o.coords())
    return [*lines, f"{grad} = {value}"]


def dropout_lines(spec: AttnSpec, k: KernelText, o: Orient) -> list[str]:
    """`dkeep`: the dropout multiplier of each tile element before the 1/(1-p) scale (a bool tile for
    Philox dropout, the mask's value for an explicit mask)."""
    d = spec.dropout
    if isinstance(d, PhiloxDropout):
        # element (b, h, i, j) draws tl.rand(seed, offset + ((b*Hq + h)*Sq + i)*Skv + j) (int64)
        p32 = float(np.float32(d.p))
        return [
            f"dlin = drop_base + ({o.i}).to(tl.int64) * {spec.Skv} + ({o.j}).to(tl.int64)",
            f"dkeep = _og_attn_uniform(drop_seed, dlin) >= {p32!r}",
        ]
    if isinstance(d, MaskDropout):
        m = d.mask
        k.param(m.name)
        axes = ((o.i, m.strides[2], o.i_ok), (o.j, m.strides[3], o.j_ok))
        return [f"dkeep = {tile_load(f'{m.name} + dmask_base', axes, '0')}.to(tl.float32)"]
    return []


def _int_scalar(v: Scalar | int) -> str:
    """An int64 scalar: a device tensor's element, a pass-by-value int64 argument or a number."""
    if isinstance(v, Scalar):
        return v.name if v.kind == "arg" else f"tl.load({v.name}).to(tl.int64)"
    return f"tl.full([], {int(v)}, tl.int64)"


def dropout_setup(spec: AttnSpec) -> list[str]:
    """Per-(b, h) values the dropout draw needs (`drop_seed`, `drop_base`; `dmask_base`) and
    `drop_scale`, the multiplier of kept elements."""
    d = spec.dropout
    if isinstance(d, PhiloxDropout):
        base = f"{_int_scalar(d.offset)} + (off_b.to(tl.int64) * {spec.Hq} + off_h) * {spec.Sq * spec.Skv}"
        return [f"drop_seed = {_int_scalar(d.seed)}", f"drop_base = {base}", f"drop_scale = {1.0 / (1.0 - d.p)!r}"]
    if isinstance(d, MaskDropout):
        s = d.scale
        if isinstance(s, Scalar):
            value = s.name if s.kind == "arg" else f"tl.load({s.name}).to(tl.float32)"
        else:
            value = repr(float(s))
        return [f"dmask_base = {base_expr(d.mask, 'off_b', 'off_h')}", f"drop_scale = {value}"]
    return []


def dropout_scale_params(spec: AttnSpec, k: KernelText) -> None:
    """Declare the dropout's scalar parameters (seed, offset, mask scale)."""
    d = spec.dropout
    if isinstance(d, MaskDropout) and isinstance(d.scale, Scalar):
        k.param(d.scale.name)
    if isinstance(d, PhiloxDropout):
        for v in (d.seed, d.offset):
            if isinstance(v, Scalar):
                k.param(v.name, "int64" if v.kind == "arg" else "float32")


def apply_keep(spec: AttnSpec, value: str) -> str:
    """`value` (a probability-shaped tile) with the dropout mask applied (without the 1/(1-p) scale)."""
    if isinstance(spec.dropout, PhiloxDropout):
        return f"tl.where(dkeep, {value}, 0.0)"
    if isinstance(spec.dropout, MaskDropout):
        return f"({value} * dkeep)"
    return value


UNIFORM_HELPER = '''
def _og_attn_uniform(seed, counter):
    """Triton's tl.rand(seed, counter) for an int64 counter, spelled out so that it does not depend on
    the Triton version's handling of 64-bit offsets: Philox-4x32-10, key = the int64 seed's low/high
    words, counter = (low word, high word, 0, 0); the first output word as int32, ~x where negative,
    times 4.6566127342e-10 in fp32."""
    lo = (counter & 0xFFFFFFFF).to(tl.uint32)
    hi = ((counter >> 32) & 0xFFFFFFFF).to(tl.uint32)
    zero = lo * 0
    r0, r1, r2, r3 = tl.philox(seed, lo, hi, zero, zero)
    x = r0.to(tl.int32, bitcast=True)
    x = tl.where(x < 0, ~x, x)
    return x.to(tl.float32) * 4.6566127342e-10
'''


def operand_tile(
    op: Operand, base: str, rows: str, cols: str, row_stride: int, mask: str | None, other: str = "0.0"
) -> str:
    """A 2-D load of `op` at base + rows * row_stride + cols (a unit-stride last axis)."""
    m = f", mask={mask}, other={other}" if mask else ""
    return f"tl.load({op.name} + {base} + {rows} * {row_stride} + {cols}{m})"


ITEMSIZE = {"tl.float32": 4, "tl.float16": 2, "tl.bfloat16": 2}


def tma_ok(op: Operand, dims: tuple[int, int, int, int]) -> bool:
    """Whether a 4-D tensor descriptor can read `op`: unit last stride, 16-byte aligned offset and
    strides (of the axes longer than 1), a 16-byte row."""
    size = ITEMSIZE.get(op.dtype)
    if size is None or op.strides[3] != 1 or (op.offset * size) % 16 or (dims[3] * size) % 16:
        return False
    return all((s * size) % 16 == 0 for d, s in zip(dims[:3], op.strides[:3]) if d > 1)


def descriptors_ok(spec: AttnSpec) -> bool:
    """Whether the forward can read q, k and v through tensor descriptors (TMA=1): static sizes (a
    descriptor's shape is the tensor's), no prologue, packed or paged operand, and each `tma_ok`."""
    return (
        spec.sizes is None
        and not spec.prologue
        and not spec.ragged
        and not spec.paged
        and all(
            tma_ok(op, (spec.B, h, s, d))
            for op, h, s, d in (
                (spec.q, spec.Hq, spec.Sq, spec.D),
                (spec.k, spec.Hk, spec.Skv, spec.D),
                (spec.v, spec.Hv, spec.Skv, spec.Dv),
            )
        )
    )


def tma_desc(op: Operand, var: str, dims: tuple[int, int, int, int], rows: int, cols: int) -> str:
    """A line making descriptor `var` over `op` ([B, H, S, D] dims) with [1, 1, rows, cols] blocks
    (cols may exceed D: TMA fills columns and rows past the ends with zeros)."""
    size = ITEMSIZE[op.dtype]
    strides: list[int] = []
    inner = dims[3]
    for a in (2, 1, 0):  # axes of length 1: any 16-byte multiple (never stepped)
        s = op.strides[a] if dims[a] > 1 else max(inner, 16 // size)
        strides.insert(0, s)
        inner = s * dims[a]
    base = f"{op.name} + {op.offset}" if op.offset else op.name
    return (
        f"{var} = tl.make_tensor_descriptor({base}, shape={list(dims)}, strides={[*strides, 1]}, "
        f"block_shape=[1, 1, {rows}, {cols}])"
    )


def tma_load(var: str, b: str, h: str, row: str, rows: int, cols: int) -> str:
    return f"{var}.load([{b}, {h}, {row}, 0]).reshape({rows}, {cols})"


def and_mask(*terms: str | None) -> str | None:
    t = [x for x in terms if x]
    return " & ".join(t) if t else None
