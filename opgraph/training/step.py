"""`train_step(imported, loss=..., optimizer=..., mixed_precision=None, grad_clip_norm=None)`: one
training-step graph for a module imported with `opgraph.from_torch` in train mode.

    imported = opgraph.from_torch(model.train(), (tokens,))
    step = opgraph.training.train_step(imported, loss="cross_entropy",
                                       optimizer=opgraph.training.AdamW(3e-4), mixed_precision="bf16",
                                       grad_clip_norm=1.0)
    for tokens, targets in batches:
        loss = step.run(tokens, targets)        # = autocast forward, loss, backward, clip, AdamW.step()
        step.optimizer.set(lr=schedule(i))      # device scalars: a captured step reads the new value

Building and running are apart: the step's graph (`step.step_graph`, a `ModuleStepGraph`; `step.graph`
its Graph) is made by a pure function (opgraph.training.module_graph, over training.step_graph): the
module's forward prepared for training (tied, sliced and expanded parameters made one input each,
normalizations in training form, autocast's casts), the loss, the backward (opgraph.grad, combined),
optional fp16 loss scaling and gradient clipping, and the optimizer's in-place updates of the module's own
parameters and of the optimizer state (opgraph.training.optimizers). `TrainStep` binds the module's
tensors and the optimizer state to it, builds the plan and runs it.

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
  clean steps double it. With `compute_copies=True` the 16-bit copies of the parameters the forward
  reads are step state: the update writes each with its parameter, in its kernel, instead of every
  forward casting the parameters again; a parameter PyTorch changed outside the step (its version
  counter) is cast again before the next step, and `refresh_compute_copies()` does it on demand.
- `run(*inputs, target)` builds the plan on first use on the inputs' device (fp32 products in full
  precision unless the import allows TF32, as `ImportedGraph.run`), copies inputs and target
  into the step's own buffers, executes, writes batchnorm running stats back into the module and
  returns the loss (a 0-d tensor, a copy). `pack(...)` gives the same variant pack to drive the plan
  yourself; `capture(...)` records the step (and the write-back) in a CUDA graph: `replay(*inputs,
  target)`. The optimizer state lives in the step (`param_state(key)`, `step_count`, `loss_scale`);
  `state_dict()` / `load_state_dict(sd)` checkpoint it in torch.optim's layout (opgraph.training.checkpoint).
- process_group=group (torch.distributed): data-parallel, each rank on its shard, gradients averaged over
  the group in buckets inside the step graph (opgraph.training.distributed); None: one process.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, GraphError, VariantPackError, expect
from ..core.symbolic import evaluate
from ..core.tensor import Tensor
from ..core.types import Buffer, UidPack
from . import checkpoint
from .distributed import (
    DEFAULT_BUCKET_CAP_MB,
    OwnedParams,
    check_ranks_agree,
    data_parallel_hook,
    owned_params,
    shard_owners,
)
from .losses import Loss
from .module_graph import MIXED, ModuleStepGraph, module_step_graph
from .optimizers import Optimizer
from .step_graph import SCALER_DEFAULTS, GradientHook, ParamSlot, handles_by_uid

SHAPE_PACKS = 8  # shapes whose buffers a training step of dynamic dims keeps (least recently used out)

__all__ = ["MIXED", "SCALER_DEFAULTS", "CapturedStep", "ParamSlot", "TrainStep", "train_step"]


class TrainStep:
    """A training step of an imported module: its graph (`step_graph`) and what runs it (see the module
    docstring). The optimizer state lives here, per parameter key (`param_state`)."""

    def __init__(
        self,
        imported: Any,
        loss: Any = "cross_entropy",
        optimizer: Optimizer | None = None,
        mixed_precision: str | None = None,
        grad_clip_norm: float | None = None,
        *,
        target_like: Any = None,
        loss_scale: Mapping[str, float] | None = None,
        grad_data_type: Any = None,
        on_gradient: Sequence[GradientHook] = (),
        name: str | None = None,
        process_group: Any = None,
        bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
        zero: bool = False,
        compute_copies: bool = False,
    ) -> None:
        self.imported = imported
        self.process_group = process_group
        self._owners: dict[str, int] | None = None  # ZeRO-1: parameter key -> the rank that updates it
        self._owned: OwnedParams | None = None  # ZeRO-1: the parameters laid out for the broadcast
        if zero and process_group is None:
            raise AttributeValueError(
                "zero=True (ZeRO-1) shards the optimizer state over a process group",
                rule="training.zero",
                hint="pass process_group=... as well, or zero=False",
            )
        if process_group is not None:  # gradients averaged over the group, in buckets (training.distributed)
            hook = data_parallel_hook(process_group, bucket_cap_mb, zero)
            on_gradient = (*on_gradient, hook)
        self.step_graph: ModuleStepGraph = module_step_graph(
            imported,
            loss,
            optimizer,
            mixed_precision,
            grad_clip_norm,
            target_like=target_like,
            loss_scale=loss_scale,
            grad_data_type=grad_data_type,
            on_gradient=on_gradient,
            compute_copies=compute_copies,
            name=name,
        )
        if process_group is not None:
            if zero:
                final = self.graph.final
                self._owners = shard_owners([(s.key, final.tensors[s.uid].numel) for s in self.params], hook.size)
                what = "\n".join(
                    [
                        imported.graph.to_json(indent=None),
                        repr(self.optimizer),
                        str(mixed_precision),
                        str(grad_clip_norm),
                        str(bucket_cap_mb),
                        type(self.loss_fn).__name__,
                    ]
                )
            else:
                what = self.graph.to_json(indent=None)
            check_ranks_agree(
                what,
                {
                    h.name or str(h.uid): tuple(d if isinstance(d, int) else str(d) for d in h.known_dim())
                    for h in imported.inputs
                },
                process_group,
            )
        self.mixed_precision = mixed_precision
        self.grad_clip_norm = grad_clip_norm
        self.scaler = {**SCALER_DEFAULTS, **(loss_scale or {})} if self.low is DataType.HALF else None
        self.plan: Any = None
        self._device: Any = None
        self._pack: UidPack | None = None
        self._state: dict[str, dict[str, Any]] = {}  # parameter key -> state name -> tensor (the parameter's layout)
        self._copies: dict[str, tuple[Any, Any, int]] = {}  # key -> (parameter, compute copy, the parameter's version)
        self._fingerprint: tuple = ()
        self._shaped: OrderedDict[tuple[int, ...], UidPack] = OrderedDict()  # shape -> its buffers (dynamic dims)
        self._env: Mapping[str, int] = {}  # the dynamic dims' values of the last pack

    # -- the graph (ModuleStepGraph's) ----------------------------------------------------------------------
    @property
    def graph(self) -> Any:
        return self.step_graph.graph

    @property
    def params(self) -> list[ParamSlot]:
        return list(self.step_graph.params)

    @property
    def scalars(self) -> dict[str, int]:
        """Device scalar inputs by name: hyper-parameters, counters, loss scale."""
        return dict(self.step_graph.scalars)

    @property
    def optimizer(self) -> Optimizer:
        return self.step_graph.optimizer

    @property
    def loss_fn(self) -> Loss:
        return self.step_graph.loss_fn

    @property
    def low(self) -> DataType | None:
        return self.step_graph.low

    @property
    def loss_uid(self) -> int:
        return self.step_graph.loss_uid

    @property
    def target_uid(self) -> int:
        return self.step_graph.target_uid

    @property
    def out_uid(self) -> int:
        return self.step_graph.out_uid

    @property
    def seed_uid(self) -> int | None:
        return self.step_graph.seed_uid

    @property
    def grad_norm_uid(self) -> int | None:
        return self.step_graph.grad_norm_uid

    @property
    def loss(self) -> Tensor:
        return handles_by_uid(self.graph)[self.loss_uid]

    @property
    def target(self) -> Tensor:
        return handles_by_uid(self.graph)[self.target_uid]

    # -- binding --------------------------------------------------------------------------------------------
    def build(self, device: str | None = None, allow_tf32: bool | None = None, **build_options: Any) -> Any:
        """Build (or rebuild) the step's plan for `device` (default: a GPU if usable, else the CPU). fp32
        products are computed in full precision unless TF32 is allowed: `allow_tf32`, else the imported
        module's setting (ImportedGraph.numeric_options: from_torch's allow_tf32 or PyTorch's at import)."""
        numeric = getattr(self.imported, "numeric_options", None)
        options = numeric(allow_tf32, **build_options) if numeric is not None else build_options
        self.plan = self.graph.build(device=device, **options)
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
        dict (and buffers) every call; parameters are re-bound when the module's tensors moved. With
        dynamic dims (an import with dynamic_shapes), the inputs' shape picks the buffers of the
        tensors whose dims vary (inputs, target, activations the step outputs), one set per shape
        (the last SHAPE_PACKS kept); the rest are shared by every shape."""
        if target is None and len(inputs) == len(self.imported.inputs) + 1:
            inputs, target = inputs[:-1], inputs[-1]
        torch = _torch()
        device = self._device_of(inputs)
        leaves = self.imported._flat_inputs(inputs)
        env = self.imported.shape_of(leaves)  # (the dynamic dims' values, checked against their ranges)
        if self._pack is None or self._device != device:
            self._make_pack(device)
        elif self._fingerprint != self._params_fingerprint():
            self._bind_module(self._pack, device)
        pack = expect(self._pack, "the step's variant pack")  # (made or bound just above)
        self.refresh_compute_copies(force=False)
        if env:
            pack.update(self._shape_buffers(env, device))
        self._env = env
        handles = [h for h in self.imported._input_slots if h is not None]
        values = [v for h, v in zip(self.imported._input_slots, leaves) if h is not None]
        for h, v in zip(handles, values):
            pack[h.uid].copy_(self.imported._user_input(h, v, env).to(device))
        if target is None:
            raise VariantPackError(
                "a training step needs the target", rule="training.target", hint="call step.run(*inputs, target)"
            )
        d = self.graph.final.tensors[self.target_uid]
        tdims, _ = _layout(d, env)
        t = target if isinstance(target, torch.Tensor) else torch.as_tensor(target)
        if t.numel() != math.prod(tdims):
            raise VariantPackError(
                f"the target has shape {list(t.shape)} ({t.numel()} elements); the loss takes "
                f"{math.prod(tdims)} ({list(tdims)}"
                + (f", dims {[str(x) for x in d.dim]} at {_shape_text(env)})" if env else ")"),
                tensor=d,
                rule="training.target_shape",
                hint="pass the targets of this batch (class indices for cross_entropy)",
            )
        pack[self.target_uid].copy_(t.reshape(tdims).to(device=device, dtype=d.data_type.to_torch()))
        for handle, source in self.imported.bound_inputs:  # dropout masks: a new draw per step
            if source.kind == "random" and handle.uid in pack:
                pack[handle.uid].copy_(self.imported._resolve(source, {}, {}, device, None))
        return pack

    def _shape_buffers(self, env: Mapping[str, int], device: Any) -> UidPack:
        """The buffers of the tensors whose dims vary at the shape `env` (made at its first use; the
        last SHAPE_PACKS shapes kept)."""
        key = tuple(env.values())
        found = self._shaped.get(key)
        if found is not None:
            self._shaped.move_to_end(key)
            return found
        torch = _torch()
        final = self.graph.final
        bufs: UidPack = {}
        for uid in self._dynamic_uids():
            d = final.tensors[uid]
            if uid in self.step_graph.ones:  # one element, zero strides, at this shape's dims
                dims = tuple(evaluate(x, env) for x in self.step_graph.ones[uid])
                bufs[uid] = torch.ones(1, dtype=d.data_type.to_torch(), device=device).expand(*dims)
            else:
                dims, strides = _layout(d, env)
                bufs[uid] = torch.empty_strided(dims, strides, dtype=d.data_type.to_torch(), device=device)
        self._shaped[key] = bufs
        while len(self._shaped) > SHAPE_PACKS:
            self._shaped.popitem(last=False)
        return bufs

    def _dynamic_uids(self) -> list[int]:
        """The step's bound tensors (inputs and outputs) whose dims or strides are dynamic."""
        final = self.graph.final
        return [u for u in dict.fromkeys((*final.inputs, *final.outputs)) if final.tensors[u].is_dynamic]

    def _params_fingerprint(self) -> tuple:
        module = self.imported.module
        return tuple(module.get_parameter(p.key).data_ptr() for p in self.params)

    def _make_pack(self, device: Any) -> None:
        torch = _torch()
        sg = self.step_graph
        final = self.graph.final

        dynamic = set(self._dynamic_uids())  # (bound per shape: `_shape_buffers`)
        self._shaped.clear()

        def empty(uid: int) -> Any:
            d = final.tensors[uid]
            return torch.empty_strided(d.dim, d.stride, dtype=d.data_type.to_torch(), device=device)

        pack: UidPack = {}
        for h in self.imported.inputs:
            if h.uid not in dynamic:
                pack[h.uid] = empty(h.uid)
        if self.target_uid not in dynamic:
            pack[self.target_uid] = empty(self.target_uid)
        self._bind_module(pack, device)
        scalars = sg.state_pack(device, params=())  # the device scalars (bound to the optimizer) and the seed
        pack.update(scalars)
        if self._pack is not None:  # the module moved: the step count and the loss scale go on
            for uid in sg.scalars.values():
                pack[uid].copy_(self._pack[uid])
        for uid, dims in sg.ones.items():  # the broadcast of an expanded parameter: one element, zero strides
            if uid not in dynamic:
                pack[uid] = torch.ones(1, dtype=final.tensors[uid].data_type.to_torch(), device=device).expand(*dims)
        for uid in final.outputs:
            if uid not in pack and uid not in dynamic:
                pack[uid] = empty(uid)
        missing = [final.tensors[u].label() for u in final.inputs if u not in pack and u not in dynamic]
        if missing:
            raise GraphError(
                f"the step graph reads inputs train_step does not bind: {', '.join(missing)}",
                rule="training.internal",
                hint="report this as a bug, with the module",
            )
        self._pack, self._device = pack, device

    def _bind_module(self, pack: UidPack, device: Any) -> None:
        """Parameters, buffers and constants (views of the module's tensors), and the optimizer state
        (made once per parameter, laid out like it: `_param_state`)."""
        imp = self.imported
        final = self.graph.final
        if self._owners is not None:  # ZeRO-1: each owner's parameters views of one buffer, before binding
            named = [(s.key, imp.module.get_parameter(s.key)) for s in self.params]
            if all(p.device == device for _, p in named) and (
                self._owned is None or not self._owned.holds([p for _, p in named])
            ):
                self._owned = owned_params(named, self._owners, self.process_group)
        cache: dict = {}
        for handle, source in imp.bound_inputs:
            if (
                handle.uid in final.tensors
                and final.tensors[handle.uid].is_virtual is False
                and handle.uid in final.inputs
            ):
                pack[handle.uid] = imp._resolve(source, cache, {}, device, None)
        module = imp.module
        for slot in self.params:
            p = module.get_parameter(slot.key).detach()
            if p.device != device:
                raise VariantPackError(
                    f"parameter '{slot.key}' is on {p.device}, the inputs on {device}",
                    rule="training.device",
                    hint="move the module to the inputs' device",
                )
            pack[slot.uid] = slot.source.apply(p) if slot.source is not None else p
            for sname, uid in slot.state.items():
                state = self._param_state(slot.key, sname, p)
                pack[uid] = slot.source.apply(state) if slot.source is not None else state
            if slot.compute_copy is not None:
                d = final.tensors[slot.compute_copy]
                copy = self._compute_copy(slot.key, p, d.data_type)
                view = slot.source.apply(copy) if slot.source is not None else copy
                pack[slot.compute_copy] = view.as_strided(view.shape, d.stride)  # (its unit axes' strides as declared)
        self._fingerprint = self._params_fingerprint()

    def _compute_copy(self, key: str, p: Any, data_type: DataType) -> Any:
        """Parameter `key`'s compute copy (`p` cast to `data_type`, laid out like it), made or refilled."""
        torch = _torch()
        found = self._copies.get(key)
        copy = found[1] if found is not None else None
        if copy is None or copy.device != p.device or copy.shape != p.shape or copy.stride() != p.stride():
            copy = torch.empty_like(p, dtype=data_type.to_torch(), memory_format=torch.preserve_format)
        self._cast_into(key, p, copy)
        return copy

    def _cast_into(self, key: str, p: Any, copy: Any) -> None:
        copy.copy_(p)
        self._copies[key] = (p, copy, p._version)

    def refresh_compute_copies(self, force: bool = True) -> int:
        """Cast the parameters into their compute copies again (mixed precision: the 16-bit copies the
        step's forward reads, which its update writes): every one with `force`, else those whose
        parameter PyTorch changed since (its version counter: any in-place torch op, `model.load_state_dict`,
        a torch optimizer). `run`, `pack` and `replay` do the second before each step; call this after
        writing a parameter where PyTorch does not count it (through `.data`, a raw pointer, another
        library's kernel). Returns how many were refreshed."""
        n = 0
        for key, (p, copy, version) in self._copies.items():
            if force or p._version != version:
                self._cast_into(key, p, copy)
                n += 1
        return n

    def _param_state(self, key: str, name: str, p: Any) -> Any:
        """Parameter `key`'s optimizer state `name`: zeros like the parameter when first asked for (torch's
        lazily made state), kept across steps (and moved to the parameter's device when it moved)."""
        state = self._state.setdefault(key, {})
        if name not in state:
            state[name] = _torch().zeros_like(p, memory_format=_torch().preserve_format)
        elif state[name].device != p.device:  # the module moved: its state goes with it
            state[name] = state[name].to(p.device)
        return state[name]

    # -- running --------------------------------------------------------------------------------------
    def run(self, *inputs: Any, target: Any = None) -> Any:
        """One training step on `inputs` (the module's arguments) and `target`; returns the loss (0-d)."""
        pack = self.pack(*inputs, target=target)
        if self.plan is None or self.plan.device.torch_name != str(self._device):
            self.build(str(self._device))
        self.plan.execute(pack)
        self._after_execute(pack)
        return pack[self.loss_uid].reshape(()).clone()

    def capture(self, *inputs: Any, target: Any = None) -> CapturedStep:
        """The step (execute + running-stat write-back) recorded in a CUDA graph on the step's buffers.
        Warming up runs one step, whose effect on parameters, optimizer state and module buffers is
        undone before capturing. Replays read the current hyper-parameters (device scalars)."""
        torch = _torch()
        pack = self.pack(*inputs, target=target)
        if self._device.type != "cuda":
            raise GraphError(
                "CUDA graphs need inputs on a CUDA device",
                rule="cudagraph.device",
                hint="move the module and inputs to the GPU",
            )
        if self.plan is None or self.plan.device.torch_name != str(self._device):
            self.build(str(self._device))
        saved = self._snapshot(pack)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.plan.execute(pack)
            self._after_execute(pack)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self._restore(saved)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.plan.execute(pack)
            self._after_execute(pack)
        return CapturedStep(self, graph, dict(self._env), {u: pack[u] for u in self._dynamic_uids()})

    def _after_execute(self, pack: Mapping[int, Buffer]) -> None:
        """Batchnorm running stats back into the module; with ZeRO-1, each parameter from its owner (one
        broadcast per owner's buffer; nothing with one rank)."""
        self.imported.write_back(pack)
        if self._owned is not None:
            self._owned.broadcast()

    def _snapshot(self, pack: Mapping[int, Buffer]) -> list[tuple[Any, Any]]:
        # every output: parameters and optimizer state are updated in place (outputs read before
        # they are written, not graph inputs), and the rest are cheap
        keep = [pack[u] for u in self.graph.final.outputs]
        keep += [b for b in self.imported.module.buffers()]
        if self._owners is not None:  # (parameters other ranks update are not outputs here)
            keep += [self.imported.module.get_parameter(s.key).detach() for s in self.params]
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
        uid = self.grad_norm_uid
        return None if uid is None or self._pack is None else self._pack[uid].reshape(())

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint laid out as PyTorch's: {"model": the module's state dict, "optimizer": torch.optim's
        layout ({"state": {i: ...}, "param_groups": [...]}, i a position in module.parameters()),
        "loss_scale": GradScaler's state dict or None, "step": AdamW's step count or None}. Its tensors
        are the live ones (torch.save it). See opgraph.training.checkpoint."""
        return checkpoint.state_dict(self)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a checkpoint of this step, or one made by an eager loop ({"model": model.state_dict(),
        "optimizer": opt.state_dict(), "loss_scale": scaler.state_dict()}): the module's tensors, the
        optimizer's state and hyper-parameters, the step count, the loss scale. A checkpoint that does
        not fit raises StateDictError before anything changes."""
        checkpoint.load_state_dict(self, state_dict)

    def __repr__(self) -> str:
        return (
            f"<TrainStep {self.graph.name}: {len(self.params)} parameters, {self.optimizer}, "
            f"loss {self.loss_fn.name}, mixed_precision={self.mixed_precision}, "
            f"grad_clip_norm={self.grad_clip_norm}>"
        )


class CapturedStep:
    """A training step captured in a CUDA graph: `replay(*inputs, target)` copies the batch into the
    step's buffers and replays; returns the loss buffer (0-d, overwritten by the next replay)."""

    def __init__(
        self, step: TrainStep, graph: Any, shape: Mapping[str, int] | None = None, buffers: UidPack | None = None
    ) -> None:
        self.step = step
        self.graph = graph
        self.shape = dict(shape or {})  # the dynamic dims' values it was captured at ({} when static)
        self.buffers = dict(buffers or {})  # the captured buffers of dynamic dims (kept alive: the graph reads them)

    def replay(self, *inputs: Any, target: Any = None) -> Any:
        """Copy `inputs` and `target` (if given) into the captured buffers and replay. With dynamic
        dims, the inputs must have the captured shape (a graph records one shape's buffers): another
        shape is a VariantPackError (capture one step per shape)."""
        if self.graph is None:
            raise GraphError(
                "this captured step was released",
                rule="training.capture_released",
                hint="capture the step again (step.capture(*inputs, target)) to replay it",
            )
        batch = bool(inputs) or target is not None  # (a new batch to copy in; else the buffers as they are)
        if self.shape:
            step = self.step
            if batch:
                given = inputs[:-1] if target is None and len(inputs) == len(step.imported.inputs) + 1 else inputs
                shape = step.imported.shape_of(step.imported._flat_inputs(given))
                if shape != self.shape:
                    raise VariantPackError(
                        "the inputs give the dynamic dims "
                        + ", ".join(f"'{k}' = {shape[k]}" for k, v in self.shape.items() if shape.get(k) != v)
                        + f"; the step was captured at {_shape_text(self.shape)}",
                        rule="training.capture_shape",
                        hint="capture a step per shape (step.capture(*inputs, target) at each), or run it: step.run(...)",
                    )
            step._shaped[tuple(self.shape.values())] = self.buffers  # (the captured buffers, if evicted since)
            step._shaped.move_to_end(tuple(self.shape.values()))
            if not batch:
                expect(step._pack, "the captured step's variant pack").update(self.buffers)
        if batch:
            pack = self.step.pack(*inputs, target=target)
        else:
            pack = expect(self.step._pack, "the captured step's variant pack")  # (capture made it)
            self.step.refresh_compute_copies(force=False)  # (pack does it otherwise)
        self.graph.replay()
        return pack[self.step.loss_uid].reshape(())

    def release(self) -> None:
        """Free the CUDA graph now. Call it on every captured data-parallel step before
        `torch.distributed.destroy_process_group()`: NCCL cannot destroy a communicator that a live
        captured graph still uses, and the teardown waits for good (PyTorch issue 115388)."""
        if self.graph is not None:
            if _torch().cuda.is_available():
                _torch().cuda.synchronize()  # (a replay in flight finishes first)
            self.graph.reset()
            self.graph = None


def train_step(
    imported: Any,
    loss: Any = "cross_entropy",
    optimizer: Optimizer | None = None,
    mixed_precision: str | None = None,
    grad_clip_norm: float | None = None,
    **options: Any,
) -> TrainStep:
    """The training step of module `imported` (opgraph.from_torch, train mode): forward, `loss`, backward,
    clipping and `optimizer`'s update in one plan (see the module docstring).

    loss: "cross_entropy", "mse", a `Loss` (CrossEntropy(...), MSE()) or a function (g, output, target) -> loss.
    optimizer: SGD(...) or AdamW(...) (default AdamW(1e-3)); its hyper-parameters are device scalars.
    mixed_precision: None, "bf16" or "fp16" (fp16 adds GradScaler's dynamic loss scale).
    grad_clip_norm: the max global gradient norm (torch.nn.utils.clip_grad_norm_), or None.
    options: target_like (the target's example or (dims, dtype), for a loss function), loss_scale
        ({init_scale, growth_factor, backoff_factor, growth_interval} for fp16), grad_data_type,
        on_gradient (gradient-ready hooks, opgraph.training.step_graph), name, process_group (a
        torch.distributed group: data-parallel, gradients averaged over it in buckets of bucket_cap_mb
        MiB, default 25; zero=True: ZeRO-1, optimizer state sharded; opgraph.training.distributed),
        compute_copies (with mixed_precision: each parameter's 16-bit cast kept as step state and written
        by its update instead of cast again by every forward: refresh_compute_copies; off by default: on
        the Llama zoo step it ran slower, bench/results/constants.md#compute-copies).
    """
    return TrainStep(imported, loss, optimizer, mixed_precision, grad_clip_norm, **options)


def _torch() -> Any:
    import torch

    return torch


def _layout(desc: Any, env: Mapping[str, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A tensor's dims and strides at a shape of the dynamic dims (as declared where static)."""
    if not env:
        return tuple(desc.dim), tuple(desc.stride)
    return tuple(evaluate(d, env) for d in desc.dim), tuple(evaluate(s, env) for s in desc.stride)


def _shape_text(env: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items())
