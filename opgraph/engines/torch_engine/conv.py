"""Convolutions in torch: conv_fprop through F.conv{1,2,3}d, conv_dgrad and conv_wgrad through
torch.nn.grad.conv{1,2,3}d_input / _weight (cuDNN on CUDA, oneDNN or native on the CPU).

ConvGeometry: groups = C / W.dim[1]; symmetric padding goes to torch as is, asymmetric padding is applied
with F.pad (fprop, wgrad) or by computing the gradient of the padded image and cropping it (dgrad);
CONVOLUTION mode flips the filter (fprop, dgrad) or the filter gradient (wgrad) in every spatial axis.

Types: see gemm.py (exact fp32 or fp64; fp16/bf16 natively or fp32 with TF32 on CUDA where that is
exact; integer operands in float64, exact while partial sums stay below 2**53).
"""

from __future__ import annotations

from typing import Any

from ...ops.conv import ConvolutionMode, _Conv
from . import gemm
from .common import Call, implements


def _operands(call: Call, first: str, second: str, out_role: str):
    """Both operands in the type the convolution runs in, and whether TF32 may be used."""
    a, b, out = call.desc(first), call.desc(second), call.out(out_role)
    assert a is not None and b is not None and out is not None
    dtype, tf32 = gemm.plan(call, a, b, out)
    return call.tensor(first, dtype), call.tensor(second, dtype), tf32


def _geometry(call: Call, nsp: int):
    return call.node.op_as(_Conv).geometry(nsp)


def _flip(w: Any) -> Any:
    return w.flip(dims=tuple(range(2, w.dim())))


def _functional(nsp: int):
    import torch.nn.functional as F

    return {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nsp]


def _grad_fns(nsp: int):
    import torch.nn.grad as G

    return {
        1: (G.conv1d_input, G.conv1d_weight),
        2: (G.conv2d_input, G.conv2d_weight),
        3: (G.conv3d_input, G.conv3d_weight),
    }[nsp]


def _pad_spec(geo) -> list[int]:
    """F.pad's argument: (pre, post) pairs from the last spatial axis to the first."""
    spec: list[int] = []
    for p0, p1 in reversed(list(zip(geo.pre, geo.post))):
        spec += [p0, p1]
    return spec


def _padded(x: Any, geo) -> tuple[Any, tuple[int, ...]]:
    """x and the padding to give torch: symmetric padding as is, asymmetric applied with F.pad."""
    import torch.nn.functional as F

    if geo.pre == geo.post:
        return x, geo.pre
    return F.pad(x, _pad_spec(geo)), (0,) * len(geo.pre)


@implements("conv_fprop")
def conv_fprop(call: Call) -> list[Any]:
    x, w, tf32 = _operands(call, "image", "weight", "Y")
    nsp = x.dim() - 2
    geo = _geometry(call, nsp)
    if call.node.op_as(_Conv).convolution_mode is ConvolutionMode.CONVOLUTION:
        w = _flip(w)
    x, padding = _padded(x, geo)
    groups = x.shape[1] // w.shape[1]
    with gemm.math_mode(call, tf32):
        return [_functional(nsp)(x, w, None, geo.stride, padding, geo.dilation, groups)]


@implements("conv_dgrad")
def conv_dgrad(call: Call) -> list[Any]:
    dy, w, tf32 = _operands(call, "loss", "filter", "DX")
    out = call.out("DX")
    assert out is not None
    nsp = dy.dim() - 2
    geo = _geometry(call, nsp)
    if call.node.op_as(_Conv).convolution_mode is ConvolutionMode.CONVOLUTION:
        w = _flip(w)
    groups = out.dim[1] // w.shape[1]
    data_grad, _ = _grad_fns(nsp)
    if geo.pre == geo.post:
        with gemm.math_mode(call, tf32):
            return [data_grad(out.dim, w, dy, geo.stride, geo.pre, geo.dilation, groups)]
    # the gradient of the explicitly padded image, cropped back to the image
    padded = [*out.dim[:2], *(x + p0 + p1 for x, p0, p1 in zip(out.dim[2:], geo.pre, geo.post))]
    with gemm.math_mode(call, tf32):
        dxp = data_grad(padded, w, dy, geo.stride, (0,) * nsp, geo.dilation, groups)
    crop = (slice(None), slice(None), *(slice(p0, p0 + x) for p0, x in zip(geo.pre, out.dim[2:])))
    return [dxp[crop]]


@implements("conv_wgrad")
def conv_wgrad(call: Call) -> list[Any]:
    x, dy, tf32 = _operands(call, "image", "loss", "DW")
    out = call.out("DW")
    assert out is not None
    nsp = x.dim() - 2
    geo = _geometry(call, nsp)
    groups = x.shape[1] // out.dim[1]
    x, padding = _padded(x, geo)
    _, weight_grad = _grad_fns(nsp)
    with gemm.math_mode(call, tf32):
        dw = weight_grad(x, out.dim, dy, geo.stride, padding, geo.dilation, groups)
    return [_flip(dw) if call.node.op_as(_Conv).convolution_mode is ConvolutionMode.CONVOLUTION else dw]
