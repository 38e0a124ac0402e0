"""Losses for training steps (`opgraph.training.train_step(loss=...)`), built as graph ops.

    CrossEntropy(class_axis=-1, ignore_index=-100, label_smoothing=0.0)     "cross_entropy"
        torch.nn.functional.cross_entropy with class-index targets, over a vocabulary on `class_axis`
        (the last axis by default: logits [B, T, V] and targets [B, T], the language-model layout;
        [N, C] logits are PyTorch's own layout). Mean over the targets that are not ignore_index.
            m = max_c(x)  (no gradient flows through it)    s = sum_c exp(x - m)
            nll = log(s) - (x[t] - m)                         (shifted: no cancellation)
            loss = sum_i valid_i * ((1 - eps) * nll_i + eps * (log(s_i) - mean_c(x - m))) / sum_i valid_i
        The row reductions over the logits (s, x[t] - m as a one-hot sum, mean_c) come one after the
        other, so they run as one kernel: one read of the logits after the max (which a GEMM producing
        the logits computes in its epilogue).
        Its gradient is formed directly, one elementwise op over the logits that generated kernels
        fuse into the consumers' prologue: dx = seed * valid * ((1 - eps) * (exp(x - m) / s - onehot)
        + eps * (exp(x - m) / s - 1/C)) / count.
    OneHotCrossEntropy()
        the same against one-hot (or soft) labels of the logits' dims, classes on axis 1 (a classifier's
        [N, classes] or [N, classes, 1, 1] logits): mean over samples of log-sum-exp - picked logit,
        its gradient (softmax - onehot) / N formed in the forward's intermediate type.
    MSE()                                                                   "mse"
        mean((y - t)^2), dy = seed * 2 * (y - t) / numel.
    a function `loss(g, output, target) -> Tensor`: any ops on the graph (differentiated by
        opgraph.grad); the target is declared like the output unless train_step's target_like says.

`stop_gradient(g, x)` is the identity whose gradient is zero (the op stop_gradient, a fusable IDENTITY);
`softmax_cross_entropy(g, logits, onehot)` builds OneHotCrossEntropy's loss on a hand-made graph.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, GraphError, expect
from ..core.symbolic_value import exact_quotient, size_value
from ..core.tensor import Tensor, TensorDesc
from ..graph.builder import Graph
from ..ops.pointwise import StopGradient
from ..ops.reduction import ReductionMode


def stop_gradient(g: Graph, x: Tensor, name: str = "") -> Tensor:
    """x itself, through which opgraph.grad passes no gradient (the op stop_gradient)."""
    return expect(g._add_op(StopGradient(), [x], name=name or StopGradient.kind)[0], "stop_gradient's output")


@dataclass
class LossParts:
    """What a loss built on the forward graph: the loss (dims [1]) and the tensors its gradient reads."""

    loss: Tensor
    saved: dict[str, Tensor]


class Loss:
    """A loss: the target it takes, its ops, and (optionally) its gradient formed directly."""

    name = "loss"

    def target(self, out: TensorDesc) -> tuple[tuple[int, ...], DataType]:
        """Dims and type of the target input, given the model output's descriptor."""
        raise NotImplementedError

    def forward(self, g: Graph, out: Tensor, target: Tensor, out_desc: TensorDesc) -> LossParts:
        raise NotImplementedError

    def gradient(
        self, g: Graph, out: Tensor, target: Tensor, saved: Mapping[str, Tensor], seed: Any, out_desc: TensorDesc
    ) -> Tensor | None:
        """d(loss)/d(out) times `seed` (a number or a [1] tensor), or None to differentiate `forward`."""
        return None


def _reduce(g: Graph, x: Tensor, mode: ReductionMode, dims: tuple[int, ...], name: str) -> Tensor:
    """A reduction in the graph's intermediate type (FLOAT; DOUBLE for a float64 module)."""
    return g.reduction(x, mode, name=name).set_dim(list(dims)).set_data_type(g.intermediate_data_type)


@dataclass(frozen=True)
class CrossEntropy(Loss):
    class_axis: int = -1
    ignore_index: int = -100
    label_smoothing: float = 0.0
    name = "cross_entropy"

    def _axis(self, out: TensorDesc) -> int:
        rank = len(out.dim)
        if rank < 2 or not -rank <= self.class_axis < rank:
            raise GraphError(
                f"cross_entropy over output dims {list(out.dim)} with class_axis {self.class_axis}",
                tensor=out,
                rule="training.loss_dims",
                hint="the model must return logits with a batch axis and a class axis",
            )
        return self.class_axis % rank

    def target(self, out: TensorDesc) -> tuple[tuple[int, ...], DataType]:
        axis = self._axis(out)
        return tuple(1 if i == axis else d for i, d in enumerate(out.dim)), DataType.INT64

    def forward(self, g: Graph, out: Tensor, target: Tensor, out_desc: TensorDesc) -> LossParts:
        if not 0.0 <= self.label_smoothing <= 1.0:
            raise AttributeValueError(
                f"label_smoothing {self.label_smoothing} is not in [0, 1]",
                rule="training.label_smoothing",
                hint="pass a value in [0, 1]",
            )
        axis = self._axis(out_desc)
        rows = self.target(out_desc)[0]
        ones = (1,) * len(rows)
        m = stop_gradient(g, _reduce(g, out, ReductionMode.MAX, rows, "ce.max"), name="ce.max_no_grad")
        shifted = g.sub(out, m, name="ce.shift").set_data_type(g.intermediate_data_type)
        e = g.exp(shifted, name="ce.exp").set_data_type(g.intermediate_data_type)
        s = _reduce(g, e, ReductionMode.ADD, rows, "ce.sum")
        onehot = g.cmp_eq(g.gen_index(out, axis, name="ce.classes"), target, name="ce.onehot")
        onehot.set_data_type(g.intermediate_data_type)
        # the picked logit's (and label smoothing's mean logit's) reduction right after the sum of exps,
        # before any op that reads a reduced value: all reduce the same rows, so the partitioner puts
        # them in one kernel, one pass over the logits
        picked = _reduce(
            g,
            g.mul(
                onehot, g.sub(out, m, name="ce.shift_picked").set_data_type(g.intermediate_data_type), name="ce.pick"
            ),
            ReductionMode.ADD,
            rows,
            "ce.picked",
        )
        mean_c = _reduce(g, shifted, ReductionMode.AVG, rows, "ce.mean_logit") if self.label_smoothing else None
        log_s = g.log(s, name="ce.log_sum")
        nll = g.sub(log_s, picked, name="ce.nll")
        if mean_c is not None:
            smooth = g.sub(log_s, mean_c, name="ce.smooth")
            eps = self.label_smoothing
            nll = g.add(
                g.mul(nll, 1.0 - eps, name="ce.nll_part"), g.mul(smooth, eps, name="ce.smooth_part"), name="ce.smoothed"
            )
        valid = g.cmp_neq(target, self.ignore_index, name="ce.valid").set_data_type(g.intermediate_data_type)
        total = _reduce(g, g.mul(nll, valid, name="ce.masked"), ReductionMode.ADD, ones, "ce.total")
        count = _reduce(g, valid, ReductionMode.ADD, ones, "ce.count")
        loss = g.div(total, count, name="ce.loss")
        return LossParts(loss, {"m": m, "s": s, "count": count, "valid": valid, "onehot": onehot})

    def gradient(
        self, g: Graph, out: Tensor, target: Tensor, saved: Mapping[str, Tensor], seed: Any, out_desc: TensorDesc
    ) -> Tensor:
        axis = self._axis(out_desc)
        # per-row weights first, then one elementwise chain over the logits (one kernel, fused into the
        # consumers' prologues where they can): nothing of the logits' size is kept from the forward
        valid = g.cmp_neq(target, self.ignore_index, name="ce.bwd_valid").set_data_type(g.intermediate_data_type)
        row = g.mul(g.div(valid, saved["count"], name="ce.bwd_weight"), seed, name="ce.bwd_seed")
        p = g.div(g.exp(g.sub(out, saved["m"], name="ce.bwd_shift"), name="ce.bwd_exp"), saved["s"], name="ce.softmax")
        onehot = g.cmp_eq(g.gen_index(out, axis, name="ce.bwd_classes"), target, name="ce.bwd_onehot")
        onehot.set_data_type(g.intermediate_data_type)
        eps = self.label_smoothing
        if eps:
            smooth = size_value(1, out_desc.dim[axis], eps)  # eps / C (C a dynamic size too)
            onehot = g.add(g.mul(onehot, 1.0 - eps, name="ce.bwd_hot"), smooth, name="ce.bwd_smooth")
        return g.mul(g.sub(p, onehot, name="ce.bwd_diff"), row, name="ce.dlogits")


def softmax_cross_entropy(g: Graph, logits: Tensor, onehot: Tensor, name: str = "loss") -> Tensor:
    """The mean over samples of -log softmax(logits)[label] (torch.nn.functional.cross_entropy), with
    classes on axis 1: logits and one-hot labels of dims [N, classes] or [N, classes, 1, 1] (the
    output of a 1x1-conv classifier). Returns a tensor of ones dims, of `g`'s intermediate type. Each
    sample's logits are shifted by their max first (log-sum-exp), so large logits do not overflow."""
    return _softmax_cross_entropy(g, logits, onehot, name)[0]


def _softmax_cross_entropy(g: Graph, logits: Tensor, onehot: Tensor, name: str) -> tuple[Tensor, Tensor, Tensor]:
    """`softmax_cross_entropy`, and the per-sample max m and sum of exp(logits - m) s it computes."""
    dims = onehot.dim or logits.dim
    if dims is None or len(dims) < 2:
        raise GraphError(
            "the one-hot labels need declared dims [N, classes, ...]",
            tensor=onehot,
            rule="training.labels",
            hint="declare onehot with g.tensor(dim=[N, classes])",
        )
    per_sample = [dims[0], 1, *dims[2:]]
    dt = g.intermediate_data_type

    def reduce(x: Tensor, mode: str, dim: list[int], what: str) -> Tensor:
        return g.reduction(x, mode=mode, name=f"{name}.{what}").set_dim(dim).set_data_type(dt)

    m = reduce(logits, "max", per_sample, "max")
    s = reduce(g.exp(g.sub(logits, m)), "add", per_sample, "sum_exp")
    lse = g.add(g.log(s), m)
    picked = reduce(g.mul(logits, onehot), "add", per_sample, "picked")
    return reduce(g.sub(lse, picked), "avg", [1] * len(dims), "mean").set_name(name), m, s


@dataclass(frozen=True)
class OneHotCrossEntropy(Loss):
    """`softmax_cross_entropy` against one-hot labels of the logits' dims and type, with its gradient
    formed directly as PyTorch's cross_entropy backward forms it: dlogits = (softmax - onehot) * (seed /
    N), computed in the forward's intermediate type (FLOAT for a 16-bit model) and rounded once to the
    logits' gradient type. Differentiating the loss's ops instead computes each backward intermediate in
    the gradients' type: for an fp16 model, seed / N / s (below fp16's smallest normal for a wide
    classifier) and the softmax are rounded apart, and the max's gradient (zero, as a difference of two
    fp16 values near 1/N) adds a rounding error to each row's largest logit; the bias gradient (the batch
    sum of dlogits) came out 3 to 9 times less accurate than PyTorch's."""

    name = "softmax_cross_entropy"

    def target(self, out: TensorDesc) -> tuple[tuple[int, ...], DataType]:
        if len(out.dim) < 2:
            raise GraphError(
                f"one-hot cross-entropy needs logits [N, classes, ...], got dims {list(out.dim)}",
                tensor=out,
                rule="training.classifier",
                hint="import a module that returns the logits alone (wrap it if it returns more)",
            )
        return tuple(out.dim), out.data_type

    def forward(self, g: Graph, out: Tensor, target: Tensor, out_desc: TensorDesc) -> LossParts:
        loss, m, s = _softmax_cross_entropy(g, out, target, "loss")
        return LossParts(loss, {"m": m, "s": s})

    def gradient(
        self, g: Graph, out: Tensor, target: Tensor, saved: Mapping[str, Tensor], seed: Any, out_desc: TensorDesc
    ) -> Tensor:
        wide = saved["s"].known_data_type()  # the forward's intermediate type (FLOAT, DOUBLE)
        # the samples the loss averages over (a size of the graph at each shape where dims are dynamic)
        count = exact_quotient(math.prod(out_desc.dim), out_desc.dim[1])
        if count is None:  # (the classes axis is a factor of the logits' element count: never taken)
            raise GraphError(
                "the logits' samples are not numel / classes", rule="training.internal", hint="report this"
            )
        shifted = g.sub(out, saved["m"], name="ce.bwd_shift").set_data_type(wide)
        e = g.exp(shifted, name="ce.bwd_exp").set_data_type(wide)
        p = g.div(e, saved["s"], name="ce.softmax").set_data_type(wide)
        diff = g.sub(p, target, name="ce.bwd_diff").set_data_type(wide)
        # the product is the logits' gradient: train_step gives it their type (one rounding)
        if isinstance(seed, (int, float)):
            return g.mul(diff, size_value(1, count, float(seed)), name="ce.dlogits")
        weight = g.mul(seed, size_value(1, count), name="ce.bwd_weight").set_data_type(wide)
        return g.mul(diff, weight, name="ce.dlogits")


@dataclass(frozen=True)
class MSE(Loss):
    name = "mse"

    def target(self, out: TensorDesc) -> tuple[tuple[int, ...], DataType]:
        return out.dim, out.data_type

    def forward(self, g: Graph, out: Tensor, target: Tensor, out_desc: TensorDesc) -> LossParts:
        d = g.sub(out, target, name="mse.diff").set_data_type(g.intermediate_data_type)
        mean = _reduce(g, g.mul(d, d, name="mse.square"), ReductionMode.AVG, (1,) * len(out_desc.dim), "mse.loss")
        return LossParts(mean, {})

    def gradient(
        self, g: Graph, out: Tensor, target: Tensor, saved: Mapping[str, Tensor], seed: Any, out_desc: TensorDesc
    ) -> Tensor:
        d = g.sub(out, target, name="mse.bwd_diff")
        k = size_value(1, math.prod(out_desc.dim), 2.0)  # 2 / numel (a size of the graph at each shape)
        scale = seed * k if isinstance(seed, (int, float)) else g.mul(seed, k, name="mse.bwd_scale")
        return g.mul(d, scale, name="mse.dout")


@dataclass(frozen=True)
class FunctionLoss(Loss):
    """A loss written as ops by `fn(g, output, target)`; the target takes `target_spec` (dims, type),
    or the output's dims and type."""

    fn: Callable[..., Tensor]
    target_spec: tuple[tuple[int, ...], Any] | None = None
    name = "function"

    def target(self, out: TensorDesc) -> tuple[tuple[int, ...], DataType]:
        if self.target_spec is None:
            return out.dim, out.data_type
        from ..core.dtypes import as_data_type

        return tuple(self.target_spec[0]), as_data_type(self.target_spec[1])

    def forward(self, g: Graph, out: Tensor, target: Tensor, out_desc: TensorDesc) -> LossParts:
        loss = self.fn(g, out, target)
        if not isinstance(loss, Tensor):
            raise GraphError(
                f"the loss function returned {type(loss).__name__}, not a tensor of the graph",
                rule="training.loss",
                hint="return the loss tensor (dims [1]) your ops computed",
            )
        return LossParts(loss, {})


def as_loss(loss: Any, target_like: Any = None) -> Loss:
    """A Loss from "cross_entropy", "mse", a Loss, or a function (see the module docstring)."""
    if isinstance(loss, Loss):
        return loss
    if loss == "cross_entropy":
        return CrossEntropy()
    if loss in ("mse", "mse_loss"):
        return MSE()
    if callable(loss):
        spec = None
        if target_like is not None:
            if hasattr(target_like, "shape") and hasattr(target_like, "dtype"):
                spec = (tuple(int(d) for d in target_like.shape) or (1,), target_like.dtype)
            else:
                spec = (tuple(target_like[0]), target_like[1])
        return FunctionLoss(loss, spec)
    raise AttributeValueError(
        f"loss={loss!r} is not 'cross_entropy', 'mse', a Loss or a function",
        rule="training.loss",
        hint="pass loss='cross_entropy', 'mse', "
        "opgraph.training.CrossEntropy(...), or fn(g, output, target) -> loss tensor",
    )
