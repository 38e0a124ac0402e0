"""Pointwise ops: one op kind (`pointwise`) whose `mode` picks the math, with NumPy-free broadcasting
rules of cuDNN (operands of equal rank, 1 in broadcast axes; 1-element tensors and Python numbers
broadcast to anything).

Formulas (x = input0, y = input1, dy = the loss, i.e. the incoming gradient):
    ADD x+y   SUB x-y   MUL x*y   DIV x/y   MAX max(x,y)   MIN min(x,y)   POW x**y   MOD fmod(x,y)
    (POW is C99's pow, special values included: 1**nan = 1, (-1)**inf = 1, (-inf)**0.5 = inf,
    0**nan = nan, (-0)**-1 = -inf; MOD is C's fmod)
    ADD_SQUARE x + y*y
    CMP_* 1 where the comparison holds else 0 (BOOLEAN by default); LOGICAL_* on x != 0
    BINARY_SELECT input2 ? input0 : input1
    IDENTITY x (a cast to the output type)   RECIPROCAL 1/x   RSQRT 1/sqrt(x)   ... (unary NumPy math)
    RELU_FWD   lower + negative_slope*(x - lower) if x < lower, min(x, upper_clip) otherwise
               (lower_clip=0, upper_clip=+inf, negative_slope=0 by default: plain relu; leaky relu
               with a slope; relu6 with upper_clip=6)
    RELU_BWD   dy * (1 if lower < x < upper, negative_slope if x <= lower, 0 if x >= upper)
    ELU_FWD    x if x > 0 else alpha*(exp(x)-1)           ELU_BWD dy * (1 if x > 0 else alpha*exp(x))
    GELU_FWD   x*Phi(x) (erf form)                        GELU_BWD dy * (Phi(x) + x*phi(x))
    GELU_APPROX_TANH_FWD 0.5x(1+tanh(k(x+0.044715x^3))), k=sqrt(2/pi), and its exact derivative
    SOFTPLUS_FWD log1p(exp(beta*x))/beta                  SOFTPLUS_BWD dy * sigmoid(beta*x)
    SWISH_FWD  x*sigmoid(swish_beta*x)                    SWISH_BWD dy * (s + beta*x*s*(1-s))
    TANH_BWD   dy*(1-tanh(x)^2)                           SIGMOID_BWD dy*s*(1-s), s = sigmoid(x)
    GEN_INDEX  the index along `axis` of each element of input0's dims (INT32 by default)
Backward modes take the forward *input* x (not the forward output), as cuDNN's do.

stop_gradient(x) = x: a pointwise IDENTITY of its own kind (`StopGradient`): every engine runs and fuses
it as IDENTITY, and opgraph.grad passes no gradient through it (training's cross-entropy shifts the
logits by their row max through it). Built by `opgraph.training.stop_gradient(g, x)`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, expect
from ..core.op import NodeContext, Op, TensorSpec, register_op
from ..core.tensor import TensorDesc
from .base import broadcast_dims, first_tensor
from .custom import LEGACY_CUSTOM


class PointwiseMode(enum.Enum):
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    MIN = "min"
    POW = "pow"
    MOD = "mod"
    ADD_SQUARE = "add_square"
    CMP_EQ = "cmp_eq"
    CMP_NEQ = "cmp_neq"
    CMP_GT = "cmp_gt"
    CMP_GE = "cmp_ge"
    CMP_LT = "cmp_lt"
    CMP_LE = "cmp_le"
    LOGICAL_AND = "logical_and"
    LOGICAL_OR = "logical_or"
    LOGICAL_NOT = "logical_not"
    BINARY_SELECT = "binary_select"
    IDENTITY = "identity"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    EXP = "exp"
    LOG = "log"
    NEG = "neg"
    ABS = "abs"
    CEIL = "ceil"
    FLOOR = "floor"
    RECIPROCAL = "reciprocal"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ERF = "erf"
    TANH_FWD = "tanh"
    SIGMOID_FWD = "sigmoid"
    ELU_FWD = "elu"
    GELU_FWD = "gelu"
    GELU_APPROX_TANH_FWD = "gelu_approx_tanh"
    SOFTPLUS_FWD = "softplus"
    SWISH_FWD = "swish"
    RELU_FWD = "relu"
    GEN_INDEX = "gen_index"
    RELU_BWD = "relu_backward"
    TANH_BWD = "tanh_backward"
    SIGMOID_BWD = "sigmoid_backward"
    ELU_BWD = "elu_backward"
    GELU_BWD = "gelu_backward"
    GELU_APPROX_TANH_BWD = "gelu_approx_tanh_backward"
    SOFTPLUS_BWD = "softplus_backward"
    SWISH_BWD = "swish_backward"

    def __repr__(self) -> str:
        return f"PointwiseMode.{self.name}"


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def erf(x: np.ndarray) -> np.ndarray:
    """Elementwise erf in float64 (math.erf is exact to double precision); float32 in, float32 out
    (what an fp32 evaluation of a formula using it is)."""
    x = np.asarray(x)
    return _erf(x).astype(np.float32) if x.dtype == np.float32 else _erf(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _phi_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + erf(x / math.sqrt(2.0)))


def _half_1p_tanh(u: np.ndarray) -> np.ndarray:
    """(1 + tanh(u)) / 2 = sigmoid(2u), without the cancellation of 1 + tanh(u) for u << 0."""
    e = np.exp(-2.0 * np.abs(u))
    return np.where(u >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return x * _half_1p_tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3))


def _sech2(x: np.ndarray) -> np.ndarray:
    """1 - tanh(x)**2, as 4e / (1 + e)**2 with e = exp(-2|x|): no cancellation for large |x|."""
    e = np.exp(-2.0 * np.abs(x))
    return 4.0 * e / ((1.0 + e) * (1.0 + e))


def _sigmoid_grad(x: np.ndarray) -> np.ndarray:
    """s * (1 - s) for s = sigmoid(x), as e / (1 + e)**2 with e = exp(-|x|)."""
    e = np.exp(-np.abs(x))
    return e / ((1.0 + e) * (1.0 + e))


def _gelu_tanh_grad(x: np.ndarray) -> np.ndarray:
    inner = _SQRT_2_OVER_PI * (x + 0.044715 * x**3)
    return _half_1p_tanh(inner) + 0.5 * x * _sech2(inner) * _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)


def _relu(x: np.ndarray, lower_clip: Any, upper_clip: Any, negative_slope: Any) -> np.ndarray:
    y = np.minimum(x, upper_clip)
    # slope 0 is exactly the clip, also at x = -inf (0 * inf would be NaN)
    below = np.where(negative_slope == 0, lower_clip, lower_clip + negative_slope * (x - lower_clip))
    return np.where(x < lower_clip, below, y)


def _relu_bwd(dy, x, lower_clip, upper_clip, negative_slope):
    slope = np.where(x <= lower_clip, negative_slope, np.where(x >= upper_clip, 0.0, 1.0))
    return dy * slope


def _softplus(x, beta):
    return np.logaddexp(0.0, beta * x) / beta


def _swish_bwd(dy, x, swish_beta):
    s = _sigmoid(swish_beta * x)
    return dy * (s + swish_beta * x * s * (1.0 - s))


def _pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """C99 pow (Annex F.9.4.4; IEEE 754 pow): 1 ** y and x ** 0 are 1 even for NaN, (-1) ** +-inf is 1,
    (-inf) ** y and (+-0) ** y follow the sign rules of odd integer y. np.power is that, except that
    for a one-element or stride-0 exponent of 0.5 it takes sqrt, which gives NaN for -inf and -0 for
    -0 (pow gives +inf and +0): the result would depend on the exponent's shape."""
    return np.where(y == 0.5, np.where(np.isneginf(x), np.inf, np.sqrt(x) + 0.0), np.power(x, y))


def _t(x: np.ndarray) -> np.ndarray:
    return x != 0


def _select(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(_t(mask), a, b)


@dataclass(frozen=True)
class ModeInfo:
    arity: int
    fn: Callable[..., np.ndarray]
    params: tuple[tuple[str, float], ...] = ()  # scalar parameter roles and their defaults
    bool_out: bool = False


_INF = math.inf
_RELU_PARAMS = (("lower_clip", 0.0), ("upper_clip", _INF), ("negative_slope", 0.0))
M = PointwiseMode
MODES: dict[PointwiseMode, ModeInfo] = {
    M.ADD: ModeInfo(2, np.add),
    M.SUB: ModeInfo(2, np.subtract),
    M.MUL: ModeInfo(2, np.multiply),
    M.DIV: ModeInfo(2, np.divide),
    M.MAX: ModeInfo(2, np.maximum),
    M.MIN: ModeInfo(2, np.minimum),
    M.POW: ModeInfo(2, _pow),
    M.MOD: ModeInfo(2, np.fmod),
    M.ADD_SQUARE: ModeInfo(2, lambda a, b: a + b * b),
    M.CMP_EQ: ModeInfo(2, np.equal, bool_out=True),
    M.CMP_NEQ: ModeInfo(2, np.not_equal, bool_out=True),
    M.CMP_GT: ModeInfo(2, np.greater, bool_out=True),
    M.CMP_GE: ModeInfo(2, np.greater_equal, bool_out=True),
    M.CMP_LT: ModeInfo(2, np.less, bool_out=True),
    M.CMP_LE: ModeInfo(2, np.less_equal, bool_out=True),
    M.LOGICAL_AND: ModeInfo(2, lambda a, b: _t(a) & _t(b), bool_out=True),
    M.LOGICAL_OR: ModeInfo(2, lambda a, b: _t(a) | _t(b), bool_out=True),
    M.LOGICAL_NOT: ModeInfo(1, lambda a: ~_t(a), bool_out=True),
    M.BINARY_SELECT: ModeInfo(3, _select),
    M.IDENTITY: ModeInfo(1, lambda a: a),
    M.SQRT: ModeInfo(1, np.sqrt),
    M.RSQRT: ModeInfo(1, lambda a: 1.0 / np.sqrt(a)),
    M.EXP: ModeInfo(1, np.exp),
    M.LOG: ModeInfo(1, np.log),
    M.NEG: ModeInfo(1, np.negative),
    M.ABS: ModeInfo(1, np.abs),
    M.CEIL: ModeInfo(1, np.ceil),
    M.FLOOR: ModeInfo(1, np.floor),
    M.RECIPROCAL: ModeInfo(1, lambda a: 1.0 / a),
    M.SIN: ModeInfo(1, np.sin),
    M.COS: ModeInfo(1, np.cos),
    M.TAN: ModeInfo(1, np.tan),
    M.ERF: ModeInfo(1, erf),
    M.TANH_FWD: ModeInfo(1, np.tanh),
    M.SIGMOID_FWD: ModeInfo(1, _sigmoid),
    M.ELU_FWD: ModeInfo(1, lambda x, alpha: np.where(x > 0, x, alpha * np.expm1(x)), (("alpha", 1.0),)),
    M.GELU_FWD: ModeInfo(1, lambda x: x * _phi_cdf(x)),
    M.GELU_APPROX_TANH_FWD: ModeInfo(1, _gelu_tanh),
    M.SOFTPLUS_FWD: ModeInfo(1, _softplus, (("beta", 1.0),)),
    M.SWISH_FWD: ModeInfo(1, lambda x, swish_beta: x * _sigmoid(swish_beta * x), (("swish_beta", 1.0),)),
    M.RELU_FWD: ModeInfo(1, _relu, _RELU_PARAMS),
    M.GEN_INDEX: ModeInfo(1, lambda x: x),  # replaced by the axis logic in Pointwise.reference
    M.RELU_BWD: ModeInfo(2, _relu_bwd, _RELU_PARAMS),
    M.TANH_BWD: ModeInfo(2, lambda dy, x: dy * _sech2(x)),
    M.SIGMOID_BWD: ModeInfo(2, lambda dy, x: dy * _sigmoid_grad(x)),
    M.ELU_BWD: ModeInfo(2, lambda dy, x, alpha: dy * np.where(x > 0, 1.0, alpha * np.exp(x)), (("alpha", 1.0),)),
    M.GELU_BWD: ModeInfo(2, lambda dy, x: dy * (_phi_cdf(x) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))),
    M.GELU_APPROX_TANH_BWD: ModeInfo(2, lambda dy, x: dy * _gelu_tanh_grad(x)),
    M.SOFTPLUS_BWD: ModeInfo(2, lambda dy, x, beta: dy * _sigmoid(beta * x), (("beta", 1.0),)),
    M.SWISH_BWD: ModeInfo(2, _swish_bwd, (("swish_beta", 1.0),)),
}
OPERAND_ROLES = ("input0", "input1", "input2")


@register_op
@dataclass(frozen=True, kw_only=True)
class Pointwise(Op):
    """An elementwise op; `mode` selects the formula (see the module docstring)."""

    kind = "pointwise"
    DYNAMIC = True
    mode: PointwiseMode
    axis: int | None = None  # GEN_INDEX only

    @property
    def info(self) -> ModeInfo:
        return MODES[self.mode]

    def operand_roles(self) -> tuple[str, ...]:
        return OPERAND_ROLES[: self.info.arity]

    def input_roles(self) -> tuple[str, ...]:
        return self.operand_roles() + tuple(p for p, _ in self.info.params)

    def output_roles(self) -> tuple[str, ...]:
        return ("output",)

    def optional_inputs(self) -> frozenset[str]:
        return frozenset(p for p, _ in self.info.params)

    def scalar_inputs(self) -> frozenset[str]:
        return frozenset(p for p, _ in self.info.params)

    def literal_inputs(self) -> frozenset[str]:
        return frozenset(self.input_roles())

    def dependence(self, output: str, input: str) -> str:
        return "none" if self.mode is PointwiseMode.GEN_INDEX else "aligned"

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        dim = broadcast_dims(ctx, self.operand_roles())
        if self.mode is PointwiseMode.GEN_INDEX:
            dt: DataType | None = DataType.INT32
        elif self.info.bool_out:
            dt = DataType.BOOLEAN
        else:
            dt = None
        like = first_tensor(ctx, self.operand_roles(), dim)
        from .base import strides_like

        return [TensorSpec(dim, strides_like(dim, like), dt)]

    def check(self, ctx: NodeContext) -> None:
        if self.mode is PointwiseMode.GEN_INDEX:
            out = ctx.output("output")
            assert isinstance(out, TensorDesc)
            if self.axis is None or not (0 <= self.axis < len(out.dim)):
                ctx.error(
                    AttributeValueError,
                    f"gen_index axis={self.axis} is outside the output's rank {len(out.dim)}",
                    tensor="output",
                    rule="pointwise.gen_index_axis",
                    hint=f"pick an axis in [0, {len(out.dim) - 1}]",
                )
        elif self.axis is not None:
            ctx.error(
                AttributeValueError,
                f"axis is only used by GEN_INDEX, not {self.mode.name}",
                rule="pointwise.axis",
                hint="drop the axis argument",
            )

    def reference(self, ins, outs):
        out = outs[0]
        assert out is not None
        if self.mode is PointwiseMode.GEN_INDEX:
            axis = expect(self.axis, "GEN_INDEX's axis")  # (checked by infer)
            shape = [1] * len(out.dim)
            shape[axis] = out.dim[axis]
            idx = np.arange(out.dim[axis], dtype=np.float64).reshape(shape)
            return [np.broadcast_to(idx, out.dim)]
        n = self.info.arity
        # 1-element operands broadcast to anything, whatever their rank (finalize allows it)
        operands = [v.reshape(()) if v.size == 1 else v for v in ins[:n]]
        params = {p: (default if v is None else v.reshape(())) for (p, default), v in zip(self.info.params, ins[n:])}
        with np.errstate(all="ignore"):
            result = self.info.fn(*operands, **params)
        return [np.broadcast_to(np.asarray(result, dtype=np.float64), out.dim)]


@register_op
@dataclass(frozen=True, kw_only=True)
class StopGradient(Pointwise):
    """y = x, through which opgraph.grad passes no gradient: IDENTITY to every engine (see the module
    docstring); its mode is fixed, so it has no attributes of its own."""

    kind = "stop_gradient"
    mode: PointwiseMode = field(default=PointwiseMode.IDENTITY, init=False)
    axis: int | None = field(default=None, init=False)


LEGACY_CUSTOM.register(StopGradient.kind, lambda params: StopGradient())
