"""Resample (pooling) in torch: F.max_pool{1,2,3}d / F.avg_pool{1,2,3}d over an explicitly padded
input (F.pad with -inf for MAX, 0 for the averages), so any asymmetric padding below the window
works (torch's own padding argument is symmetric and at most window // 2).

MAX with an index: the reference's index is the row-major position within the window,
k_0 * w_1 * w_2 + k_1 * w_2 + k_2; the windows are unfolded and argmax'ed (the first maximum, the
first NaN: the reference's rule, which max_pool's own indices do not follow for NaN).
AVG_EXCLUDE_PADDING divides the window sum by the count of real positions, pooled from a mask.

The backward ops (ops/pooling_backward.py): max through aten's own pooling backward kernels where the
padding is implicit (symmetric, at most half the window), else autograd through the forward above;
averages through autograd.
"""

from __future__ import annotations

import math
from typing import Any

from ...ops.pooling import PoolGeometry, Resample, ResampleMode
from ...ops.pooling_backward import ResampleAvgBackward, ResampleMaxBackward
from .common import Call, implements


def _pad_spec(pre, post) -> list[int]:
    spec: list[int] = []
    for p0, p1 in reversed(list(zip(pre, post))):
        spec += [p0, p1]
    return spec


def _window_index(xp: Any, geo) -> Any:
    """Row-major index within each window of the padded input (first maximum, first NaN)."""
    nsp = xp.dim() - 2
    v = xp
    for axis in range(nsp):  # [N, C, out..., window...]
        v = v.unfold(2 + axis, geo.window[axis], geo.stride[axis])
    return v.reshape(*v.shape[: 2 + nsp], -1).argmax(-1)


@implements("resample")
def resample(call: Call) -> list[Any]:
    import torch
    import torch.nn.functional as F

    op = call.node.op_as(Resample)
    x = call.tensor("input")
    nsp = x.dim() - 2
    geo = op.geometry(None, tuple(x.shape))
    spec = _pad_spec(geo.pre_padding, geo.post_padding)
    if op.mode is ResampleMode.MAX:
        pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nsp]
        xp = F.pad(x, spec, value=-math.inf) if any(spec) else x
        if not call.wants("index"):
            return [pool(xp, geo.window, geo.stride), None]
        return [pool(xp, geo.window, geo.stride), _window_index(xp, geo)]
    avg_pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nsp]
    xp = F.pad(x, spec) if any(spec) else x
    y = avg_pool(xp, geo.window, geo.stride)
    if op.mode is ResampleMode.AVG_EXCLUDE_PADDING and any(spec):
        ones = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
        # the fraction of each window that is real data (exact: counts / prod(window))
        real = avg_pool(F.pad(ones, spec), geo.window, geo.stride)
        y = y / real
    return [y, None]


def _pool(x: Any, mode: ResampleMode, geo: PoolGeometry) -> Any:
    """Pooling of x with explicit padding (what the backward differentiates)."""
    import torch.nn.functional as F

    nsp = x.dim() - 2
    spec = _pad_spec(geo.pre_padding, geo.post_padding)
    fn = {1: (F.max_pool1d, F.avg_pool1d), 2: (F.max_pool2d, F.avg_pool2d), 3: (F.max_pool3d, F.avg_pool3d)}[nsp]
    if mode is ResampleMode.MAX:
        return fn[0](F.pad(x, spec, value=-math.inf), geo.window, geo.stride)
    total = fn[1](F.pad(x, spec), geo.window, geo.stride)
    if mode is ResampleMode.AVG_INCLUDE_PADDING:
        return total
    count = fn[1](F.pad(x.new_ones((1, 1, *x.shape[2:])), spec), geo.window, geo.stride)
    return total / count


def _autograd_backward(x: Any, dy: Any, mode: ResampleMode, geo: PoolGeometry) -> Any:
    import torch

    with torch.enable_grad():
        xr = x.detach().requires_grad_(True)
        (dx,) = torch.autograd.grad(_pool(xr, mode, geo), xr, dy)
    return dx


@implements("resample_avg_backward")
def resample_avg_backward(call: Call) -> list[Any]:
    import torch

    op = call.node.op_as(ResampleAvgBackward)
    dy = call.tensor("grad")
    x = torch.zeros(op.in_dim, dtype=dy.dtype, device=dy.device)
    return [_autograd_backward(x, dy, op.mode, op.geometry(tuple(dy.shape), op.in_dim))]


@implements("resample_max_backward")
def resample_max_backward(call: Call) -> list[Any]:
    import torch

    op = call.node.op_as(ResampleMaxBackward)
    dy, x = call.tensor("grad"), call.tensor("input")
    geo = op.geometry(tuple(dy.shape), tuple(x.shape))
    nsp = x.dim() - 2
    w, s, pre = geo.window, geo.stride, geo.pre_padding
    if nsp in (2, 3) and pre == geo.post_padding and all(2 * p <= k for p, k in zip(pre, w)):
        # PyTorch's own pooling kernels, padding implicit: no padded copy of x and no autograd graph (the
        # autograd route took 1.5 ms of host and device time for ResNet's stem pool at batch 64)
        aten = torch.ops.aten
        fwd, bwd = (
            (aten.max_pool2d_with_indices, aten.max_pool2d_with_indices_backward)
            if nsp == 2
            else (aten.max_pool3d_with_indices, aten.max_pool3d_with_indices_backward)
        )
        ones = [1] * nsp
        _, indices = fwd(x, list(w), list(s), list(pre), ones, False)
        return [bwd(dy, x, list(w), list(s), list(pre), ones, False, indices)]
    return [_autograd_backward(x, dy, ResampleMode.MAX, geo)]
