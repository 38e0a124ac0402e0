"""Pointwise ops in torch: every PointwiseMode, with the formulas of opgraph.ops.pointwise.

Operands are in the compute type; 1-element operands and literals broadcast to anything. Each mode
is one to a few torch elementwise kernels (one read of each operand, one write).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ...core.errors import expect
from ...ops.pointwise import MODES, Pointwise, PointwiseMode
from .common import Call, implements

M = PointwiseMode
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _torch():
    import torch

    return torch


def _nz(a):
    return a != 0


def _phi(x):
    return 0.5 * (1.0 + _torch().erf(x * _INV_SQRT_2))


def _half_1p_tanh(u):
    """(1 + tanh(u)) / 2 = sigmoid(2u) without the cancellation for u << 0 (see opgraph.ops.pointwise)."""
    torch = _torch()
    e = torch.exp(-2.0 * u.abs())
    return torch.where(u >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _gelu_tanh(x):
    return x * _half_1p_tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))


def _sech2(x):
    """1 - tanh(x)**2 without the cancellation for large |x| (see opgraph.ops.pointwise)."""
    e = _torch().exp(-2.0 * x.abs())
    return 4.0 * e / ((1.0 + e) * (1.0 + e))


def _sigmoid_grad(x):
    e = _torch().exp(-x.abs())
    return e / ((1.0 + e) * (1.0 + e))


def _gelu_tanh_grad(x):
    inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
    return _half_1p_tanh(inner) + 0.5 * x * _sech2(inner) * _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)


def _softplus(x, beta):
    z = beta * x  # log(1 + exp(z)) without overflow: max(z, 0) + log1p(exp(-|z|))
    torch = _torch()
    return (torch.clamp(z, min=0) + torch.log1p(torch.exp(-torch.abs(z)))) / beta


def _relu(x, lower_clip, upper_clip, negative_slope):
    torch = _torch()
    y = torch.minimum(x, upper_clip)
    # slope 0 is exactly the clip, also at x = -inf (0 * inf would be NaN)
    below = torch.where(negative_slope == 0, lower_clip, lower_clip + negative_slope * (x - lower_clip))
    return torch.where(x < lower_clip, below, y)


def _relu_bwd(dy, x, lower_clip, upper_clip, negative_slope):
    torch = _torch()
    one, zero = torch.ones_like(negative_slope), torch.zeros_like(negative_slope)
    slope = torch.where(x <= lower_clip, negative_slope, torch.where(x >= upper_clip, zero, one))
    return dy * slope


def _swish_bwd(dy, x, swish_beta):
    s = _torch().sigmoid(swish_beta * x)
    return dy * (s + swish_beta * x * s * (1.0 - s))


def _table() -> dict[PointwiseMode, Callable[..., Any]]:
    torch = _torch()
    return {
        M.ADD: torch.add,
        M.SUB: torch.sub,
        M.MUL: torch.mul,
        M.DIV: torch.div,
        M.MAX: torch.maximum,
        M.MIN: torch.minimum,
        M.POW: torch.pow,
        M.MOD: torch.fmod,
        M.ADD_SQUARE: lambda a, b: a + b * b,
        M.CMP_EQ: torch.eq,
        M.CMP_NEQ: torch.ne,
        M.CMP_GT: torch.gt,
        M.CMP_GE: torch.ge,
        M.CMP_LT: torch.lt,
        M.CMP_LE: torch.le,
        M.LOGICAL_AND: lambda a, b: _nz(a) & _nz(b),
        M.LOGICAL_OR: lambda a, b: _nz(a) | _nz(b),
        M.LOGICAL_NOT: lambda a: ~_nz(a),
        M.BINARY_SELECT: lambda a, b, mask: torch.where(_nz(mask), a, b),
        M.IDENTITY: lambda a: a,
        M.SQRT: torch.sqrt,
        M.RSQRT: lambda a: 1.0 / torch.sqrt(a),
        M.EXP: torch.exp,
        M.LOG: torch.log,
        M.NEG: torch.neg,
        M.ABS: torch.abs,
        M.CEIL: torch.ceil,
        M.FLOOR: torch.floor,
        M.RECIPROCAL: lambda a: 1.0 / a,
        M.SIN: torch.sin,
        M.COS: torch.cos,
        M.TAN: torch.tan,
        M.ERF: torch.erf,
        M.TANH_FWD: torch.tanh,
        M.SIGMOID_FWD: torch.sigmoid,
        M.ELU_FWD: lambda x, alpha: torch.where(x > 0, x, alpha * torch.expm1(x)),
        M.GELU_FWD: lambda x: x * _phi(x),
        M.GELU_APPROX_TANH_FWD: _gelu_tanh,
        M.SOFTPLUS_FWD: _softplus,
        M.SWISH_FWD: lambda x, swish_beta: x * torch.sigmoid(swish_beta * x),
        M.RELU_FWD: _relu,
        M.RELU_BWD: _relu_bwd,
        M.TANH_BWD: lambda dy, x: dy * _sech2(x),
        M.SIGMOID_BWD: lambda dy, x: dy * _sigmoid_grad(x),
        M.ELU_BWD: lambda dy, x, alpha: dy * torch.where(x > 0, torch.ones_like(x), alpha * torch.exp(x)),
        M.GELU_BWD: lambda dy, x: dy * (_phi(x) + x * torch.exp(-0.5 * x * x) * _INV_SQRT_2PI),
        M.GELU_APPROX_TANH_BWD: lambda dy, x: dy * _gelu_tanh_grad(x),
        M.SOFTPLUS_BWD: lambda dy, x, beta: dy * torch.sigmoid(beta * x),
        M.SWISH_BWD: _swish_bwd,
    }


_TABLE: dict[PointwiseMode, Callable[..., Any]] = {}


def formula(mode: PointwiseMode) -> Callable[..., Any]:
    if not _TABLE:
        _TABLE.update(_table())
    return _TABLE[mode]


@implements("pointwise", "stop_gradient")  # (stop_gradient: a Pointwise IDENTITY of its own kind)
def pointwise(call: Call) -> list[Any]:
    op = call.node.op_as(Pointwise)
    out = call.out("output")
    assert out is not None
    torch = _torch()
    if op.mode is PointwiseMode.GEN_INDEX:
        axis = expect(op.axis, "GEN_INDEX's axis")
        shape = [1] * len(out.dim)
        shape[axis] = out.dim[axis]
        return [torch.arange(out.dim[axis], dtype=call.compute, device=call.device).reshape(shape)]
    info = MODES[op.mode]
    roles = op.input_roles()
    operands = [call.operand(r) for r in roles[: info.arity]]
    params = {name: call.scalar(name, default) for name, default in info.params}
    return [formula(op.mode)(*operands, **params)]
