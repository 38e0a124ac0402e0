"""The tile list (knob TILES=1 of the forward and of the backward): packed (ragged) sequences walked as
a list of their own blocks instead of a grid over the longest sequence's blocks.

A plain grid has max_seq_len / BLOCK blocks for every sequence and head; a program past its sequence's
length returns at once (ragged.exit_past_length), but still takes a launch slot with the kernel's whole
shared-memory reservation (32 sequences of 128-4,096 tokens, 32k in all: 1,024 query blocks a head, of
which 256 hold rows). With the list, program (tile, head) decodes its tile from the lengths: level L is
every sequence's block L. The forward and dQ take the levels from the highest down (under a causal band
the query blocks with the most keys first; without one, the longest sequences' first); dK/dV from level 0
up under a causal band (the key blocks the most queries see), else from the highest down.

A sequence's rows are those of the packed output it writes (O; dK for the key side, dQ for the query
side), clipped to that output's T rows; the grid has ceil(T / BLOCK) + B programs a head, which is every
tile where the sequences do not overlap in the output (as ragged.py takes them: overlapping ones have no
defined result either way) and start at or after its first row. One tile a program: a loop over several
(for any layout) cost the forward's 128x128 tiles (8 warps, D 128) 11 registers and 12 bytes of spills
on sm_90.

Offered where the early exit applies (every output the kernel writes packed, ragged.py), for a kernel of
one shape (not a dynamic bucket's), not with split-KV, GQA packing or the fused backward."""

from __future__ import annotations

from ....core.errors import AttributeValueError
from .common import KernelText, pow2
from .spec import AttnSpec

_OUTPUTS = ("o", "stats", "score_max", "score_sum_exp")


def tiles_ok(spec: AttnSpec, outputs: tuple[str, ...] = _OUTPUTS, lengths: tuple[str, ...] = ("q",)) -> str | None:
    """Why the tile list does not apply to a kernel of `spec` writing `outputs` with blocks along the
    sides `lengths` ("q", "kv") (None: it does)."""
    written = [r for r in outputs if getattr(spec, r, None) is not None]
    if spec.sizes is not None:
        return "a dynamic bucket's kernel (its batch and lengths are run-time sizes)"
    for side in lengths:
        if getattr(spec, f"seq_len_{side}") is None or spec.packed("q" if side == "q" else "k") is None:
            return f"the {'queries' if side == 'q' else 'keys'} are not packed with per-sequence lengths"
    if not written or any(spec.packed(r) is None for r in written):
        return "an output the kernel writes is not packed (its rows past a sequence's length are written)"
    return None


def check_tiles(spec: AttnSpec, why: str | None) -> None:
    if why is not None:
        raise AttributeValueError(
            f"TILES=1 does not apply here: {why}",
            rule="triton.attention.knob",
            hint="drop TILES: take configs from engine_configs()",
        )


def programs(spec: AttnSpec, block: int, blocks: int, out: str = "o") -> int:
    """Programs a head: the tiles of sequences that do not overlap in the packed output `out`, at most."""
    rows = spec.packed(out).tokens  # type: ignore[union-attr]
    return max(1, min(spec.B * blocks, -(-int(rows) // block) + spec.B))


def tile_lines(
    spec: AttnSpec,
    k: KernelText,
    block: int,
    blocks: int,
    *,
    side: str = "q",
    out: str = "o",
    start: str = "start_m",
    head: str = "off_h",
    descending: bool = True,
) -> list[str]:
    """The program's tile: `head` (grid axis 1), then `start` (the tile's level, a block index along
    `side`) and `off_b` (its sequence) from the sequences' blocks `nblk` (their lengths clipped to the
    packed output `out`'s rows), the levels' tile counts `cnt` and `before` (the tiles of the levels
    taken before each: from the highest level down where `descending`, else from level 0 up); past the
    last tile, return."""
    lens = getattr(spec, f"seq_len_{side}")
    packed = spec.packed(out)
    assert lens is not None and packed is not None
    offs = packed.offsets
    k.param(lens.name)
    k.param(offs.name)
    full = spec.Sq if side == "q" else spec.Skv
    bp, lp = pow2(spec.B), pow2(blocks)
    at_len = f"{lens.offset} + " if lens.offset else ""
    at_off = f"{offs.offset} + " if offs.offset else ""
    n = packed.per_row
    tok0 = f"tl.load({offs.name} + {at_off}seqs * {offs.strides[0]}, mask=seqs < {spec.B}, other=0).to(tl.int64)"
    lines = [
        "tile = tl.program_id(0)",
        f"{head} = tl.program_id(1)",
        f"seqs = tl.arange(0, {bp})",
        f"lens = tl.load({lens.name} + {at_len}seqs * {lens.strides[0]}, mask=seqs < {spec.B}, other=0).to(tl.int64)",
        f"first = {tok0}",
    ]
    if n != 1:  # (floor division of either sign, as ragged_lines)
        lines.append(f"first = tl.where(first >= 0, first // {n}, -(({n - 1} - first) // {n}))")
    before = "tl.sum(cnt, 0) - tl.cumsum(cnt, 0)" if descending else "tl.cumsum(cnt, 0) - cnt"
    return [
        *lines,
        f"rows = tl.minimum(tl.minimum(tl.maximum(lens, 0), {full}), tl.maximum({packed.tokens} - first, 0))",
        f"nblk = ((rows + {block - 1}) // {block}).to(tl.int32)",
        f"levels = tl.arange(0, {lp})",
        "cnt = tl.sum((nblk[None, :] > levels[:, None]).to(tl.int32), 1)",
        f"before = {before}",
        "if tile >= tl.sum(cnt, 0):",
        "    return",
        "in_level = (before <= tile) & (tile < before + cnt)",
        f"{start} = tl.sum(tl.where(in_level, levels, 0), 0)",
        "rank = tile - tl.sum(tl.where(in_level, before, 0), 0)",
        f"has = nblk > {start}",
        "off_b = tl.sum(tl.where(has & (tl.cumsum(has.to(tl.int32), 0) - 1 == rank), seqs, 0), 0)",
    ]


__all__ = ["check_tiles", "programs", "tile_lines", "tiles_ok"]
