"""Buckets of a dynamic plan (docs/design/dynamic-shapes.md, "Buckets"): a box of sub-ranges, one per
dynamic dim, with a hint (a representative value per dim). The build chooses them
(opgraph.build.buckets); a dynamic plan picks the bucket of each shape; generated kernels that take
sizes at run time decide by their bucket (int64 indexing at its maximum, tiles at its hint), so every
shape of a bucket runs the same compiled kernels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .symbolic import Ranges


@dataclass(frozen=True)
class Bucket:
    """Sub-ranges (name, lowest, highest) and a hint (name, value) per dynamic dim, in the graph's
    symbol order; `index` is its place among the plan's buckets."""

    index: int
    ranges: tuple[tuple[str, int, int], ...]
    hint: tuple[tuple[str, int], ...]

    @property
    def range_map(self) -> Ranges:
        return {name: (lo, hi) for name, lo, hi in self.ranges}

    @property
    def hint_map(self) -> dict[str, int]:
        return dict(self.hint)

    def contains(self, shape: Mapping[str, int]) -> bool:
        return all(lo <= shape[name] <= hi for name, lo, hi in self.ranges)

    def describe(self) -> str:
        """`batch 2..16, seq 17..256 (hint batch=6 seq=64)`."""
        spans = ", ".join(f"{name} {lo}" if lo == hi else f"{name} {lo}..{hi}" for name, lo, hi in self.ranges)
        return f"{spans} (hint {' '.join(f'{k}={v}' for k, v in self.hint)})"


__all__ = ["Bucket"]
