"""Causal depthwise 1-D convolution (cuDNN's `cudnn.ops.causal_conv1d`, the Mamba / Hyena mixer) and its
backward:

    x [B, D, L], weight [D, K], bias [D] (optional), activation IDENTITY or SILU
    z[b, d, t] = bias[d] + sum_k weight[d, k] * x[b, d, t - (K - 1) + k]      (x at t < 0 is 0)
    y = activation(z)                                                          [B, D, L]

causal_conv1d_backward(grad dy, x, weight, bias) recomputes z and gives
    dz = dy * activation'(z)                      (silu'(z) = s (1 + z (1 - s)), s = sigmoid(z))
    dx[b, d, t] = sum_k weight[d, k] * dz[b, d, t + (K - 1) - k]   (dz past L is 0)
    dweight[d, k] = sum_{b, t} dz[b, d, t] * x[b, d, t - (K - 1) + k]
    dbias[d] = sum_{b, t} dz[b, d, t]
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import AttributeValueError, DataTypeError, ShapeError
from ..core.op import NodeContext, Op, TensorSpec, graph_method, register_op
from .base import strides_like

if TYPE_CHECKING:
    from ..core.tensor import Tensor


class Conv1dActivation(enum.Enum):
    IDENTITY = "identity"
    SILU = "silu"


def as_activation(value: Any, label: str) -> Conv1dActivation:
    if isinstance(value, Conv1dActivation):
        return value
    for a in Conv1dActivation:
        if isinstance(value, str) and value.lower() in (a.value, a.name.lower()):
            return a
    raise AttributeValueError(
        f"activation={value!r} is not 'identity' or 'silu'",
        op=label,
        rule="causal_conv1d.activation",
        hint="pass activation='identity' or 'silu'",
    )


def _check(ctx: NodeContext, roles: tuple[str, ...]) -> tuple[int, int, int, int]:
    """(B, D, L, K) with the shape and type rules of the family."""
    x, w = ctx.tensor("input"), ctx.tensor("weight")
    if len(x.dim) != 3:
        ctx.error(
            ShapeError,
            f"input has dims {list(x.dim)}; causal_conv1d takes [B, D, L]",
            tensor="input",
            rule="causal_conv1d.dims",
            hint="give the input as [batch, channels, sequence]",
        )
    b, d, length = x.dim
    if len(w.dim) != 2 or w.dim[0] != d or w.dim[1] < 1:
        ctx.error(
            ShapeError,
            f"weight has dims {list(w.dim)}, expected [{d}, K]",
            tensor="weight",
            rule="causal_conv1d.dims",
            hint="one filter of K taps per channel: weight [D, K]",
        )
    if ctx.has("bias") and ctx.tensor("bias").dim not in ((d,), (1, d, 1)):
        ctx.error(
            ShapeError,
            f"bias has dims {list(ctx.tensor('bias').dim)}, expected [{d}]",
            tensor="bias",
            rule="causal_conv1d.dims",
            hint="one bias per channel: bias [D]",
        )
    for role in roles:
        if ctx.has(role) and not ctx.tensor(role).data_type.is_floating:
            ctx.error(
                DataTypeError,
                f"input '{role}' has data type {ctx.tensor(role).data_type.name}",
                tensor=role,
                rule="causal_conv1d.dtype",
                hint="causal_conv1d takes floating tensors",
            )
    return b, d, length, w.dim[1]


def pre_activation(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """z of the module docstring (float64)."""
    _, _, length = x.shape
    k = w.shape[1]
    padded = np.concatenate([np.zeros(x.shape[:2] + (k - 1,)), x], axis=2)
    z = sum(w[None, :, j, None] * padded[:, :, j : j + length] for j in range(k))
    return z + (0.0 if bias is None else bias.reshape(1, -1, 1))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


@register_op
@dataclass(frozen=True, kw_only=True)
class CausalConv1d(Op):
    """y = activation(causal depthwise conv1d(x, weight) + bias) (see the module docstring)."""

    kind = "causal_conv1d"
    INPUTS = ("input", "weight", "bias")
    OUTPUTS = ("y",)
    OPTIONAL_INPUTS = frozenset({"bias"})
    activation: Conv1dActivation = Conv1dActivation.IDENTITY

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        _check(ctx, self.INPUTS)
        x = ctx.tensor("input")
        return [TensorSpec(x.dim, strides_like(x.dim, x))]

    def reference(self, ins, outs):
        x, w, bias = ins
        z = pre_activation(x, w, None if bias is None else bias.reshape(-1))
        return [z * _sigmoid(z) if self.activation is Conv1dActivation.SILU else z]


@register_op
@dataclass(frozen=True, kw_only=True)
class CausalConv1dBackward(Op):
    """dx, dweight, dbias of causal_conv1d from dy, x, weight and bias (see the module docstring)."""

    kind = "causal_conv1d_backward"
    INPUTS = ("grad", "input", "weight", "bias")
    OUTPUTS = ("dx", "dweight", "dbias")
    OPTIONAL_INPUTS = frozenset({"bias"})
    activation: Conv1dActivation = Conv1dActivation.IDENTITY

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        _, d, _, k = _check(ctx, self.INPUTS)
        x, dy = ctx.tensor("input"), ctx.tensor("grad")
        if dy.dim != x.dim:
            ctx.error(
                ShapeError,
                f"grad has dims {list(dy.dim)}, the input {list(x.dim)}",
                tensor="grad",
                rule="causal_conv1d.dims",
                hint="pass dy = dL/dy of the forward's output",
            )
        w = ctx.tensor("weight")
        b = ctx.input("bias")
        bdim = tuple(b.dim) if b is not None and hasattr(b, "dim") else (d,)
        return [
            TensorSpec(x.dim, strides_like(x.dim, x)),
            TensorSpec(w.dim, strides_like(w.dim, w)),
            TensorSpec(bdim, strides_like(bdim, None)),
        ]

    def reference(self, ins, outs):
        dy, x, w, bias = ins
        length, k = x.shape[2], w.shape[1]
        z = pre_activation(x, w, None if bias is None else bias.reshape(-1))
        if self.activation is Conv1dActivation.SILU:
            s = _sigmoid(z)
            dz = dy * s * (1.0 + z * (1.0 - s))
        else:
            dz = dy
        padded_x = np.concatenate([np.zeros(x.shape[:2] + (k - 1,)), x], axis=2)
        padded_dz = np.concatenate([dz, np.zeros(dz.shape[:2] + (k - 1,))], axis=2)
        dx = sum(w[None, :, j, None] * padded_dz[:, :, k - 1 - j : k - 1 - j + length] for j in range(k))
        dw = np.stack([(dz * padded_x[:, :, j : j + length]).sum(axis=(0, 2)) for j in range(k)], axis=1)
        db = dz.sum(axis=(0, 2))
        return [dx, dw, None if outs[2] is None else db.reshape(outs[2].dim)]


@graph_method
def causal_conv1d(
    self,
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: Any = "identity",
    compute_data_type: Any = None,
    name: str = "",
) -> Tensor:
    """Causal depthwise 1-D convolution with an optional fused activation (cuDNN's causal_conv1d).

    Shapes: input [B, D, L]; weight [D, K]; bias [D] (optional); y [B, D, L].

    Layouts: any strides; y takes the input's axis order.

    Types: floating tensors; computed in `compute_data_type` (default FLOAT).

    Formula: `y[b, d, t] = act(bias[d] + sum_k weight[d, k] * x[b, d, t - K + 1 + k])`, x at t < 0 read
    as 0; act is the identity or SiLU.

    Args:
        input: x.
        weight: one filter of K taps per channel.
        bias: one bias per channel (optional).
        activation: "identity" or "silu".
        compute_data_type: the accumulation type.
        name: the op's name.

    Returns:
        y.

    Example:
        ```python
        y = g.causal_conv1d(x, w, b, activation="silu")
        ```
    """
    op = CausalConv1d(activation=as_activation(activation, f"causal_conv1d '{name}'"))
    return self._add_op(op, [input, weight, bias], name=name, compute_data_type=compute_data_type)[0]


@graph_method
def causal_conv1d_backward(
    self,
    grad: Tensor,
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: Any = "identity",
    compute_data_type: Any = None,
    name: str = "",
) -> list[Tensor | None]:
    """The gradients of causal_conv1d: [dx, dweight, dbias].

    Shapes: grad and input [B, D, L]; weight [D, K]; bias [D] (optional); dx as the input, dweight as
    weight, dbias [D].

    Layouts: any strides; dx takes the input's axis order.

    Types: floating tensors; computed in `compute_data_type` (default FLOAT).

    Formula: with z the forward's pre-activation and `dz = dy * act'(z)`:
    `dx[t] = sum_k weight[k] * dz[t + K - 1 - k]`, `dweight[k] = sum_{b,t} dz[t] * x[t - K + 1 + k]`,
    `dbias = sum_{b,t} dz`.

    Args:
        grad: dy.
        input: the forward's x.
        weight: the forward's weight.
        bias: the forward's bias (optional: without it z has none).
        activation: the forward's activation.
        compute_data_type: the accumulation type.
        name: the op's name.

    Returns:
        [dx, dweight, dbias].

    Example:
        ```python
        dx, dw, db = g.causal_conv1d_backward(dy, x, w, b, activation="silu")
        ```
    """
    op = CausalConv1dBackward(activation=as_activation(activation, f"causal_conv1d_backward '{name}'"))
    return self._add_op(op, [grad, input, weight, bias], name=name, compute_data_type=compute_data_type)
