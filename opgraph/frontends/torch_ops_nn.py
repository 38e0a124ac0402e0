"""Translators of the neural-network ops: reductions, softmax, losses, matmul/linear, convolution,
dropout and random draws (normalization and pooling: torch_ops_norm; the formulas are in `torch_ops`'
docstring)."""

from __future__ import annotations

import math
from typing import Any

from ..core.dtypes import DataType
from ..core.errors import expect
from ..core.tensor import Tensor
from ..ops.reduction import ReductionMode
from .torch_importer import Args, Importer, Untranslatable, Value, dynamic_refusal, og_dims, symbolic
from .torch_ops import TRANSLATORS, Translator, _axis, _ints, _meta, _operands, _scaled, _shape, op
from .torch_symbolic import to_shape

# -- reductions ---------------------------------------------------------------------------------------


def reduce(
    imp: Importer, x: Value, axes: list[int], keepdim: bool, mode: ReductionMode, out_shape: tuple[int, ...]
) -> Tensor:
    """Reduce `x` over `axes` (torch axes); the result has torch shape `out_shape`."""
    rank = x.rank
    axes = sorted({_axis(d, rank) for d in axes}) if axes else list(range(rank))
    kept = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if rank else (1,)
    t = imp.reduction(imp.tensor(x), mode, og_dims(kept), imp.op_name(mode.name.lower()))
    if og_dims(out_shape) != og_dims(kept):
        t = imp.reshape(t, list(og_dims(out_shape)), name=imp.op_name("squeeze"))
    return t


def _dims_arg(a: Args) -> list[int]:
    dim = a.get("dim")
    if dim is None:
        return []
    return [dim] if isinstance(dim, int) else list(dim)


def _reduction(mode: ReductionMode) -> Translator:
    def translate(imp: Importer, node: Any, a: Args) -> Tensor:
        return reduce(imp, a["self"], _dims_arg(a), bool(a.get("keepdim")), mode, _shape(node))

    return translate


TRANSLATORS.register("mean", _reduction(ReductionMode.AVG))
TRANSLATORS.register("sum", _reduction(ReductionMode.ADD))
TRANSLATORS.register("amax", _reduction(ReductionMode.MAX))
TRANSLATORS.register("amin", _reduction(ReductionMode.MIN))


@op("max", "min")
def _max_min(imp: Importer, node: Any, a: Args) -> Any:
    base = node.target._schema.name.split("::")[-1]
    mode = ReductionMode.MAX if base == "max" else ReductionMode.MIN
    if a.get("other") is not None:  # max.other: elementwise
        x, y = _operands(imp, node, a["self"], a["other"])
        return getattr(imp.g, base)(x, y, name=imp.op_name())
    meta = _meta(node)
    if isinstance(meta, (list, tuple)):  # max.dim -> (values, indices)
        if imp.used.get(node, set()) - {0}:
            raise Untranslatable(f"{base}.dim indices")
        return [reduce(imp, a["self"], [a["dim"]], bool(a.get("keepdim")), mode, tuple(meta[0].shape)), None]
    return reduce(imp, a["self"], [], False, mode, _shape(node))


def _softmax_parts(imp: Importer, x: Value, dim: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(x - max, exp(x - max), sum of it) over `dim`, keeping dims, and the shifted input."""
    axis = _axis(dim, x.rank)
    kept = tuple(1 if i == axis else d for i, d in enumerate(x.shape))
    t = imp.tensor(x)
    m = imp.reduction(t, ReductionMode.MAX, og_dims(kept), imp.op_name("max"))
    shifted = imp.g.sub(t, m, name=imp.op_name("shift"))
    e = imp.g.exp(shifted, name=imp.op_name("exp"))
    z = imp.reduction(e, ReductionMode.ADD, og_dims(kept), imp.op_name("sum"))
    return shifted, e, z, m


@op("softmax", "_softmax")
def _softmax(imp: Importer, node: Any, a: Args) -> Tensor:
    _, e, z, _ = _softmax_parts(imp, a["self"], a["dim"])
    return imp.g.div(e, z, name=imp.op_name())


@op("_safe_softmax")
def _safe_softmax(imp: Importer, node: Any, a: Args) -> Tensor:
    """softmax with 0 for rows wholly -inf (PyTorch's math attention: a fully masked query row)."""
    _, e, z, m = _softmax_parts(imp, a["self"], a["dim"])
    y = imp.g.div(e, z, name=imp.op_name())
    empty = imp.g.cmp_eq(m, -math.inf, name=imp.op_name("empty"))
    return imp.g.binary_select(0.0, y, empty, name=imp.op_name("safe"))


@op("log_softmax", "_log_softmax")
def _log_softmax(imp: Importer, node: Any, a: Args) -> Tensor:
    shifted, _, z, _ = _softmax_parts(imp, a["self"], a["dim"])
    return imp.g.sub(shifted, imp.g.log(z, name=imp.op_name("log")), name=imp.op_name())


# -- losses -------------------------------------------------------------------------------------------

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _nll(
    imp: Importer,
    node: Any,
    logp: Tensor,
    x: Value,
    target: Value,
    weight: Value | None,
    reduction: int,
    ignore_index: int,
    smoothing: float = 0.0,
) -> Tensor:
    """The negative log-likelihood of class-index targets over log-probabilities `logp` (dims of x),
    class axis 1, with PyTorch's weighting, ignore_index and reduction."""
    g = imp.g
    if x.rank < 2:
        raise Untranslatable("a loss over unbatched input")
    if target.dtype.is_floating_point:
        raise Untranslatable("class-probability targets")
    rows = (x.shape[0], 1) + x.shape[2:]
    t = imp.reshaped(target, rows)
    onehot = g.cmp_eq(g.gen_index(logp, 1, name=imp.op_name("classes")), t, name=imp.op_name("onehot"))
    onehot.set_data_type("float")
    pick = g.mul(onehot, logp, name=imp.op_name("pick"))
    picked = imp.reduction(pick, ReductionMode.ADD, og_dims(rows), imp.op_name("nll"))
    valid = g.cmp_neq(t, ignore_index, name=imp.op_name("valid"))
    valid.set_data_type("float")
    if weight is not None:
        w = imp.reshaped(weight, (1, x.shape[1]) + (1,) * (x.rank - 2))
        wpick = g.mul(onehot, w, name=imp.op_name("wpick"))
        wr = imp.reduction(wpick, ReductionMode.ADD, og_dims(rows), imp.op_name("wrow"))
        valid = g.mul(valid, wr, name=imp.op_name("weight"))
    loss = g.neg(g.mul(picked, valid, name=imp.op_name("masked")), name=imp.op_name("loss"))
    if smoothing:
        if weight is not None:
            raise Untranslatable("label_smoothing with class weights")
        total = imp.reduction(logp, ReductionMode.ADD, og_dims(rows), imp.op_name("smooth"))
        smooth = g.mul(
            g.mul(total, valid, name=imp.op_name("smask")), -smoothing / x.shape[1], name=imp.op_name("sscale")
        )
        loss = g.add(g.mul(loss, 1.0 - smoothing, name=imp.op_name("lscale")), smooth, name=imp.op_name("smoothed"))
    how = _REDUCTIONS.get(reduction)
    if how == "none":
        return imp.reshape(loss, list(og_dims(_shape(node))), name=imp.op_name("rows"))
    ones = [1] * len(rows)
    total = imp.reduction(loss, ReductionMode.ADD, ones, imp.op_name("total"))
    if how == "mean":
        count = imp.reduction(valid, ReductionMode.ADD, ones, imp.op_name("count"))
        total = g.div(total, count, name=imp.op_name("mean"))
    return imp.reshape(total, [1], name=imp.op_name("scalar"))


@op("cross_entropy_loss")
def _cross_entropy(imp: Importer, node: Any, a: Args) -> Tensor:
    x = a["self"]
    if x.rank < 2 or a["target"].rank != x.rank - 1:
        raise Untranslatable("cross_entropy with probability targets or unbatched input")
    shifted, _, z, _ = _softmax_parts(imp, x, 1)
    logp = imp.g.sub(shifted, imp.g.log(z, name=imp.op_name("log")), name=imp.op_name("logp"))
    return _nll(
        imp,
        node,
        logp,
        x,
        a["target"],
        a.get("weight"),
        a["reduction"],
        a["ignore_index"],
        float(a.get("label_smoothing") or 0.0),
    )


@op("nll_loss", "nll_loss_nd", "nll_loss2d", "nll_loss_forward", "nll_loss2d_forward")
def _nll_loss(imp: Importer, node: Any, a: Args) -> Any:
    x = a["self"]
    if a["target"].rank != x.rank - 1:
        raise Untranslatable("nll_loss over unbatched input")
    loss = _nll(
        imp,
        node if not isinstance(_meta(node), (list, tuple)) else _Sub(node, 0),
        imp.tensor(x),
        x,
        a["target"],
        a.get("weight"),
        a["reduction"],
        a["ignore_index"],
    )
    if isinstance(_meta(node), (list, tuple)):  # *_forward -> (output, total_weight)
        if imp.used.get(node, set()) - {0}:
            raise Untranslatable("nll_loss total_weight")
        return [loss, None]
    return loss


class _Sub:
    """A stand-in node whose meta is one result of a multi-result node."""

    def __init__(self, node: Any, index: int) -> None:
        self.name = node.name
        self.meta = {"val": node.meta["val"][index]}
        self.target = node.target


@op("mse_loss")
def _mse_loss(imp: Importer, node: Any, a: Args) -> Tensor:
    x, y = a["self"], a["target"]
    rank = max(x.rank, y.rank)
    d = imp.g.sub(imp.at_rank(x, rank), imp.at_rank(y, rank), name=imp.op_name("diff"))
    sq = imp.g.mul(d, d, name=imp.op_name("sq"))
    how = _REDUCTIONS.get(a["reduction"])
    if how is None:
        raise Untranslatable(f"reduction {a['reduction']!r}")
    if how == "none":
        return sq
    mode = ReductionMode.AVG if how == "mean" else ReductionMode.ADD
    r = imp.reduction(sq, mode, [1] * max(rank, 1), imp.op_name(how))
    return r if rank <= 1 else imp.reshape(r, [1], name=imp.op_name("scalar"))


# -- matmul, linear, convolution ------------------------------------------------------------------------


def _transposed(imp: Importer, w: Value) -> Tensor:
    """W^T of a 2-D value: a transposed view when W is bound, else a transpose op."""
    viewed = imp.view(w, imp.torch.ops.aten.t.default)
    if viewed is not None:
        return imp.tensor(viewed)
    return imp.g.transpose(imp.tensor(w), [1, 0], name=imp.op_name("wt"))


def _lead_ones(imp: Importer, v: Value | Tensor, shape: tuple[int, ...], rank: int) -> Tensor:
    if isinstance(v, Tensor):
        if len(shape) == rank:
            return v
        return imp.reshape(v, [1] * (rank - len(shape)) + list(shape), name=imp.op_name("batch"))
    return imp.at_rank(v, rank) if v.rank < rank else imp.tensor(v)


@op("linear")
def _linear(imp: Importer, node: Any, a: Args) -> Tensor:
    x, w, b = a["input"], a["weight"], a.get("bias")
    if x.rank < 2 or w.rank != 2:
        raise Untranslatable("linear over a 1-D input")
    wt_shape = (w.shape[1], w.shape[0])
    if x.rank == 2:
        bt = _transposed(imp, w)
    elif w.is_bound:
        bt = imp.reshaped(
            expect(imp.view(w, imp.torch.ops.aten.t.default), "the view of a bound weight"),
            (1,) * (x.rank - 2) + wt_shape,
        )
    else:
        bt = _lead_ones(imp, _transposed(imp, w), wt_shape, x.rank)
    y = imp.g.matmul(imp.tensor(x), bt, name=imp.op_name("matmul"))
    if b is None:
        return y
    return imp.g.add(y, imp.at_rank(b, x.rank), name=imp.op_name("bias"))


@op("matmul", "mm", "bmm")
def _matmul(imp: Importer, node: Any, a: Args) -> Tensor:
    x, y = a["self"], expect(a.get("other", a.get("mat2")), "matmul's second operand")
    if x.rank < 2 or y.rank < 2:
        raise Untranslatable("matmul with a 1-D operand")
    rank = max(x.rank, y.rank)
    return imp.g.matmul(_lead_ones(imp, x, x.shape, rank), _lead_ones(imp, y, y.shape, rank), name=imp.op_name())


@op("addmm", "baddbmm")
def _addmm(imp: Importer, node: Any, a: Args) -> Tensor:
    """beta * self + alpha * (mat1 @ mat2); baddbmm the same over a batch (batch1 @ batch2)."""
    x, y = (a["mat1"], a["mat2"]) if "mat1" in a else (a["batch1"], a["batch2"])
    m = imp.g.matmul(imp.tensor(x), imp.tensor(y), name=imp.op_name("matmul"))
    m = _scaled(imp, m, a.get("alpha"))
    bias = a["self"]
    beta = a.get("beta", 1)
    if beta == 0:
        return m
    b = imp.at_rank(bias, x.rank)
    return imp.g.add(m, _scaled(imp, b, beta), name=imp.op_name("bias"))


@op("_scaled_mm")
def _scaled_mm(imp: Importer, node: Any, a: Args) -> Tensor:
    """torch._scaled_mm (cuBLAS's fp8 GEMM, torchao's float8 linears): (mat1 @ mat2) * scale_a * scale_b
    (+ bias), per-tensor or row-wise scales, the product and scales in fp32 and the result in out_dtype (the
    node's type): the matmul template's fused fp8 GEMM. `use_fast_accum` asks for no less than the precise
    sum opgraph computes; an fp8 result's `scale_result` is not translated."""
    if a.get("scale_result") is not None:
        raise Untranslatable("_scaled_mm's scale_result (an fp8 result's scale)")
    x, y = a["self"], a["mat2"]
    if x.rank != 2 or y.rank != 2:
        raise Untranslatable("_scaled_mm of operands other than 2-D")
    f32 = DataType.FLOAT
    sa, sb = imp.at_rank(a["scale_a"], 2), imp.at_rank(a["scale_b"], 2)
    m = imp.g.scaled_matmul(imp.tensor(x), imp.tensor(y), sa, sb, out_data_type=f32, name=imp.op_name())
    bias = a.get("bias")
    if bias is not None:
        m = imp.g.add(m, imp.at_rank(bias, 2), name=imp.op_name("bias")).set_data_type(f32)
    return m


@op("t")
def _t(imp: Importer, node: Any, a: Args) -> Any:
    x = a["self"]
    if x.rank < 2:
        return x
    return imp.view(x, imp.torch.ops.aten.t.default) or imp.g.transpose(imp.tensor(x), [1, 0], name=imp.op_name())


@op("permute")
def _permute(imp: Importer, node: Any, a: Args) -> Any:
    x = a["self"]
    perm = [_axis(d, x.rank) for d in a["dims"]]
    if perm == list(range(x.rank)):
        return x
    return imp.view(x, imp.torch.ops.aten.permute.default, perm) or imp.g.transpose(
        imp.tensor(x), perm, name=imp.op_name()
    )


@op("transpose")
def _transpose(imp: Importer, node: Any, a: Args) -> Any:
    x = a["self"]
    if x.rank < 2:
        return x
    d0, d1 = _axis(a["dim0"], x.rank), _axis(a["dim1"], x.rank)
    if d0 == d1:
        return x
    perm = list(range(x.rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return imp.view(x, imp.torch.ops.aten.permute.default, perm) or imp.g.transpose(
        imp.tensor(x), perm, name=imp.op_name()
    )


def _conv_padding(padding: Any, w: Value, dilation: list[int], nsp: int) -> tuple[list[int], list[int]]:
    if isinstance(padding, str):
        if padding == "valid":
            return [0] * nsp, [0] * nsp
        if padding == "same":
            total = [d * (k - 1) for d, k in zip(dilation, w.shape[2:])]
            return [t // 2 for t in total], [t - t // 2 for t in total]
        raise Untranslatable(f"padding={padding!r}")
    p = _ints(padding, nsp)
    return p, p


_CONVS = ("conv1d", "conv2d", "conv3d", "convolution", "_convolution")


def _zero_pads(node: Any) -> list[int] | None:
    """F.pad(x, pads) with zeros (TF-style 'same' padding before a convolution): the pads, when they
    are non-negative and on the spatial axes only, else None."""
    if getattr(node, "op", None) != "call_function" or not hasattr(node.target, "_schema"):
        return None
    base = node.target._schema.name.split("::")[-1]
    if base not in ("pad", "constant_pad_nd"):
        return None
    schema_args = [x.name for x in node.target._schema.arguments]
    given = dict(zip(schema_args, node.args)) | dict(node.kwargs)
    pads = [int(p) for p in given["pad"]]
    value = given.get("value") or 0
    rank = len(node.meta["val"].shape)
    if (
        given.get("mode", "constant") != "constant"
        or value != 0
        or min(pads, default=0) < 0
        or len(pads) > 2 * (rank - 2)
    ):
        return None
    return pads


def pad_absorbed(node: Any) -> bool:
    """Whether every reader of pad node `node` is a convolution that takes its zeros as padding."""
    if _zero_pads(node) is None or not node.users:
        return False
    return all(
        u.op == "call_function"
        and hasattr(u.target, "_schema")
        and u.args
        and u.args[0] is node
        and u.target._schema.name.split("::")[-1] in _CONVS
        and not (len(u.args) > 6 and u.args[6] is True)
        and not u.kwargs.get("transposed")
        for u in node.users
    )


@op(*_CONVS)
def _conv(imp: Importer, node: Any, a: Args) -> Tensor:
    x, w, b = a["input"], a["weight"], a.get("bias")
    nsp = x.rank - 2
    if nsp < 1 or x.rank != w.rank:
        raise Untranslatable("convolution over an unbatched input")
    stride, dilation = _ints(a["stride"], nsp), _ints(a["dilation"], nsp)
    pre, post = (list(p) for p in _conv_padding(a["padding"], w, dilation, nsp))
    source = node.args[0]
    if pad_absorbed(source) and not a.get("transposed"):  # the zeros of F.pad(x) as the convolution's padding
        pads = _zero_pads(source) or []
        x = imp.env[source.args[0]]
        for k in range(len(pads) // 2):
            pre[nsp - 1 - k] += pads[2 * k]
            post[nsp - 1 - k] += pads[2 * k + 1]
    g = imp.g
    if a.get("transposed"):
        y = g.conv_dgrad(
            imp.tensor(x),
            imp.tensor(w),
            pre_padding=pre,
            post_padding=post,
            stride=stride,
            dilation=dilation,
            name=imp.op_name("conv_transpose"),
        )
        y.set_dim(og_dims(_shape(node)))
    else:
        y = g.conv_fprop(
            imp.tensor(x),
            imp.tensor(w),
            pre_padding=pre,
            post_padding=post,
            stride=stride,
            dilation=dilation,
            name=imp.op_name("conv"),
        )
    if b is None:
        return y
    return g.add(y, imp.reshaped(b, (1, b.shape[0]) + (1,) * nsp), name=imp.op_name("bias"))


# -- dropout and random draws ---------------------------------------------------------------------------


def _mask_dropout(imp: Importer, x: Value, p: float, shape: tuple[int, ...]) -> Tensor:
    keep = 1.0 - p
    mask = imp.random_value("bernoulli", shape, x.dtype, keep)
    scaled = imp.g.div(imp.tensor(mask), keep, name=imp.op_name("scale"))
    imp.note(
        "dropout in train mode: a Bernoulli mask input drawn by variant_pack from torch's RNG at every call "
        "(the same draws as PyTorch's CPU dropout after the same seed)"
    )
    return imp.g.mul(
        imp.at_rank(x, len(shape)) if len(shape) < x.rank else imp.tensor(x),
        imp.at_rank(Value(shape, x.dtype, tensor=scaled), x.rank),
        name=imp.op_name(),
    )


@op("dropout", "native_dropout", "feature_dropout")
def _dropout(imp: Importer, node: Any, a: Args) -> Any:
    x = a["input"] if "input" in a else a["self"]
    p, train = float(a["p"]), a["train"]
    multi = isinstance(_meta(node), (list, tuple))
    if multi and imp.used.get(node, set()) - {0}:
        raise Untranslatable("dropout mask output")
    base = node.target._schema.name.split("::")[-1].rstrip("_")
    if train is False or p == 0.0:
        out: Any = x
    elif p == 1.0:
        out = imp.g.mul(imp.tensor(x), 0.0, name=imp.op_name())
    else:
        shape = x.shape if base != "feature_dropout" else x.shape[:2] + (1,) * (x.rank - 2)
        out = _mask_dropout(imp, x, p, shape)
    return [out, None] if multi else out


@op("alpha_dropout", "feature_alpha_dropout")
def _alpha_dropout(imp: Importer, node: Any, a: Args) -> Any:
    if a["train"] and a["p"] > 0:
        raise Untranslatable("alpha dropout in train mode")
    return a["input"] if "input" in a else a["self"]


@op("bernoulli")
def _bernoulli(imp: Importer, node: Any, a: Args) -> Value:
    x = a["self"]
    p = a.get("p")
    if not isinstance(p, (int, float)):
        raise Untranslatable("bernoulli with tensor probabilities")
    return imp.random_value("bernoulli", x.shape, _meta(node).dtype, p)


@op("rand_like", "randn_like")
def _rand_like(imp: Importer, node: Any, a: Args) -> Value:
    base = node.target._schema.name.split("::")[-1]
    meta = _meta(node)
    return imp.random_value("uniform" if base == "rand_like" else "normal", tuple(meta.shape), meta.dtype)


@op(
    "zeros_like",
    "ones_like",
    "full_like",
    "empty_like",
    "new_zeros",
    "new_ones",
    "new_full",
    "new_empty",
    "fill",
    "zero",
)
def _like(imp: Importer, node: Any, a: Args) -> Value:
    base = node.target._schema.name.split("::")[-1].rstrip("_")
    meta = _meta(node)
    shape, dtype = to_shape(meta.shape), meta.dtype
    if symbolic(shape):
        raise dynamic_refusal(node, "makes a filled tensor", shape)
    torch = imp.torch
    if base in ("empty_like", "new_empty"):
        return Value(shape, dtype, uninit=True)
    fill: Any  # the scalar torch.full fills with
    if base in ("zeros_like", "new_zeros", "zero"):
        fill = 0
    elif base in ("ones_like", "new_ones"):
        fill = 1
    else:
        fill = a.get("fill_value", a.get("value"))
        if isinstance(fill, Value):
            raise Untranslatable("fill with a tensor value")
    return imp.constant_value(torch.full(shape, fill, dtype=dtype), base)
