"""The forward's tile list (knob TILES=1): packed (ragged) queries walked as a list of their sequences'
own query blocks instead of a grid over the longest sequence's blocks.

The plain grid has max_seq_len / BLOCK_M blocks for every sequence and head; a program past its
sequence's length returns at once (ragged.exit_past_length), but still takes a launch slot with the
kernel's whole shared-memory reservation (32 sequences of 128-4,096 tokens, 32k in all: 1,024 blocks a
head, of which 256 hold rows). With the list, program (tile, head) decodes its tile from the lengths:
level L is every sequence's query block L, the levels taken from the highest down, so the first tiles
are the heaviest under a causal band (the most keys) and, without one, the longest sequences'.

A sequence's rows are those of the packed output O it writes, clipped to O's T rows; the grid has
ceil(T / BLOCK_M) + B programs a head, which is every tile where the sequences do not overlap in O (as
ragged.py takes them: overlapping ones have no defined result either way) and start at or after its
first row. One tile a program: a loop over several (for any layout) cost the heuristic's 128x128 tiles
(8 warps, D 128) 11 registers and 12 bytes of spills on sm_90.

Offered where the early exit applies (every output the forward writes packed, ragged.py), for a kernel
of one shape (not a dynamic bucket's), not with split-KV or GQA packing."""

from __future__ import annotations

from ....core.errors import AttributeValueError
from .common import KernelText, pow2
from .spec import AttnSpec

_OUTPUTS = ("o", "stats", "score_max", "score_sum_exp")


def tiles_ok(spec: AttnSpec) -> str | None:
    """Why the tile list does not apply to `spec` (None: it does)."""
    written = [r for r in _OUTPUTS if getattr(spec, r, None) is not None]
    if spec.sizes is not None:
        return "a dynamic bucket's kernel (its batch and lengths are run-time sizes)"
    if spec.seq_len_q is None or spec.packed("q") is None:
        return "the queries are not packed with per-sequence lengths"
    if not written or any(spec.packed(r) is None for r in written):
        return "an output the forward writes is not packed (its rows past a sequence's length are written)"
    return None


def check_tiles(spec: AttnSpec, split: bool, pack: bool) -> None:
    why = tiles_ok(spec) or ("split-KV" if split else "GQA packing" if pack else None)
    if why is not None:
        raise AttributeValueError(
            f"TILES=1 does not apply here: {why}",
            rule="triton.attention.knob",
            hint="drop TILES: take configs from engine_configs()",
        )


def _out(spec: AttnSpec) -> str:
    """The packed output whose rows bound the tiles: O, else the first other one written."""
    return next(r for r in _OUTPUTS if getattr(spec, r, None) is not None)


def programs(spec: AttnSpec, bm: int, num_m: int) -> int:
    """Programs a head: the tiles of sequences that do not overlap in the packed output, at most."""
    rows = spec.packed(_out(spec)).tokens  # type: ignore[union-attr]
    return max(1, min(spec.B * num_m, -(-int(rows) // bm) + spec.B))


def tile_lines(spec: AttnSpec, k: KernelText, bm: int, num_m: int) -> list[str]:
    """The program's tile: `off_h`, then `start_m` (the tile's level) and `off_b` (its sequence) from
    the sequences' query blocks `nblk` (their lengths clipped to the output's rows), the levels' tile
    counts `cnt` and `above` (the tiles of the levels above each); past the last tile, return."""
    lens, role = spec.seq_len_q, _out(spec)
    packed = spec.packed(role)
    assert lens is not None and packed is not None
    offs = packed.offsets
    k.param(lens.name)
    k.param(offs.name)
    bp, lp = pow2(spec.B), pow2(num_m)
    at_len = f"{lens.offset} + " if lens.offset else ""
    at_off = f"{offs.offset} + " if offs.offset else ""
    n = packed.per_row
    tok0 = f"tl.load({offs.name} + {at_off}seqs * {offs.strides[0]}, mask=seqs < {spec.B}, other=0).to(tl.int64)"
    lines = [
        "tile = tl.program_id(0)",
        "off_h = tl.program_id(1)",
        f"seqs = tl.arange(0, {bp})",
        f"lens = tl.load({lens.name} + {at_len}seqs * {lens.strides[0]}, mask=seqs < {spec.B}, other=0).to(tl.int64)",
        f"first = {tok0}",
    ]
    if n != 1:  # (floor division of either sign, as ragged_lines)
        lines.append(f"first = tl.where(first >= 0, first // {n}, -(({n - 1} - first) // {n}))")
    return [
        *lines,
        f"rows = tl.minimum(tl.minimum(tl.maximum(lens, 0), {spec.Sq}), tl.maximum({packed.tokens} - first, 0))",
        f"nblk = ((rows + {bm - 1}) // {bm}).to(tl.int32)",
        f"levels = tl.arange(0, {lp})",
        "cnt = tl.sum((nblk[None, :] > levels[:, None]).to(tl.int32), 1)",
        "above = tl.sum(cnt, 0) - tl.cumsum(cnt, 0)",
        "if tile >= tl.sum(cnt, 0):",
        "    return",
        "in_level = (above <= tile) & (tile < above + cnt)",
        "start_m = tl.sum(tl.where(in_level, levels, 0), 0)",
        "rank = tile - tl.sum(tl.where(in_level, above, 0), 0)",
        "has = nblk > start_m",
        "off_b = tl.sum(tl.where(has & (tl.cumsum(has.to(tl.int32), 0) - 1 == rank), seqs, 0), 0)",
    ]


__all__ = ["check_tiles", "programs", "tile_lines", "tiles_ok"]
