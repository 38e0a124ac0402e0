"""GQA head packing choice: whether the generated attention forward of a decode step runs one program per
key/value head with the group's query heads packed into its tile's rows (the template offers it, knob
PACK_GQA; opgraph/engines/triton/attention/gqa_pack.py).

A decode step is bound by reading the K/V cache. Unpacked, each of the G = Hq / Hk query heads of a group
has its program, and each program streams the group's whole cache: G reads of every K/V block (L2 catches
some, not at 8k-128k tokens a sequence). Packed, the group's G heads times the Sq queries are the rows of
one tile and every block is read once. The rule: pack where there are groups (Hq > Hk) and their rows,
Sq * G, fit the packed config's tile (BLOCK_M rows). The grid then has Hk heads instead of Hq, and the
split-KV estimate (split_kv.py) counts its programs so."""

from __future__ import annotations

__all__ = ["packs"]


def packs(hq: int, hk: int, sq: int, block_m: int) -> bool:
    """Whether a forward of Hq query heads over Hk key/value heads and Sq queries runs GQA-packed in
    tiles of `block_m` rows."""
    return hk > 0 and hq > hk and hq % hk == 0 and sq * (hq // hk) <= block_m
