"""adalayernorm and adalayernorm_backward in torch (opgraph/ops/adalayernorm.py has the formulas): the
layernorm mappings' arithmetic over the adaptive op's normalized axes."""

from __future__ import annotations

from typing import Any

from ...ops.adalayernorm import ada_axes
from .common import Call, implements
from .norm import _centered_backward, _inv_std, _moments, _normalize


@implements("adalayernorm")
def adalayernorm(call: Call) -> list[Any]:
    x, scale = call.tensor("input"), call.tensor("scale")
    mean, var = _moments(x, ada_axes(tuple(x.shape), tuple(scale.shape)))
    inv = _inv_std(var, call.scalar("epsilon"))
    return [_normalize(x, mean, inv, scale, call.tensor("bias") if call.has("bias") else None), mean, inv]


@implements("adalayernorm_backward")
def adalayernorm_backward(call: Call) -> list[Any]:
    dy, x, scale = call.tensor("grad"), call.tensor("input"), call.tensor("scale")
    axes = ada_axes(tuple(x.shape), tuple(scale.shape))
    return _centered_backward(dy, x, scale, call.tensor("mean"), call.tensor("inv_variance"), axes)
