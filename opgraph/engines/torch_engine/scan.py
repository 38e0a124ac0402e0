"""The running sum (cumsum) in torch: torch.cumsum in the compute type, flipped for a reverse scan."""

from __future__ import annotations

from typing import Any

from ...ops.scan import Cumsum
from .common import Call, implements


@implements("cumsum")
def cumsum(call: Call) -> list[Any]:
    op = call.node.op_as(Cumsum)
    x = call.tensor("input")
    if op.reverse:
        return [x.flip(op.axis).cumsum(op.axis).flip(op.axis)]
    return [x.cumsum(op.axis)]
