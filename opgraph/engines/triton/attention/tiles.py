"""The tile list (knob TILES=1 of the forward and of the backward): packed (ragged) sequences walked as
a list of their own blocks instead of a grid over the longest sequence's blocks.

A plain grid has max_seq_len / BLOCK blocks for every sequence and head; a program past its sequence's
length returns at once (ragged.exit_past_length), but still takes a launch slot with the kernel's whole
shared-memory reservation (32 sequences of 128-4,096 tokens, 32k in all: 1,024 query blocks a head, of
which 256 hold rows). With the list, program (tile, head) decodes its tile from the lengths: level L is
every sequence's block L. The forward and dQ take the levels from the highest down (under a causal band
the query blocks with the most keys first; without one, the longest sequences' first); dK/dV from level 0
up under a causal band (the key blocks the most queries see), else from the highest down.

A tile is a block that holds rows of its sequence in some packed output the kernel writes (O, Stats,
score_max, score_sum_exp; dK, dV; dQ: each with its own offsets and T rows, rows outside [0, T) never
written); the grid has the sum over those outputs of ceil(T / BLOCK) + B + 1 programs a head, which is
every tile where a sequence's rows do not overlap another's in an output (as ragged.py takes them: the
rows of overlapping ones have no defined result, and with the list their tiles may also take the
programs of others). One tile a program: a loop over several (for any layout) cost the forward's
128x128 tiles (8 warps, D 128) 11 registers and 12 bytes of spills on sm_90.

Offered where the early exit applies (every output the kernel writes packed, ragged.py), for a kernel of
one shape (not a dynamic bucket's), not with split-KV, GQA packing or the fused backward."""

from __future__ import annotations

from ....core.errors import AttributeValueError
from .common import KernelText, pow2
from .ragged import first_row_lines
from .spec import AttnSpec

FORWARD_OUTPUTS = ("o", "stats", "score_max", "score_sum_exp")  # (the forward's packed outputs)


def tiles_ok(
    spec: AttnSpec, outputs: tuple[str, ...] = FORWARD_OUTPUTS, lengths: tuple[str, ...] = ("q",)
) -> str | None:
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


def _outputs(spec: AttnSpec, outs: tuple[str, ...]) -> list[str]:
    """The packed outputs under `outs` the kernel writes, one per distinct layout (offsets, units, T)."""
    keep, seen = [], []
    for r in outs:
        packed = spec.packed(r) if getattr(spec, r, None) is not None else None
        if packed is not None and (key := (packed.offsets, packed.per_row, packed.tokens)) not in seen:
            seen.append(key)
            keep.append(r)
    return keep


def programs(spec: AttnSpec, block: int, blocks: int, outs: tuple[str, ...]) -> int:
    """Programs a head: every tile of sequences that do not overlap in each packed output of `outs`, at
    most (a sequence that starts before an output's first row adds one block, its first partial)."""
    n = 0
    for r in _outputs(spec, outs):
        packed = spec.packed(r)
        assert packed is not None
        n += -(-int(packed.tokens) // block) + int(spec.B) + 1
    return max(1, min(int(spec.B) * blocks, n))


def tile_lines(
    spec: AttnSpec,
    k: KernelText,
    block: int,
    blocks: int,
    *,
    side: str,
    outs: tuple[str, ...],
    start: str = "start_m",
    head: str = "off_h",
    descending: bool = True,
) -> list[str]:
    """The program's tile: `head` (grid axis 1), then `start` (the tile's level, a block index along
    `side`) and `off_b` (its sequence). Level L holds sequence b where block L holds rows of b that some
    packed output of `outs` has (`need`: its rows [lo, hi) of the sequence's local rows, clipped to the
    output's T rows); `cnt` the levels' tile counts, `before` the tiles of the levels taken before each
    (from the highest level down where `descending`, else from level 0 up); past the last tile, return."""
    lens = getattr(spec, f"seq_len_{side}")
    assert lens is not None
    k.param(lens.name)
    full = spec.Sq if side == "q" else spec.Skv
    bp, lp = pow2(spec.B), pow2(blocks)
    at_len = f"{lens.offset} + " if lens.offset else ""
    lines = [
        "tile = tl.program_id(0)",
        f"{head} = tl.program_id(1)",
        f"seqs = tl.arange(0, {bp})",
        f"lens = tl.load({lens.name} + {at_len}seqs * {lens.strides[0]}, mask=seqs < {spec.B}, other=0).to(tl.int64)",
        f"lens = tl.minimum(tl.maximum(lens, 0), {full})",
        f"levels = tl.arange(0, {lp})",
        f"need = tl.zeros([{lp}, {bp}], tl.int1)",
    ]
    for i, role in enumerate(_outputs(spec, outs)):
        packed = spec.packed(role)
        assert packed is not None
        offs, n = packed.offsets, packed.per_row
        k.param(offs.name)
        at_off = f"{offs.offset} + " if offs.offset else ""
        load = f"tl.load({offs.name} + {at_off}seqs * {offs.strides[0]}, mask=seqs < {spec.B}, other=0)"
        lines += first_row_lines(f"first{i}", load, n)
        lines += [
            f"lo{i} = tl.maximum(-first{i}, 0)",
            f"hi{i} = tl.minimum(lens, {packed.tokens} - first{i})",
            f"b0_{i} = (lo{i} // {block}).to(tl.int32)",
            f"b1_{i} = tl.where(hi{i} > lo{i}, (hi{i} + {block - 1}) // {block}, 0).to(tl.int32)",
            f"need = need | ((levels[:, None] >= b0_{i}[None, :]) & (levels[:, None] < b1_{i}[None, :]))",
        ]
    before = "tl.sum(cnt, 0) - tl.cumsum(cnt, 0)" if descending else "tl.cumsum(cnt, 0) - cnt"
    return [
        *lines,
        "cnt = tl.sum(need.to(tl.int32), 1)",
        f"before = {before}",
        "if tile >= tl.sum(cnt, 0):",
        "    return",
        "in_level = (before <= tile) & (tile < before + cnt)",
        f"{start} = tl.sum(tl.where(in_level, levels, 0), 0)",
        "rank = tile - tl.sum(tl.where(in_level, before, 0), 0)",
        f"has = tl.sum(tl.where(levels[:, None] == {start}, need.to(tl.int32), 0), 0) > 0",
        "off_b = tl.sum(tl.where(has & (tl.cumsum(has.to(tl.int32), 0) - 1 == rank), seqs, 0), 0)",
    ]


# the largest [levels, sequences] table a program builds: B 512 at 8k tokens compiled (sm_90) in 251
# registers without spills beside the attention body, B 2,048 at 32k spilled 308 bytes
MAX_TABLE = 32 * 1024


def table_fits(spec: AttnSpec, block: int, blocks: int) -> bool:
    return pow2(spec.B) * pow2(blocks) <= MAX_TABLE


__all__ = ["FORWARD_OUTPUTS", "MAX_TABLE", "check_tiles", "programs", "table_fits", "tile_lines", "tiles_ok"]
