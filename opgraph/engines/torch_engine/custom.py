"""Custom ops: their registered PyTorch implementation, else the host fallback."""

from __future__ import annotations

from typing import Any

from ...ops.custom import Custom
from .common import Call, implements
from .host import run_on_host


@implements("custom")
def custom(call: Call) -> list[Any]:
    op = call.node.op_as(Custom)
    fn = op.definition.torch
    if fn is None:
        return run_on_host(call)
    out = fn(*(call.tensor(r) for r in op.input_roles()), **dict(op.params))
    return list(out) if isinstance(out, (list, tuple)) else [out]
