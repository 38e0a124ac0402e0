"""The graph of a training step, built by a pure function: `step_graph(forward, loss, params, optimizer)`.

    sg = opgraph.training.step_graph(g, loss, [w1, b1, w2], opgraph.training.SGD(0.1, momentum=0.9))
    plan = sg.graph.build()
    pack = {**my_buffers, **sg.state_pack()}     # optimizer state (zeros), device scalars, the seed
    plan.execute(pack)                           # forward, backward and the updates, in place

The step graph is the forward graph (its UIDs and names) followed by the backward (opgraph.grad,
combined) and, per parameter, the optimizer's in-place update of the parameter and its state
(opgraph.training.optimizers). What it holds besides the graph (`StepGraph`): a `ParamSlot` per trained
parameter (its graph input, gradient and state UIDs), the device scalars by name (hyper-parameters,
AdamW's step counter, the clipping norm, the fp16 loss scale) and where the loss is. Running it is
someone else's: `TrainStep` (opgraph.training.step) binds an imported module's tensors to it; a
hand-built graph's caller binds its own buffers (examples 09 and 11).

- The backward is seeded at the loss (its incoming gradient `grad_<loss>` an input bound to ones), or,
  with an `AnalyticSeed`, at a tensor whose gradient the caller forms directly (cross-entropy's from the
  logits: opgraph.training.losses).
- `on_gradient` hooks see each parameter's gradient as soon as it is made and return the tensor the
  update reads instead (the seam for a process group's all-reduce). A hook with a `gradients(g, slots,
  grads)` method sees them all at once (UID -> gradient, returns the same): buckets of gradients
  (opgraph.training.distributed). A hook's op that reads a gradient is placed right after the op making
  it (an all-reduce starts as soon as its bucket exists); its other ops after the backward. A hook's
  `updated_elsewhere(g, slots)` names parameters this graph does not update (another process does: ZeRO-1).
- Without clipping or loss scaling, each parameter's update ops are placed right after the op that makes
  its gradient, so the partitioner can fuse the update into that kernel's epilogue, in place. Clipping
  (the global norm, torch.nn.utils.clip_grad_norm_) and fp16 loss scaling (GradScaler's dynamic scale on
  the device: an inf or NaN skips the update and halves the scale) need every gradient first.
- `compute_copies=True` (mixed precision): a parameter the forward reads only through its cast to a
  16-bit type keeps that cast as step state, its *compute copy* (`ParamSlot.compute_copy`), bound like
  the parameter: the forward and the backward read the copy, and the update writes it with the new
  parameter (in its kernel: two bytes an element more where a cast pass read four and wrote two). Bind it
  to the parameter cast to its type before the first step, and again whenever the parameter changes
  outside the step (opgraph.training.TrainStep does both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..autodiff import grad
from ..autodiff.grad import resolve
from ..core.dtypes import DataType, as_data_type
from ..core.errors import AttributeValueError, GraphError, expect
from ..core.tensor import Tensor, storage_extent
from ..core.types import UidPack
from ..graph.builder import Graph
from ..ops.reduction import ReductionMode
from .optimizers import Optimizer, UpdateScope, scalar_type

SCALER_DEFAULTS = {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}


@dataclass(frozen=True)
class ParamSlot:
    """A trained parameter: its `key` (a state_dict key, or the tensor's name), the step graph input
    `uid` it is read from and updated in place, the `source` that binds it (an imported module tensor
    through its views; None: bound as it is), its gradient's UID in the step graph (virtual unless
    kept) and its optimizer state buffers (name -> UID, laid out like the parameter)."""

    key: str
    uid: int
    source: Any = None
    grad_uid: int | None = None
    state: Mapping[str, int] = field(default_factory=dict)
    compute_copy: int | None = None  # its 16-bit cast kept as step state (see the module docstring)


@dataclass(frozen=True)
class AnalyticSeed:
    """Seed the backward at tensor `uid` (the model's output) with `gradient(g, handles, scale)`: d(loss)/d(out)
    times `scale` (1.0, or the fp16 loss scale tensor), formed directly on the step graph `g` from its
    handles by UID (a loss whose gradient is cheaper or more accurate formed than differentiated)."""

    uid: int
    gradient: Callable[[Graph, Mapping[int, Tensor], Any], Tensor]


# gradient-ready hook: (step graph, parameter slot, its gradient) -> the gradient the update reads
GradientHook = Callable[[Graph, ParamSlot, Tensor], Tensor]


@dataclass(frozen=True)
class StepGraph:
    """A training step's graph and what binding it needs (see the module docstring)."""

    graph: Graph
    params: tuple[ParamSlot, ...]
    optimizer: Optimizer
    scalars: Mapping[str, int]  # device scalar inputs by name (1 element each)
    scalar_values: Mapping[str, float]  # their initial values
    hyper_scalars: Mapping[str, int]  # the optimizer's hyper-parameters among them (hyper name -> UID)
    loss_uid: int
    seed_uid: int | None  # the backward's incoming gradient, where it is an input (bind ones)
    grad_norm_uid: int | None = None  # the global gradient norm before clipping (an output), with clipping

    @property
    def loss(self) -> Tensor:
        return handles_by_uid(self.graph)[self.loss_uid]

    def scalar(self, name: str) -> Tensor:
        """The device scalar `name` ("lr", "sgd.momentum", "optimizer.step", ...; a hyper-parameter by its
        own name too) as a handle of the step graph."""
        uid = self.scalars.get(name) or self.hyper_scalars.get(name)
        if uid is None:
            raise GraphError(
                f"the step has no device scalar {name!r}",
                rule="training.scalar",
                hint=f"its scalars: {sorted(self.scalars)}",
            )
        return handles_by_uid(self.graph)[uid]

    def state_pack(self, device: Any = None, params: Iterable[ParamSlot] | None = None) -> UidPack:
        """Fresh buffers for what the step keeps besides the parameters: the optimizer state (zeros),
        the device scalars (bound to the optimizer: `optimizer.set(lr=...)` writes them) and the seed
        (ones). NumPy arrays when `device` is None, else torch tensors on `device`."""
        f = self.graph.final
        out: UidPack = {}
        for slot in self.params if params is None else params:
            for uid in slot.state.values():
                out[uid] = _filled(f.tensors[uid], 0.0, device)
        hyper = {uid: h for h, uid in self.hyper_scalars.items()}
        values = self.optimizer.hyper  # (the values now: `optimizer.set` may have changed them since the build)
        for name, uid in self.scalars.items():
            out[uid] = _filled(f.tensors[uid], values[hyper[uid]] if uid in hyper else self.scalar_values[name], device)
        self.optimizer.bind({h: out[uid] for h, uid in self.hyper_scalars.items()})
        if self.seed_uid is not None and self.seed_uid in f.inputs:
            out[self.seed_uid] = _filled(f.tensors[self.seed_uid], 1.0, device)
        return out


def step_graph(
    forward: Graph,
    loss: Any,
    params: Sequence[Any],
    optimizer: Optimizer,
    *,
    seed: AnalyticSeed | None = None,
    grad_clip_norm: float | None = None,
    loss_scale: Mapping[str, float] | None = None,
    grad_data_type: Any = None,
    forward_types: bool = False,
    scalar_data_type: Any = None,
    keep_grads: bool = False,
    scalar_names: Mapping[str, str] | None = None,
    virtual: Iterable[int] = (),
    on_gradient: Sequence[GradientHook] = (),
    compute_copies: bool = False,
    name: str | None = None,
) -> StepGraph:
    """The training step of `forward` (a validated graph computing `loss`, a 1-element floating tensor):
    gradients of `params` and `optimizer`'s in-place updates, as one graph (see the module docstring).

    params: forward inputs to train (handles, UIDs, names, or `ParamSlot`s); each is updated in place.
    seed: seed the backward at another tensor with a directly formed gradient (see AnalyticSeed).
    grad_clip_norm: clip the global gradient norm to this (a device scalar, "max_grad_norm").
    loss_scale: fp16 dynamic loss scaling, with GradScaler's settings (SCALER_DEFAULTS; {} for them).
    grad_data_type: the backward's intermediate type (opgraph.grad); forward_types: gradients in their
        forward tensor's type (mixed precision).
    scalar_data_type: the device scalars' type (default FLOAT, DOUBLE for float64 parameters).
    keep_grads: make the gradients outputs (``grad_<name>``) as well.
    scalar_names: other names for device scalars ({"sgd.lr": "lr"}).
    virtual: forward outputs that are virtual in the step (statistics the backward reads).
    on_gradient: gradient-ready hooks, applied in order (see GradientHook).
    compute_copies: keep each parameter's 16-bit cast as step state, written by its update (see the
        module docstring).
    """
    return _Builder(forward, optimizer, scalar_names or {}, name).build(
        loss,
        params,
        seed,
        grad_clip_norm,
        loss_scale,
        grad_data_type,
        forward_types,
        scalar_data_type,
        keep_grads,
        set(virtual),
        tuple(on_gradient),
        compute_copies,
    )


class _Builder:
    def __init__(self, forward: Graph, optimizer: Optimizer, scalar_names: Mapping[str, str], name: str | None) -> None:
        if not isinstance(optimizer, Optimizer):
            raise AttributeValueError(
                f"optimizer={optimizer!r} is not an opgraph.training optimizer",
                rule="training.optimizer",
                hint="pass opgraph.training.SGD(...) or AdamW(...)",
            )
        self.forward = forward
        self.opt = optimizer
        self.names = scalar_names
        self.name = name
        self.scalars: dict[str, int] = {}
        self.values: dict[str, float] = {}
        self.next_uid = 0
        self.grad_norm_uid: int | None = None

    def build(
        self,
        loss: Any,
        params: Sequence[Any],
        seed: AnalyticSeed | None,
        clip: float | None,
        loss_scale: Mapping[str, float] | None,
        grad_data_type: Any,
        forward_types: bool,
        sdt: Any,
        keep_grads: bool,
        virtual: set[int],
        hooks: tuple[GradientHook, ...],
        compute_copies: bool,
    ) -> StepGraph:
        fg = self.forward.final
        loss_uid = resolve(fg, loss, "loss")
        d = fg.tensors[loss_uid]
        if d.numel != 1 or not d.data_type.is_floating:
            raise GraphError(
                f"the loss must be a 1-element floating tensor, got {d.type_str()}",
                tensor=d,
                rule="training.loss",
                hint="reduce the loss to one value (a mean or a sum)",
            )
        slots = [
            p
            if isinstance(p, ParamSlot)
            else ParamSlot(fg.tensors[resolve(fg, p, "params")].name, resolve(fg, p, "params"))
            for p in params
        ]
        for slot in slots:
            if slot.uid not in fg.inputs:
                raise GraphError(
                    "a trained parameter must be an input of the forward graph (it is updated in place)",
                    tensor=fg.tensors[slot.uid],
                    rule="training.param",
                    hint="declare the parameter with g.tensor(...) and pass that handle",
                )
        if clip is not None and not clip > 0:
            raise AttributeValueError(
                f"grad_clip_norm={clip!r} must be > 0",
                rule="training.clip",
                hint="pass a positive max norm, or None for no clipping",
            )
        scaler = None if loss_scale is None else {**SCALER_DEFAULTS, **loss_scale}
        unknown = set(loss_scale or {}) - set(SCALER_DEFAULTS)
        if unknown:
            raise AttributeValueError(
                f"loss_scale has unknown keys {sorted(unknown)}",
                rule="training.loss_scale",
                hint=f"known: {sorted(SCALER_DEFAULTS)}",
            )
        seeded = seed.uid if seed is not None else loss_uid
        n_forward = len(fg.nodes)  # (the combined graph copies the final forward: its duplicated views too)
        res = grad(
            self.forward,
            [seeded],
            [s.uid for s in slots],
            combined=True,
            intermediate_data_type=grad_data_type,
            forward_types=forward_types,
            name=self.name or f"{self.forward.name or 'graph'}_train_step",
        )
        g = res.graph
        for uid in fg.inputs:  # combined graphs copy inputs without the flag: double-buffered inputs keep it
            if fg.tensors[uid].is_by_reference:
                handles_by_uid(g)[uid].set_is_by_reference(True)
        for t in g._tensors:
            if t._uid in virtual:
                t.set_is_virtual(True)
        g.validate()
        self.next_uid = max(g.final.tensors) + 1
        pdesc = {s.uid: g.final.tensors[s.uid] for s in slots}
        sdt = as_data_type(sdt) if sdt is not None else scalar_type({d.data_type for d in pdesc.values()})
        handles = handles_by_uid(g)
        scale = self._scalar(g, "loss_scale", DataType.FLOAT, scaler["init_scale"]) if scaler else None
        seed_in = res.grad_inputs[seeded]
        seed_uid: int | None = seed_in.uid
        first = len(g._records)
        if seed is not None:
            _alias(seed_in, seed.gradient(g, handles, 1.0 if scale is None else scale))
        elif scale is not None:
            value = g.identity(scale, name="loss_scale.seed").set_data_type(seed_in.data_type)
            if seed_in.known_dim() != (1,):
                value = g.reshape(value, list(seed_in.known_dim()), name="loss_scale.seed_dims")
            _alias(seed_in, value)
        # the seed's ops between the forward and the backward (they come last in the list): ops are
        # scheduled lowest record first among the ready ones, so an op left behind them would wait
        order: dict[int, tuple] = {id(r): (n_forward, -1, i) for i, r in enumerate(g._records[first:])}
        grads = {s.uid: res.grads[s.uid].set_output(keep_grads) for s in slots}
        first = len(g._records)
        for hook in hooks:
            together = getattr(hook, "gradients", None)  # a hook of every gradient at once (buckets)
            grads = (
                dict(together(g, slots, grads))
                if together is not None
                else {s.uid: hook(g, s, grads[s.uid]) for s in slots}
            )
        order.update(_early(g, g._records[first:], [res.grads[s.uid] for s in slots]))
        elsewhere = {k for hook in hooks for k in getattr(hook, "updated_elsewhere", lambda g, slots: ())(g, slots)}
        skip: Tensor | None = None
        if scale is not None:
            grads, skip = self._unscale(g, grads, scale, pdesc)
        global_deps = skip is not None or clip is not None
        if clip is not None:
            grads = self._clip(g, grads, sdt, pdesc, clip)
        opt = self.opt
        hyper = {n: self._scalar(g, f"{opt.name}.{n}", sdt, opt.hyper[n]) for n in opt.used_hyper()}
        step = self._scalar(g, "optimizer.step", sdt, 0.0) if opt.COUNTS_STEPS else None
        scope = UpdateScope(g, hyper, step, skip)
        first = len(g._records)
        opt.prepare(scope)
        order.update({id(r): (-1, i) for i, r in enumerate(g._records[first:])})
        # the casts a compute copy replaces, removed before any record's position is taken for the order
        copies = {
            s.uid: c
            for s in slots
            if compute_copies and s.key not in elsewhere
            for c in [_cast_read(g, handles[s.uid], pdesc[s.uid])]
            if c is not None
        }
        out_slots = []
        for slot in slots:
            if slot.key in elsewhere:  # another process updates it (ZeRO-1): its gradient kept, no update nor state
                grads[slot.uid].set_output(True)
                out_slots.append(replace(slot, grad_uid=res.grads[slot.uid].uid))
                continue
            w = handles[slot.uid]
            d = pdesc[slot.uid]
            state = {}
            for sname in opt.state_names():
                state[sname] = g.tensor(
                    dim=d.dim, stride=d.stride, data_type=d.data_type, name=f"{sname}.{slot.key}", uid=self._new_uid()
                )
            copy = copies.get(slot.uid)
            mark = len(g._records)
            opt.update(scope, w, grads[slot.uid], state, slot.key)
            if copy is not None:
                _write_copy(g, copy, handles_by_uid(g)[slot.uid])
            if not global_deps:
                at = _producer_index(g, res.grads[slot.uid])
                order.update({id(r): (at, 1, i) for i, r in enumerate(g._records[mark:])})
            out_slots.append(
                replace(
                    slot,
                    grad_uid=res.grads[slot.uid].uid,
                    state={k: t.known_uid() for k, t in state.items()},
                    compute_copy=None if copy is None else copy.known_uid(),
                )
            )
        # each update right after its gradient's producer (without clipping or loss scaling, which need
        # every gradient first): the partitioner can then fuse it into that kernel's epilogue
        index = {id(r): (i, 0) for i, r in enumerate(g._records)}
        g._records.sort(key=lambda r: order.get(id(r), index[id(r)]))
        g._invalidate()
        if scale is not None and skip is not None:  # (_unscale made skip with the scale)
            self._update_scale(g, scale, skip, expect(scaler, "the loss scaler's settings"))
        g.validate()
        names = {self.names.get(k, k): u for k, u in self.scalars.items()}
        values = {self.names.get(k, k): v for k, v in self.values.items()}
        return StepGraph(
            g,
            tuple(out_slots),
            opt,
            names,
            values,
            {n: t.known_uid() for n, t in hyper.items()},
            loss_uid,
            seed_uid if seed_uid in g.final.inputs else None,
            self.grad_norm_uid,
        )

    def _new_uid(self) -> int:
        self.next_uid += 1
        return self.next_uid - 1

    def _scalar(self, g: Graph, name: str, dt: DataType, value: float) -> Tensor:
        t = g.tensor(dim=[1], data_type=dt, name=self.names.get(name, name), uid=self._new_uid())
        self.scalars[name] = t.known_uid()
        self.values[name] = float(value)
        return t

    def _unscale(
        self, g: Graph, grads: dict[int, Tensor], scale: Tensor, pdesc: Mapping[int, Any]
    ) -> tuple[dict[int, Tensor], Tensor]:
        """Gradients divided by the loss scale, and `skip`: whether any of them holds an inf or NaN
        (x * 0 is NaN exactly for those)."""
        inv = g.reciprocal(scale, name="loss_scale.inverse")
        out, total = {}, None
        for uid, gr in grads.items():
            tag = str(uid)
            u = g.mul(gr, inv, name=f"unscale.{tag}")
            probe = _sum_to_one(g, g.mul(u, 0.0, name=f"finite.{tag}.zero"), len(pdesc[uid].dim), f"finite.{tag}")
            total = probe if total is None else g.add(total, probe, name=f"finite.{tag}.total")
            out[uid] = u
        skip = g.cmp_neq(expect(total, "a parameter's gradient"), 0.0, name="found_inf")
        return out, skip

    def _clip(
        self, g: Graph, grads: dict[int, Tensor], sdt: DataType, pdesc: Mapping[int, Any], clip: float
    ) -> dict[int, Tensor]:
        max_norm = self._scalar(g, "max_grad_norm", sdt, clip)
        total = None
        for uid, gr in grads.items():
            sq = _sum_to_one(g, g.mul(gr, gr, name=f"clip.{uid}.square"), len(pdesc[uid].dim), f"clip.{uid}")
            total = sq if total is None else g.add(total, sq, name=f"clip.{uid}.total")
        norm = g.sqrt(expect(total, "a parameter's gradient"), name="grad_norm")
        norm.set_output(True).set_uid(self._new_uid()).set_data_type(sdt)
        self.grad_norm_uid = norm.uid
        coef = g.min(g.div(max_norm, g.add(norm, 1e-6, name="clip.norm_eps"), name="clip.ratio"), 1.0, name="clip.coef")
        return {uid: g.mul(gr, coef, name=f"clip.{uid}") for uid, gr in grads.items()}

    def _update_scale(self, g: Graph, scale: Tensor, skip: Tensor, c: Mapping[str, float]) -> None:
        """GradScaler.update on the device: backoff on inf/NaN, growth after growth_interval clean steps."""
        tracker = self._scalar(g, "loss_scale.growth_tracker", DataType.FLOAT, 0.0)
        next_count = g.add(tracker, 1.0, name="loss_scale.count")
        grow = g.cmp_ge(next_count, float(c["growth_interval"]), name="loss_scale.grow")
        factor = g.binary_select(
            float(c["backoff_factor"]),
            g.binary_select(float(c["growth_factor"]), 1.0, grow, name="loss_scale.grow_factor"),
            skip,
            name="loss_scale.factor",
        )
        new_scale = g.mul(scale, factor, name="loss_scale.new")
        new_scale.set_uid(scale.uid).set_name(scale.name).set_data_type(DataType.FLOAT).set_output(True)
        reset = g.logical_or(skip, grow, name="loss_scale.reset")
        delta = g.binary_select(g.neg(tracker, name="loss_scale.zero"), 1.0, reset, name="loss_scale.delta")
        new_tracker = g.add(tracker, delta, name="loss_scale.tracker")
        new_tracker.set_uid(tracker.uid).set_name(tracker.name).set_data_type(DataType.FLOAT).set_output(True)


# -- helpers ------------------------------------------------------------------------------------------------


def handles_by_uid(g: Graph) -> dict[int, Tensor]:
    """Handles by UID: for a UID held by a declared handle and an op output, the op output (the
    tensor's value after that op)."""
    produced = {id(t) for r in g._records for t in r.outputs if t is not None}
    out: dict[int, Tensor] = {}
    for t in g._tensors:
        uid = t._uid if t._uid is not None else t.uid
        if uid is None:
            continue
        if uid not in out or id(t) in produced:
            out[uid] = t
    return out


def _alias(seed: Tensor, value: Tensor) -> None:
    """Make `value` (an op output) the backward's incoming gradient `seed` (a forward reference)."""
    seed.set_is_virtual(True)
    value.set_uid(seed.known_uid()).set_data_type(seed.data_type).set_is_virtual(True).set_name(seed.name)


def _early(g: Graph, records: Sequence[Any], gradients: Sequence[Tensor]) -> dict[int, tuple]:
    """Order keys placing each hook op that reads a gradient right after the latest producer of the
    gradients it reads (an all-reduce starts as soon as its bucket is made); other hook ops keep their
    place after the backward (the wait for a reduction, as late as it can be)."""
    producer = {id(o): i for i, r in enumerate(g._records) for o in r.outputs if o is not None}
    made = {id(t): producer[id(t)] for t in gradients if id(t) in producer}
    out: dict[int, tuple] = {}
    for i, r in enumerate(records):
        at = [made[id(v)] for v in r.inputs if id(v) in made]
        if at:
            out[id(r)] = (max(at), 2, i)
    return out


def _cast_read(g: Graph, w: Tensor, d: Any) -> Tensor | None:
    """The compute copy of parameter `w` (a declared handle, `d` its descriptor, FLOAT or DOUBLE): when every op
    reading `w` is one cast to a 16-bit type, that cast is removed and its output becomes a declared
    input of the parameter's layout (the copy, read by the forward and the backward as the cast's
    output was). None when the parameter is read otherwise (then its cast stays a pass of the step)."""
    if d.data_type not in (DataType.FLOAT, DataType.DOUBLE):
        return None
    readers = [r for r in g._records if any(v is w for v in r.inputs)]
    if len(readers) != 1:
        return None
    r = readers[0]
    out = r.outputs[0] if len(r.outputs) == 1 else None
    mode = getattr(r.op, "mode", None)
    if (
        out is None
        or getattr(mode, "value", None) != "identity"
        or len([v for v in r.inputs if v is not None]) != 1
        or out.data_type not in (DataType.BFLOAT16, DataType.HALF)
        or out._uid is None
    ):
        return None
    g._records.remove(r)
    return out.set_dim(list(d.dim)).set_stride(_unit_strides(d.dim, d.stride)).set_is_virtual(False)


def _unit_strides(dim: Sequence[int], stride: Sequence[int]) -> list[int]:
    """`stride` with each unit axis's stride the tensor's extent, as the cast's packed output had it (a
    weight's view [1, K, N] of an [N, K] parameter has stride K on its unit axis; declared so, the GEMMs
    reading it ran 3-12% slower on an H200, without the flattened batch: bench/results/constants.md#compute-copies)."""
    extent = storage_extent(dim, stride)
    return [extent if n == 1 else s for n, s in zip(dim, stride)]


def _write_copy(g: Graph, copy: Tensor, new: Tensor) -> None:
    """The update's write of the compute copy: the new parameter in the copy's type, in place. The copy's
    old value is an operand that selects nothing (an in-place update reads what it writes: the forward's
    and the backward's reads of the old copy then run before it); generated kernels never load it."""
    out = g.binary_select(new, copy, 1.0, name=f"{copy.name}.update")
    out.set_uid(copy.known_uid()).set_name(copy.name).set_data_type(copy.data_type).set_output(True)
    out.set_dim(list(copy.known_dim())).set_stride(list(copy.known_stride()))


def _producer_index(g: Graph, t: Tensor) -> int:
    for i, r in enumerate(g._records):
        if any(o is t for o in r.outputs):
            return i
    raise GraphError(
        "the gradient has no producer in the step graph",
        rule="training.internal",
        hint="report this as a bug, with the module",
    )


def _sum_to_one(g: Graph, x: Tensor, rank: int, name: str) -> Tensor:
    """The sum of all of x's elements (x of rank `rank`) as a [1] tensor (FLOAT)."""
    r = g.reduction(x, ReductionMode.ADD, name=f"{name}.sum").set_dim([1] * rank)
    r.set_data_type(g.intermediate_data_type)
    return r if rank == 1 else g.reshape(r, [1], name=f"{name}.flat")


def _filled(desc: Any, value: float, device: Any) -> Any:
    """A buffer with the descriptor's dims and strides holding `value` (NumPy without a device)."""
    if device is None:
        import numpy as np

        from ..memory.fill import empty_like_desc

        arr = empty_like_desc(desc)
        arr[...] = np.asarray(value).astype(desc.data_type.numpy)
        return arr
    import torch

    t = torch.empty_strided(desc.dim, desc.stride, dtype=desc.data_type.to_torch(), device=device)
    return t.fill_(value)
