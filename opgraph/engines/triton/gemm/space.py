"""The output space: how a GEMM-class op's output maps onto BLOCK_M x BLOCK_N tiles."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class OutputSpace:
    """How the main op's output maps onto tiles. `rows`: axes flattened into the row index
    (outermost first); `col`: the axis along the columns, split into `groups` independent ranges of
    `n` columns each; `cols`: axes after `col` flattened with it into the column index (a product's
    columns split into heads x head dims: _matmul_split_cols.py; one group); `batch`: axes fixed per
    program (outermost first)."""

    dims: tuple[int, ...]
    rows: tuple[int, ...]
    col: int
    batch: tuple[int, ...] = ()
    groups: int = 1
    cols: tuple[int, ...] = ()

    @property
    def col_axes(self) -> tuple[int, ...]:
        """The axes flattened into the column index, outermost first."""
        return (self.col, *self.cols)

    @property
    def m(self) -> int:
        return math.prod(self.dims[a] for a in self.rows)

    @property
    def n(self) -> int:
        return math.prod(self.dims[a] for a in self.col_axes) // self.groups

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
        if axis in self.col_axes:
            return "c"
        return "s"
