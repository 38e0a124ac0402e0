"""Backward rules of the GEMM-class ops: convolutions and matmul.

    conv_fprop  Y = conv(X, W)      dX = conv_dgrad(dY, W), dW = conv_wgrad(X, dY)
    conv_dgrad  DX = dgrad(DY, W)   dDY = conv_fprop(dDX, W), dW = conv_wgrad(dDX, DY)
    conv_wgrad  DW = wgrad(X, DY)   dX = conv_dgrad(DY, dDW), dDY = conv_fprop(X, dDW)
    matmul      C = A @ B           dA = dC @ B^T, dB = A^T @ dC (summed over broadcast batch axes; a B
                                    shared by the whole batch gets one GEMM over the batch's rows)

Every backward conv keeps the forward's padding, stride, dilation and convolution mode, and has its
output dims set explicitly (dgrad's image dims are ambiguous for stride > 1, wgrad's filter dims for
groups > 1). Transposes are layout ops whose strides make them views of the operand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..core.tensor import Tensor
from ..ops.conv import ConvDgrad, ConvFprop, ConvWgrad, _Conv
from ..ops.matmul import Matmul
from .rules import RuleContext, Value, register_rule


def _attrs(op: _Conv) -> dict:
    return {
        "pre_padding": op.pre_padding,
        "post_padding": op.post_padding,
        "stride": op.stride,
        "dilation": op.dilation,
        "convolution_mode": op.convolution_mode,
    }


def _fprop(ctx: RuleContext, x: Value | None, w: Value | None, dims: Sequence[int]) -> Tensor:
    return ctx.b.op(ConvFprop(**_attrs(ctx.op_as(_Conv))), [x, w], ["Y"], [dims], tag="fprop")[0]


def _dgrad(ctx: RuleContext, dy: Value | None, w: Value | None, dims: Sequence[int]) -> Tensor:
    return ctx.b.op(ConvDgrad(**_attrs(ctx.op_as(_Conv))), [dy, w], ["DX"], [dims], tag="dgrad")[0]


def _wgrad(ctx: RuleContext, x: Value | None, dy: Value | None, dims: Sequence[int]) -> Tensor:
    return ctx.b.op(ConvWgrad(**_attrs(ctx.op_as(_Conv))), [x, dy], ["DW"], [dims], tag="wgrad")[0]


@register_rule("conv_fprop", inputs=("image", "weight"))
def conv_fprop(ctx: RuleContext):
    dy = ctx.grad_full("Y")
    out = {}
    if ctx.needs("image"):
        out["image"] = _dgrad(ctx, dy, ctx.input("weight"), ctx.tensor_desc("image").dim)
    if ctx.needs("weight"):
        out["weight"] = _wgrad(ctx, ctx.input("image"), dy, ctx.tensor_desc("weight").dim)
    return out


@register_rule("conv_dgrad", inputs=("loss", "filter"))
def conv_dgrad(ctx: RuleContext):
    ddx = ctx.grad_full("DX")
    out = {}
    if ctx.needs("loss"):
        out["loss"] = _fprop(ctx, ddx, ctx.input("filter"), ctx.tensor_desc("loss").dim)
    if ctx.needs("filter"):
        out["filter"] = _wgrad(ctx, ddx, ctx.input("loss"), ctx.tensor_desc("filter").dim)
    return out


@register_rule("conv_wgrad", inputs=("image", "loss"))
def conv_wgrad(ctx: RuleContext):
    ddw = ctx.grad_full("DW")
    out = {}
    if ctx.needs("image"):
        out["image"] = _dgrad(ctx, ctx.input("loss"), ddw, ctx.tensor_desc("image").dim)
    if ctx.needs("loss"):
        out["loss"] = _fprop(ctx, ctx.input("image"), ddw, ctx.tensor_desc("loss").dim)
    return out


def _swap_last(rank: int) -> tuple[int, ...]:
    return (*range(rank - 2), rank - 1, rank - 2)


@register_rule("matmul", inputs=("A", "B"))
def matmul(ctx: RuleContext):
    b = ctx.b
    dc = ctx.grad_full("C")
    c = ctx.result_desc("C")
    a_desc, b_desc = ctx.tensor_desc("A"), ctx.tensor_desc("B")
    rank = len(c.dim)
    batch = c.dim[:-2]
    out = {}
    if ctx.needs("A"):
        bt = b.transpose(ctx.tensor("B"), _swap_last(rank))
        out["A"] = b.op(Matmul(), [dc, bt], ["C"], [(*batch, a_desc.dim[-2], a_desc.dim[-1])], tag="dA")[0]
    if ctx.needs("B"):
        a = ctx.tensor("A")
        if (
            rank > 2
            and math.prod(b_desc.dim[:-2]) == 1
            and tuple(a_desc.dim[:-2]) == tuple(batch)
            and math.prod(batch) != 1
        ):
            # B shared by the batch (a linear layer's weight): one GEMM over all rows, not one per
            # batch entry and a sum (the reshapes are views of tensors in memory)
            rows, ones = math.prod(batch) * a_desc.dim[-2], (1,) * (rank - 2)
            a, dc = b.reshape(a, (*ones, rows, a_desc.dim[-1])), b.reshape(dc, (*ones, rows, c.dim[-1]))
            batch = ones
        at = b.transpose(a, _swap_last(rank))
        out["B"] = b.op(Matmul(), [at, dc], ["C"], [(*batch, b_desc.dim[-2], b_desc.dim[-1])], tag="dB")[0]
    return out
