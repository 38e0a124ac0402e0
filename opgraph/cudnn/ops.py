"""`cudnn.ops`: cuDNN frontend's PyTorch operators, as opgraph plans behind `torch.library` custom ops
(so they work under autograd and `torch.compile`, as cuDNN's do).

    y = cudnn.ops.causal_conv1d(x, weight, bias=None, activation="identity")   # "identity" or "silu"

x [batch, dim, seq_len], weight [dim, kernel_size], bias [dim] (zeros when None), one floating type;
y = activation(causal depthwise conv1d(x, weight) + bias) (opgraph/ops/causal_conv1d.py). The backward
gives dx, dweight and dbias in x's type. Each (shape, type, device, activation) builds one plan,
kept in a small cache; tensors on the CPU run on the CPU engines. Importing this module needs PyTorch.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor

from ..core.dtypes import as_data_type
from ..graph.builder import Graph
from ..ops.causal_conv1d import as_activation

_PLANS: OrderedDict[tuple, tuple[Any, list[Any]]] = OrderedDict()
_MAX_PLANS = 64


def _device(t: Tensor) -> str:
    return "cpu" if t.device.type == "cpu" else f"cuda:{t.device.index or 0}"


def _plan(backward: bool, x: Tensor, weight: Tensor, activation: str) -> tuple[Any, list[Any]]:
    """(plan, [its tensors in call order]) for one shape, type, device and activation."""
    key = (backward, tuple(x.shape), tuple(weight.shape), x.dtype, _device(x), activation)
    hit = _PLANS.get(key)
    if hit is not None:
        _PLANS.move_to_end(key)
        return hit
    dt = as_data_type(x.dtype)
    g = Graph("causal_conv1d_backward" if backward else "causal_conv1d", io_data_type=dt)
    xt = g.tensor(dim=list(x.shape), name="x")
    wt = g.tensor(dim=list(weight.shape), name="weight")
    bt = g.tensor(dim=[weight.shape[0]], name="bias")
    if backward:
        dy = g.tensor(dim=list(x.shape), name="dy")
        outs = g.causal_conv1d_backward(dy, xt, wt, bt, activation=activation, name="conv1d_bwd")
        for t in outs:
            t.set_output(True).set_data_type(dt)
        tensors = [dy, xt, wt, bt, *outs]
    else:
        y = g.causal_conv1d(xt, wt, bt, activation=activation, name="conv1d").set_output(True)
        tensors = [xt, wt, bt, y]
    entry = (g.build(device=_device(x)), tensors)
    _PLANS[key] = entry
    if len(_PLANS) > _MAX_PLANS:
        _PLANS.popitem(last=False)
    return entry


def _check(x: Tensor, weight: Tensor, bias: Tensor) -> None:
    if x.dim() != 3 or weight.dim() != 2 or bias.dim() != 1:
        raise ValueError(
            f"expected x (3-D), weight (2-D), bias (1-D); got {tuple(x.shape)}, {tuple(weight.shape)}, "
            f"{tuple(bias.shape)}"
        )
    if not x.dtype == weight.dtype == bias.dtype:
        raise TypeError(f"x, weight and bias have types {x.dtype}, {weight.dtype}, {bias.dtype}; give them one")
    if not x.device == weight.device == bias.device:
        raise ValueError(f"x, weight and bias are on {x.device}, {weight.device}, {bias.device}; give them one device")


@torch.library.custom_op("opgraph_cudnn::causal_conv1d_fwd", mutates_args=())
def _forward(x: Tensor, weight: Tensor, bias: Tensor, activation: str) -> Tensor:
    _check(x, weight, bias)
    x, weight, bias = x.contiguous(), weight.contiguous(), bias.contiguous()
    plan, (xt, wt, bt, yt) = _plan(False, x, weight, activation)
    y = torch.empty_like(x)
    plan.execute({xt: x, wt: weight, bt: bias, yt: y})
    return y


@_forward.register_fake
def _forward_fake(x: Tensor, weight: Tensor, bias: Tensor, activation: str) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("opgraph_cudnn::causal_conv1d_bwd", mutates_args=())
def _backward(grad: Tensor, x: Tensor, weight: Tensor, bias: Tensor, activation: str) -> list[Tensor]:
    _check(x, weight, bias)
    if grad.shape != x.shape:
        raise ValueError(f"dy has shape {tuple(grad.shape)} but x has {tuple(x.shape)}")
    grad, x, weight, bias = (t.contiguous() for t in (grad, x.to(grad.dtype), weight, bias))
    plan, (dyt, xt, wt, bt, dxt, dwt, dbt) = _plan(True, x, weight, activation)
    dx, dw, db = torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias)
    plan.execute({dyt: grad, xt: x, wt: weight, bt: bias, dxt: dx, dwt: dw, dbt: db})
    return [dx, dw, db]


@_backward.register_fake
def _backward_fake(grad: Tensor, x: Tensor, weight: Tensor, bias: Tensor, activation: str) -> list[Tensor]:
    return [torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias)]


def _setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
    x, weight, bias, activation = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.activation = activation


def _autograd_backward(ctx: Any, grad: Tensor) -> tuple:
    x, weight, bias = ctx.saved_tensors
    dx, dw, db = torch.ops.opgraph_cudnn.causal_conv1d_bwd(grad, x, weight, bias, ctx.activation)
    return dx, dw, db, None


torch.library.register_autograd("opgraph_cudnn::causal_conv1d_fwd", _autograd_backward, setup_context=_setup_context)


def causal_conv1d(x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str = "identity") -> Tensor:
    """Depthwise causal 1-D convolution with an optional fused activation (cuDNN's cudnn.ops.causal_conv1d):
    `y = activation(conv1d_causal(x, weight) + bias)`, padding kernel_size - 1 on the left.

    Args:
        x: [batch, dim, seq_len], BF16, FP16 or FP32.
        weight: [dim, kernel_size], x's type.
        bias: [dim] (zeros when None), x's type.
        activation: "identity" (default) or "silu".

    Returns:
        y [batch, dim, seq_len] in x's type; differentiable (autograd) and traceable (torch.compile).
    """
    activation = as_activation(activation, "cudnn.ops.causal_conv1d").value
    if bias is None:
        bias = torch.zeros(weight.shape[0], device=x.device, dtype=x.dtype)
    return torch.ops.opgraph_cudnn.causal_conv1d_fwd(x, weight, bias, activation)


__all__ = ["causal_conv1d"]
