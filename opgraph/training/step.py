"""`train_step(imported, loss=..., optimizer=..., mixed_precision=None, grad_clip_norm=None)`: one
training-step graph for a module imported with `opgraph.from_torch` in train mode.

    imported = opgraph.from_torch(model.train(), (tokens,))
    step = opgraph.training.train_step(imported, loss="cross_entropy",
                                       optimizer=opgraph.training.AdamW(3e-4), mixed_precision="bf16",
                                       grad_clip_norm=1.0)
    for tokens, targets in batches:
        loss = step.run(tokens, targets)        # = autocast forward, loss, backward, clip, AdamW.step()
        step.optimizer.set(lr=schedule(i))      # device scalars: a captured step reads the new value

The graph (`step.graph`): the module's forward (prepared by opgraph.train_graph: tied parameters
made one input, normalizations in training form, autocast's casts), the loss, the backward
(opgraph.grad, combined), optional fp16 loss scaling and gradient clipping, and the optimizer's
in-place updates of the module's own parameters and of the optimizer state (opgraph.optimizers).

- The loss's gradient seeds the backward: cross-entropy's and mse's are formed directly from the
  logits and per-row statistics (opgraph.losses); a loss function's ops are differentiated.
- Without clipping or loss scaling, each parameter's update ops are placed right after the op that
  makes its gradient, so the partitioner can fuse the update into that kernel's epilogue, in place.
  Clipping (the global norm, in-graph: sqrt of the sum of every gradient's squares, coefficient
  min(max_norm / (norm + 1e-6), 1), torch.nn.utils.clip_grad_norm_) and loss scaling need every
  gradient first.
- mixed_precision="bf16" / "fp16": fp32 master parameters and optimizer state, 16-bit compute copies
  and activations as torch.autocast makes them; "fp16" adds GradScaler's dynamic loss scale on the
  device: the backward is seeded with the scale, gradients are unscaled, an inf or NaN skips the
  update (parameters, state and step counter unchanged) and halves the scale, `growth_interval`
  clean steps double it.
- `run(*inputs, target)` builds the plan on first use on the inputs' device, copies inputs and target
  into the step's own buffers, executes, writes batchnorm running stats back into the module and
  returns the loss (a 0-d tensor, a copy). `pack(...)` gives the same variant pack to drive the plan
  yourself; `capture(...)` records the step (and the write-back) in a CUDA graph: `replay(*inputs,
  target)`. The optimizer state lives in the step (`param_state(key)`, `step_count`, `loss_scale`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..autodiff import grad
from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, GraphError, VariantPackError, expect
from ..core.tensor import Tensor
from ..core.types import Buffer, UidPack
from ..graph.builder import Graph
from ..ops.reduction import ReductionMode
from .forward import TiedParam, prepare_forward
from .losses import Loss, as_loss
from .optimizers import AdamW, Optimizer, UpdateScope, scalar_type

MIXED = {None: None, "bf16": DataType.BFLOAT16, "bfloat16": DataType.BFLOAT16, "fp16": DataType.HALF,
         "float16": DataType.HALF, "half": DataType.HALF}
SCALER_DEFAULTS = {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}


@dataclass
class ParamSlot:
    """A trained parameter: its state_dict `key`, the step graph input `uid` updated in place, the
    `source` that binds it (the module tensor through the importer's views; None: the tensor itself),
    and its optimizer state buffers (name -> uid)."""

    key: str
    uid: int
    source: Any
    state: dict[str, int] = field(default_factory=dict)


class TrainStep:
    """A training step of an imported module (see the module docstring)."""

    def __init__(self, imported: Any, loss: Any = "cross_entropy", optimizer: Optimizer | None = None,
                 mixed_precision: str | None = None, grad_clip_norm: float | None = None, *,
                 target_like: Any = None, loss_scale: Mapping[str, float] | None = None,
                 grad_data_type: Any = None, name: str | None = None) -> None:
        if mixed_precision not in MIXED:
            raise AttributeValueError(f"mixed_precision={mixed_precision!r} is not None, 'bf16' or 'fp16'",
                                      rule="training.mixed_precision", hint="pass None, 'bf16' or 'fp16'")
        if grad_clip_norm is not None and not grad_clip_norm > 0:
            raise AttributeValueError(f"grad_clip_norm={grad_clip_norm!r} must be > 0", rule="training.clip",
                                      hint="pass a positive max norm, or None for no clipping")
        self.imported = imported
        self.loss_fn: Loss = as_loss(loss, target_like)
        self.optimizer = optimizer if optimizer is not None else AdamW(1e-3)
        if not isinstance(self.optimizer, Optimizer):
            raise AttributeValueError(f"optimizer={optimizer!r} is not an opgraph.training optimizer",
                                      rule="training.optimizer", hint="pass opgraph.training.SGD(...) or AdamW(...)")
        self.low = MIXED[mixed_precision]
        self.mixed_precision = mixed_precision
        self.grad_clip_norm = grad_clip_norm
        unknown = set(loss_scale or {}) - set(SCALER_DEFAULTS)
        if unknown:
            raise AttributeValueError(f"loss_scale has unknown keys {sorted(unknown)}", rule="training.loss_scale",
                                      hint=f"known: {sorted(SCALER_DEFAULTS)}")
        self.scaler = {**SCALER_DEFAULTS, **(loss_scale or {})} if self.low is DataType.HALF else None
        self.params: list[ParamSlot] = []
        self.scalars: dict[str, int] = {}  # device scalar inputs: hyper-parameters, counters, loss scale
        self.plan: Any = None
        self._device: Any = None
        self._pack: UidPack | None = None
        self._state: dict[str, dict[str, Any]] = {}
        self._fingerprint: tuple = ()
        self._build(grad_data_type, name)

    # -- the graph ------------------------------------------------------------------------------------
    def _build(self, grad_data_type: Any, name: str | None) -> None:
        imp = self.imported
        fg = imp.graph.final
        module = imp.module
        groups: dict[str, list[tuple[Tensor, Any]]] = {}
        for t, source in imp.bound_inputs:
            if source.kind == "parameter" and module.get_parameter(source.key).requires_grad:
                groups.setdefault(source.key, []).append((t, source))
        if not groups:
            raise GraphError("the module has no trainable parameter", rule="training.no_params",
                             hint="import a module with parameters that require grad")
        tied = []
        for key, members in groups.items():
            p = module.get_parameter(key)
            if not p.dtype.is_floating_point:
                continue
            if self.low is not None and p.dtype not in (_torch().float32, _torch().float64):
                raise GraphError(f"mixed precision keeps fp32 master weights, but parameter '{key}' is {p.dtype}",
                                 rule="training.master_type", hint="train the fp32 module (model.float()) with "
                                 "mixed_precision, or a 16-bit module without it")
            if len(members) > 1:
                tied.append(TiedParam(key, [(t.known_uid(), s.views) for t, s in members], tuple(p.shape) or (1,),
                                      tuple(p.stride()) or (1,), _og_type(p.dtype)))
        bound = {t.known_uid() for t, _ in imp.bound_inputs}
        outputs = imp.outputs
        if len(outputs) != 1:
            raise GraphError(f"train_step needs a module with one output (the one the loss reads); it has "
                             f"{len(outputs)}", rule="training.outputs",
                             hint="wrap the module so that it returns the logits (or prediction) alone")
        out_uid = outputs[0].known_uid()
        prep = prepare_forward(fg, bound=bound, tied=tied, low=self.low, internal=[out_uid],
                               name=name or f"{fg.name}_train_step")
        g = prep.graph
        tied_keys = {t.key for t in tied}
        for key, members in groups.items():
            if key in tied_keys:
                self.params.append(ParamSlot(key, prep.tied[key].known_uid(), None))
            elif fg.tensors[members[0][0].known_uid()].data_type.is_floating:
                self.params.append(ParamSlot(key, members[0][0].known_uid(), members[0][1]))
        out = _by_uid(g)[out_uid]
        out_desc = replace(fg.tensors[out_uid], data_type=out.data_type, is_virtual=True)
        next_uid = max(max(fg.tensors), max(t._uid for t in g._tensors if t._uid is not None)) + 1
        tdims, tdt = self.loss_fn.target(out_desc)
        target = g.tensor(dim=list(tdims), data_type=tdt, name="target", uid=next_uid)
        parts = self.loss_fn.forward(g, out, target, out_desc)
        wide = fg.intermediate_data_type
        loss = parts.loss.set_output(True).set_name("loss").set_data_type(wide)
        g.validate()
        ld = g.final.tensors[loss.known_uid()]
        if ld.numel != 1 or not ld.data_type.is_floating:
            raise GraphError(f"the loss must be a 1-element floating tensor, got {ld.type_str()}", tensor=ld,
                             rule="training.loss", hint="reduce the loss to one value (a mean or a sum)")
        self.loss_uid, self.target_uid, self.out_uid = loss.known_uid(), target.known_uid(), out_uid
        saved = {k: v.known_uid() for k, v in parts.saved.items()}
        analytic = type(self.loss_fn).gradient is not Loss.gradient
        seeded = out_uid if analytic else self.loss_uid
        n_forward = len(g._records)
        res = grad(g, [seeded], [p.uid for p in self.params], combined=True, intermediate_data_type=grad_data_type,
                   forward_types=self.low is not None, name=g.name)
        sg = res.graph
        self.graph = sg
        for t in sg._tensors:
            if t._uid in prep.stats:
                t.set_is_virtual(True)
        sg.validate()
        self._next_uid = max(sg.final.tensors) + 1
        self._pdesc = {p.uid: sg.final.tensors[p.uid] for p in self.params}
        handles = _by_uid(sg)
        sdt = scalar_type({d.data_type for d in self._pdesc.values()})
        scale = self._scalar(sg, "loss_scale", DataType.FLOAT) if self.scaler else None
        seed = res.grad_inputs[seeded]
        self.seed_uid: int | None = seed.uid
        first = len(sg._records)
        if analytic:
            named = {k: handles[u] for k, u in saved.items()}
            d_out = self.loss_fn.gradient(sg, handles[out_uid], handles[self.target_uid], named,
                                          1.0 if scale is None else scale, out_desc)
            if d_out is None:
                raise GraphError(f"{type(self.loss_fn).__name__}.gradient returned None", rule="training.loss_gradient",
                                 hint="return d(loss)/d(out) times seed, or do not override gradient (then "
                                      "opgraph.grad differentiates forward)")
            self._alias(seed, d_out)
        elif scale is not None:
            value = sg.identity(scale, name="loss_scale.seed").set_data_type(seed.data_type)
            if seed.known_dim() != (1,):
                value = sg.reshape(value, list(seed.known_dim()), name="loss_scale.seed_dims")
            self._alias(seed, value)
        # the seed's ops between the forward and the backward (they come last in the list): ops are
        # scheduled lowest record first among the ready ones, so an op left behind them would wait
        order: dict[int, tuple] = {id(r): (n_forward, -1, i) for i, r in enumerate(sg._records[first:])}
        grads = {p.uid: res.grads[p.uid].set_output(False) for p in self.params}
        skip: Tensor | None = None
        if scale is not None:
            grads, skip = self._unscale(sg, grads, scale)
        global_deps = skip is not None or self.grad_clip_norm is not None
        if self.grad_clip_norm is not None:
            grads = self._clip(sg, grads, sdt)
        opt = self.optimizer
        hyper = {n: self._scalar(sg, f"{type(opt).__name__.lower()}.{n}", sdt) for n in opt.used_hyper()}
        step = self._scalar(sg, "optimizer.step", sdt) if opt.COUNTS_STEPS else None
        scope = UpdateScope(sg, hyper, step, skip)
        first = len(sg._records)
        opt.prepare(scope)
        order.update({id(r): (-1, i) for i, r in enumerate(sg._records[first:])})
        for slot in self.params:
            w = handles[slot.uid]
            d = self._pdesc[slot.uid]
            state = {}
            for sname in opt.state_names():
                uid = self._new_uid()
                state[sname] = sg.tensor(dim=d.dim, stride=d.stride, data_type=d.data_type,
                                         name=f"{sname}.{slot.key}", uid=uid)
                slot.state[sname] = uid
            mark = len(sg._records)
            opt.update(scope, w, grads[slot.uid], state, slot.key)
            if not global_deps:
                at = _producer_index(sg, res.grads[slot.uid])
                order.update({id(r): (at, 1, i) for i, r in enumerate(sg._records[mark:])})
        # each update right after its gradient's producer (without clipping or loss scaling, which need
        # every gradient first): the partitioner can then fuse it into that kernel's epilogue
        index = {id(r): (i, 0) for i, r in enumerate(sg._records)}
        sg._records.sort(key=lambda r: order.get(id(r), index[id(r)]))
        sg._invalidate()
        if scale is not None and skip is not None:  # (_unscale made skip with the scale)
            self._update_scale(sg, scale, skip)
        sg.validate()

    def _new_uid(self) -> int:
        self._next_uid += 1
        return self._next_uid - 1

    def _rank(self, uid: int) -> int:
        return len(self._pdesc[uid].dim)

    def _scalar(self, g: Graph, name: str, dt: DataType) -> Tensor:
        t = g.tensor(dim=[1], data_type=dt, name=name, uid=self._new_uid())
        self.scalars[name] = t.known_uid()
        return t

    @staticmethod
    def _alias(seed: Tensor, value: Tensor) -> None:
        """Make `value` (an op output) the backward's incoming gradient `seed` (a forward reference)."""
        seed.set_is_virtual(True)
        value.set_uid(seed.known_uid()).set_data_type(seed.data_type).set_is_virtual(True).set_name(seed.name)

    def _unscale(self, g: Graph, grads: dict[int, Tensor], scale: Tensor) -> tuple[dict[int, Tensor], Tensor]:
        """Gradients divided by the loss scale, and `skip`: whether any of them holds an inf or NaN
        (x * 0 is NaN exactly for those)."""
        inv = g.reciprocal(scale, name="loss_scale.inverse")
        out, total = {}, None
        for uid, gr in grads.items():
            tag = str(uid)
            u = g.mul(gr, inv, name=f"unscale.{tag}")
            probe = _sum_to_one(g, g.mul(u, 0.0, name=f"finite.{tag}.zero"), self._rank(uid), f"finite.{tag}")
            total = probe if total is None else g.add(total, probe, name=f"finite.{tag}.total")
            out[uid] = u
        skip = g.cmp_neq(total, 0.0, name="found_inf")
        return out, skip

    def _clip(self, g: Graph, grads: dict[int, Tensor], sdt: DataType) -> dict[int, Tensor]:
        max_norm = self._scalar(g, "max_grad_norm", sdt)
        total = None
        for uid, gr in grads.items():
            sq = _sum_to_one(g, g.mul(gr, gr, name=f"clip.{uid}.square"), self._rank(uid), f"clip.{uid}")
            total = sq if total is None else g.add(total, sq, name=f"clip.{uid}.total")
        norm = g.sqrt(total, name="grad_norm").set_output(True).set_uid(self._new_uid()).set_data_type(sdt)
        self.grad_norm_uid = norm.uid
        coef = g.min(g.div(max_norm, g.add(norm, 1e-6, name="clip.norm_eps"), name="clip.ratio"), 1.0,
                     name="clip.coef")
        return {uid: g.mul(gr, coef, name=f"clip.{uid}") for uid, gr in grads.items()}

    def _update_scale(self, g: Graph, scale: Tensor, skip: Tensor) -> None:
        """GradScaler.update on the device: backoff on inf/NaN, growth after growth_interval clean steps."""
        c = expect(self.scaler, "the loss scaler's settings")  # (loss scaling is on)
        tracker = self._scalar(g, "loss_scale.growth_tracker", DataType.FLOAT)
        next_count = g.add(tracker, 1.0, name="loss_scale.count")
        grow = g.cmp_ge(next_count, float(c["growth_interval"]), name="loss_scale.grow")
        factor = g.binary_select(float(c["backoff_factor"]),
                                 g.binary_select(float(c["growth_factor"]), 1.0, grow, name="loss_scale.grow_factor"),
                                 skip, name="loss_scale.factor")
        new_scale = g.mul(scale, factor, name="loss_scale.new")
        new_scale.set_uid(scale.uid).set_name(scale.name).set_data_type(DataType.FLOAT).set_output(True)
        reset = g.logical_or(skip, grow, name="loss_scale.reset")
        delta = g.binary_select(g.neg(tracker, name="loss_scale.zero"), 1.0, reset, name="loss_scale.delta")
        new_tracker = g.add(tracker, delta, name="loss_scale.tracker")
        new_tracker.set_uid(tracker.uid).set_name(tracker.name).set_data_type(DataType.FLOAT).set_output(True)

    # -- binding --------------------------------------------------------------------------------------
    @property
    def loss(self) -> Tensor:
        return _by_uid(self.graph)[self.loss_uid]

    @property
    def target(self) -> Tensor:
        return _by_uid(self.graph)[self.target_uid]

    def build(self, device: str | None = None, **build_options: Any) -> Any:
        """Build (or rebuild) the step's plan for `device` (default: a GPU if usable, else the CPU)."""
        self.plan = self.graph.build(device=device, **build_options)
        return self.plan

    def _device_of(self, inputs: Sequence[Any]) -> Any:
        torch = _torch()
        for x in inputs:
            if isinstance(x, torch.Tensor):
                return x.device
        return next(iter(self.imported.module.parameters())).device

    def pack(self, *inputs: Any, target: Any = None) -> UidPack:
        """The step's variant pack with `inputs` and `target` copied into its input buffers: the
        module's parameters and buffers (views), the optimizer state, scalars and outputs. The same
        dict (and buffers) every call; parameters are re-bound when the module's tensors moved."""
        if target is None and len(inputs) == len(self.imported.inputs) + 1:
            inputs, target = inputs[:-1], inputs[-1]
        torch = _torch()
        device = self._device_of(inputs)
        if self._pack is None or self._device != device:
            self._make_pack(device)
        elif self._fingerprint != self._params_fingerprint():
            self._bind_module(self._pack, device)
        pack = expect(self._pack, "the step's variant pack")  # (made or bound just above)
        handles = [h for h in self.imported._input_slots if h is not None]
        leaves = self.imported._flat_inputs(inputs)
        values = [v for h, v in zip(self.imported._input_slots, leaves) if h is not None]
        for h, v in zip(handles, values):
            pack[h.uid].copy_(self.imported._user_input(h, v).to(device))
        if target is None:
            raise VariantPackError("a training step needs the target", rule="training.target",
                                   hint="call step.run(*inputs, target)")
        d = self.graph.final.tensors[self.target_uid]
        t = target if isinstance(target, torch.Tensor) else torch.as_tensor(target)
        if t.numel() != d.numel:
            raise VariantPackError(f"the target has shape {list(t.shape)} ({t.numel()} elements); the loss takes "
                                   f"{d.numel} ({list(d.dim)})", tensor=d, rule="training.target_shape",
                                   hint="pass the targets of this batch (class indices for cross_entropy)")
        pack[self.target_uid].copy_(t.reshape(d.dim).to(device=device, dtype=d.data_type.to_torch()))
        for handle, source in self.imported.bound_inputs:  # dropout masks: a new draw per step
            if source.kind == "random" and handle.uid in pack:
                pack[handle.uid].copy_(self.imported._resolve(source, {}, {}, device, None))
        return pack

    def _params_fingerprint(self) -> tuple:
        module = self.imported.module
        return tuple(module.get_parameter(p.key).data_ptr() for p in self.params)

    def _make_pack(self, device: Any) -> None:
        torch = _torch()
        final = self.graph.final
        pack: UidPack = {}

        def empty(uid: int) -> Any:
            d = final.tensors[uid]
            return torch.empty_strided(d.dim, d.stride, dtype=d.data_type.to_torch(), device=device)

        for h in self.imported.inputs:
            pack[h.uid] = empty(h.uid)
        pack[self.target_uid] = empty(self.target_uid)
        self._bind_module(pack, device)
        opt = self.optimizer
        values = {**{f"{type(opt).__name__.lower()}.{n}": v for n, v in opt.hyper.items()},
                  "optimizer.step": 0.0, "max_grad_norm": self.grad_clip_norm or 0.0,
                  "loss_scale": (self.scaler or {}).get("init_scale", 1.0), "loss_scale.growth_tracker": 0.0}
        bound: dict[str, Any] = {}
        for name, uid in self.scalars.items():
            pack[uid] = empty(uid).fill_(values[name])
            if name.startswith(f"{type(opt).__name__.lower()}."):
                bound[name.split(".", 1)[1]] = pack[uid]
        opt.bind(bound)
        if self.seed_uid is not None and self.seed_uid in final.inputs:
            pack[self.seed_uid] = empty(self.seed_uid).fill_(1.0)
        for uid in final.outputs:
            if uid not in pack:
                pack[uid] = empty(uid)
        missing = [final.tensors[u].label() for u in final.inputs if u not in pack]
        if missing:
            raise GraphError(f"the step graph reads inputs train_step does not bind: {', '.join(missing)}",
                             rule="training.internal", hint="report this as a bug, with the module")
        self._pack, self._device = pack, device

    def _bind_module(self, pack: UidPack, device: Any) -> None:
        """Parameters, buffers and constants (views of the module's tensors), and the optimizer state
        (zeros made once per parameter, laid out like it)."""
        torch = _torch()
        imp = self.imported
        final = self.graph.final
        cache: dict = {}
        for handle, source in imp.bound_inputs:
            if handle.uid in final.tensors and final.tensors[handle.uid].is_virtual is False \
                    and handle.uid in final.inputs:
                pack[handle.uid] = imp._resolve(source, cache, {}, device, None)
        module = imp.module
        for slot in self.params:
            p = module.get_parameter(slot.key).detach()
            if p.device != device:
                raise VariantPackError(f"parameter '{slot.key}' is on {p.device}, the inputs on {device}",
                                       rule="training.device", hint="move the module to the inputs' device")
            view = slot.source.apply(p) if slot.source is not None else p
            pack[slot.uid] = view
            state = self._state.setdefault(slot.key, {})
            for sname, uid in slot.state.items():
                if sname not in state or state[sname].device != device:
                    state[sname] = torch.zeros_like(p, memory_format=torch.preserve_format)
                pack[uid] = slot.source.apply(state[sname]) if slot.source is not None else state[sname]
        self._fingerprint = self._params_fingerprint()

    # -- running --------------------------------------------------------------------------------------
    def run(self, *inputs: Any, target: Any = None) -> Any:
        """One training step on `inputs` (the module's arguments) and `target`; returns the loss (0-d)."""
        pack = self.pack(*inputs, target=target)
        if self.plan is None or self.plan.device.is_cuda != (self._device.type == "cuda"):
            self.build("cuda" if self._device.type == "cuda" else "cpu")
        self.plan.execute(pack)
        self.imported.write_back(pack)
        return pack[self.loss_uid].reshape(()).clone()

    def capture(self, *inputs: Any, target: Any = None) -> CapturedStep:
        """The step (execute + running-stat write-back) recorded in a CUDA graph on the step's buffers.
        Warming up runs one step, whose effect on parameters, optimizer state and module buffers is
        undone before capturing. Replays read the current hyper-parameters (device scalars)."""
        torch = _torch()
        pack = self.pack(*inputs, target=target)
        if self._device.type != "cuda":
            raise GraphError("CUDA graphs need inputs on a CUDA device", rule="cudagraph.device",
                             hint="move the module and inputs to the GPU")
        if self.plan is None or not self.plan.device.is_cuda:
            self.build("cuda")
        saved = self._snapshot(pack)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.plan.execute(pack)
            self.imported.write_back(pack)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self._restore(saved)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.plan.execute(pack)
            self.imported.write_back(pack)
        return CapturedStep(self, graph)

    def _snapshot(self, pack: Mapping[int, Buffer]) -> list[tuple[Any, Any]]:
        # every output: parameters and optimizer state are updated in place (outputs read before
        # they are written, not graph inputs), and the rest are cheap
        keep = [pack[u] for u in self.graph.final.outputs]
        keep += [b for b in self.imported.module.buffers()]
        return [(t, t.detach().clone()) for t in keep]

    @staticmethod
    def _restore(saved: list[tuple[Any, Any]]) -> None:
        for t, copy in saved:
            t.copy_(copy)

    # -- state ----------------------------------------------------------------------------------------
    def param_state(self, key: str) -> dict[str, Any]:
        """The optimizer state of parameter `key` (any of its names, for a tied one), laid out like the
        module's tensor."""
        if key not in self._state:
            p = self.imported.module.get_parameter(key)
            key = next((k for k in self._state if self.imported.module.get_parameter(k) is p), key)
        return dict(self._state.get(key, {}))

    def _scalar_value(self, name: str) -> float | None:
        uid = self.scalars.get(name)
        if uid is None or self._pack is None:
            return None
        return float(self._pack[uid].reshape(()).item())

    @property
    def step_count(self) -> float | None:
        """Steps taken by the optimizer (AdamW; skipped fp16 steps do not count)."""
        return self._scalar_value("optimizer.step")

    @property
    def loss_scale(self) -> float | None:
        """The current fp16 loss scale (None without fp16 mixed precision)."""
        return self._scalar_value("loss_scale")

    @property
    def grad_norm(self) -> Any:
        """The last step's global gradient norm before clipping (0-d), with grad_clip_norm."""
        uid = getattr(self, "grad_norm_uid", None)
        return None if uid is None or self._pack is None else self._pack[uid].reshape(())

    def __repr__(self) -> str:
        return (f"<TrainStep {self.graph.name}: {len(self.params)} parameters, {self.optimizer}, "
                f"loss {self.loss_fn.name}, mixed_precision={self.mixed_precision}, "
                f"grad_clip_norm={self.grad_clip_norm}>")


class CapturedStep:
    """A training step captured in a CUDA graph: `replay(*inputs, target)` copies the batch into the
    step's buffers and replays; returns the loss buffer (0-d, overwritten by the next replay)."""

    def __init__(self, step: TrainStep, graph: Any) -> None:
        self.step = step
        self.graph = graph

    def replay(self, *inputs: Any, target: Any = None) -> Any:
        pack = (self.step.pack(*inputs, target=target) if inputs or target is not None
                else expect(self.step._pack, "the captured step's variant pack"))  # (capture made it)
        self.graph.replay()
        return pack[self.step.loss_uid].reshape(())


def train_step(imported: Any, loss: Any = "cross_entropy", optimizer: Optimizer | None = None,
               mixed_precision: str | None = None, grad_clip_norm: float | None = None, **options: Any) -> TrainStep:
    """A `TrainStep` for `imported` (see the module docstring). options: target_like (the target's
    example or (dims, dtype), for a loss function), loss_scale ({init_scale, growth_factor,
    backoff_factor, growth_interval} for fp16), grad_data_type, name."""
    return TrainStep(imported, loss, optimizer, mixed_precision, grad_clip_norm, **options)


# -- helpers ------------------------------------------------------------------------------------------------


def _torch() -> Any:
    import torch

    return torch


def _og_type(dtype: Any) -> DataType:
    from ..core.dtypes import as_data_type

    return as_data_type(dtype)


def _by_uid(g: Graph) -> dict[int, Tensor]:
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


def _producer_index(g: Graph, t: Tensor) -> int:
    for i, r in enumerate(g._records):
        if any(o is t for o in r.outputs):
            return i
    raise GraphError("the gradient has no producer in the step graph", rule="training.internal",
                     hint="report this as a bug, with the module")


def _sum_to_one(g: Graph, x: Tensor, rank: int, name: str) -> Tensor:
    """The sum of all of x's elements (x of rank `rank`) as a [1] tensor (FLOAT)."""
    r = g.reduction(x, ReductionMode.ADD, name=f"{name}.sum").set_dim([1] * rank)
    r.set_data_type(g.intermediate_data_type)
    return r if rank == 1 else g.reshape(r, [1], name=f"{name}.flat")
