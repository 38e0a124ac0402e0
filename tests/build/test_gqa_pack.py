"""The GQA head packing rule (opgraph/build/gqa_pack.py): which decode steps run with a key/value head's
query heads packed into one tile (the configs' order is tested with the template's candidates in
tests/engines/test_triton_attention_gqa_pack.py)."""

from __future__ import annotations

import pytest

from opgraph.build.gqa_pack import packs


@pytest.mark.parametrize(
    "hq, hk, sq, block_m, want",
    [
        (32, 8, 1, 16, True),  # 4 rows in a 16-row tile
        (32, 8, 3, 16, True),  # 12 rows
        (64, 8, 3, 16, False),  # 24 rows: more than the tile
        (64, 8, 3, 32, True),
        (8, 8, 1, 16, False),  # no groups
        (64, 1, 3, 128, False),  # MQA, 192 rows
        (64, 1, 2, 128, True),
        (12, 8, 1, 16, False),  # (not a grouping)
    ],
)
def test_packs(hq, hk, sq, block_m, want):
    assert packs(hq, hk, sq, block_m) is want
