"""Reductions: reduction(input, mode) over the axes where the output's dim is 1, and genstats."""

from __future__ import annotations

import enum


class ReductionMode(enum.Enum):
    ADD = "add"
    MUL = "mul"
    MIN = "min"
    MAX = "max"
    AMAX = "amax"
    AVG = "avg"
    NORM1 = "norm1"
    NORM2 = "norm2"
    MUL_NO_ZEROS = "mul_no_zeros"
