"""`opgraph.compile(module, example_inputs, **build_options)`: an `nn.Module` whose forward runs an
opgraph forward plan and whose backward runs an opgraph gradient plan, inside PyTorch's autograd.

    model = MyNet().cuda()
    fast = opgraph.compile(model, (x,))               # parameters: model's own nn.Parameter objects
    opt = torch.optim.AdamW(fast.parameters(), 1e-3)  # any optimizer, GradScaler, hooks, DDP
    loss = F.cross_entropy(fast(x), y)
    loss.backward()                                   # the gradient plan fills p.grad
    opt.step()

How. The module is imported with `from_torch` (eval-mode batchnorm as graph ops on its parameters, so
that they get gradients too) and, per module mode, autocast type and set of inputs that need a
gradient, made into two plans, cached (`Variant`):
- the forward graph: the imported graph replayed by `training.forward.prepare_forward` (what a training
  step starts from: tied parameters one input, normalizations in training form saving their
  statistics, under torch.autocast its casts), with the tensors the backward reads marked as outputs
  (`GradGraph.keep_in`);
- the gradient graph: `opgraph.grad` of the module's floating outputs with respect to the parameters
  that require grad and the floating inputs that do (split mode: cheap tensors recomputed, heavy
  ones saved).
A `torch.autograd.Function` runs them. Its inputs are the module's inputs and its parameters
themselves, so autograd accumulates into `p.grad`, runs parameter hooks and DDP's reducer as for any
module. The saved activations are the forward plan's output buffers, which the backward pack binds
as they are: not copied, held by the autograd graph until it is freed (fresh per forward call, so a
second forward before the first backward keeps both). Batchnorm running stats are written back
after each training-mode forward, as PyTorch does. Differentiable once: a backward with create_graph=True
gives the gradients' values, and differentiating those raises UnsupportedGraphError (compile.double_backward).

One plan pair per input shape (a new shape imports again and builds new plans, logged on
`opgraph.dynamo`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..autodiff import grad
from ..core.dtypes import as_data_type
from ..core.errors import GraphError, UnsupportedGraphError
from ..graph.builder import Graph
from ..training.forward import TiedParam, prepare_forward
from .torch_runtime import ImportedGraph, Source

log = logging.getLogger("opgraph.dynamo")


@dataclass
class Variant:
    """The plans for one module mode, autocast type and set of inputs needing a gradient.

    params       (key, forward uid, source or None for a tied parameter's own input) per parameter
                 differentiated
    inputs       (flat input index, forward uid) per floating input differentiated
    """

    forward: Graph
    forward_plan: Any
    backward_plan: Any = None
    grad_outputs: dict[int, int] = field(default_factory=dict)  # forward output uid -> its grad input uid
    grads: dict[int, int] = field(default_factory=dict)  # wrt forward uid -> grad output uid
    saved: tuple[int, ...] = ()
    params: list[tuple[str, int, Source | None]] = field(default_factory=list)
    inputs: list[tuple[int, int]] = field(default_factory=list)
    tied: dict[str, tuple[int, set[int]]] = field(default_factory=dict)  # key -> (own uid, member uids)


class CompiledModule(torch.nn.Module):
    """What `opgraph.compile` returns: `module` run by opgraph plans (see the module docstring).
    `parameters()`, `buffers()` and `state_dict()` are the module's own."""

    def __init__(self, module: torch.nn.Module, example_inputs: Any, build_options: dict[str, Any]) -> None:
        super().__init__()
        self.module = module
        self.build_options = build_options
        self._imports: dict[tuple, ImportedGraph] = {}
        self._variants: dict[tuple, Variant] = {}
        self._param_keys: dict[int, list[str]] = {}
        self.register_load_state_dict_pre_hook(CompiledModule._under_module)
        args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
        self._imported(args)  # import now: a module from_torch cannot import fails here, not in a loop

    # the module's own state under its own names (no "module." prefix), also inside a parent module or DDP
    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        out = self.module.state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", "")
        metadata = getattr(out, "_metadata", None)
        if metadata is not None:  # (a parent's load looks the module's versions up under "<prefix>module")
            for key in [k for k in metadata if k == prefix[:-1] or k.startswith(prefix)]:
                metadata.setdefault(
                    prefix + "module" + ("." + key[len(prefix) :] if key != prefix[:-1] else ""), metadata[key]
                )
        return out

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.module.load_state_dict(*args, **kwargs)

    @staticmethod
    def _under_module(owner: torch.nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        """A parent's load_state_dict walks into `module`: its keys, as state_dict gave them, go under it."""
        for key in [k for k in state_dict if k.startswith(prefix)]:
            state_dict[prefix + "module." + key[len(prefix) :]] = state_dict.pop(key)

    def _imported(self, args: tuple) -> ImportedGraph:
        from . import from_torch

        key = (self.module.training, _signature(args))
        imported = self._imports.get(key)
        if imported is None:
            if self._imports:
                log.info(
                    "opgraph.compile: importing %s again for %s (one plan per shape and mode)",
                    type(self.module).__name__,
                    key,
                )
            imported = from_torch(self.module, args, eval_batchnorm="scale_shift")
            self._imports[key] = imported
        return imported

    def forward(self, *inputs: Any) -> Any:
        imported = self._imported(inputs)
        leaves = imported._flat_inputs(inputs)
        device = next((x.device for x in leaves if isinstance(x, torch.Tensor)), None)
        if device is None:
            device = next((p.device for p in self.module.parameters()), torch.device("cpu"))
        low = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
        needs, current = self._needs_grad(imported, leaves)
        key = (id(imported), device.type, low, needs)
        variant = self._variants.get(key)
        if variant is None:
            variant = self._variants[key] = self._make(imported, needs, low, device, inputs)
        tensors = [leaves[i] for i, _ in variant.inputs]
        params = [current[k] for k, _, _ in variant.params]
        run = _Run(self, imported, variant, inputs, device, params, tensors)
        if variant.backward_plan is None:
            outs = run.forward()
        else:
            outs = _Function.apply(run, *tensors, *params)
        return _unflatten(imported, outs)

    def _needs_grad(self, imported: ImportedGraph, leaves: list[Any]) -> tuple[tuple, dict[str, Any]]:
        """((flat indices of floating inputs, parameter keys) that need a gradient now, {key: the
        module's parameter} for those keys)."""
        if not torch.is_grad_enabled():
            return ((), ()), {}
        inputs = tuple(
            i
            for i, (h, x) in enumerate(zip(imported._input_slots, leaves))
            if h is not None and isinstance(x, torch.Tensor) and x.requires_grad and x.is_floating_point()
        )
        keys = self._param_keys.get(id(imported))
        if keys is None:
            keys = self._param_keys[id(imported)] = list(
                dict.fromkeys(s.key for _, s in imported.bound_inputs if s.kind == "parameter")
            )
        current = {k: p for k in keys if (p := self.module.get_parameter(k)).requires_grad and p.is_floating_point()}
        return (inputs, tuple(current)), current

    def _make(self, imported: ImportedGraph, needs: tuple, low: Any, device: Any, inputs: tuple) -> Variant:
        input_idx, keys = needs
        fg = imported.graph.final
        groups: dict[str, list[tuple[Any, Source]]] = {}
        for t, s in imported.bound_inputs:
            if s.kind == "parameter" and s.key in keys:
                groups.setdefault(s.key, []).append((t, s))
        tied: list[TiedParam] = []
        for key, members in groups.items():
            if len(members) > 1:
                p = self.module.get_parameter(key)
                tied.append(
                    TiedParam(
                        key,
                        [(t.known_uid(), s.views) for t, s in members],
                        tuple(p.shape) or (1,),
                        tuple(p.stride()) or (1,),
                        as_data_type(p.dtype),
                    )
                )
        bound = {t.known_uid() for t, _ in imported.bound_inputs}
        types = None if low is None else _autocast_types(self.module, imported, inputs, device.type, low)
        prep = prepare_forward(
            fg,
            bound=bound,
            tied=tied,
            low=None if low is None else as_data_type(low),
            output_types=types,
            name=f"{fg.name}_forward",
        )
        g = prep.graph
        variant = Variant(g, None)
        for tp in tied:
            variant.tied[tp.key] = (prep.tied[tp.key].known_uid(), {u for u, _ in tp.members})
        for key, members in groups.items():
            if key in variant.tied:
                variant.params.append((key, variant.tied[key][0], None))
            else:
                variant.params.append((key, members[0][0].known_uid(), members[0][1]))
        slots = imported._input_slots
        variant.inputs = [(i, h.known_uid()) for i in input_idx if (h := slots[i]) is not None]
        wrt = [u for _, u, _ in variant.params] + [u for _, u in variant.inputs]
        outputs = [t.known_uid() for t in imported.outputs if fg.tensors[t.known_uid()].data_type.is_floating]
        options = {"device": "cuda" if device.type == "cuda" else "cpu", **self.build_options}
        if wrt and outputs:
            try:
                res = grad(
                    g, outputs, wrt, allow_unused=True, forward_types=low is not None, name=f"{fg.name}_backward"
                )
            except GraphError as err:
                raise UnsupportedGraphError(
                    f"opgraph.compile cannot differentiate {type(self.module).__name__}: {err.detail}",
                    op=err.op,
                    tensor=err.tensor,
                    rule="compile.grad",
                    hint=err.hint or "run the module without gradients (torch.no_grad)",
                ) from err
            res.keep_in(g)
            g.validate()
            variant.grad_outputs = {u: t.known_uid() for u, t in res.grad_inputs.items()}
            variant.grads = {u: t.known_uid() for u, t in res.grads.items()}
            variant.saved = tuple(res.saved)
            variant.backward_plan = res.graph.build(**options)
        g.validate()
        variant.forward_plan = g.build(**options)
        return variant


def _autocast_types(
    module: torch.nn.Module, imported: ImportedGraph, inputs: tuple, device_type: str, low: Any
) -> dict[int, Any]:
    """The types eager PyTorch gives the module's floating results under autocast(device_type, low), by
    output UID: the module run on fake tensors (no computation, its parameters and buffers untouched).
    Where that run fails, None per output: the autocast type of the op making it."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.func import functional_call

    leaves = [leaf.tensor.known_uid() if leaf.tensor is not None else None for leaf in imported._output_leaves]
    fallback: dict[int, Any] = {u: None for u in leaves if u is not None}
    mode = FakeTensorMode()

    def fake(t: Any) -> Any:
        return mode.from_tensor(t) if isinstance(t, torch.Tensor) else t

    try:
        state = {k: fake(v) for k, v in [*module.named_parameters(), *module.named_buffers()]}
        args = pytree.tree_map(fake, inputs)
        with mode, torch.autocast(device_type, dtype=low):
            out = functional_call(module, state, args)
        types = [x.dtype if isinstance(x, torch.Tensor) else None for x in pytree.tree_leaves(out)]
    except Exception as err:  # noqa: BLE001 - any failure of a fake run: the ops' autocast types instead
        log.debug(
            "opgraph.compile: the fake autocast run of %s failed (%s); outputs take their op's autocast type",
            type(module).__name__,
            err,
        )
        return fallback
    if len(types) != len(leaves):
        return fallback
    return {
        u: as_data_type(t) for u, t in zip(leaves, types) if u is not None and t is not None and t.is_floating_point
    }


def _signature(args: tuple) -> tuple:
    return tuple(
        (tuple(x.shape), x.dtype, x.device.type) if isinstance(x, torch.Tensor) else repr(x)
        for x in pytree.tree_leaves(args)
    )


def _unflatten(imported: ImportedGraph, outs: Sequence[Any]) -> Any:
    """The module-structured result from the flat graph outputs (in `imported.outputs` order)."""
    by_uid = {t.known_uid(): o for t, o in zip(imported.outputs, outs)}
    return imported.unpack(by_uid)


class _Run:
    """One call: the forward pack (kept for the backward), then the backward pack."""

    def __init__(
        self,
        owner: CompiledModule,
        imported: ImportedGraph,
        variant: Variant,
        inputs: tuple,
        device: Any,
        params: list[Any],
        tensors: list[Any],
    ) -> None:
        self.owner, self.imported, self.variant, self.inputs, self.device = owner, imported, variant, inputs, device
        self.params = params  # the module's parameters differentiated, in variant.params' order
        self.tensors = tensors  # the inputs differentiated, in variant.inputs' order
        self.pack: dict[int, Any] = {}

    def forward(self) -> tuple[Any, ...]:
        v, imported = self.variant, self.imported
        final = v.forward.final
        base = imported.variant_pack(*self.inputs, outputs={})
        members = {u for _, (_, ms) in v.tied.items() for u in ms}
        pack = {u: b for u, b in base.items() if u in final.inputs and u not in members}
        for (key, uid, _), p in zip(v.params, self.params):
            if key in v.tied:
                pack[uid] = p.detach()
        for uid in final.outputs:
            d = final.tensors[uid]
            pack[uid] = torch.empty_strided(d.dim, d.stride, dtype=d.data_type.to_torch(), device=self.device)
        v.forward_plan.execute(pack)
        imported.write_back(pack)
        self.pack = pack
        return tuple(pack[t.known_uid()] for t in imported.outputs)

    def backward(self, grads: Sequence[Any]) -> list[Any]:
        v, imported = self.variant, self.imported
        plan = v.backward_plan
        final = plan.graph
        pack = {u: self.pack[u] for u in v.saved}
        by_output = {t.known_uid(): g for t, g in zip(imported.outputs, grads)}
        for out_uid, uid in v.grad_outputs.items():
            d = final.tensors[uid]
            g = by_output.get(out_uid)
            buf = torch.empty_strided(d.dim, d.stride, dtype=d.data_type.to_torch(), device=self.device)
            if g is None:
                buf.zero_()
            else:
                buf.copy_(g.reshape(d.dim) if tuple(g.shape) != d.dim else g)
            pack[uid] = buf
        results: list[Any] = []
        for (_, uid, source), p in zip(v.params, self.params):
            out = torch.empty_like(p, memory_format=torch.preserve_format)
            pack[v.grads[uid]] = source.apply(out) if source is not None else out
            results.append(out)
        leaves = imported._flat_inputs(self.inputs)
        input_grads = []
        for i, uid in v.inputs:
            d = final.tensors[v.grads[uid]]
            out = torch.empty_strided(d.dim, d.stride, dtype=d.data_type.to_torch(), device=self.device)
            pack[v.grads[uid]] = out
            input_grads.append(out.reshape(leaves[i].shape))
        plan.execute(pack)
        return input_grads + results


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, run: _Run, *tensors: Any) -> Any:
        ctx.run = run
        outs = run.forward()
        ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
        return outs

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        run = ctx.run
        if run is None:
            raise UnsupportedGraphError(
                "a second backward through opgraph.compile's module (retain_graph=True): the first freed the "
                "saved activations",
                rule="compile.retain_graph",
                hint="run the module's forward again for each backward",
            )
        ctx.run = None  # the saved activations go with the autograd graph's node
        create_graph = torch.is_grad_enabled()
        with torch.no_grad():
            results = run.backward(grads)
        if create_graph:  # values now; differentiating them raises (the gradient plan is not differentiable)
            sources = [*run.params, *[t for t in run.tensors if isinstance(t, torch.Tensor) and t.requires_grad]]
            results = list(_NotTwice.apply(len(results), *results, *sources))
        return (None, *results)


class _NotTwice(torch.autograd.Function):
    """The gradients of a backward run with create_graph=True: their values, and a typed error when they
    are differentiated (double backward, a gradient penalty)."""

    @staticmethod
    def forward(ctx: Any, count: int, *tensors: Any) -> Any:
        return tuple(t.view_as(t) for t in tensors[:count])

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise UnsupportedGraphError(
            "opgraph.compile's module is differentiable once: a gradient of its gradients (create_graph=True "
            "then a backward through the result: double backward, a gradient penalty, Hessian-vector products) "
            "would differentiate its gradient plan, which opgraph does not",
            rule="compile.double_backward",
            hint="compute the term that needs second derivatives with the eager module (or torch.compile "
            "with another backend); create_graph=True alone, with the gradients used as values, works",
        )


def compile(module: torch.nn.Module, example_inputs: Any, **build_options: Any) -> CompiledModule:  # noqa: A001
    """`module` as an `nn.Module` run by opgraph plans, forward and backward, sharing the module's
    parameters (see `opgraph.frontends.autograd_module`). `example_inputs`: a tensor or a tuple of the
    forward's arguments (their shapes, dtypes and layouts are what the plans are built for).
    `build_options`: passed to `Graph.build` (engines, autotune, heur_mode, ...; `device` defaults to
    the inputs')."""
    if not isinstance(module, torch.nn.Module):
        raise UnsupportedGraphError(
            f"opgraph.compile takes a torch.nn.Module, got {type(module).__name__}",
            rule="compile.module",
            hint="pass the model (an nn.Module)",
        )
    return CompiledModule(module, example_inputs, dict(build_options))
