"""The two custom ops of pooling's backward, registered when the op families are imported (so a plan
file that holds them loads in any process):

    resample_avg_backward(dy; in_dim, window, stride, pre_padding, post_padding, mode) -> dx
        dx[i] = sum over the windows o that hold i of dy[o] / count(o), count = prod(window)
        (AVG_INCLUDE_PADDING) or the number of non-padded positions of o (AVG_EXCLUDE_PADDING)
    resample_max_backward(dy, x; window, stride, pre_padding, post_padding) -> dx
        dx[i] = sum over the windows o whose first maximum (padding is -inf) is i of dy[o]
        (PyTorch's rule: one position per window gets the gradient, the first one on a tie)

No built-in op expresses them (average pooling backward is a transposed depthwise convolution with a
constant filter, and graphs have no constant tensors; max pooling backward scatters each gradient to
its window's argmax). ConvGeometry parameters are comma-separated ints (custom-op parameters are plain
values). Each op has a NumPy reference and a PyTorch implementation; the reference engine runs them
everywhere, the torch engine on the GPU. autodiff/rules_pooling.py emits them.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import AttributeValueError, ShapeError
from .builtin_custom import ints
from .custom import CUSTOM_OPS, register_custom_op
from .pooling import ResampleMode

AVG_BACKWARD = "resample_avg_backward"
MAX_BACKWARD = "resample_max_backward"


def _scatter(contrib, dims, out, window, stride, pre, post):
    """Sum, per window tap, contrib(tap number, tap) (an array of dy's dims) onto the padded input
    positions o*s + tap, then crop the padding: a float64 array of `dims`."""
    padded = [d + p + q for d, p, q in zip(dims[2:], pre, post)]
    dxp = np.zeros((*dims[:2], *padded))
    for k, tap in enumerate(np.ndindex(*window)):
        target = tuple(slice(t, t + (o - 1) * s + 1, s) for t, o, s in zip(tap, out, stride))
        at = (Ellipsis, *target)
        dxp[at] += contrib(k, tap)
    crop = (Ellipsis, *(slice(p, p + d) for p, d in zip(pre, dims[2:])))
    return dxp[crop]


def geometry(window: str, stride: str, pre_padding: str, post_padding: str, nsp: int):
    """(window, stride, pre, post) per spatial axis from the ops' text parameters (one value: every axis)."""
    def full(v):
        v = ints(v)
        return v * nsp if len(v) == 1 else v

    return full(window), full(stride), full(pre_padding), full(post_padding)


def _avg_backward_ref(dy, *, in_dim, mode, window, stride, pre_padding, post_padding):
    dims = ints(in_dim)
    w, s, pre, post = geometry(window, stride, pre_padding, post_padding, len(dims) - 2)
    if mode == ResampleMode.AVG_INCLUDE_PADDING.value:
        g = dy / math.prod(w)
    else:
        ones = np.pad(np.ones(dims[2:]), list(zip(pre, post)))
        v = np.lib.stride_tricks.sliding_window_view(ones, w)
        v = v[tuple(slice(None, None, st) for st in s)]
        g = dy / v.reshape(*v.shape[: len(w)], -1).sum(axis=-1)
    return _scatter(lambda k, tap: g, dims, dy.shape[2:], w, s, pre, post)


def _max_backward_ref(dy, x, *, window, stride, pre_padding, post_padding):
    w, s, pre, post = geometry(window, stride, pre_padding, post_padding, x.ndim - 2)
    nsp = len(w)
    xp = np.pad(x, [(0, 0), (0, 0), *zip(pre, post)], constant_values=-np.inf)
    v = np.lib.stride_tricks.sliding_window_view(xp, w, axis=tuple(range(2, 2 + nsp)))
    strided = (slice(None), slice(None), *(slice(None, None, st) for st in s))
    v = v[strided]
    arg = np.argmax(v.reshape(*v.shape[: 2 + nsp], -1), axis=-1)  # the first maximum (or NaN)
    return _scatter(lambda k, tap: np.where(arg == k, dy, 0.0), x.shape, dy.shape[2:], w, s, pre, post)


def _torch_pool(x, mode: str, w, s, pre, post):
    import torch.nn.functional as F

    nsp = len(w)
    pads = [p for a in reversed(range(nsp)) for p in (pre[a], post[a])]
    fn = {1: (F.max_pool1d, F.avg_pool1d), 2: (F.max_pool2d, F.avg_pool2d), 3: (F.max_pool3d, F.avg_pool3d)}[nsp]
    if mode == ResampleMode.MAX.value:
        return fn[0](F.pad(x, pads, value=float("-inf")), w, s)
    total = fn[1](F.pad(x, pads), w, s)
    if mode == ResampleMode.AVG_INCLUDE_PADDING.value:
        return total
    count = fn[1](F.pad(x.new_ones((1, 1, *x.shape[2:])), pads), w, s)
    return total / count


def _torch_backward(x, dy, mode, params):
    import torch

    w, s, pre, post = geometry(params["window"], params["stride"], params["pre_padding"], params["post_padding"],
                                x.dim() - 2)
    with torch.enable_grad():
        xr = x.detach().requires_grad_(True)
        (dx,) = torch.autograd.grad(_torch_pool(xr, mode, w, s, pre, post), xr, dy)
    return dx


def _avg_backward_torch(dy, **params):
    import torch

    x = torch.zeros(ints(params["in_dim"]), dtype=dy.dtype, device=dy.device)
    return _torch_backward(x, dy, params["mode"], params)


def _max_backward_torch(dy, x, **params):
    import torch

    nsp = x.dim() - 2
    w, s, pre, post = geometry(params["window"], params["stride"], params["pre_padding"], params["post_padding"], nsp)
    if nsp in (2, 3) and pre == post and all(2 * p <= k for p, k in zip(pre, w)):
        # PyTorch's own pooling kernels, padding implicit: no padded copy of x and no autograd graph (the
        # autograd route below took 1.5 ms of host and device time for ResNet's stem pool at batch 64)
        aten = torch.ops.aten
        fwd, bwd = ((aten.max_pool2d_with_indices, aten.max_pool2d_with_indices_backward) if nsp == 2 else
                    (aten.max_pool3d_with_indices, aten.max_pool3d_with_indices_backward))
        ones = [1] * nsp
        _, indices = fwd(x, list(w), list(s), list(pre), ones, False)
        return bwd(dy, x, list(w), list(s), list(pre), ones, False, indices)
    return _torch_backward(x, dy, ResampleMode.MAX.value, params)


def checked_geometry(name: str, dy_dims, in_dims, params) -> tuple[tuple[int, ...], ...]:
    """(window, stride, pre, post) of a pooling backward op, validated against its tensors: 1-3 spatial
    axes, windows and strides of at least 1, paddings of at least 0, and dy of exactly the pooled dims
    (N, C and each (in + pre + post - window) // stride + 1; no broadcasting), else a graph error."""
    rule, nsp = "pooling_backward.geometry", len(in_dims) - 2
    if not 1 <= nsp <= 3:
        raise ShapeError(f"{name}: the input has {len(in_dims)} dims; pooling takes [N, C, 1 to 3 spatial]",
                         rule=rule, hint="pool a tensor of rank 3, 4 or 5")
    try:
        geo = geometry(str(params["window"]), str(params["stride"]), str(params["pre_padding"]),
                       str(params["post_padding"]), nsp)
    except (KeyError, ValueError) as err:
        raise AttributeValueError(f"{name}: window, stride, pre_padding and post_padding must be comma-separated "
                                  f"ints ({type(err).__name__}: {err})", rule=rule,
                                  hint="build the op through autodiff's resample rule, or pass as_text(ints)") from None
    for label, values, low in zip(("window", "stride", "pre_padding", "post_padding"), geo, (1, 1, 0, 0)):
        if len(values) != nsp or min(values) < low:
            raise AttributeValueError(f"{name}: {label} {list(values)} needs {nsp} values of at least {low} (one "
                                      f"per spatial axis)", rule=rule, hint=f"give {label} for every spatial axis")
    w, st, pre, post = geo
    out = tuple((d + a + b - k) // t + 1 for d, a, b, k, t in zip(in_dims[2:], pre, post, w, st))
    want = (*in_dims[:2], *out)
    if min(out) < 1 or tuple(dy_dims) != want:
        raise ShapeError(f"{name}: dy has dims {list(dy_dims)}; pooling {list(in_dims)} with window {list(w)}, "
                         f"stride {list(st)}, padding {list(pre)} / {list(post)} gives {list(want)}", rule=rule,
                         hint="pass the gradient of the pooled output, of the pooled output's dims")
    return geo


def _infer_avg(dy, **p):
    if p.get("mode") not in (ResampleMode.AVG_INCLUDE_PADDING.value, ResampleMode.AVG_EXCLUDE_PADDING.value):
        raise AttributeValueError(f"{AVG_BACKWARD}: mode {p.get('mode')!r} is not an average pooling mode",
                                  rule="pooling_backward.mode", hint="mode='avg_include_padding' or 'avg_exclude_padding'")
    dims = ints(str(p["in_dim"]))
    checked_geometry(AVG_BACKWARD, dy.dim, dims, p)
    return [dims]


def _infer_max(dy, x, **p):
    checked_geometry(MAX_BACKWARD, dy.dim, x.dim, p)
    return [x.dim]


# the built-in definitions (an engine that generates these ops checks that a graph's op is still this one)
REFERENCES = {MAX_BACKWARD: _max_backward_ref, AVG_BACKWARD: _avg_backward_ref}


def ensure_registered() -> None:
    """Register the custom ops (again, if a test emptied the registry)."""
    if AVG_BACKWARD not in CUSTOM_OPS:
        register_custom_op(AVG_BACKWARD, num_inputs=1, reference=_avg_backward_ref, torch=_avg_backward_torch,
                           infer=_infer_avg)
    if MAX_BACKWARD not in CUSTOM_OPS:
        register_custom_op(MAX_BACKWARD, num_inputs=2, reference=_max_backward_ref, torch=_max_backward_torch,
                           infer=_infer_max)


ensure_registered()
