"""Split-KV (flash-decoding) forward: where a problem has too few query blocks to fill the GPU (a decode
step: Sq of 1 to a few tokens against a long cache), SPLIT programs share each query block's keys, one
chunk of ceil(Skv / SPLIT) keys (a multiple of BLOCK_N) each, and write fp32 partials to scratch: the row
maximum m (log2 units), the row sum l and the unnormalised O (times the dropout's 1/(1-p)). A second
launch merges a row's partials as the online softmax merges key blocks (M = max m_s, L = sum l_s 2^(m_s -
M), O = sum O_s 2^(m_s - M)), starting from the sink where there is one, and finishes as the one-launch
forward does (epilogue.py). Every mask, packed or paged layout and score modifier works unchanged: the
split only narrows each program's key range.

In a dynamic plan's bucket kernel (sized.py) the split count stays a knob (the bucket offers the splits
of its largest KV length, the build's policy picks one at each shape: build/split_kv.at_shape) and the
rest takes the run-time sizes: the chunk length is a size argument (ceil(Skv / SPLIT) rounded up to
BLOCK_N, computed per shape), the partials are laid out for the bucket's largest B * Hq * Sq (the
same scratch at every shape: Generated.bucket_scratch) and indexed by the run-time sizes, and the
combining launch's grid and row masks follow the run-time Sq. A chunk past the keys (Skv below
SPLIT * BLOCK_N) runs no key block: its partial row (m = -inf, l = 0, O = 0) merges as the neutral
element."""

from __future__ import annotations

from ....memory.workspace import align_up
from ..templates.base import Arg, ArgKind
from .common import KernelText, pow2, seqlen_lines
from .epilogue import finish, sink_lines
from .ragged import ragged_lines
from .sized import divides, upper
from .spec import AttnSpec

__all__ = ["combine", "partial_stores", "partials", "split_range"]

COMBINE_ROWS = 16  # query rows a combining program merges


def partials(spec: AttnSpec, split: int) -> tuple[dict[str, Arg], int]:
    """The scratch of the partials (fp32 each): PM, PL [SPLIT, B * Hq, Sq], PO [SPLIT, B * Hq, Sq, Dv
    padded to a power of two], and their bytes (a bucket kernel's at the bucket's largest shape)."""
    rows = split * spec.B * spec.Hq * spec.Sq
    sizes = {"PM": rows, "PL": rows, "PO": rows * pow2(spec.Dv)}
    out, offset = {}, 0
    for name, numel in sizes.items():
        out[name] = Arg(ArgKind.SCRATCH, offset=offset, dtype="float32")
        offset += align_up(upper(numel) * 4)
    return out, offset


def split_range(spec: AttnSpec, bn: int, split: int) -> list[str]:
    """The key range [lo, hi) (and r1, r2 inside it, fwd_ranges') cut to this program's chunk (a
    bucket kernel's chunk length a size argument)."""
    per = (spec.Skv + split - 1) // split
    chunk = (per + bn - 1) // bn * bn
    return [
        f"s_lo = pid_s * {chunk}",
        "lo = tl.maximum(lo, s_lo)",
        f"hi = tl.minimum(hi, s_lo + {chunk})",
        "hi = tl.maximum(hi, lo)",
        "r1 = tl.minimum(tl.maximum(r1, lo), hi)",
        "r2 = tl.minimum(tl.maximum(r2, r1), hi)",
    ]


def _part_base(spec: AttnSpec, s: str, bh: str) -> str:
    return f"(({s}).to(tl.int64) * {spec.B * spec.Hq} + {bh}) * {spec.Sq}"


def partial_stores(spec: AttnSpec, partial_rows: bool, head: str | None = None) -> list[str]:
    """The split program's m_i, l_i and acc (rows offs_m < Sq; `partial_rows`: some of the tile's rows are
    past Sq) into the partials. `head`: the vector of a row's query head where a tile packs several
    (gqa_pack.py; None: the program's head, pid_bh)."""
    dvp = pow2(spec.Dv)
    ok = f", mask=offs_m < {spec.Sq}" if partial_rows else ""
    ok2 = f", mask=(offs_m < {spec.Sq})[:, None]" if partial_rows else ""
    acc = "acc * drop_scale" if spec.dropout is not None else "acc"
    if head is not None:
        return [
            f"p_row = {_part_base(spec, 'pid_s', f'off_b * {spec.Hq} + {head}')} + offs_m",
            f"tl.store(PM + p_row, m_i{ok})",
            f"tl.store(PL + p_row, l_i{ok})",
            f"tl.store(PO + p_row[:, None] * {dvp} + offs_dv[None, :], {acc}{ok2})",
        ]
    return [
        f"p_base = {_part_base(spec, 'pid_s', 'pid_bh')}",
        f"tl.store(PM + p_base + offs_m, m_i{ok})",
        f"tl.store(PL + p_base + offs_m, l_i{ok})",
        f"tl.store(PO + (p_base + offs_m[:, None]) * {dvp} + offs_dv[None, :], {acc}{ok2})",
    ]


def combine(spec: AttnSpec, name: str, scratch: dict[str, Arg], split: int) -> tuple[KernelText, tuple[int, int]]:
    """The launch merging the partials of COMBINE_ROWS query rows of one (batch, head) a program."""
    k = KernelText(name, scratch, spec.sizes)
    cm, dvp = COMBINE_ROWS, pow2(spec.Dv)
    for p in ("PM", "PL", "PO"):
        k.param(p)
    for op in (spec.o, spec.stats, spec.score_max, spec.score_sum_exp):
        if op is not None:
            k.param(op.name)
    k.add(
        "pid_m = tl.program_id(0)",
        "pid_bh = tl.program_id(1)",
        f"off_b = pid_bh // {spec.Hq}",
        f"off_h = pid_bh % {spec.Hq}",
        f"offs_m = pid_m * {cm} + tl.arange(0, {cm})",
        f"offs_dv = tl.arange(0, {dvp})",
    )
    k.add(*seqlen_lines(spec, k))
    k.add(*ragged_lines(spec, k, ("o", "stats", "score_max", "score_sum_exp")))
    k.add(
        f'm_i = tl.full([{cm}], float("-inf"), tl.float32)',
        f"l_i = tl.zeros([{cm}], tl.float32)",
        f"acc = tl.zeros([{cm}, {dvp}], tl.float32)",
    )
    k.add(*sink_lines(spec, k, cm))
    row = f"offs_m < {spec.Sq}"
    k.add(
        f"for s in range({split}):",
        f"    p_base = {_part_base(spec, 's + pid_bh * 0', 'pid_bh')}",  # (s a tensor under the interpreter too)
        f'    m_s = tl.load(PM + p_base + offs_m, mask={row}, other=float("-inf"))',
        f"    l_s = tl.load(PL + p_base + offs_m, mask={row}, other=0.0)",
        f"    o_s = tl.load(PO + (p_base + offs_m[:, None]) * {dvp} + offs_dv[None, :], mask=({row})[:, None], other=0.0)",
        "    m_new = tl.maximum(m_i, m_s)",
        '    m_z = tl.where(m_new == float("-inf"), 0.0, m_new)',
        "    alpha = tl.math.exp2(m_i - m_z)",
        "    beta = tl.math.exp2(m_s - m_z)",
        "    l_i = l_i * alpha + l_s * beta",
        "    acc = acc * alpha[:, None] + o_s * beta[:, None]",
        "    m_i = m_new",
    )
    row_ok = f"(offs_m[:, None] < {spec.Sq})" if not divides(cm, spec.Sq) else None
    dvmask = f"(offs_dv[None, :] < {spec.Dv})" if dvp != spec.Dv else None
    finish(spec, k, row_ok, dvmask, dropped=True)
    return k, ((spec.Sq + cm - 1) // cm, spec.B * spec.Hq)
