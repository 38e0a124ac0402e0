"""The forward's rng_dump output: the Philox dropout's keep mask (1.0 kept, 0.0 dropped) of every
(b, h, i, j) of the padded scores [B, Hq, Sq, Skv], masks or not, from the same counters the attention
kernel draws (common.dropout_lines): a launch of its own, one program a block of query rows of one
(batch, head) stepping over the keys."""

from __future__ import annotations

from .common import KernelText, base_expr, dropout_lines, dropout_scale_params, dropout_setup, rows_orient
from .spec import AttnSpec, PhiloxDropout

__all__ = ["rng_dump_kernel"]

ROWS, COLS = 16, 64  # the tile a program writes a step


def rng_dump_kernel(spec: AttnSpec, name: str) -> tuple[KernelText, tuple[int, int]] | None:
    """The launch writing rng_dump (None where it is not wanted)."""
    dump = spec.rng_dump
    if dump is None or not isinstance(spec.dropout, PhiloxDropout):
        return None
    k = KernelText(name)
    k.param(dump.name)
    dropout_scale_params(spec, k)
    k.add(
        "pid_bh = tl.program_id(1)",
        f"off_b = pid_bh // {spec.Hq}",
        f"off_h = pid_bh % {spec.Hq}",
        f"offs_m = tl.program_id(0) * {ROWS} + tl.arange(0, {ROWS})",
        f"offs_n0 = tl.arange(0, {COLS})",
        *dropout_setup(spec),
        f"d_base = {dump.name} + {base_expr(dump, 'off_b', 'off_h')} + offs_m[:, None].to(tl.int64) * {dump.strides[2]}",
        f"for start_n in range(0, {spec.Skv}, {COLS}):",
    )
    o = rows_orient(None, None)
    k.add(
        "offs_n = start_n + offs_n0",
        *dropout_lines(spec, k, o),
        f"ok = (offs_m[:, None] < {spec.Sq}) & (offs_n[None, :] < {spec.Skv})",
        f"tl.store(d_base + offs_n[None, :].to(tl.int64) * {dump.strides[3]}, "
        f"tl.where(dkeep, 1.0, 0.0).to({dump.dtype}), mask=ok)",
        depth=1,
    )
    return k, (-(-spec.Sq // ROWS), spec.B * spec.Hq)
