"""Resample (pooling) in torch: F.max_pool{1,2,3}d / F.avg_pool{1,2,3}d over an explicitly padded
input (F.pad with -inf for MAX, 0 for the averages), so any asymmetric padding below the window
works (torch's own padding argument is symmetric and at most window // 2).

MAX with an index: the reference's index is the row-major position within the window,
k_0 * w_1 * w_2 + k_1 * w_2 + k_2; the windows are unfolded and argmax'ed (the first maximum, the
first NaN: the reference's rule, which max_pool's own indices do not follow for NaN).
AVG_EXCLUDE_PADDING divides the window sum by the count of real positions, pooled from a mask.
"""

from __future__ import annotations

import math
from typing import Any

from ...ops.pooling import Resample, ResampleMode
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
