"""Deprecated training-step entry points, kept as thin wrappers over the one training API:

    sgd_momentum(g, loss, params, weight_decay=wd)   ->  step_graph(g, loss, params, SGD(lr, momentum=m,
                                                          weight_decay=wd))  (opgraph.training.step_graph)
    classifier_step(imported)                        ->  train_step(imported, OneHotCrossEntropy(),
                                                          SGD(lr, momentum=0.9))  (opgraph.training.step)

Each warns (DeprecationWarning) and returns what it always did: `TrainingStep` (the step graph's
handles: lr and momentum device scalars, velocities, the seed; `state(lr, momentum)` makes their
buffers) and `ClassifierStep` (`pack(x, onehot, lr=, momentum=)`, `finish(pack)`). The update is
torch.optim.SGD's (dampening 0, no Nesterov); `softmax_cross_entropy` lives in opgraph.training.losses.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.dtypes import as_data_type
from ..core.errors import GraphError
from ..core.tensor import Tensor
from ..core.types import UidPack
from ..graph.builder import Graph
from .losses import OneHotCrossEntropy, softmax_cross_entropy
from .optimizers import SGD
from .step import TrainStep, train_step
from .step_graph import StepGraph, handles_by_uid, step_graph

__all__ = ["TrainingStep", "sgd_momentum", "softmax_cross_entropy", "ClassifierStep", "classifier_step"]


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"opgraph.training.{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)


@dataclass
class Grads:
    """The gradients of a `TrainingStep`: `grads[param_uid]`, the handle in the step graph."""

    grads: dict[int, Tensor]


@dataclass
class TrainingStep:
    """The training-step graph of `sgd_momentum` and its handles (all in `graph`; deprecated: see the
    module docstring).

    graph      forward + backward + updates
    loss       the loss output
    params     forward parameter UID -> its handle (read, then updated in place under the same UID)
    velocity   forward parameter UID -> its momentum buffer (updated in place)
    lr         learning rate, a 1-element tensor read at run time
    momentum   momentum, a 1-element tensor read at run time
    seed       the loss's incoming gradient (bind ones: `state` does)
    grads      the gradients (`grads.grads[param_uid]`)
    step_graph the StepGraph it is
    """

    graph: Graph
    loss: Tensor
    params: dict[int, Tensor]
    velocity: dict[int, Tensor]
    lr: Tensor
    momentum: Tensor
    seed: Tensor
    grads: Grads
    step_graph: StepGraph

    def state(self, lr: float, momentum: float, device: Any = None) -> UidPack:
        """Buffers for the optimizer state, keyed by UID: zero velocities, `lr`, `momentum` (and the weight
        decay) and the seed (ones). NumPy arrays when `device` is None, else torch tensors on `device`."""
        self.step_graph.optimizer.set(lr=lr, momentum=momentum)
        return self.step_graph.state_pack(device)


def sgd_momentum(
    forward: Graph,
    loss: Tensor,
    params: Sequence[Tensor],
    *,
    weight_decay: float = 0.0,
    keep_grads: bool = False,
    scalar_data_type: Any = None,
    grad_data_type: Any = None,
    name: str | None = None,
) -> TrainingStep:
    """Deprecated: `step_graph(forward, loss, params, SGD(lr, momentum=m, weight_decay=weight_decay))`.

    The training step of `forward`: loss and gradients of `params`, then SGD with momentum, as one graph
    whose device scalars are named "lr" and "momentum" (and "weight_decay" when it is not 0).
    scalar_data_type: their type (default: the forward's compute type); grad_data_type: the gradients'
    (opgraph.grad's intermediate_data_type); keep_grads: make the gradients outputs.
    """
    _deprecated("sgd_momentum", "opgraph.training.step_graph(g, loss, params, SGD(lr, momentum=...))")
    sdt = as_data_type(scalar_data_type) if scalar_data_type is not None else forward.final.compute_data_type
    sg = step_graph(
        forward,
        loss,
        params,
        SGD(0.0, momentum=0.9, weight_decay=weight_decay),
        scalar_data_type=sdt,
        keep_grads=keep_grads,
        grad_data_type=grad_data_type,
        scalar_names={"sgd.lr": "lr", "sgd.momentum": "momentum", "sgd.weight_decay": "weight_decay"},
        name=name or f"{forward.name or 'graph'}_sgd",
    )
    handles = handles_by_uid(sg.graph)
    first: dict[int | None, Tensor] = {}
    for t in sg.graph._tensors:  # the declared handle of each parameter (what the update reads)
        first.setdefault(t._uid, t)
    return TrainingStep(
        sg.graph,
        handles[sg.loss_uid],
        {s.uid: first[s.uid] for s in sg.params},
        {s.uid: handles[s.state["momentum_buffer"]] for s in sg.params},
        sg.scalar("lr"),
        sg.scalar("momentum"),
        first[sg.seed_uid] if sg.seed_uid is not None else handles[sg.loss_uid],
        Grads({s.uid: handles[s.grad_uid] for s in sg.params if s.grad_uid is not None}),
        sg,
    )


@dataclass
class ClassifierStep:
    """Deprecated: `train_step(imported, OneHotCrossEntropy(), SGD(lr, momentum=0.9))`, which `step` is.

    The training step of a PyTorch classifier imported with `opgraph.from_torch` (train mode): softmax
    cross-entropy on its logits against one-hot labels, then SGD with momentum on every parameter of the
    module, which it trains (bound as views); `finish(pack)` copies the new batchnorm running stats into it.
    """

    imported: Any
    step: TrainStep
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
    """Deprecated: `train_step(imported, OneHotCrossEntropy(), SGD(lr, momentum=0.9, weight_decay=...),
    grad_data_type=...)`. Gradients have the parameters' type (fp16 for a `.half()` model) unless
    `grad_data_type` says otherwise (or the parameters' types differ: then the graph's intermediate type)."""
    _deprecated("classifier_step", "opgraph.training.train_step(imported, OneHotCrossEntropy(), SGD(...))")
    outputs = list(imported.outputs)
    if len(outputs) != 1 or len(outputs[0].dim) != 2:
        raise GraphError(
            f"classifier_step needs one output of dims [N, classes]; the module has {[list(t.dim) for t in outputs]}",
            rule="training.classifier",
            hint="import a module that returns the logits alone (wrap it if it returns more)",
        )
    if grad_data_type is None:
        types = {
            imported.graph.final.tensors[t.uid].data_type for t, s in imported.bound_inputs if s.kind == "parameter"
        }
        grad_data_type = types.pop() if len(types) == 1 else None
    # momentum is structural (a velocity buffer); pack() writes the caller's values into the scalars
    step = train_step(
        imported, OneHotCrossEntropy(), SGD(0.0, momentum=0.9, weight_decay=weight_decay), grad_data_type=grad_data_type
    )
    return ClassifierStep(imported, step, step.target)


def _handle(g: Graph, uid: int) -> Tensor:
    """The handle standing for forward tensor `uid` in a combined gradient graph (its first handle with
    that UID: the declared one for an input)."""
    for t in g._tensors:
        if t._uid == uid:
            return t
    raise AssertionError(f"the step graph has no tensor with UID {uid}")
