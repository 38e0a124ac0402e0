"""Constants shared by the GEMM-class kernel framework."""

from __future__ import annotations

INT32_LIMIT = 2**31 - 1
VIEW_KINDS = ("slice", "transpose", "reshape")  # reshape: where strides allow (reshape_strides)
REDUCE_KINDS = ("genstats", "reduction")
