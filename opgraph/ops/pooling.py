"""Pooling: resample (max, average including or excluding padding), optionally with the max index."""

from __future__ import annotations

import enum


class ResampleMode(enum.Enum):
    MAX = "max"
    AVG_INCLUDE_PADDING = "avg_include_padding"
    AVG_EXCLUDE_PADDING = "avg_exclude_padding"
    # cuDNN's C++ names for the same modes
    MAXPOOL = "max"
    AVGPOOL_INCLUDE_PADDING = "avg_include_padding"
    AVGPOOL_EXCLUDE_PADDING = "avg_exclude_padding"
