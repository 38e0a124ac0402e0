"""The split-KV estimate (opgraph/build/split_kv.py): which split of a decode step goes first for
grids of a few programs to thousands on 132 multiprocessors (the configs' order is tested with the
template's candidates in tests/engines/test_triton_attention_split.py)."""

from __future__ import annotations

import pytest

from opgraph.build.split_kv import split_count


@pytest.mark.parametrize(
    "b, hq, sq, skv, want",
    [
        (1, 32, 1, 32768, 4),  # 32 programs: 4 splits make 128 of 132 (97%); 8 add nothing
        (2, 32, 1, 8192, 2),  # 64 programs: 2 splits 97%
        (1, 8, 1, 131072, 16),  # 8 programs: 16 splits 97%
        (1, 8, 4, 131072, 16),  # a few queries: one 16-row block, the same grid
        (64, 32, 1, 8192, 0),  # 2048 programs fill the GPU
        (4, 32, 1, 8192, 0),  # 128 programs: 0.97 of the SMs, above MIN_FILL
        (2, 8, 1, 256, 0),  # every split under 4 key blocks
        (1, 8, 1, 1024, 4),  # at most 1024 / 256 splits
    ],
)
def test_split_count(b, hq, sq, skv, want):
    assert split_count(b, hq, sq, skv, 16, 132, 64) == want


def test_split_count_among_the_offered():
    assert split_count(1, 32, 1, 32768, 16, 132, 64, splits=(8, 16)) == 8
    assert split_count(1, 32, 1, 32768, 16, 132, 64, splits=(3,)) == 3
