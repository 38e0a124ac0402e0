"""GQA head packing in the generated forward (knob PACK_GQA; the build chooses it for decode steps,
opgraph/build/gqa_pack.py): with grouped-query attention (Hq = G * Hk) and few queries, a program per
query head reads each K/V block of its group G times. Packed, a program owns one key/value head and its
tile's rows are the group's G query heads times the queries, row r = query r // G of query head
Hk-head * G + r % G (FlashInfer's and FlashAttention's decode layout), so each K/V block is loaded once
per key/value head and G times more rows share each tensor-core product.

The program's values then differ per row where they depended on the query head: `off_h` becomes a
[BLOCK_M, 1] column (2-D tile code, q loads, O stores, bias, ALiBi, dropout, block mask, hooks read it
unchanged) and `off_hr` the [BLOCK_M] vector of 1-D per-row values (Stats rows, the sink, split-KV's
partials). `offs_m` stays each row's query position, so masks, padding and ragged rows are the
unpacked kernel's. Everything about K and V (paged, packed caches) is unchanged: one head a program."""

from __future__ import annotations

from ....core.errors import AttributeValueError
from .spec import AttnSpec

__all__ = ["check_packable", "pack_lines", "query_span"]


def check_packable(spec: AttnSpec) -> None:
    """A typed error where the query heads of one key head do not share one value head."""
    if spec.Hk != spec.Hv:
        raise AttributeValueError(
            f"PACK_GQA=1 needs as many key as value heads (this sdpa has {spec.Hk} key and {spec.Hv} value heads)",
            rule="triton.attention.knob",
            hint="drop PACK_GQA: take configs from engine_configs()",
        )


def pack_lines(spec: AttnSpec, bm: int) -> list[str]:
    """The program's coordinates: batch `off_b`, key/value head `off_hk` (= `off_hv`), the rows' query
    positions `offs_m` and heads (`off_hr`, `off_h`), `m0` the block's first query."""
    g = spec.gk
    return [
        f"off_b = pid_bh // {spec.Hk}",
        f"off_hk = pid_bh % {spec.Hk}",
        "off_hv = off_hk",
        f"r0 = start_m * {bm}",
        f"offs_r = r0 + tl.arange(0, {bm})",
        f"offs_m = offs_r // {g}",
        f"off_hr = off_hk * {g} + offs_r % {g}",
        "off_h = off_hr[:, None]",
        f"m0 = r0 // {g}",
    ]


def query_span(bm: int, g: int) -> int:
    """At most how many query positions a block of `bm` packed rows (starting at a multiple of bm) holds:
    the key ranges of the block (forward.fwd_ranges) cover them."""
    return (bm + g - 2) // g + 1 if bm % g else bm // g
