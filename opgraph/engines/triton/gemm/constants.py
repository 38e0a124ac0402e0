"""Constants shared by the GEMM-class kernel framework."""

from __future__ import annotations

from ....ops.layout import VIEW_KINDS  # noqa: F401 (re-exported; a reshape only where strides allow: reshape_strides)

INT32_LIMIT = 2**31 - 1
REDUCE_KINDS = ("genstats", "reduction")
