"""Translations of the aten ops that only AOTAutograd graphs hold (the torch.compile backend's forward
and backward graphs), added to the translation table of `torch_ops`. `from_torch` never meets them:
torch.export's training IR keeps `layer_norm`, and has no backward ops.

    native_layer_norm(x, shape, w, b, eps)        -> layernorm (training form): y, mean, rstd (the
                                                     inference form where mean and rstd go unread)
    native_layer_norm_backward(dy, x, ..., mask)  -> layernorm_backward: dx, dw, db
    native_batch_norm_backward(dy, x, w, ..., mask) -> batchnorm_backward (train: the saved statistics;
                                                     eval: pointwise ops and sums on the running ones)
    convolution_backward(dy, x, w, ..., mask)     -> conv_dgrad, conv_wgrad, a sum over N and space
    threshold_backward(dy, y, t)                  -> relu_backward (lower clip t)
    gelu_backward(dy, x, approximate)             -> gelu_backward / gelu_approx_tanh_backward
    silu_backward(dy, x)                          -> swish_backward
    sigmoid_backward(dy, y) = dy * y * (1 - y);  tanh_backward(dy, y) = dy * (1 - y * y)   (y: the output)
    _softmax_backward_data(dy, y, dim)            = dy * y - y * sum_dim(dy * y)
    _log_softmax_backward_data(dy, y, dim)        = dy - exp(y) * sum_dim(dy)
    embedding_dense_backward(dy, idx, n, pad)     -> embedding_backward
    slice_backward(dy, sizes, dim, start, end, step) -> slice_backward (dy written into zeros)

The other backward ops are decomposed by AOTAutograd (`DECOMPOSED`: PyTorch's own decompositions into
pointwise ops and sums), or left to PyTorch by the backend's partitioner.
"""

from __future__ import annotations

import builtins
from typing import Any

from ..core.tensor import Tensor
from ..ops.layernorm import LayernormBackward
from ..ops.layout import SliceBackward
from ..ops.norm import BatchnormBackward
from ..ops.reduction import ReductionMode
from .torch_importer import Args, Importer, Untranslatable, Value
from .torch_ops import _ints, _shape, op
from .torch_ops_nn import reduce
from .torch_symbolic import to_shape

# backward ops (and composites AOTAutograd leaves whole) decomposed into ops the table covers
DECOMPOSED = (
    # eval-mode batch norm as pointwise ops (its empty saved statistics stay in PyTorch)
    "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit",
    "mse_loss_backward",
    "hardtanh_backward",
    "leaky_relu_backward",
    "elu_backward",
    "softplus_backward",
    "hardswish_backward",
    "hardsigmoid_backward",
    "_fused_rms_norm",
    "_fused_rms_norm_backward",
    "native_group_norm",
    "native_group_norm_backward",
    "native_dropout_backward",
    "rsub",
    "addcmul",
)


def decompositions() -> dict[Any, Any]:
    """PyTorch's decompositions of the ops in `DECOMPOSED` (for aot_autograd's `decompositions`)."""
    import torch
    from torch._decomp import get_decompositions

    aten = torch.ops.aten
    return get_decompositions([getattr(aten, name) for name in DECOMPOSED if hasattr(aten, name)])


def _used(imp: Importer, node: Any, mask: Any, n: int) -> list[bool]:
    """Which of a multi-result node's `n` results are read and asked for (output_mask)."""
    read = imp.used.get(node, set(range(n)))
    asked = list(mask) if mask is not None else [True] * n
    return [i in read and bool(asked[i]) for i in range(n)]


def _full_rank(v: Value, normalized: list[int]) -> tuple[int, ...]:
    return (1,) * (v.rank - len(normalized)) + tuple(normalized)


def _ones(imp: Importer, shape: tuple[int, ...]) -> Tensor:
    dtype = imp.g.intermediate_data_type.to_torch()
    return imp.tensor(imp.constant_value(imp.torch.ones(shape, dtype=dtype), "ones"))


# -- normalizations ---------------------------------------------------------------------------------


@op("native_layer_norm")
def _native_layer_norm(imp: Importer, node: Any, a: Args) -> list[Any]:
    x, normalized = a["input"], [int(s) for s in a["normalized_shape"]]
    full = _full_rank(x, normalized)
    w, b = a.get("weight"), a.get("bias")
    scale = imp.reshaped(w, full) if w is not None else _ones(imp, full)
    bias = imp.reshaped(b, full) if b is not None else None
    # an inference graph reads y alone: the inference form (a training form's unread statistics are an
    # invalid graph, and the whole layer norm fell back to PyTorch, 18 times in ConvNeXt-T)
    phase = "training" if any(_used(imp, node, None, 3)[1:]) else "inference"
    return imp.g.layernorm(phase, imp.tensor(x), scale, bias, epsilon=float(a["eps"]), name=imp.op_name())


@op("native_layer_norm_backward")
def _native_layer_norm_backward(imp: Importer, node: Any, a: Args) -> list[Any]:
    dy, x, normalized = a["grad_out"], a["input"], [int(s) for s in a["normalized_shape"]]
    full = _full_rank(x, normalized)
    w = a.get("weight")
    scale = imp.reshaped(w, full) if w is not None else _ones(imp, full)
    want = _used(imp, node, a.get("output_mask"), 3)
    dx, dw, db = _outputs(
        imp,
        LayernormBackward(),
        [imp.tensor(dy), imp.tensor(x), scale, imp.tensor(a["mean"]), imp.tensor(a["rstd"])],
        want,
    )
    g = imp.g
    out: list[Any] = [dx if want[0] else None]
    for i, t in ((1, dw), (2, db)):
        if want[i] and t is not None:
            t.set_data_type(x.dtype if w is None else w.dtype)  # (FLOAT unless told: keep a float64 model's)
            out.append(g.reshape(t, normalized, name=imp.op_name("flat")) if len(full) != len(normalized) else t)
        else:
            out.append(None)
    return out


@op("native_batch_norm_backward")
def _native_batch_norm_backward(imp: Importer, node: Any, a: Args) -> list[Any]:
    dy, x, w = a["grad_out"], a["input"], a.get("weight")
    if x.rank < 2:
        raise Untranslatable("the backward of a batch norm of a 1-D input")
    if not a["train"]:
        return _eval_batch_norm_backward(imp, node, a)
    mean, invstd = a.get("save_mean"), a.get("save_invstd")
    if not isinstance(mean, Value) or not isinstance(invstd, Value):
        raise Untranslatable("a batch norm backward without the saved statistics")
    c = x.shape[1]
    per_channel = (1, c) + (1,) * (x.rank - 2)
    scale = imp.reshaped(w, per_channel) if w is not None else _ones(imp, per_channel)
    want = _used(imp, node, a.get("output_mask"), 3)
    stats: list[Any]
    if x.dtype == imp.torch.float64:  # the forward stored its statistics as FLOAT: recompute them exactly
        stats = [None, None, float(a["eps"])]
    else:
        stats = [imp.reshaped(mean, per_channel), imp.reshaped(invstd, per_channel), None]
    dx, dw, db = _outputs(imp, BatchnormBackward(), [imp.tensor(dy), imp.tensor(x), scale, *stats], want)
    out: list[Any] = [dx if want[0] else None]
    for i, t in ((1, dw), (2, db)):
        if want[i] and t is not None:  # (per-channel results are FLOAT unless told: keep a float64 model's)
            out.append(imp.g.reshape(t.set_data_type(x.dtype if w is None else w.dtype), [c], name=imp.op_name("flat")))
        else:
            out.append(None)
    return out


def _eval_batch_norm_backward(imp: Importer, node: Any, a: Args) -> list[Any]:
    """Eval mode: y = (x - running_mean) * s * w + b with s = rsqrt(running_var + eps), so
    dx = dy * (w * s), dw = sum(dy * (x - running_mean) * s), db = sum(dy) (sums over N and space)."""
    dy, x, w = a["grad_out"], a["input"], a.get("weight")
    rm, rv = a.get("running_mean"), a.get("running_var")
    if not isinstance(rm, Value) or not isinstance(rv, Value):
        raise Untranslatable("an eval-mode batch norm backward without running statistics")
    g = imp.g
    c = x.shape[1]
    per_channel = (1, c) + (1,) * (x.rank - 2)
    want = _used(imp, node, a.get("output_mask"), 3)
    inv = g.rsqrt(
        g.add(imp.reshaped(rv, per_channel), float(a["eps"]), name=imp.op_name("var_eps")), name=imp.op_name("inv_std")
    )
    axes = [0] + list(range(2, x.rank))
    out: list[Any] = [None, None, None]
    if want[0]:
        coefficient = g.mul(imp.reshaped(w, per_channel), inv, name=imp.op_name("w_inv")) if w is not None else inv
        out[0] = g.mul(imp.tensor(dy), coefficient, name=imp.op_name("dx"))
    if want[1]:
        xhat = g.mul(
            g.sub(imp.tensor(x), imp.reshaped(rm, per_channel), name=imp.op_name("centered")),
            inv,
            name=imp.op_name("xhat"),
        )
        prod = g.mul(imp.tensor(dy), xhat, name=imp.op_name("dy_xhat"))
        out[1] = reduce(imp, Value(dy.shape, dy.dtype, tensor=prod), axes, False, ReductionMode.ADD, (c,))
    if want[2]:
        out[2] = reduce(imp, dy, axes, False, ReductionMode.ADD, (c,))
    return out


def _outputs(imp: Importer, op: Any, inputs: list[Any], want: list[bool]) -> list[Any]:
    """The op's results, only the wanted ones made (an unread virtual output is a graph error)."""
    roles = [r for r, w in zip(op.output_roles(), want) if w]
    made = dict(zip(op.output_roles(), imp.g._add_op(op, inputs, name=imp.op_name(), outputs=roles)))
    return [made.get(r) if w else None for r, w in zip(op.output_roles(), want)]


# -- convolution ------------------------------------------------------------------------------------


@op("convolution_backward")
def _convolution_backward(imp: Importer, node: Any, a: Args) -> list[Any]:
    dy, x, w = a["grad_output"], a["input"], a["weight"]
    if a.get("transposed"):
        raise Untranslatable("the backward of a transposed convolution")
    nsp = x.rank - 2
    if nsp < 1 or x.rank != w.rank:
        raise Untranslatable("the backward of a convolution over an unbatched input")
    stride, dilation, padding = _ints(a["stride"], nsp), _ints(a["dilation"], nsp), _ints(a["padding"], nsp)
    geometry = dict(pre_padding=padding, post_padding=padding, stride=stride, dilation=dilation)
    want = _used(imp, node, a.get("output_mask"), 3)
    g = imp.g
    out: list[Any] = [None, None, None]
    if want[0]:
        dx = g.conv_dgrad(imp.tensor(dy), imp.tensor(w), name=imp.op_name("dgrad"), **geometry)
        out[0] = dx.set_dim(list(x.shape))
    if want[1]:
        dw = g.conv_wgrad(imp.tensor(x), imp.tensor(dy), name=imp.op_name("wgrad"), **geometry)
        out[1] = dw.set_dim(list(w.shape))
    if want[2]:
        out[2] = reduce(imp, dy, [0] + list(range(2, dy.rank)), False, ReductionMode.ADD, (dy.shape[1],))
    return out


# -- activations ------------------------------------------------------------------------------------


@op("threshold_backward")
def _threshold_backward(imp: Importer, node: Any, a: Args) -> Tensor:
    dy, y, threshold = a["grad_output"], a["self"], a["threshold"]
    if not isinstance(threshold, (int, float)) or dy.shape != y.shape:
        raise Untranslatable("threshold_backward with a tensor threshold or broadcast operands")
    return imp.g.relu_backward(imp.tensor(dy), imp.tensor(y), lower_clip=float(threshold), name=imp.op_name())


@op("gelu_backward")
def _gelu_backward(imp: Importer, node: Any, a: Args) -> Tensor:
    dy, x = a["grad_output"], a["self"]
    if dy.shape != x.shape:
        raise Untranslatable("gelu_backward of broadcast operands")
    approximate = a.get("approximate", "none")
    builder = {"none": imp.g.gelu_backward, "tanh": imp.g.gelu_approx_tanh_backward}.get(approximate)
    if builder is None:
        raise Untranslatable(f"gelu_backward with approximate={approximate!r}")
    return builder(imp.tensor(dy), imp.tensor(x), name=imp.op_name())


@op("silu_backward")
def _silu_backward(imp: Importer, node: Any, a: Args) -> Tensor:
    dy, x = a["grad_output"], a["self"]
    if dy.shape != x.shape:
        raise Untranslatable("silu_backward of broadcast operands")
    return imp.g.swish_backward(imp.tensor(dy), imp.tensor(x), name=imp.op_name())


@op("sigmoid_backward")
def _sigmoid_backward(imp: Importer, node: Any, a: Args) -> Tensor:
    g, dy, y = imp.g, imp.tensor(a["grad_output"]), imp.tensor(a["output"])
    return g.mul(
        g.mul(dy, y, name=imp.op_name("dy_y")), g.sub(1.0, y, name=imp.op_name("one_minus")), name=imp.op_name()
    )


@op("tanh_backward")
def _tanh_backward(imp: Importer, node: Any, a: Args) -> Tensor:
    g, dy, y = imp.g, imp.tensor(a["grad_output"]), imp.tensor(a["output"])
    return g.mul(
        dy, g.sub(1.0, g.mul(y, y, name=imp.op_name("square")), name=imp.op_name("one_minus")), name=imp.op_name()
    )


def _sum_keep(imp: Importer, t: Tensor, like: Value, dim: int, what: str) -> Tensor:
    axis = dim % like.rank
    kept = tuple(1 if i == axis else d for i, d in enumerate(like.shape))
    return imp.reduction(t, ReductionMode.ADD, kept, imp.op_name(what))


@op("_softmax_backward_data")
def _softmax_backward(imp: Importer, node: Any, a: Args) -> Tensor:
    dy, y = a["grad_output"], a["output"]
    if dy.shape != y.shape or not y.rank:
        raise Untranslatable("softmax backward of broadcast or 0-d operands")
    g = imp.g
    dyy = g.mul(imp.tensor(dy), imp.tensor(y), name=imp.op_name("dy_y"))
    total = _sum_keep(imp, dyy, y, int(a["dim"]), "sum")
    return g.sub(dyy, g.mul(imp.tensor(y), total, name=imp.op_name("y_sum")), name=imp.op_name())


@op("_log_softmax_backward_data")
def _log_softmax_backward(imp: Importer, node: Any, a: Args) -> Tensor:
    dy, y = a["grad_output"], a["output"]
    if dy.shape != y.shape or not y.rank:
        raise Untranslatable("log_softmax backward of broadcast or 0-d operands")
    g = imp.g
    total = _sum_keep(imp, imp.tensor(dy), y, int(a["dim"]), "sum")
    p = g.exp(imp.tensor(y), name=imp.op_name("exp"))
    return g.sub(imp.tensor(dy), g.mul(p, total, name=imp.op_name("p_sum")), name=imp.op_name())


@op("embedding_dense_backward")
def _embedding_dense_backward(imp: Importer, node: Any, a: Args) -> Tensor:
    dy, idx = a["grad_output"], a["indices"]
    if a.get("scale_grad_by_freq"):
        raise Untranslatable("embedding backward with scale_grad_by_freq")
    if idx.dtype.is_floating_point or dy.rank != idx.rank + 1:
        raise Untranslatable("embedding backward of floating indices or another rank")
    n, d = int(a["num_weights"]), int(dy.shape[-1])
    pad = int(a.get("padding_idx", -1))
    t = imp.g.embedding_backward(
        imp.tensor(dy),
        imp.reshaped(idx, idx.shape or (1,)),
        n,
        padding_idx=pad + n if pad < -1 else pad,
        name=imp.op_name(),
    )
    return t.set_dim([n, d]) if _shape(node) == (n, d) else t


# -- layout -----------------------------------------------------------------------------------------


@op("slice_backward")
def _slice_backward(imp: Importer, node: Any, a: Args) -> Tensor:
    sizes = list(to_shape(a["input_sizes"]))
    dim = int(a["dim"]) % len(sizes)
    bounds = [(0, d, 1) for d in sizes]
    bounds[dim] = builtins.slice(int(a["start"]), int(a["end"]), int(a["step"])).indices(sizes[dim])
    if not range(*bounds[dim]):
        raise Untranslatable("the backward of an empty slice")
    op = SliceBackward(in_dim=tuple(sizes), slices=tuple(bounds))
    return _outputs(imp, op, [imp.tensor(a["grad_output"])], [True])[0]
