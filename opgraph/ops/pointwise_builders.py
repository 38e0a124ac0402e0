"""The pointwise builders (names and keyword arguments as in cuDNN frontend's Python API): `g.pointwise`
and one builder per mode (`g.add`, `g.relu`, `g.gelu`, ...), each with its docstring. The op and
its modes' semantics: opgraph.ops.pointwise."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from ..core.errors import AttributeValueError
from ..core.op import graph_method
from ..core.suggest import did_you_mean
from .pointwise import MODES, Pointwise, PointwiseMode

M = PointwiseMode

# -- builders (names and keyword arguments as in cuDNN frontend's Python API) -----------------------


def _pw(g, mode: PointwiseMode, operands, params=None, *, name, compute_data_type, axis=None):
    info = MODES[mode]
    values = dict(params or {})
    unknown = set(values) - {p for p, _ in info.params}
    if unknown:
        raise TypeError(f"{mode.name} takes no parameter(s) {sorted(unknown)}")
    inputs = list(operands) + [values.get(p) for p, _ in info.params]
    return g._add_op(Pointwise(mode=mode, axis=axis), inputs, name=name, compute_data_type=compute_data_type)[0]


@graph_method
def pointwise(self, input0, input1=None, input2=None, *, mode, compute_data_type=None, name="", **params):
    """Any pointwise mode, by enum or name: what every named builder (add, relu, gelu, ...) calls.

    Shapes: operands of equal rank whose dims are equal or 1 (a broadcast axis); 1-element tensors
    and Python numbers broadcast to anything. The output has the broadcast dims.

    Layouts: any strides; the output is packed in the axis order of its first full-size operand.

    Types: computed in `compute_data_type`; comparisons give BOOLEAN, GEN_INDEX INT32, others the
    graph's intermediate type when virtual, its io type when an output.

    Formula: the mode's (see `PointwiseMode` and the module's table), e.g. RELU_FWD
    `min(max(x, lower_clip) + negative_slope * min(x - lower_clip, 0), upper_clip)`.

    Args:
        input0: the first operand.
        input1: the second operand (binary and ternary modes).
        input2: the third operand (BINARY_SELECT's mask).
        mode: a PointwiseMode or its name ("ADD", "GELU_FWD", ...).
        compute_data_type: the type the math runs in.
        name: the op's name.
        **params: the mode's parameters (negative_slope, lower_clip, upper_clip, alpha, beta,
            swish_beta) as numbers or scalar tensors, and `axis` for GEN_INDEX.

    Returns:
        the output, a virtual tensor.

    Example:
        ```python
        y = g.pointwise(x, mode="RELU_FWD", upper_clip=6.0)      # relu6
        ```
    """
    if isinstance(mode, str) and mode.upper() in PointwiseMode.__members__:
        mode = PointwiseMode[mode.upper()]
    if not isinstance(mode, PointwiseMode):
        raise AttributeValueError(
            f"mode={mode!r} is not a pointwise mode{did_you_mean(str(mode), PointwiseMode.__members__)}",
            op="pointwise",
            rule="pointwise.mode",
            hint="pass an opgraph.PointwiseMode (e.g. PointwiseMode.ADD) or its name",
        )
    operands = [input0, input1, input2][: MODES[mode].arity]
    axis = params.pop("axis", None)
    axis = None if axis is None else _axis(axis, name)
    return _pw(self, mode, operands, params, name=name, compute_data_type=compute_data_type, axis=axis)


def _bind(op: str, names: tuple[str, str], args: tuple, kwargs: dict):
    """Positional-or-keyword binding of (first, second, compute_data_type, name) with per-mode names."""
    order = (*names, "compute_data_type", "name")
    if len(args) > len(order):
        raise TypeError(f"{op}() takes at most {len(order)} arguments ({len(args)} given)")
    values = dict(zip(order, args))
    for k, v in kwargs.items():
        if k not in order:
            raise TypeError(f"{op}() got an unexpected keyword argument '{k}' (it takes {', '.join(order)})")
        if k in values:
            raise TypeError(f"{op}() got multiple values for argument '{k}'")
        values[k] = v
    missing = [n for n in names if n not in values]
    if missing:
        raise TypeError(f"{op}() missing required argument(s): {', '.join(missing)}")
    return (values[names[0]], values[names[1]]), values.get("compute_data_type"), values.get("name", "")


_PW_COMMON = """Shapes: operands of equal rank whose dims are equal or 1 (a broadcast axis); 1-element tensors
    and Python numbers broadcast to anything. The output has the broadcast dims.

    Layouts: any strides; the output is packed in the axis order of its first full-size operand.

    Types: computed in `compute_data_type` (default the graph's, FLOAT); the output is the graph's
    intermediate type when virtual, its io type when an output (or what `set_data_type` says)."""


def _pw_doc(summary: str, formula: str, args: list[tuple[str, str]], example: str, types: str = "") -> str:
    """A pointwise builder's docstring: what every pointwise op shares, and its own formula."""
    arg_lines = "".join(
        f"\n        {n}: {d}"
        for n, d in [
            *args,
            ("compute_data_type", "the type the math runs in."),
            ("name", "the op's name (shown in plans and errors)."),
        ]
    )
    common = _PW_COMMON if not types else _PW_COMMON.rsplit("Types:", 1)[0] + "Types: " + types
    return (
        f"{summary}\n\n    {common}\n\n    Formula: `{formula}`.\n\n    Args:{arg_lines}\n\n"
        f"    Returns:\n        the output, a virtual tensor.\n\n    Example:\n        ```python\n"
        f"        {example}\n        ```\n    "
    )


def _binary(mode: PointwiseMode, doc: str, first: str = "a", second: str = "b"):
    def builder(self, *args, **kwargs):
        (x, y), cdt, name = _bind(mode.value, (first, second), args, kwargs)
        return _pw(self, mode, [x, y], name=name, compute_data_type=cdt)

    builder.__name__ = mode.value
    builder.__doc__ = doc
    P = inspect.Parameter
    builder.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            P("self", P.POSITIONAL_OR_KEYWORD),
            P(first, P.POSITIONAL_OR_KEYWORD),
            P(second, P.POSITIONAL_OR_KEYWORD),
            P("compute_data_type", P.POSITIONAL_OR_KEYWORD, default=None),
            P("name", P.POSITIONAL_OR_KEYWORD, default=""),
        ]
    )
    return graph_method(builder)


def _unary(mode: PointwiseMode, doc: str, builder_name: str | None = None):
    def builder(self, input, compute_data_type=None, name=""):
        return _pw(self, mode, [input], name=name, compute_data_type=compute_data_type)

    builder.__name__ = builder_name or mode.value
    builder.__doc__ = doc
    return graph_method(builder)


def _backward(mode: PointwiseMode, doc: str):
    def builder(self, loss, input, compute_data_type=None, name="", **params):
        return _pw(self, mode, [loss, input], params, name=name, compute_data_type=compute_data_type)

    builder.__name__ = mode.value
    builder.__doc__ = doc
    return graph_method(builder)


_OPERAND = "a tensor or a Python number."
for _mode, _f in [
    (M.ADD, "a + b"),
    (M.SUB, "a - b"),
    (M.MUL, "a * b"),
    (M.DIV, "a / b"),
    (M.ADD_SQUARE, "a + b * b"),
    (M.LOGICAL_AND, "(a != 0) and (b != 0)"),
    (M.LOGICAL_OR, "(a != 0) or (b != 0)"),
]:
    _binary(
        _mode,
        _pw_doc(
            f"Elementwise {_f}, with broadcasting.",
            f"output = {_f}",
            [("a", "the first operand: " + _OPERAND), ("b", "the second operand: " + _OPERAND)],
            f"y = g.{_mode.value}(x, g.tensor(dim=[1, 64, 1, 1], name='b'))",
        ),
    )
for _mode, _f in [
    (M.MAX, "max(input0, input1)"),
    (M.MIN, "min(input0, input1)"),
    (M.POW, "input0 ** input1 (C99 pow, special values included)"),
    (M.MOD, "fmod(input0, input1)"),
]:
    _binary(
        _mode,
        _pw_doc(
            f"Elementwise {_f}, with broadcasting.",
            f"output = {_f}",
            [("input0", "the first operand: " + _OPERAND), ("input1", "the second operand: " + _OPERAND)],
            f"y = g.{_mode.value}(x, 2.0)",
        ),
        "input0",
        "input1",
    )
for _mode, _f in [
    (M.CMP_EQ, "=="),
    (M.CMP_NEQ, "!="),
    (M.CMP_GT, ">"),
    (M.CMP_GE, ">="),
    (M.CMP_LT, "<"),
    (M.CMP_LE, "<="),
]:
    _binary(
        _mode,
        _pw_doc(
            f"Elementwise comparison input {_f} comparison: 1 where it holds, else 0.",
            f"output = (input {_f} comparison)",
            [("input", "the left operand: " + _OPERAND), ("comparison", "the right operand: " + _OPERAND)],
            f"mask = g.{_mode.value}(x, 0.0)   # BOOLEAN",
            types="computed in `compute_data_type`; the output is BOOLEAN unless its type is set.",
        ),
        "input",
        "comparison",
    )

for _mode, _f in [
    (M.LOGICAL_NOT, "x == 0"),
    (M.IDENTITY, "x (a cast to the output's type)"),
    (M.SQRT, "sqrt(x)"),
    (M.RSQRT, "1 / sqrt(x)"),
    (M.EXP, "exp(x)"),
    (M.LOG, "log(x)"),
    (M.NEG, "-x"),
    (M.ABS, "|x|"),
    (M.CEIL, "ceil(x)"),
    (M.FLOOR, "floor(x)"),
    (M.RECIPROCAL, "1 / x"),
    (M.SIN, "sin(x)"),
    (M.COS, "cos(x)"),
    (M.TAN, "tan(x)"),
    (M.ERF, "erf(x)"),
    (M.TANH_FWD, "tanh(x)"),
    (M.SIGMOID_FWD, "1 / (1 + exp(-x))"),
    (M.GELU_FWD, "x * Phi(x), Phi the standard normal CDF (erf form)"),
    (M.GELU_APPROX_TANH_FWD, "0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))"),
]:
    _unary(
        _mode, _pw_doc(f"Elementwise {_f}.", f"output = {_f}", [("input", "x, a tensor.")], f"y = g.{_mode.value}(x)")
    )

_FORWARD = {
    M.TANH_BWD: ("tanh", "1 - tanh(x)^2"),
    M.SIGMOID_BWD: ("sigmoid", "s * (1 - s), s = sigmoid(x)"),
    M.ELU_BWD: ("elu", "1 if x > 0 else alpha * exp(x)"),
    M.GELU_BWD: ("gelu", "Phi(x) + x * phi(x)"),
    M.GELU_APPROX_TANH_BWD: ("gelu_approx_tanh", "the derivative of the tanh approximation"),
    M.SOFTPLUS_BWD: ("softplus", "sigmoid(beta * x)"),
    M.SWISH_BWD: ("swish", "s + beta * x * s * (1 - s), s = sigmoid(beta * x)"),
}
for _mode, (_fwd, _d) in _FORWARD.items():
    _backward(
        _mode,
        _pw_doc(
            f"The gradient of `{_fwd}` at its input x, times the incoming gradient (cuDNN's {_mode.name}).",
            f"output = loss * ({_d})",
            [
                ("loss", "dy, the gradient of the forward op's output."),
                ("input", "x, the forward op's *input* (not its output), as cuDNN's backward modes take."),
                ("**params", "the forward op's parameters (alpha, beta, swish_beta), when it had them."),
            ],
            f"dx = g.{_mode.value}(dy, x)",
        ),
    )


@graph_method
def bias(self, input, bias, compute_data_type=None, name=""):
    """Add a broadcast bias: cuDNN's name for ADD.

    Shapes: bias of the input's rank with 1 in broadcast axes ([1, C, 1, 1] per channel of an image,
    [1, N] per column of a matrix). The output has the input's dims.

    Layouts: any strides; the output is packed in the input's axis order.

    Types: computed in `compute_data_type` (default FLOAT); output in the intermediate / io type.

    Formula: `output = input + bias`.

    Args:
        input: x.
        bias: the bias, broadcast.
        compute_data_type: the type the math runs in.
        name: the op's name.

    Returns:
        the output, a virtual tensor.

    Example:
        ```python
        y = g.relu(g.bias(g.conv_fprop(x, w, padding=1), g.tensor(dim=[1, 64, 1, 1], name="B")))
        ```
    """
    return _pw(self, M.ADD, [input, bias], name=name, compute_data_type=compute_data_type)


@graph_method
def scale(self, input, scale, compute_data_type=None, name=""):
    """Multiply by a broadcast scale: cuDNN's name for MUL.

    Shapes: scale of the input's rank with 1 in broadcast axes, a 1-element tensor or a Python number.

    Layouts: any strides; the output is packed in the input's axis order.

    Types: computed in `compute_data_type` (default FLOAT); output in the intermediate / io type.

    Formula: `output = input * scale`.

    Args:
        input: x.
        scale: the scale, broadcast (a pass-by-value tensor is a host value given at execute).
        compute_data_type: the type the math runs in.
        name: the op's name.

    Returns:
        the output, a virtual tensor.

    Example:
        ```python
        s = g.tensor(dim=[1], is_pass_by_value=True, name="s")
        y = g.scale(x, s)           # execute with {"s": 0.5, ...}
        ```
    """
    return _pw(self, M.MUL, [input, scale], name=name, compute_data_type=compute_data_type)


@graph_method
def binary_select(self, input0, input1, mask, compute_data_type=None, name=""):
    """Elementwise select: input0 where mask is true, else input1.

    Shapes: the three operands broadcast (equal rank, 1 in broadcast axes).

    Layouts: any strides; the output is packed in its first full-size operand's axis order.

    Types: mask BOOLEAN (or numeric: nonzero is true); the output in the intermediate / io type.

    Formula: `output = mask ? input0 : input1`.

    Args:
        input0: the value where mask holds.
        input1: the value elsewhere.
        mask: the condition.
        compute_data_type: the type the math runs in.
        name: the op's name.

    Returns:
        the output, a virtual tensor.

    Example:
        ```python
        y = g.binary_select(x, 0.0, g.cmp_gt(x, 0.0))     # relu, spelled out
        ```
    """
    return _pw(self, M.BINARY_SELECT, [input0, input1, mask], name=name, compute_data_type=compute_data_type)


@graph_method
def relu(self, input, negative_slope=None, lower_clip=None, upper_clip=None, compute_data_type=None, name=""):
    """Relu, with cuDNN's optional slope and clips (leaky relu, relu6, clipped relu).

    Shapes: elementwise: the output has the input's dims.

    Layouts: any strides; the output is packed in the input's axis order.

    Types: computed in `compute_data_type` (default FLOAT); output in the intermediate / io type.

    Formula, with lower = lower_clip (default 0) and upper = upper_clip (default +inf):
    `output = lower + negative_slope * (x - lower)` where x < lower, else `min(x, upper)`.

    Args:
        input: x.
        negative_slope: the slope below lower_clip (default 0). Each parameter is a number (baked
            in), a pass-by-value tensor (a host value at execute) or a 1-element tensor (read from
            memory at run time).
        lower_clip: the lower threshold (default 0).
        upper_clip: the upper clip (default none; 6 gives relu6).
        compute_data_type: the type the math runs in.
        name: the op's name.

    Returns:
        the output, a virtual tensor.

    Example:
        ```python
        y = g.relu(x, upper_clip=6.0)
        ```
    """
    params = {"negative_slope": negative_slope, "lower_clip": lower_clip, "upper_clip": upper_clip}
    return _pw(self, M.RELU_FWD, [input], params, name=name, compute_data_type=compute_data_type)


@graph_method
def leaky_relu(self, input, negative_slope, compute_data_type=None, name=""):
    """Leaky relu: RELU_FWD with a slope below zero.

    Shapes: elementwise: the output has the input's dims.

    Layouts: any strides; the output is packed in the input's axis order.

    Types: computed in `compute_data_type` (default FLOAT); output in the intermediate / io type.

    Formula: `output = x if x > 0 else negative_slope * x`.

    Args:
        input: x.
        negative_slope: the slope for x <= 0: a number or a scalar tensor.
        compute_data_type: the type the math runs in.
        name: the op's name.

    Returns:
        the output, a virtual tensor.

    Example:
        ```python
        y = g.leaky_relu(x, 0.01)
        ```
    """
    return _pw(
        self, M.RELU_FWD, [input], {"negative_slope": negative_slope}, name=name, compute_data_type=compute_data_type
    )


@graph_method
def relu_backward(
    self, loss, input, negative_slope=None, lower_clip=None, upper_clip=None, compute_data_type=None, name=""
):
    """The gradient of `relu` at its input, times the incoming gradient (RELU_BWD).

    Shapes: loss and input broadcast; the output has their dims.

    Layouts: any strides; the output is packed in the first full-size operand's axis order.

    Types: computed in `compute_data_type`; output in the intermediate / io type.

    Formula: `output = loss * (1 if lower < x < upper, negative_slope if x <= lower, 0 if x >= upper)`.

    Args:
        loss: dy, the gradient of relu's output.
        input: x, relu's input.
        negative_slope: relu's slope.
        lower_clip: relu's lower clip.
        upper_clip: relu's upper clip.
        compute_data_type: the type the math runs in.
        name: the op's name.

    Returns:
        the output, a virtual tensor.

    Example:
        ```python
        dx = g.relu_backward(dy, x)
        ```
    """
    params = {"negative_slope": negative_slope, "lower_clip": lower_clip, "upper_clip": upper_clip}
    return _pw(self, M.RELU_BWD, [loss, input], params, name=name, compute_data_type=compute_data_type)


@graph_method
def leaky_relu_backward(self, loss, input, negative_slope, compute_data_type=None, name=""):
    """The gradient of `leaky_relu` at its input, times the incoming gradient.

    Shapes: loss and input broadcast; the output has their dims.

    Layouts: any strides; the output is packed in the first full-size operand's axis order.

    Types: computed in `compute_data_type`; output in the intermediate / io type.

    Formula: `output = loss * (1 if x > 0 else negative_slope)`.

    Args:
        loss: dy, the gradient of leaky_relu's output.
        input: x, leaky_relu's input.
        negative_slope: leaky_relu's slope.
        compute_data_type: the type the math runs in.
        name: the op's name.

    Returns:
        the output, a virtual tensor.

    Example:
        ```python
        dx = g.leaky_relu_backward(dy, x, 0.01)
        ```
    """
    return _pw(
        self,
        M.RELU_BWD,
        [loss, input],
        {"negative_slope": negative_slope},
        name=name,
        compute_data_type=compute_data_type,
    )


@graph_method
def elu(self, input, compute_data_type=None, name="", *, alpha=None):
    """ELU, elementwise.

    Shapes: the output has the input's dims. Layouts: any strides; packed in the input's axis order.

    Types: computed in `compute_data_type`; output in the intermediate / io type.

    Formula: `output = x if x > 0 else alpha * (exp(x) - 1)`.

    Args:
        input: x.
        compute_data_type: the type the math runs in.
        name: the op's name.
        alpha: (keyword, an opgraph extension) the negative saturation, default 1.

    Returns:
        the output, a virtual tensor.

    Example:
        ```python
        y = g.elu(x, alpha=0.5)
        ```
    """
    return _pw(self, M.ELU_FWD, [input], {"alpha": alpha}, name=name, compute_data_type=compute_data_type)


@graph_method
def softplus(self, input, compute_data_type=None, name="", *, beta=None):
    """Softplus, elementwise.

    Shapes: the output has the input's dims. Layouts: any strides; packed in the input's axis order.

    Types: computed in `compute_data_type`; output in the intermediate / io type.

    Formula: `output = log(1 + exp(beta * x)) / beta`.

    Args:
        input: x.
        compute_data_type: the type the math runs in.
        name: the op's name.
        beta: (keyword, an opgraph extension) the sharpness, default 1.

    Returns:
        the output, a virtual tensor.

    Example:
        ```python
        y = g.softplus(x)
        ```
    """
    return _pw(self, M.SOFTPLUS_FWD, [input], {"beta": beta}, name=name, compute_data_type=compute_data_type)


@graph_method
def swish(self, input, swish_beta=None, compute_data_type=None, name=""):
    """Swish (SiLU when swish_beta is 1), elementwise.

    Shapes: the output has the input's dims. Layouts: any strides; packed in the input's axis order.

    Types: computed in `compute_data_type`; output in the intermediate / io type.

    Formula: `output = x * sigmoid(swish_beta * x)`.

    Args:
        input: x.
        swish_beta: the slope inside the sigmoid (default 1): a number or a scalar tensor.
        compute_data_type: the type the math runs in.
        name: the op's name.

    Returns:
        the output, a virtual tensor.

    Example:
        ```python
        y = g.swish(x)           # SiLU
        ```
    """
    return _pw(self, M.SWISH_FWD, [input], {"swish_beta": swish_beta}, name=name, compute_data_type=compute_data_type)


@graph_method
def gen_index(self, input, axis, compute_data_type=None, name=""):
    """The index along `axis` of every element (GEN_INDEX): an iota of the input's dims.

    Shapes: the output has the input's dims (the input's values are not read).

    Layouts: any strides; the output is packed in the input's axis order.

    Types: the output is INT32 unless its type is set.

    Formula: `output[i_0, ..., i_{r-1}] = i_axis`.

    Args:
        input: a tensor whose dims the output takes.
        axis: the axis whose index is written.
        compute_data_type: the type the math runs in.
        name: the op's name.

    Returns:
        the output, a virtual tensor.

    Example:
        ```python
        col = g.gen_index(x, axis=1)
        causal = g.cmp_le(col, g.gen_index(x, axis=0))      # a lower-triangular mask
        ```
    """
    return _pw(self, M.GEN_INDEX, [input], name=name, compute_data_type=compute_data_type, axis=_axis(axis, name))


def _axis(axis: Any, name: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise AttributeValueError(
            f"gen_index axis must be an int, got {axis!r}",
            op=f"gen_index '{name}'",
            rule="pointwise.gen_index_axis",
            hint="pass the axis as an int",
        )
    return int(axis)
