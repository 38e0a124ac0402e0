"""The translation table: aten op (base name, in-place variants folded in) -> opgraph ops.

A translator takes (importer, node, args) with `args` the op's arguments by schema name (traced
tensors as `Value`s) and returns a new graph tensor (the importer gives it PyTorch's dtype), an
existing `Value` (a no-op such as a view or an eval-mode dropout), or a list of those for ops with
several results. It raises `Untranslatable` for arguments it does not cover: the node then becomes a
custom op. `PREPARE` hooks run before any activation op is emitted (see torch_import). The
neural-network translators live in `torch_ops_nn`.

Composite translations (PyTorch formulas):
    hardswish(x)   = x * relu6(x + 3) / 6          hardsigmoid(x) = relu6(x + 3) / 6
    relu6 / hardtanh / clamp = relu with lower_clip / upper_clip
    softmax(x)     = e / sum(e),  e = exp(x - max(x))     log_softmax(x) = (x - max) - log(sum(e))
    eval batchnorm = x * s + t, s = weight * rsqrt(running_var + eps), t = bias - running_mean * s
        (PyTorch's CPU formula; s, t bound inputs computed at bind time by default, or graph ops, or
        batchnorm_inference: from_torch's eval_batchnorm option)
    train batchnorm = batchnorm (training) with the running-stat update; next stats are graph outputs
    linear(x, W, b) = matmul(x, W^T) + b        (W^T: W seen with transposed strides, zero-copy)
    conv(x, W, b)   = conv_fprop(x, W) + b      (b seen as [1, K, 1, ...])
    adaptive_avg_pool(x, 1) = reduction AVG over the spatial axes (divisible sizes: resample AVG)
    cross_entropy(x, t) with class indices t: log_softmax, one-hot = cmp_eq(gen_index(axis 1), t),
        nll_i = -sum_c(onehot * logp), weighted by weight[t_i] and by t_i != ignore_index; 'mean'
        divides by the summed weights (as PyTorch). Targets are an ordinary input (int64 classes).
    dropout, train mode: x * (mask / (1 - p)), mask a Bernoulli(1 - p) input drawn by variant_pack
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

from ..core.errors import expect
from ..core.registry import Registry
from ..core.tensor import Tensor
from .torch_importer import Args, Importer, Untranslatable, Value, dynamic_refusal, og_dims, symbolic
from .torch_symbolic import to_shape

Translator = Callable[[Importer, Any, Args], Any]
TRANSLATORS: Registry[str, Translator] = Registry("aten translator")
PREPARE: Registry[str, Translator] = Registry("aten prepare hook")


# the modules whose translators register on import: torch.export's ops, and the ops only AOTAutograd's
# graphs hold (the torch.compile backend's: backward ops, the attention kernel PyTorch picked)
EXPORT_MODULES = ("torch_ops_attention", "torch_ops_lm", "torch_ops_nn", "torch_ops_norm")
AOT_MODULES = ("aot_attention", "aot_ops")


def load_translators(aot: bool = False) -> Registry[str, Translator]:
    """The translation table with its modules imported: torch.export's, and AOTAutograd's with `aot`."""
    for name in EXPORT_MODULES + (AOT_MODULES if aot else ()):
        importlib.import_module(f"{__package__}.{name}")
    return TRANSLATORS


def op(*names: str) -> Callable[[Translator], Translator]:
    def register(fn: Translator) -> Translator:
        for n in names:
            TRANSLATORS.register(n, fn)
        return fn

    return register


def _meta(node: Any) -> Any:
    return node.meta["val"]


def _shape(node: Any) -> tuple[int, ...]:
    return to_shape(_meta(node).shape)


def _ints(value: Any, n: int) -> list[int]:
    """An int[n] schema argument (an int means n copies)."""
    if isinstance(value, int):
        return [value] * n
    values = list(to_shape(value))
    return values * n if len(values) == 1 and n > 1 else values


def _axis(dim: int, rank: int) -> int:
    return dim % rank if rank else 0


def _all_ones(v: Any) -> bool:
    return isinstance(v, Value) and all(d == 1 for d in v.dims)


# -- no-ops ----------------------------------------------------------------------------------------


@op("clone", "contiguous", "alias", "detach", "lift_fresh_copy", "lift_fresh", "view_as_real_copy")
def _same(imp: Importer, node: Any, a: Args) -> Any:
    return a["self"]


_WIDER = {"bfloat16": ("float32", "float64"), "float16": ("float32", "float64"), "float32": ("float64",)}


@op("_to_copy", "to", "type_as")
def _cast(imp: Importer, node: Any, a: Args) -> Any:
    return _cast_to(imp, node, a["self"])


@op("prims::convert_element_type")  # (AOTAutograd's decompositions of casts in graphs of symbolic sizes)
def _convert_element_type(imp: Importer, node: Any, a: Args) -> Any:
    return _cast_to(imp, node, a["a"])


def _cast_to(imp: Importer, node: Any, x: Any) -> Any:
    dtype = _meta(node).dtype
    if dtype == x.dtype:
        return x
    cast = imp.g.identity(imp.tensor(x), name=imp.op_name("cast"))
    if imp.options.get("recast_widening") and str(dtype).removeprefix("torch.") in _WIDER.get(
        str(x.dtype).removeprefix("torch."), ()
    ):
        imp.widened[id(cast)] = (x, node, cast)  # (exact: each later reader casts again, Importer._recast)
    return cast


# -- pointwise ---------------------------------------------------------------------------------------


def _operands(imp: Importer, node: Any, *values: Any) -> list[Any]:
    rank = len(_shape(node))
    return [imp.at_rank(v, rank) for v in values]


_UNARY = {
    "neg": "neg",
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "reciprocal": "reciprocal",
    "abs": "abs",
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "erf": "erf",
    "floor": "floor",
    "ceil": "ceil",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "relu": "relu",
    "silu": "swish",
    "logical_not": "logical_not",
}


def _unary(builder: str) -> Translator:
    def translate(imp: Importer, node: Any, a: Args) -> Tensor:
        return getattr(imp.g, builder)(imp.tensor(a["self"]), name=imp.op_name())

    return translate


for _name, _builder in _UNARY.items():
    TRANSLATORS.register(_name, _unary(_builder))

_BINARY = {
    "mul": "mul",
    "maximum": "max",
    "minimum": "min",
    "eq": "cmp_eq",
    "ne": "cmp_neq",
    "gt": "cmp_gt",
    "ge": "cmp_ge",
    "lt": "cmp_lt",
    "le": "cmp_le",
    "logical_and": "logical_and",
    "logical_or": "logical_or",
    "fmod": "mod",
    "true_divide": "div",
}


def _binary(builder: str) -> Translator:
    def translate(imp: Importer, node: Any, a: Args) -> Tensor:
        x, y = _operands(imp, node, a["self"], a["other"])
        return getattr(imp.g, builder)(x, y, name=imp.op_name())

    return translate


for _name, _builder in _BINARY.items():
    TRANSLATORS.register(_name, _binary(_builder))


def _scaled(imp: Importer, value: Any, alpha: Any) -> Any:
    if alpha in (None, 1):
        return value
    if isinstance(value, (int, float)):
        return value * alpha
    return imp.g.mul(value, alpha, name=imp.op_name("alpha"))


@op("add")
def _add(imp: Importer, node: Any, a: Args) -> Tensor:
    x, y = _operands(imp, node, a["self"], a["other"])
    return imp.g.add(x, _scaled(imp, y, a.get("alpha")), name=imp.op_name())


@op("sub")
def _sub(imp: Importer, node: Any, a: Args) -> Tensor:
    x, y = _operands(imp, node, a["self"], a["other"])
    return imp.g.sub(x, _scaled(imp, y, a.get("alpha")), name=imp.op_name())


@op("rsub")
def _rsub(imp: Importer, node: Any, a: Args) -> Tensor:
    x, y = _operands(imp, node, a["self"], a["other"])
    return imp.g.sub(y, _scaled(imp, x, a.get("alpha")), name=imp.op_name())


@op("div")
def _div(imp: Importer, node: Any, a: Args) -> Tensor:
    mode = a.get("rounding_mode")
    if mode not in (None, "floor"):
        raise Untranslatable(f"div with rounding_mode={mode!r}")
    x, y = _operands(imp, node, a["self"], a["other"])
    q = imp.g.div(x, y, name=imp.op_name())
    return q if mode is None else imp.g.floor(q, name=imp.op_name("floor"))


@op("pow")
def _pow(imp: Importer, node: Any, a: Args) -> Tensor:
    x, y = _operands(imp, node, a["self"], a["exponent"])
    if isinstance(y, (int, float)) and y == 2:
        return imp.g.mul(x, x, name=imp.op_name())
    return imp.g.pow(x, y, name=imp.op_name())


@op("square")
def _square(imp: Importer, node: Any, a: Args) -> Tensor:
    x = imp.tensor(a["self"])
    return imp.g.mul(x, x, name=imp.op_name())


@op("where")
def _where(imp: Importer, node: Any, a: Args) -> Tensor:
    if a.get("condition") is None or a.get("self") is None:
        raise Untranslatable("where with one argument (nonzero)")
    c, x, y = _operands(imp, node, a["condition"], a["self"], a["other"])
    if not isinstance(c, Tensor):
        raise Untranslatable("where with a literal condition")
    return imp.g.binary_select(x, y, c, name=imp.op_name())


@op("masked_fill")
def _masked_fill(imp: Importer, node: Any, a: Args) -> Tensor:
    """masked_fill(x, mask, value) = where(mask, value, x) (an attention key-padding mask, say)."""
    x, mask, value = _operands(imp, node, a["self"], a["mask"], a["value"])
    if not isinstance(mask, Tensor):
        raise Untranslatable("masked_fill with a literal mask")
    return imp.g.binary_select(value, x, mask, name=imp.op_name())


# -- activations ---------------------------------------------------------------------------------


def _clip(imp: Importer, x: Any, lower: Any, upper: Any) -> Tensor:
    lo = -math.inf if lower is None else lower
    hi = math.inf if upper is None else upper
    return imp.g.relu(imp.tensor(x), lower_clip=lo, upper_clip=hi, name=imp.op_name())


@op("relu6")
def _relu6(imp: Importer, node: Any, a: Args) -> Tensor:
    return imp.g.relu(imp.tensor(a["self"]), upper_clip=6.0, name=imp.op_name())


@op("hardtanh")
def _hardtanh(imp: Importer, node: Any, a: Args) -> Tensor:
    return _clip(imp, a["self"], a["min_val"], a["max_val"])


@op("clamp", "clip")
def _clamp(imp: Importer, node: Any, a: Args) -> Tensor:
    lo, hi = a.get("min"), a.get("max")
    if isinstance(lo, Value) or isinstance(hi, Value):
        t = _operands(imp, node, a["self"])[0]
        if lo is not None:
            t = imp.g.max(t, _operands(imp, node, lo)[0], name=imp.op_name("min"))
        if hi is not None:
            t = imp.g.min(t, _operands(imp, node, hi)[0], name=imp.op_name("max"))
        return t
    return _clip(imp, a["self"], lo, hi)


@op("clamp_min")
def _clamp_min(imp: Importer, node: Any, a: Args) -> Tensor:
    if isinstance(a["min"], Value):
        x, m = _operands(imp, node, a["self"], a["min"])
        return imp.g.max(x, m, name=imp.op_name())
    return _clip(imp, a["self"], a["min"], None)


@op("clamp_max")
def _clamp_max(imp: Importer, node: Any, a: Args) -> Tensor:
    if isinstance(a["max"], Value):
        x, m = _operands(imp, node, a["self"], a["max"])
        return imp.g.min(x, m, name=imp.op_name())
    return _clip(imp, a["self"], None, a["max"])


@op("leaky_relu")
def _leaky_relu(imp: Importer, node: Any, a: Args) -> Tensor:
    return imp.g.leaky_relu(imp.tensor(a["self"]), a["negative_slope"], name=imp.op_name())


@op("elu")
def _elu(imp: Importer, node: Any, a: Args) -> Tensor:
    if a.get("scale", 1) != 1 or a.get("input_scale", 1) != 1:
        raise Untranslatable("elu with scale or input_scale (selu)")
    return imp.g.elu(imp.tensor(a["self"]), alpha=a.get("alpha", 1.0), name=imp.op_name())


@op("gelu")
def _gelu(imp: Importer, node: Any, a: Args) -> Tensor:
    x = imp.tensor(a["self"])
    if a.get("approximate", "none") == "tanh":
        return imp.g.gelu_approx_tanh(x, name=imp.op_name())
    return imp.g.gelu(x, name=imp.op_name())


@op("softplus")
def _softplus(imp: Importer, node: Any, a: Args) -> Tensor:
    imp.note(
        "softplus: PyTorch returns x where beta*x > threshold; opgraph computes log1p(exp(beta*x))/beta "
        "everywhere (a difference below 1e-8 relative for the default threshold 20)"
    )
    return imp.g.softplus(imp.tensor(a["self"]), beta=a.get("beta", 1.0), name=imp.op_name())


@op("mish")
def _mish(imp: Importer, node: Any, a: Args) -> Tensor:
    x = imp.tensor(a["self"])
    sp = imp.g.softplus(x, name=imp.op_name("softplus"))
    return imp.g.mul(x, imp.g.tanh(sp, name=imp.op_name("tanh")), name=imp.op_name())


@op("hardswish")
def _hardswish(imp: Importer, node: Any, a: Args) -> Tensor:
    x = imp.tensor(a["self"])
    return imp.g.div(imp.g.mul(x, _relu6_shift(imp, x), name=imp.op_name("mul")), 6.0, name=imp.op_name())


@op("hardsigmoid")
def _hardsigmoid(imp: Importer, node: Any, a: Args) -> Tensor:
    return imp.g.div(_relu6_shift(imp, imp.tensor(a["self"])), 6.0, name=imp.op_name())


def _relu6_shift(imp: Importer, x: Tensor) -> Tensor:
    """relu6(x + 3)."""
    return imp.g.relu(imp.g.add(x, 3.0, name=imp.op_name("add3")), upper_clip=6.0, name=imp.op_name("relu6"))


# -- layout -----------------------------------------------------------------------------------------


@op(
    "view",
    "_unsafe_view",
    "reshape",
    "flatten",
    "unflatten",
    "squeeze",
    "unsqueeze",
    "view_as",
    "reshape_as",
    "view_copy",
    "squeeze_copy",
    "unsqueeze_copy",
)
def _reshape(imp: Importer, node: Any, a: Args) -> Any:
    x = a["self"]
    if _meta(node).dtype != x.dtype:  # (aten.view.dtype)
        raise Untranslatable("a view as another dtype (the bytes reinterpreted)")
    shape = _shape(node)
    if og_dims(shape) == x.dims:
        return Value(shape, x.dtype, tensor=x.tensor, source=x.source, example=x.example) if x.shape != shape else x
    viewed = imp.view(x, imp.torch.ops.aten.view.default, list(shape))
    if viewed is not None:
        return viewed
    return imp.reshape(imp.tensor(x), list(og_dims(shape)), name=imp.op_name())


@op("expand", "expand_copy")
def _expand(imp: Importer, node: Any, a: Args) -> Any:
    x = a["self"]
    shape = _shape(node)
    return x if shape == x.shape else _expand_to(imp, x, shape)


def _expand_to(imp: Importer, x: Value, shape: tuple[int, ...]) -> Any:
    if symbolic(shape):
        from .torch_ops_dynamic import expand_dynamic

        return expand_dynamic(imp, x, shape)
    if x.is_bound:
        padded = expect(
            imp.view(x, imp.torch.ops.aten.view.default, [1] * (len(shape) - x.rank) + list(x.shape)),
            "the view of a bound value",
        )
        return imp.view(padded, imp.torch.ops.aten.expand.default, list(shape))
    # a value times ones of the target shape (held with zero strides: no memory)
    ones = imp.constant(imp.torch.ones(1, dtype=x.dtype), "ones")
    ones = ones.view(imp.torch.ops.aten.expand.default, list(shape))
    example = imp.torch.ones(1, dtype=x.dtype).expand(*shape)
    o = Value(shape, x.dtype, source=ones, example=example)
    return imp.g.mul(imp.at_rank(x, len(shape)), imp.tensor(o), name=imp.op_name())


@op("broadcast_tensors")
def _broadcast_tensors(imp: Importer, node: Any, a: Args) -> list[Any]:
    out = []
    for v, m in zip(a["tensors"], _meta(node)):
        shape = to_shape(m.shape)
        out.append(v if v.shape == shape else _expand_to(imp, v, shape))
    return out


def _slice_value(imp: Importer, x: Value, axis: int, start: int, stop: int, step: int) -> Any:
    size = x.shape[axis]
    if symbolic(size) or symbolic([start, stop, step]):
        from .torch_ops_dynamic import slice_dynamic

        return slice_dynamic(imp, x, axis, start, stop, step)
    start, stop, step = slice(start, stop, step).indices(size)
    if (start, stop, step) == (0, size, 1):
        return x
    if len(range(start, stop, step)) == 0:  # nothing: a value of no elements (cat leaves it out)
        return Value(x.shape[:axis] + (0,) + x.shape[axis + 1 :], x.dtype)
    viewed = imp.view(x, imp.torch.ops.aten.slice.Tensor, axis, start, stop, step)
    if viewed is not None:
        return viewed
    slices = [slice(None)] * axis + [slice(start, stop, step)]
    return imp.g.slice(imp.tensor(x), slices, name=imp.op_name())


@op("slice")
def _slice(imp: Importer, node: Any, a: Args) -> Any:
    x = a["self"]
    axis = _axis(a["dim"], x.rank)
    start = 0 if a.get("start") is None else a["start"]
    end = a.get("end")
    if end is None or symbolic([end, x.shape[axis]]):
        end = x.shape[axis] if end is None or (isinstance(end, int) and end >= 2**62) else end
    else:
        end = min(end, x.shape[axis])
    return _slice_value(imp, x, axis, start, end, a.get("step") or 1)


@op("narrow")
def _narrow(imp: Importer, node: Any, a: Args) -> Any:
    x = a["self"]
    if isinstance(a["start"], Value):
        raise Untranslatable("narrow with a tensor start")
    axis = _axis(a["dim"], x.rank)
    start = a["start"] % x.shape[axis]
    return _slice_value(imp, x, axis, start, start + a["length"], 1)


@op("select")
def _select(imp: Importer, node: Any, a: Args) -> Any:
    x = a["self"]
    axis = _axis(a["dim"], x.rank)
    index, size = a["index"], x.shape[axis]
    if not (symbolic(size) and isinstance(index, int) and index >= 0):  # (from the start of a dynamic axis:
        index = index % size  # the slice op proves it within the axis over its range)
    part = _slice_value(imp, x, axis, index, index + 1, 1)
    shape = _shape(node)
    if isinstance(part, Value):
        viewed = imp.view(part, imp.torch.ops.aten.view.default, list(shape))
        return viewed if viewed is not None else imp.reshaped(part, shape)
    return imp.reshape(part, list(og_dims(shape)), name=imp.op_name("squeeze"))


def _split_at(imp: Importer, node: Any, x: Value, axis: int, sizes: list[int]) -> list[Any]:
    used = imp.used.get(node, set(range(len(sizes))))
    out: list[Any] = []
    start = 0
    for i, n in enumerate(sizes):
        out.append(_slice_value(imp, x, axis, start, start + n, 1) if i in used else None)
        start += n
    return out


@op("split", "split_with_sizes")
def _split(imp: Importer, node: Any, a: Args) -> list[Any]:
    x = a["self"]
    axis = _axis(a["dim"], x.rank)
    sizes = [to_shape(m.shape)[axis] for m in _meta(node)]
    return _split_at(imp, node, x, axis, sizes)


@op("chunk", "unsafe_chunk", "unsafe_split", "tensor_split")
def _chunk(imp: Importer, node: Any, a: Args) -> list[Any]:
    x = a["self"]
    axis = _axis(a.get("dim", 0), x.rank)
    sizes = [to_shape(m.shape)[axis] for m in _meta(node)]
    return _split_at(imp, node, x, axis, sizes)


@op("unbind")
def _unbind(imp: Importer, node: Any, a: Args) -> list[Any]:
    x = a["self"]
    axis = _axis(a["dim"], x.rank)
    parts = _split_at(imp, node, x, axis, [1] * x.shape[axis])
    shape = x.shape[:axis] + x.shape[axis + 1 :]
    return [
        None
        if p is None
        else imp.reshaped(p, shape)
        if isinstance(p, Value)
        else imp.reshape(p, list(og_dims(shape)), name=imp.op_name("squeeze"))
        for p in parts
    ]


@op("cat", "concat", "concatenate")
def _cat(imp: Importer, node: Any, a: Args) -> Any:
    parts = [v for v in a["tensors"] if not (isinstance(v, Value) and 0 in v.shape)]
    if not parts or any(v.dtype != _meta(node).dtype for v in parts):
        # (an empty input's type may take part in the result's: torch.cat promotes across all inputs)
        raise Untranslatable("cat of no non-empty tensor, or of tensors of other dtypes than its result")
    if len(parts) == 1:
        return parts[0]
    rank = len(_shape(node))
    if any(v.rank != rank for v in parts):
        raise Untranslatable("cat of tensors of different ranks")
    return imp.g.concatenate([imp.tensor(v) for v in parts], _axis(a["dim"], rank), name=imp.op_name())


@op("stack")
def _stack(imp: Importer, node: Any, a: Args) -> Any:
    parts = a["tensors"]
    rank = len(_shape(node))
    axis = _axis(a.get("dim", 0), rank)
    grown = [imp.reshaped(v, v.shape[:axis] + (1,) + v.shape[axis:]) for v in parts]
    if len(grown) == 1:
        return grown[0]
    return imp.g.concatenate(grown, axis, name=imp.op_name())


def factory(imp: Importer, node: Any, a: Args) -> tuple[Value, str, str]:
    """A node without tensor inputs: a random draw, an uninitialised allocation, or a constant folded
    at import (computed with PyTorch on the CPU)."""
    torch = imp.torch
    target = node.target
    base = target._schema.name.split("::")[-1].rstrip("_")
    meta = _meta(node)
    if not isinstance(meta, torch.Tensor):
        from ..core.errors import UnsupportedGraphError

        raise UnsupportedGraphError(
            f"node '{node.name}' ({target}) does not make one tensor",
            rule="import.factory",
            hint="compute it outside the module and pass it as an input",
        )
    shape = to_shape(meta.shape)
    if symbolic(shape):
        if base == "arange":
            from .torch_ops_dynamic import arange_dynamic

            return arange_dynamic(imp, node, a, shape), "translated", "an index along a dynamic dim"
        if base in ("ones", "zeros", "full"):
            from .torch_ops_dynamic import full_dynamic

            fill = {"ones": 1, "zeros": 0}.get(base, a.get("fill_value"))
            return full_dynamic(imp, node, fill, shape), "translated", "a constant spread over dynamic dims"
        raise dynamic_refusal(node, "makes a tensor of a dynamic size", shape)
    if torch.Tag.nondeterministic_seeded in target.tags:
        dist = {"rand": "uniform", "randn": "normal"}.get(base)
        if dist is None:
            from ..core.errors import UnsupportedGraphError

            raise UnsupportedGraphError(
                f"random op {target} is not supported",
                rule="import.random",
                hint="draw it outside the module and pass it as an input",
            )
        return imp.random_value(dist, shape, meta.dtype), "random", f"a {dist} input drawn by variant_pack"
    if base in ("empty", "empty_strided", "empty_permuted"):
        return Value(shape, meta.dtype, uninit=True), "alias", "uninitialised"
    args = {k: v for k, v in a.items()}
    if "device" in args:
        args["device"] = torch.device("cpu")
    if "pin_memory" in args:
        args["pin_memory"] = False
    value = call_schema(target, args)
    return imp.constant_value(value, base), "constant", "folded at import"


def call_schema(target: Any, args: dict[str, Any]) -> Any:
    """Call an aten op with arguments by schema name."""
    positional, keywords = [], {}
    for arg in target._schema.arguments:
        if arg.name not in args:
            continue
        if arg.kwarg_only:
            keywords[arg.name] = args[arg.name]
        else:
            positional.append(args[arg.name])
    return target(*positional, **keywords)
