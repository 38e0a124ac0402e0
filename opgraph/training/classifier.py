"""Training steps as one graph: forward + loss + backward + SGD with momentum, updated in place.

    step = opgraph.training.sgd_momentum(g, loss, params=[w1, b1, w2])
    plan = step.graph.build()
    pack = {x.uid: images, labels.uid: onehot, loss.uid: loss_buf, w1.uid: w1_buf, ...,
            **step.state(lr=0.1, momentum=0.9)}
    for i in range(steps):
        ...                         # new data into the x and labels buffers, the next lr into pack[step.lr.uid]
        plan.execute(pack)          # parameters and velocities are updated in their buffers

`sgd_momentum` differentiates the forward graph (`opgraph.grad(..., combined=True)`) and appends,
per parameter W with gradient dW, the update of torch.optim.SGD (dampening 0, no Nesterov):

    v = momentum * v + (dW + weight_decay * W)     v shares its UID: updated in place
    W = W - lr * v                                 W shares its UID: updated in place

(the velocity as v + ((momentum * v - v) + dW), the same up to rounding: an op updating a tensor in
place must read the old value itself.)

`lr` and `momentum` are 1-element tensors read at run time (device scalars): a schedule writes the
new value into the buffer before each step, and a captured CUDA graph replays with it, never
re-captured. The velocity buffers start at zero (`state` makes them), which gives torch's first step
v = dW. Gradients stay virtual (the partitioner materialises them where they cross kernels) unless
`keep_grads`. The incoming gradient of the loss, ``seed``, is an input too: `state` binds it to 1.

The step graph keeps the forward graph's UIDs and names (bind by `handle.uid` or name; the handles
of `TrainingStep` belong to the step graph). By-reference inputs stay by reference, so a captured
step can read double-buffered batches (examples/09_cuda_graph_training.py). A forward output that
is not a parameter (batchnorm's next running stats) is an output of the step as well; the caller
carries it over (examples/11_train_mobilenet_digits.py swaps the buffers).

`classifier_step(imported)` does all of this for a PyTorch classifier imported with
`opgraph.from_torch` in train mode: cross-entropy on its logits, SGD on every parameter of the module
(bound as views, so the module itself is trained), its batchnorm running stats written back. It is a
case of `train_step` (opgraph/training/step.py): any imported module, cross-entropy / mse / your own
loss, SGD or AdamW with device-scalar hyper-parameters (opgraph/training/optimizers.py), bf16 / fp16 mixed
precision and gradient clipping.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..autodiff import GradGraph, grad
from ..autodiff.grad import resolve
from ..core.dtypes import DataType, as_data_type
from ..core.errors import GraphError
from ..core.tensor import Tensor, TensorDesc
from ..core.types import UidPack
from ..graph.builder import Graph
from .losses import Loss, LossParts
from .optimizers import SGD
from .step import train_step

__all__ = ["TrainingStep", "sgd_momentum", "softmax_cross_entropy", "ClassifierStep", "classifier_step"]


@dataclass
class TrainingStep:
    """The training-step graph of `sgd_momentum` and its handles (all in `graph`).

    graph      forward + backward + updates
    loss       the loss output
    params     forward parameter UID -> its handle (read, then updated in place under the same UID)
    velocity   forward parameter UID -> its momentum buffer (updated in place)
    lr         learning rate, a 1-element tensor read at run time
    momentum   momentum, a 1-element tensor read at run time
    seed       the loss's incoming gradient (bind ones: `state` does)
    grads      the GradGraph (gradient handles, saved tensors)
    """

    graph: Graph
    loss: Tensor
    params: dict[int, Tensor]
    velocity: dict[int, Tensor]
    lr: Tensor
    momentum: Tensor
    seed: Tensor
    grads: GradGraph

    def state(self, lr: float, momentum: float, device: Any = None) -> UidPack:
        """Buffers for the optimizer state, keyed by UID: zero velocities, `lr`, `momentum` and the
        seed (ones). NumPy arrays when `device` is None, else torch tensors on `device`."""
        f = self.graph.final
        out: UidPack = {}
        for t, value in ((*((v, 0.0) for v in self.velocity.values()), (self.lr, lr), (self.momentum, momentum),
                          (self.seed, 1.0))):
            uid = t.known_uid()
            out[uid] = _filled(f.tensors[uid], value, device)
        return out


def _filled(desc: TensorDesc, value: float, device: Any) -> Any:
    """A buffer with the descriptor's dims and strides holding `value`."""
    if device is None:
        from ..memory.fill import empty_like_desc

        arr = empty_like_desc(desc)
        arr[...] = np.asarray(value).astype(desc.data_type.numpy)
        return arr
    import torch

    t = torch.empty_strided(desc.dim, desc.stride, dtype=desc.data_type.to_torch(), device=device)
    return t.fill_(value)


def _handle(g: Graph, uid: int) -> Tensor:
    """The handle standing for forward tensor `uid` in a combined gradient graph (its first handle with
    that UID: the declared one for an input)."""
    for t in g._tensors:
        if t._uid == uid:
            return t
    raise AssertionError(f"the step graph has no tensor with UID {uid}")


def sgd_momentum(forward: Graph, loss: Tensor, params: Sequence[Tensor], *, weight_decay: float = 0.0,
                 keep_grads: bool = False, scalar_data_type: Any = None, grad_data_type: Any = None,
                 name: str | None = None) -> TrainingStep:
    """The training step of `forward`: loss and gradients of `params`, then SGD with momentum.

    forward: the forward graph, with `loss` (a 1-element floating output) computed in it.
    params: forward inputs (handles, UIDs or names) to train; each is updated in place.
    weight_decay: L2 penalty added to each gradient (torch.optim.SGD's weight_decay).
    keep_grads: make the gradients outputs (``grad_<name>``) as well.
    scalar_data_type: the type of lr and momentum (default: the forward's compute type).
    grad_data_type: the type of the gradients and other backward intermediates (`opgraph.grad`'s
        intermediate_data_type; default the forward's intermediate type). HALF for a HALF model is
        PyTorch's fp16 training: half the gradient traffic, and conv backward on fp16 tensor cores.
    """
    fg = forward.final
    loss_uid = resolve(fg, loss, "loss")
    d = fg.tensors[loss_uid]
    if d.numel != 1 or not d.data_type.is_floating:
        raise GraphError(f"the loss must be a 1-element floating tensor, got {d.type_str()}", tensor=d,
                         rule="training.loss", hint="reduce the loss to dims [1] or [1, 1] (reduction mode avg)")
    for key in params:
        uid = resolve(fg, key, "params")
        if uid not in fg.inputs:
            raise GraphError("a trained parameter must be an input of the forward graph (it is updated in place)",
                             tensor=fg.tensors[uid], rule="training.param",
                             hint="declare the parameter with g.tensor(...) and pass that handle")
    res = grad(forward, [loss], list(params), combined=True, intermediate_data_type=grad_data_type,
               name=name or f"{forward.name or 'graph'}_sgd")
    g = res.graph
    for uid in fg.inputs:  # combined graphs copy inputs without the flag: double-buffered inputs keep it
        if fg.tensors[uid].is_by_reference:
            _handle(g, uid).set_is_by_reference(True)
    sdt = as_data_type(scalar_data_type) if scalar_data_type is not None else fg.compute_data_type
    g.validate()
    next_uid = max(g.final.tensors) + 1
    lr = g.tensor(dim=[1], data_type=sdt, name="lr", uid=next_uid)
    momentum = g.tensor(dim=[1], data_type=sdt, name="momentum", uid=next_uid + 1)
    next_uid += 2
    handles: dict[int, Tensor] = {}
    velocity: dict[int, Tensor] = {}
    for uid, dw in res.grads.items():
        p = fg.tensors[uid]
        w = _handle(g, uid)
        v = g.tensor(dim=p.dim, stride=p.stride, data_type=p.data_type, name=f"velocity_{p.name or uid}", uid=next_uid)
        next_uid += 1
        tag = p.name or str(uid)
        if weight_decay:
            dw = g.add(dw, g.mul(w, float(weight_decay), name=f"sgd.decay.{tag}"), name=f"sgd.decayed.{tag}")
        # v + ((momentum * v - v) + dW) = momentum * v + dW: an in-place writer must read the old
        # value itself, so the last op is v + delta rather than (momentum * v) + dW
        delta = g.add(g.sub(g.mul(v, momentum, name=f"sgd.mv.{tag}"), v, name=f"sgd.mv_minus_v.{tag}"), dw,
                      name=f"sgd.delta.{tag}")
        v_new = g.add(v, delta, name=f"sgd.velocity.{tag}")
        v_new.set_uid(v.uid).set_output(True).set_name(v.name)
        w_new = g.sub(w, g.mul(v_new, lr, name=f"sgd.step.{tag}"), name=f"sgd.update.{tag}")
        w_new.set_uid(uid).set_output(True).set_name(p.name)
        handles[uid], velocity[uid] = w, v
    if not keep_grads:  # read by the updates now: virtual, materialised only where they cross kernels
        for t in res.grads.values():
            t.set_output(False)
    g.validate()
    return TrainingStep(g, _handle(g, loss_uid), handles, velocity, lr, momentum, res.grad_inputs[loss_uid], res)


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
        raise GraphError("the one-hot labels need declared dims [N, classes, ...]", tensor=onehot,
                         rule="training.labels", hint="declare onehot with g.tensor(dim=[N, classes])")
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
class _OneHotCrossEntropy(Loss):
    """`softmax_cross_entropy` against one-hot labels, with its gradient formed directly as PyTorch's
    cross_entropy backward forms it: dlogits = (softmax - onehot) * (seed / N), computed in the
    forward's intermediate type (FLOAT for a 16-bit model) and rounded once to the logits' gradient
    type. Differentiating the loss's ops instead computes each backward intermediate in the
    gradients' type: for an fp16 model, seed / N / s (below fp16's smallest normal for a wide
    classifier) and the softmax are rounded apart, and the max's gradient (zero, as a difference of
    two fp16 values near 1/N) adds a rounding error to each row's largest logit; the bias gradient
    (the batch sum of dlogits) came out 3 to 9 times less accurate than PyTorch's."""

    dims: tuple[int, ...]
    data_type: Any
    name = "softmax_cross_entropy"

    def target(self, out: TensorDesc) -> tuple[tuple[int, ...], DataType]:
        return tuple(self.dims), as_data_type(self.data_type)

    def forward(self, g: Graph, out: Tensor, target: Tensor, out_desc: TensorDesc) -> LossParts:
        loss, m, s = _softmax_cross_entropy(g, out, target, "loss")
        return LossParts(loss, {"m": m, "s": s})

    def gradient(self, g: Graph, out: Tensor, target: Tensor, saved: Mapping[str, Tensor], seed: Any,
                 out_desc: TensorDesc) -> Tensor:
        wide = saved["s"].known_data_type()  # the forward's intermediate type (FLOAT, DOUBLE)
        count = math.prod(out_desc.dim) // out_desc.dim[1]  # the samples the loss averages over
        shifted = g.sub(out, saved["m"], name="ce.bwd_shift").set_data_type(wide)
        e = g.exp(shifted, name="ce.bwd_exp").set_data_type(wide)
        p = g.div(e, saved["s"], name="ce.softmax").set_data_type(wide)
        diff = g.sub(p, target, name="ce.bwd_diff").set_data_type(wide)
        # the product is the logits' gradient: train_step gives it their type (one rounding)
        if isinstance(seed, (int, float)):
            return g.mul(diff, float(seed) / count, name="ce.dlogits")
        weight = g.mul(seed, 1.0 / count, name="ce.bwd_weight").set_data_type(wide)
        return g.mul(diff, weight, name="ce.dlogits")


@dataclass
class ClassifierStep:
    """The training step of a PyTorch classifier imported with `opgraph.from_torch` (train mode):
    softmax cross-entropy on its logits against one-hot labels (its gradient formed directly, as
    PyTorch's: (softmax - onehot) / N in FLOAT, rounded once to the logits' type), then SGD with
    momentum on every parameter of the module: `train_step` with that loss and optimizer (`step` is
    the `TrainStep`).
    The module's parameters are bound as views, so each step trains the module itself;
    `finish(pack)` copies the new batchnorm running stats into it.

        imported = opgraph.from_torch(model.train(), (x,))
        cs = opgraph.training.classifier_step(imported)
        plan = cs.step.graph.build()
        pack = cs.pack(x, onehot, lr=0.1, momentum=0.9)
        plan.execute(pack); cs.finish(pack)       # = loss.backward(); SGD.step(); model's BN stats
    """

    imported: Any
    step: Any
    onehot: Tensor

    def pack(self, x: Any, onehot: Any, *, lr: float, momentum: float) -> UidPack:
        """The step's variant pack with batch `x` and labels `onehot`, and `lr` and `momentum` written
        into its device scalars. The velocities are the step's (zeros at the first pack: a new
        optimizer), kept from execute to execute."""
        self.step.optimizer.set(lr=lr, momentum=momentum)
        return self.step.pack(x, target=onehot)

    def finish(self, pack: UidPack) -> None:
        """After an execute: the module's batchnorm running stats (and counters) from the pack."""
        self.imported.write_back(pack)


def classifier_step(imported: Any, *, weight_decay: float = 0.0, grad_data_type: Any = None) -> ClassifierStep:
    """`ClassifierStep` of an imported classifier whose one output is logits [N, classes]. The
    imported graph is not changed (it still runs forward passes). Gradients have the parameters'
    type, as in PyTorch (fp16 for a `.half()` model), unless `grad_data_type` says otherwise (or the
    parameters' types differ: then the graph's intermediate type)."""
    outputs = list(imported.outputs)
    if len(outputs) != 1 or len(outputs[0].dim) != 2:
        raise GraphError(f"classifier_step needs one output of dims [N, classes]; the module has "
                         f"{[list(t.dim) for t in outputs]}", rule="training.classifier",
                         hint="import a module that returns the logits alone (wrap it if it returns more)")
    d = imported.graph.final.tensors[outputs[0].uid]
    loss = _OneHotCrossEntropy(tuple(d.dim), d.data_type)
    params = [t.uid for t, source in imported.bound_inputs if source.kind == "parameter"]
    if grad_data_type is None:
        types = {imported.graph.final.tensors[uid].data_type for uid in params}
        grad_data_type = types.pop() if len(types) == 1 else None
    # momentum is structural (a velocity buffer); pack() writes the caller's values into the scalars
    step = train_step(imported, loss, SGD(0.0, momentum=0.9, weight_decay=weight_decay), grad_data_type=grad_data_type)
    return ClassifierStep(imported, step, step.target)

