"""The output space: how a GEMM-class op's output maps onto BLOCK_M x BLOCK_N tiles."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class OutputSpace:
    """How the main op's output maps onto tiles. `rows`: axes flattened into the row index
    (outermost first); `col`: the axis along the columns, split into `groups` independent ranges of
    `n` columns each; `batch`: axes fixed per program (outermost first)."""

    dims: tuple[int, ...]
    rows: tuple[int, ...]
    col: int
    batch: tuple[int, ...] = ()
    groups: int = 1

    @property
    def m(self) -> int:
        return math.prod(self.dims[a] for a in self.rows)

    @property
    def n(self) -> int:
        return self.dims[self.col] // self.groups

    @property
    def nbatch(self) -> int:
        return math.prod(self.dims[a] for a in self.batch)

    def partials(self, split: int) -> int:
        """Split-K's fp32 partial elements: `split` slices of every batch program's M x N (an expression
        of the dynamic dims in a bucket's kernel)."""
        return split * self.nbatch * self.groups * self.m * self.n

    def where(self, axis: int) -> str:
        if axis in self.rows:
            return "r"
        if axis == self.col:
            return "c"
        return "s"
