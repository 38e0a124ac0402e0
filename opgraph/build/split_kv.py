"""Split-KV (flash-decoding) choice: whether the generated attention forward of a decode-shaped piece
runs with its keys split over several programs a query block, and into how many (the template offers
the splits, knob SPLIT; opgraph/engines/triton/attention/split.py).

The estimate is the grid's fill, as FlashAttention's num_splits heuristic: without a split a decode step
has ceil(Sq / BLOCK_M) * B * Hq programs, each streaming its head's whole cache; fewer than
MIN_FILL of the GPU's multiprocessors leave HBM idle. A split s makes s times the programs; its
efficiency is the fill of the last wave, w / ceil(w) with w = programs * s / SMs. The smallest split
within EFFICIENCY of the best goes first (each extra split costs a partial a row and a share of the
combining launch), among the splits whose chunks hold at least MIN_BLOCKS key blocks. Autotuning times
the others against it. GQA-packed configs (gqa_pack.py) are estimated with their own grid: Hk heads of
Sq * G rows.

A dynamic plan's bucket is planned at its hint shape, and its split with it; `at_shape` decides again at
each shape the bucket runs (the estimate is a few integer operations), among the configs the bucket
offered, where the estimate there differs from the estimate at the hint (elsewhere the bucket's choice,
estimated or timed, stands): a bucket of KV lengths 257 to 8192 splits a 300-key step and an 8192-key
step each as the estimate says at that length (its kernels, each taking its sizes at run time, compiled
once per bucket)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ..core.config import EngineConfig
from ..core.dtypes import DataType
from ..core.op import NodeContext
from . import gqa_pack

if TYPE_CHECKING:
    from ..core.device import Device
    from ..core.piece import Piece

MIN_FILL = 0.8  # a grid of at least this many programs per multiprocessor is not split
EFFICIENCY = 0.85  # a split within this fraction of the best last-wave fill is good enough
MIN_BLOCKS = 4  # key blocks a split's chunk holds at least

__all__ = ["at_shape", "order", "split_count"]


def split_count(
    b: int, hq: int, sq: int, skv: int, block_m: int, sm_count: int, block_n: int = 64, splits: Sequence[int] = ()
) -> int:
    """The split of a forward of B x Hq heads, Sq queries, Skv keys with BLOCK_M x BLOCK_N tiles on
    `sm_count` multiprocessors (0: none), among `splits` (default 2 to 32, powers of two)."""
    programs = math.ceil(sq / block_m) * b * hq
    if programs >= MIN_FILL * sm_count:
        return 0
    fits = [s for s in (splits or (2, 4, 8, 16, 32)) if skv / s >= MIN_BLOCKS * block_n]
    if not fits:
        return 0
    fill = {s: (w := programs * s / sm_count) / math.ceil(w) for s in fits}
    best = max(fill.values())
    return min(s for s in fits if fill[s] >= EFFICIENCY * best)


def _shape(piece: Piece) -> tuple[int, int, int, int, int] | None:
    """(B, Hq, Hk, Sq, Skv) of the piece's sdpa node (the op's own geometry: packed and paged tensors)."""
    node = next((n for n in piece.nodes if n.kind == "sdpa"), None)
    if node is None:
        return None
    op = node.op
    inputs = [piece.tensor(v) if isinstance(v, int) else v for v in node.inputs]
    outputs = [piece.tensor(u) if u is not None else None for u in node.outputs]
    ctx = NodeContext(
        node.label(), op.input_roles(), inputs, op.output_roles(), outputs, DataType.FLOAT, DataType.FLOAT
    )
    g = op.geometry(ctx)  # type: ignore[attr-defined]
    return g.b, g.hq, g.hk, g.sq, g.skv


def order(piece: Piece, configs: Sequence[EngineConfig], device: Device) -> list[EngineConfig]:
    """`configs` with the generated attention forward's decode config first among that engine's configs:
    GQA-packed where gqa_pack.packs says so, with the estimated split (unchanged where the piece is
    neither packed nor split, or no config has that choice)."""
    decode = [c for c in configs if c.knob("template") == "attention" and (c.knob("SPLIT") or c.knob("PACK_GQA"))]
    shape = _shape(piece) if decode else None
    if shape is None:
        return list(configs)
    b, hq, hk, sq, skv = shape
    packed = [c for c in decode if c.knob("PACK_GQA")]
    pack = bool(packed) and gqa_pack.packs(hq, hk, sq, packed[0].knob("BLOCK_M"))
    pool = packed if pack else [c for c in decode if not c.knob("PACK_GQA")]
    if not pool:
        return list(configs)
    first = pool[0]
    offered = [c.knob("SPLIT") for c in pool if c.knob("SPLIT")]
    heads, rows = (hk, sq * (hq // hk)) if pack else (hq, sq)
    s = split_count(b, heads, rows, skv, first.knob("BLOCK_M"), device.sm_count, first.knob("BLOCK_N"), offered)
    chosen = next((c for c in pool if (c.knob("SPLIT") or 0) == s), None)
    if chosen is None or not (s or pack):
        return list(configs)
    why = [f"GQA packing: {hq // hk} query heads a K/V read (build/gqa_pack.py)"] if pack else []
    why += [f"split-KV: {s} splits fill the GPU (build/split_kv.py)"] if s else []
    out = [c for c in configs if c is not chosen]
    at = next(i for i, c in enumerate(out) if c.engine == chosen.engine)
    out.insert(at, replace(chosen, why="; ".join(why)))
    return out


def _without_split(config: EngineConfig) -> tuple[tuple[str, object], ...]:
    return tuple((k, v) for k, v in config.knobs if k != "SPLIT")


def at_shape(
    piece: Piece, config: EngineConfig, alternatives: Sequence[EngineConfig], device: Device, hint: Piece
) -> EngineConfig | None:
    """For a dynamic plan's step at one shape of its bucket (`piece` at that shape; `hint` the piece at the
    bucket's hint, where `config` was chosen, by the estimate or by timing): the config, among `config`
    and its `alternatives`, with the split the estimate gives at this shape, where that differs from the
    split it gives at the hint (None: keep `config`, the bucket's choice). A GQA-packed config changes
    only its SPLIT; an unpacked one goes to the split candidates' tile, or, where the estimate says not
    to split, to the first unsplit attention config of the ranking."""
    if config.knob("template") != "attention":
        return None
    shape, at_hint = _shape(piece), _shape(hint)
    if shape is None or at_hint is None:
        return None
    pack = bool(config.knob("PACK_GQA"))
    ranked = [c for c in (config, *alternatives) if c.engine == config.engine and c.knob("template") == "attention"]
    if pack:
        family = [c for c in ranked if c.knob("PACK_GQA") and _without_split(c) == _without_split(config)]
    else:
        family = [c for c in ranked if c.knob("SPLIT") and not c.knob("PACK_GQA")]
    offered = sorted({c.knob("SPLIT") for c in family if c.knob("SPLIT")})
    if not offered:
        return None
    probe = config if pack or config.knob("SPLIT") else family[0]  # (the tile a split would run)

    def estimate(b: int, hq: int, hk: int, sq: int, skv: int) -> int:
        heads, rows = (hk, sq * (hq // hk)) if pack else (hq, sq)
        bm, bn = probe.knob("BLOCK_M"), probe.knob("BLOCK_N")
        return split_count(b, heads, rows, skv, bm, device.sm_count, bn, offered)

    s = estimate(*shape)
    if s == estimate(*at_hint) or s == (config.knob("SPLIT") or 0):
        return None
    if s or pack:
        return next((c for c in family if (c.knob("SPLIT") or 0) == s), None)
    return next((c for c in ranked if not c.knob("SPLIT") and not c.knob("PACK_GQA")), None)
