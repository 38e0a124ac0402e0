"""causal_conv1d and causal_conv1d_backward in torch (opgraph/ops/causal_conv1d.py has the formulas):
a depthwise F.conv1d over the input padded K - 1 on the left; the backward recomputes the
pre-activation, convolves dz with the flipped filters for dx and sums windows of x for dweight."""

from __future__ import annotations

from typing import Any

from ...ops.causal_conv1d import CausalConv1d, Conv1dActivation
from .common import Call, implements


def _pre_activation(call: Call) -> tuple[Any, Any, Any]:
    """(z, x, weight) in the compute type."""
    import torch.nn.functional as F

    x, w = call.tensor("input"), call.tensor("weight")
    k = w.shape[1]
    bias = call.tensor("bias").reshape(-1) if call.has("bias") else None
    z = F.conv1d(F.pad(x, (k - 1, 0)), w.unsqueeze(1), bias=bias, groups=x.shape[1])
    return z, x, w


@implements("causal_conv1d")
def causal_conv1d(call: Call) -> list[Any]:
    import torch.nn.functional as F

    z, _, _ = _pre_activation(call)
    silu = call.node.op_as(CausalConv1d).activation is Conv1dActivation.SILU
    return [F.silu(z) if silu else z]


@implements("causal_conv1d_backward")
def causal_conv1d_backward(call: Call) -> list[Any]:
    import torch
    import torch.nn.functional as F

    z, x, w = _pre_activation(call)
    dy = call.tensor("grad")
    if call.node.op.activation is Conv1dActivation.SILU:  # type: ignore[attr-defined]
        s = torch.sigmoid(z)
        dz = dy * s * (1.0 + z * (1.0 - s))
    else:
        dz = dy
    d, k = w.shape
    length = x.shape[2]
    dx = F.conv1d(F.pad(dz, (0, k - 1)), w.flip(1).unsqueeze(1), groups=d)
    padded = F.pad(x, (k - 1, 0))
    dw = torch.stack([(dz * padded[:, :, j : j + length]).sum(dim=(0, 2)) for j in range(k)], dim=1)
    out = call.out("dbias")
    db = None if out is None else dz.sum(dim=(0, 2)).reshape(out.dim)
    return [dx, dw, db]
