"""Normalizations in torch, written out from the ops' formulas (opgraph.ops.norm) rather than through
F.batch_norm / F.layer_norm: those take epsilon and momentum as Python floats (a host read of a
device scalar) and know neither cuDNN's stats layouts nor the running-variance convention here.

Every statistic is computed in the compute type (float32, or float64) with torch.var_mean (one
pass, biased variance); epsilon and momentum are 0-d device tensors, so nothing synchronises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core.errors import expect
from .common import Call, implements


def _moments(x: Any, axes: tuple[int, ...]) -> tuple[Any, Any]:
    """mean and biased variance over `axes`, keeping dims."""
    import torch

    var, mean = torch.var_mean(x, dim=axes, correction=0, keepdim=True)
    return mean, var


def _inv_std(var: Any, eps: Any) -> Any:
    import torch

    return torch.rsqrt(var + eps)


def _normalize(x: Any, mean: Any, inv: Any, scale: Any, bias: Any) -> Any:
    """(x - mean) * inv * scale + bias (scale, bias optional) in as few passes over x as torch
    allows: a per-channel inv * scale is folded into one factor, the bias into an addcmul."""
    import torch

    xc = x if mean is None else x - mean
    if scale is not None and scale.shape == inv.shape:
        factor, scale = inv * scale, None  # both small (per channel): one factor
    else:
        factor = inv
    if scale is not None:
        xc = xc * factor
        factor = scale
    return xc * factor if bias is None else torch.addcmul(bias, xc, factor)


def _sum_to(a: Any, dim: Sequence[int]) -> Any:
    """Sum `a` over the axes where `dim` is 1 (a broadcast parameter's gradient)."""
    axes = tuple(i for i, d in enumerate(dim) if d == 1 and a.shape[i] != 1)
    return a.sum(dim=axes, keepdim=True) if axes else a


def _centered_backward(dy, x, scale, mean, inv, axes):
    """dx, dscale, dbias of y = (x - mean) * inv * scale + bias with mean, inv x's stats over `axes`."""
    xhat = (x - mean) * inv
    g = dy * scale
    dx = inv * (g - g.mean(dim=axes, keepdim=True) - xhat * (g * xhat).mean(dim=axes, keepdim=True))
    return [dx, _sum_to(dy * xhat, scale.shape), _sum_to(dy, scale.shape)]


def _opt(call: Call, role: str) -> Any:
    return call.tensor(role) if call.has(role) else None


def _norm_axes(call: Call, x: Any) -> tuple[int, ...]:
    """layernorm/rmsnorm normalized axes: where scale's (else bias's) dim equals the input's; without
    either, every axis but the first."""
    ref = next((call.desc(r) for r in ("scale", "bias") if call.has(r)), None)
    if ref is None:
        return tuple(range(1, x.dim()))
    return tuple(i for i, (d, xd) in enumerate(zip(ref.dim, x.shape)) if d == xd)


def _channel_axes(x: Any) -> tuple[int, ...]:
    return tuple(i for i in range(x.dim()) if i != 1)


# -- batchnorm ------------------------------------------------------------------------------------


@implements("batchnorm")
def batchnorm(call: Call) -> list[Any]:
    x = call.tensor("input")
    axes = _channel_axes(x)
    mean, var = _moments(x, axes)
    inv = _inv_std(var, call.scalar("epsilon"))
    y = _normalize(x, mean, inv, call.tensor("scale"), call.tensor("bias"))
    next_mean = next_var = None
    if call.has("momentum") and (call.wants("next_running_mean") or call.wants("next_running_var")):
        m = expect(call.scalar("momentum"), "batchnorm's momentum")  # (has it)
        n = x.numel() // x.shape[1]
        next_mean = (1.0 - m) * call.tensor("in_running_mean") + m * mean
        next_var = (1.0 - m) * call.tensor("in_running_var") + m * var * (n / (n - 1))
    return [y, mean, inv, next_mean, next_var]


@implements("batchnorm_inference")
def batchnorm_inference(call: Call) -> list[Any]:
    x = call.tensor("input")
    mean, inv = call.tensor("mean"), call.tensor("inv_variance")
    return [_normalize(x, mean, inv, call.tensor("scale"), call.tensor("bias"))]


@implements("batchnorm_backward")
def batchnorm_backward(call: Call) -> list[Any]:
    return _saved_or_recomputed_backward(call, lambda x: _channel_axes(x))


def _saved_or_recomputed_backward(call: Call, axes_of) -> list[Any]:
    dy, x, scale = call.tensor("grad"), call.tensor("input"), call.tensor("scale")
    axes = axes_of(x)
    if call.has("mean"):
        mean, inv = call.tensor("mean"), call.tensor("inv_variance")
    else:
        mean, var = _moments(x, axes)
        inv = _inv_std(var, call.scalar("epsilon"))
    return _centered_backward(dy, x, scale, mean, inv, axes)


# -- layernorm / rmsnorm ----------------------------------------------------------------------------


@implements("layernorm")
def layernorm(call: Call) -> list[Any]:
    x = call.tensor("input")
    mean, var = _moments(x, _norm_axes(call, x))
    inv = _inv_std(var, call.scalar("epsilon"))
    return [_normalize(x, mean, inv, _opt(call, "scale"), _opt(call, "bias")), mean, inv]


@implements("layernorm_backward")
def layernorm_backward(call: Call) -> list[Any]:
    dy, x, scale = call.tensor("grad"), call.tensor("input"), call.tensor("scale")
    mean, inv = call.tensor("mean"), call.tensor("inv_variance")
    axes = tuple(i for i, s in enumerate(mean.shape) if s == 1)
    return _centered_backward(dy, x, scale, mean, inv, axes)


@implements("rmsnorm")
def rmsnorm(call: Call) -> list[Any]:
    x = call.tensor("input")
    axes = _norm_axes(call, x)
    inv = _inv_std((x * x).mean(dim=axes, keepdim=True), call.scalar("epsilon"))
    return [_normalize(x, None, inv, call.tensor("scale"), _opt(call, "bias")), inv]


@implements("rmsnorm_backward")
def rmsnorm_backward(call: Call) -> list[Any]:
    dy, x, scale, r = call.tensor("grad"), call.tensor("input"), call.tensor("scale"), call.tensor("inv_variance")
    axes = tuple(i for i, s in enumerate(r.shape) if s == 1)
    g = dy * scale
    dx = r * (g - x * r * r * (g * x).mean(dim=axes, keepdim=True))
    dbias = _sum_to(dy, scale.shape) if call.wants("dbias") else None
    return [dx, _sum_to(dy * x * r, scale.shape), dbias]


# -- instancenorm -----------------------------------------------------------------------------------


def _spatial_axes(x: Any) -> tuple[int, ...]:
    return tuple(range(2, x.dim()))


@implements("instancenorm")
def instancenorm(call: Call) -> list[Any]:
    x = call.tensor("input")
    mean, var = _moments(x, _spatial_axes(x))
    inv = _inv_std(var, call.scalar("epsilon"))
    return [_normalize(x, mean, inv, call.tensor("scale"), call.tensor("bias")), mean, inv]


@implements("instancenorm_backward")
def instancenorm_backward(call: Call) -> list[Any]:
    return _saved_or_recomputed_backward(call, _spatial_axes)
