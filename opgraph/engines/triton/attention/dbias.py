"""A broadcast dBias of the generated attention backward: the dK/dV kernel writes dS1 as fp32 partials
[B, Hq, Sq, Skv] (backward.py), and the kernels here sum them over the axes where the bias broadcasts, in a
fixed order (deterministic, no atomics): `DbiasReduce` says how."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..templates.base import Arg
from .common import KernelText, pow2
from .spec import AttnSpec

__all__ = ["DbiasReduce", "dbias_reduce"]


@dataclass(frozen=True)
class DbiasReduce:
    """How dBias sums the fp32 partials [B, Hq, Sq, Skv] over the axes where the bias broadcasts: a first
    pass of `split` x ceil(n_out / out_block) programs, each summing a [red_block, out_block] tile at a
    time over its share of the reduced elements (coalesced along whichever of the two holds the partials'
    last axis), then, where split > 1, a second pass summing the `split` partial sums of each output.
    Programs are many for every broadcast: a scalar or a per-head dBias sums its millions of partials in
    about TARGET_PROGRAMS programs, not in one or a few looping element by element."""

    red_axes: tuple[int, ...]
    n_out: int
    n_red: int
    out_block: int
    red_block: int
    split: int

    TARGET_PROGRAMS = 1024  # the first pass's programs (several waves on any GPU), where the sum allows
    TILE = 2048  # elements a program loads at a time (4 warps: 16 a thread)

    @classmethod
    def of(cls, spec: AttnSpec) -> DbiasReduce:
        assert spec.bias_dims is not None
        full, dims = (spec.B, spec.Hq, spec.Sq, spec.Skv), spec.bias_dims
        red_axes = tuple(a for a in range(4) if dims[a] == 1 and full[a] > 1)
        n_out, n_red = math.prod(dims), math.prod(full[a] for a in red_axes)
        if 3 in red_axes:  # the partials' last axis is reduced: a program's loads run along it
            out_block = min(4, pow2(n_out, 1))
            red_block = cls.TILE // out_block
        else:
            out_block = min(256, pow2(n_out, 16))
            red_block = cls.TILE // out_block
        out_programs = -(-n_out // out_block)
        chunks = -(-n_red // red_block)
        split = max(1, min(chunks, cls.TARGET_PROGRAMS // out_programs, 1024))
        return cls(red_axes, n_out, n_red, out_block, red_block, split)

    def scratch_elements(self) -> int:
        """The second pass's fp32 partial sums (none without one)."""
        return self.split * self.n_out if self.split > 1 else 0


def dbias_reduce(spec: AttnSpec, scratch: dict[str, Arg]) -> list[tuple[KernelText, tuple[int, ...]]]:
    """dBias = the fp32 partials summed over the axes where the bias broadcasts (DbiasReduce): the
    kernels with their grids, in launch order."""
    db = spec.dbias
    assert db is not None and spec.bias_dims is not None
    plan = DbiasReduce.of(spec)
    full = (spec.B, spec.Hq, spec.Sq, spec.Skv)
    packed = (spec.Hq * spec.Sq * spec.Skv, spec.Sq * spec.Skv, spec.Skv, 1)
    dims = spec.bias_dims
    ob, rb, split = plan.out_block, plan.red_block, plan.split

    def coords(k: KernelText, index: str) -> dict[int, str]:
        out, inner = {}, 1
        for a in (3, 2, 1, 0):
            if dims[a] > 1:
                k.add(f"c{a} = ({index} // {inner}) % {dims[a]}")
                out[a] = f"c{a}"
            inner *= dims[a]
        return out

    def store(k: KernelText, c: dict[int, str], value: str, mask: str, lanes: int) -> None:
        # (a scalar dBias: offsets still a block, as the mask is; Triton rejects a block mask on a scalar
        # pointer)
        zero = [] if c else [f"tl.zeros([{lanes}], tl.int64)"]
        out = " + ".join([str(db.offset)] + [f"c{a} * {db.strides[a]}" for a in c] + zero)
        k.add(f"tl.store({db.name} + {out}, {value}.to({db.dtype}), mask={mask})")

    first = KernelText("kernel_attn_dbias_partial", scratch)
    first.param("DBP")
    if split == 1:
        first.param(db.name)
    else:
        first.param("DBS")
    first.add(
        f"o = tl.program_id(0).to(tl.int64) * {ob} + tl.arange(0, {ob})",
        f"ok_o = o < {plan.n_out}",
    )
    c = coords(first, "o")
    kept = " + ".join([f"c{a} * {packed[a]}" for a in c] or [f"tl.zeros([{ob}], tl.int64)"])
    chunk = -(-plan.n_red // split)
    first.add(
        f"src = {kept}",
        f"start = tl.program_id(1).to(tl.int64) * {chunk}",
        f"rr = tl.arange(0, {rb})",
        f"acc = tl.zeros([{rb}, {ob}], tl.float32)",
        f"for r0 in range(0, {chunk}, {rb}):",
    )
    first.add("r = start + r0 + rr", f"ok_r = (r0 + rr < {chunk}) & (r < {plan.n_red})", depth=1)
    inner, terms = 1, []
    for a in reversed(plan.red_axes):
        terms.append(f"((r // {inner}) % {full[a]}) * {packed[a]}")
        inner *= full[a]
    first.add(
        f"off = {' + '.join(terms) or 'r * 0'}",
        "acc += tl.load(DBP + off[:, None] + src[None, :], mask=ok_r[:, None] & ok_o[None, :], other=0.0)",
        depth=1,
    )
    first.add("part = tl.sum(acc, axis=0)")
    grid_first = (-(-plan.n_out // ob), split)
    if split == 1:
        store(first, c, "part", "ok_o", ob)
        return [(first, grid_first)]
    first.add(f"tl.store(DBS + tl.program_id(1).to(tl.int64) * {plan.n_out} + o, part, mask=ok_o)")

    second = KernelText("kernel_attn_dbias_reduce", scratch)
    second.param("DBS")
    second.param(db.name)
    second.add("idx = tl.program_id(0).to(tl.int64) * 256 + tl.arange(0, 256)", f"ok = idx < {plan.n_out}")
    c2 = coords(second, "idx")
    second.add("acc = tl.zeros([256], tl.float32)", f"for s in range({split}):")
    second.add(f"acc += tl.load(DBS + s * {plan.n_out} + idx, mask=ok, other=0.0)", depth=1)
    store(second, c2, "acc", "ok", 256)
    return [(first, grid_first), (second, (-(-plan.n_out // 256),))]
