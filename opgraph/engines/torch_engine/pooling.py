"""Resample (pooling) in torch: F.max_pool{1,2,3}d / F.avg_pool{1,2,3}d over an explicitly padded
input (F.pad with -inf for MAX, 0 for the averages), so any asymmetric padding below the window
works (torch's own padding argument is symmetric and at most window // 2).

MAX with an index: torch's index is the flat position in the (padded) input plane; the reference's
is the row-major position within the window, k_0 * w_1 * w_2 + k_1 * w_2 + k_2, with k = position -
o * stride per axis. Ties go to the first maximum in both. (With several NaNs in one window torch
reports the last NaN where the reference reports the first; the pooled value is NaN in both.)
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


def _window_index(flat: Any, padded: tuple[int, ...], geo) -> Any:
    """Row-major index within the window from torch's flat index into the padded spatial plane."""
    import torch

    nsp = len(padded)
    index = torch.zeros_like(flat)
    rest = flat
    coords = []
    for axis in reversed(range(nsp)):
        coords.append(rest % padded[axis])
        rest = rest // padded[axis]
    coords.reverse()
    for axis in range(nsp):
        shape = [1] * flat.dim()
        shape[2 + axis] = geo.out[axis]
        origin = (torch.arange(geo.out[axis], device=flat.device) * geo.stride[axis]).reshape(shape)
        index = index * geo.window[axis] + (coords[axis] - origin)
    return index


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
        y, flat = pool(xp, geo.window, geo.stride, return_indices=True)
        return [y, _window_index(flat, tuple(xp.shape[2:]), geo)]
    avg_pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nsp]
    xp = F.pad(x, spec) if any(spec) else x
    y = avg_pool(xp, geo.window, geo.stride)
    if op.mode is ResampleMode.AVG_EXCLUDE_PADDING and any(spec):
        ones = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
        # the fraction of each window that is real data (exact: counts / prod(window))
        real = avg_pool(F.pad(ones, spec), geo.window, geo.stride)
        y = y / real
    return [y, None]
