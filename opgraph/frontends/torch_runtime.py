"""What `from_torch` returns: the graph, and what it takes to run it on a module's own tensors.

Binding. Every graph input that is not a user input has a `Source`: a parameter or buffer of the
module (by state_dict key), a constant the importer made, or a random tensor drawn per run (dropout
masks), plus the chain of view ops (reshape to [1, C, 1, 1], the transpose of a linear weight, ...)
that turns the module's tensor into the graph tensor. `variant_pack` applies them to the module's
*current* tensors at every call, so updated or reassigned parameters are picked up (zero-copy views
where PyTorch can make them). `params=` overrides any of them by key.

Derived inputs. Eval-mode batchnorm folded into a per-channel scale and shift (the default) binds
those two tensors, computed from the module's weight, bias and running stats at bind time and
cached until one of them changes (`DerivedSpec`).

Module state. Training-mode batchnorm updates running stats: the graph has `next_running_mean/var`
outputs (named `<key>@next`), which `run()` copies into the module's buffers after executing;
with your own `variant_pack` + `plan.execute`, call `write_back(pack)`. Increments of integer buffers
(`num_batches_tracked += 1`) are done on the host by `write_back` too.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.errors import VariantPackError
from ..core.tensor import Tensor
from ..core.types import Buffer, UidPack
from ..graph.builder import Graph
from .torch_runpack import RUN_PACKS, _draw, _layout, _RunPack


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class Source:
    """Where a bound graph input comes from: `kind` ('parameter', 'buffer', 'constant', 'random'),
    its `key` (state_dict key or constant name) and the view ops applied to it, in order."""

    kind: str
    key: str
    views: tuple[tuple[Any, tuple], ...] = ()

    def view(self, op: Any, *args: Any) -> Source:
        return replace(self, views=self.views + ((op, _freeze(args)),))

    def apply(self, tensor: Any) -> Any:
        for op, args in self.views:
            try:
                tensor = op(tensor, *(_thaw(a) for a in args))
            except RuntimeError:
                # a view PyTorch cannot make for these strides: reshape copies (re-done every bind)
                name = getattr(op, "__name__", "")
                if not name.startswith("view"):
                    raise
                tensor = tensor.reshape(*(_thaw(a) for a in args))
        return tensor

    def label(self) -> str:
        return f"{self.kind} '{self.key}'" + (f" (+{len(self.views)} view op(s))" if self.views else "")


@dataclass(frozen=True)
class RandomSpec:
    """A tensor drawn at every `variant_pack`: 'bernoulli' (p = probability of 1), 'uniform' [0, 1),
    'normal' (0, 1) or 'seed' (integers in [0, 2^53), e.g. an attention dropout's Philox seed)."""

    dist: str
    shape: tuple[int, ...]
    dtype: Any
    p: float = 0.5


@dataclass(frozen=True)
class DerivedSpec:
    """A tensor computed at bind time from other bound inputs (`fn(*tensors)`, e.g. a folded
    batchnorm's scale). It is recomputed only when one of those tensors changes: another object, other
    storage, or an in-place update (PyTorch's version counter)."""

    fn: Any
    inputs: tuple[Source, ...]


@dataclass(frozen=True)
class ReportEntry:
    """How one node of the traced program was imported.

    status: 'translated' (opgraph ops), 'custom' (a custom op running the aten op), 'alias' (no op:
    a view, copy or identity), 'constant' (folded at import), 'random' (a per-run random input),
    'host' (done on the host by write_back), 'derived' (an untranslated op on buffers and constants
    alone, computed at bind time and cached until an input changes), 'size' (a size of an import with
    dynamic shapes, `aten.sym_size` or arithmetic on sizes: its expression of the dims)."""

    node: str
    target: str
    status: str
    ops: tuple[str, ...] = ()
    note: str = ""

    def __str__(self) -> str:
        ops = f" -> {', '.join(self.ops)}" if self.ops else ""
        note = f"  ({self.note})" if self.note else ""
        return f"{self.node}: {self.target} [{self.status}]{ops}{note}"


@dataclass
class ImportReport:
    """What was translated, what became a custom op, and notes (approximations, ignored mutations)."""

    entries: list[ReportEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def custom_ops(self) -> list[ReportEntry]:
        return [e for e in self.entries if e.status == "custom"]

    def counts(self) -> dict[str, int]:
        return dict(collections.Counter(e.status for e in self.entries))

    def summary(self) -> str:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(self.counts().items()))
        lines = [f"imported {len(self.entries)} node(s): {counts}"]
        targets = collections.Counter(e.target for e in self.custom_ops)
        if targets:
            lines.append("custom ops: " + ", ".join(f"{t} x{n}" for t, n in sorted(targets.items())))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary() + "\n" + "\n".join(f"  {e}" for e in self.entries)


@dataclass(frozen=True)
class OutputLeaf:
    """One leaf of the module's output structure: a graph output (with the torch shape it is given
    back in, e.g. () for a scalar loss held as [1]) or a plain Python value."""

    tensor: Tensor | None
    shape: tuple[int, ...] = ()
    value: Any = None


@dataclass(frozen=True)
class Mutation:
    """A module tensor updated by a run: copied from graph output `tensor`, or (`tensor` None) updated
    on the host by `host_add`."""

    kind: str  # 'parameter' or 'buffer'
    key: str
    tensor: Tensor | None = None
    host_add: float | int | None = None


class ImportedGraph:
    """A PyTorch module imported as an opgraph graph.

    graph    the `Graph` (validated)
    inputs   the user-input tensors, in the order of the module's (flattened) arguments
    outputs  the user-output tensors, in the order of the module's (flattened) outputs
    report   an `ImportReport`
    params   {uid: torch tensor} of every bound input (parameters, buffers, constants), current values
    """

    def __init__(
        self,
        *,
        graph: Graph,
        module: Any,
        inputs: list[Tensor | None],
        input_spec: Any,
        output_leaves: list[OutputLeaf],
        output_spec: Any,
        bound: list[tuple[Tensor, Source]],
        constants: dict[str, Any],
        randoms: dict[str, RandomSpec],
        derived: dict[str, DerivedSpec],
        mutations: list[Mutation],
        report: ImportReport,
        allow_tf32: bool = True,
    ) -> None:
        self.graph = graph
        self.module = module
        self._input_slots = inputs
        self._input_spec = input_spec
        self._output_leaves = output_leaves
        self._output_spec = output_spec
        self._bound = bound
        self.constants = constants
        self.randoms = randoms
        self.derived = derived
        self._derived_cache: dict[str, tuple[list, list, Any]] = {}
        self.mutations = mutations
        self.report = report
        self.allow_tf32 = allow_tf32
        self._plans: dict[Any, Any] = {}
        self._device_constants: dict[tuple[str, str], Any] = {}
        self._runs: dict[tuple[int, str, tuple[int, ...]], _RunPack] = {}  # run()'s packs, per plan, device, shape
        self._shape_envs: dict[tuple[Any, ...], dict[str, int]] = {}  # shape_of's answers, per input shapes

    # -- what the graph reads and writes --------------------------------------------------------------
    @property
    def inputs(self) -> list[Tensor]:
        return [t for t in self._input_slots if t is not None]

    @property
    def outputs(self) -> list[Tensor]:
        seen: list[Tensor] = []
        for leaf in self._output_leaves:
            if leaf.tensor is not None and all(leaf.tensor is not s for s in seen):
                seen.append(leaf.tensor)
        return seen

    @property
    def bound_inputs(self) -> list[tuple[Tensor, Source]]:
        """Every graph input bound from the module (or a constant, or a random draw), with its source."""
        return list(self._bound)

    @property
    def params(self) -> UidPack:
        """{uid: tensor} of the bound inputs with the module's current values (random inputs excluded)."""
        cache: dict[tuple[str, str], Any] = {}
        return {t.known_uid(): self._resolve(s, cache, {}, None, None) for t, s in self._bound if s.kind != "random"}

    # -- variant packs ------------------------------------------------------------------------------------
    def variant_pack(
        self, *inputs: Any, outputs: Any = None, params: Mapping[str, Any] | None = None, generator: Any = None
    ) -> UidPack:
        """A variant pack {uid: tensor}: the user inputs (copied to the declared layout if their strides
        differ), the module's current parameters and buffers (or `params` {key: tensor} instead),
        constants, fresh random draws (dropout masks, from torch's RNG or `generator`) and outputs
        (`outputs`: a list in the order of `self.outputs` or a {handle or uid: tensor} dict; the
        others are allocated on the inputs' device)."""
        import torch

        leaves = self._flat_inputs(inputs)
        device = next((x.device for x in leaves if isinstance(x, torch.Tensor)), None)
        if device is None:
            device = next((t.device for t in self.module.parameters()), torch.device("cpu"))
        env = self.shape_of(leaves)
        pack: UidPack = {}
        for handle, value in zip(self._input_slots, leaves):
            if handle is not None:
                pack[handle.known_uid()] = self._user_input(handle, value, env)
        cache: dict[tuple[str, str], Any] = {}
        for handle, source in self._bound:
            pack[handle.known_uid()] = self._resolve(source, cache, params or {}, device, generator)
        given = self._given_outputs(outputs)
        final = self.graph.final
        for uid in final.outputs:
            if uid in given:
                pack[uid] = given[uid]
                continue
            dim, stride = _layout(final.tensors[uid], env)
            pack[uid] = torch.empty_strided(dim, stride, dtype=final.tensors[uid].data_type.to_torch(), device=device)
        return pack

    @property
    def dynamic(self) -> bool:
        """Whether the graph has dynamic dims (an import with dynamic_shapes)."""
        return bool(self.graph.final.symbols)

    @property
    def symbols(self) -> Mapping[str, Any]:
        """The graph's dynamic dims by name (`opgraph.Dim`s with their ranges); empty when static."""
        return self.graph.final.symbols

    def shape_of(self, leaves: Sequence[Any]) -> dict[str, int]:
        """The dynamic dims' values the user inputs (flattened leaves) give, each checked against its
        range (VariantPackError naming the input, the axis, the dim and its range); {} when static."""
        final = self.graph.final
        if not final.symbols:
            return {}
        key = tuple(tuple(v.shape) if hasattr(v, "shape") else None for v in leaves)
        found = self._shape_envs.get(key)
        if found is not None:
            return dict(found)
        from ..core.symbolic_solve import solve

        env = solve(self._observed(leaves))
        if len(self._shape_envs) >= 64:
            self._shape_envs.pop(next(iter(self._shape_envs)))
        self._shape_envs[key] = env
        return dict(env)

    def _observed(self, leaves: Sequence[Any]) -> list[Any]:
        """The sizes the user inputs (flattened leaves) have on the axes of dynamic dims, to solve."""
        from ..core.symbolic import Expr
        from ..core.symbolic_solve import Observed

        final = self.graph.final
        observed = []
        for handle, value in zip(self._input_slots, leaves):
            if handle is None or not hasattr(value, "shape"):
                continue
            desc = final.tensors[handle.known_uid()]
            shape = tuple(value.shape) or (1,)
            if len(shape) != len(desc.dim):
                raise VariantPackError(
                    f"the input has {len(shape)} dims {list(value.shape)}, the graph's input {len(desc.dim)} "
                    f"{[str(d) for d in desc.dim]}",
                    tensor=desc,
                    rule="import.input_shape",
                    hint="pass a tensor of the example's rank, its dynamic dims within their ranges",
                )
            observed += [
                Observed(d, int(n), f"dim {axis} of input {desc.label()}")
                for axis, (d, n) in enumerate(zip(desc.dim, shape))
                if isinstance(d, Expr)
            ]
        return observed

    def _flat_inputs(self, inputs: Sequence[Any]) -> list[Any]:
        from torch.utils import _pytree as pytree

        leaves, spec = pytree.tree_flatten((tuple(inputs), {}))
        if len(leaves) != len(self._input_slots):
            raise VariantPackError(
                f"the module was imported with {len(self._input_slots)} input leaves, got {len(leaves)}",
                rule="import.inputs",
                hint="call with the same arguments (structure) as the example inputs",
            )
        return leaves

    def _user_input(self, handle: Tensor, value: Any, env: Mapping[str, int] | None = None) -> Any:
        import torch

        desc = self.graph.final.tensors[handle.known_uid()]
        dims, strides = _layout(desc, env or {})
        if not isinstance(value, torch.Tensor):
            value = torch.as_tensor(value)
        want = desc.data_type.to_torch()
        if value.dtype != want:
            raise VariantPackError(
                f"the input is {value.dtype} but the graph was imported with {want}",
                tensor=desc,
                rule="import.input_dtype",
                hint=f"pass a {want} tensor, or import again with one",
            )
        shape = tuple(value.shape) or (1,)
        if shape != dims:
            raise VariantPackError(
                f"the input has shape {list(value.shape)} but the graph was imported with {[str(d) for d in desc.dim]}",
                tensor=desc,
                rule="import.input_shape",
                hint="import again with an example of this shape, or with dynamic_shapes= for the dims that vary",
            )
        value = value.reshape(dims)
        if any(d > 1 and s != w for d, s, w in zip(dims, value.stride(), strides)):
            # another layout than the example's: copy into the declared one
            out = torch.empty_strided(dims, strides, dtype=value.dtype, device=value.device)
            out.copy_(value)
            value = out
        return value

    def _given_outputs(self, outputs: Any) -> UidPack:
        if outputs is None:
            return {}
        if isinstance(outputs, Mapping):
            final = self.graph.final
            out = {}
            for key, value in outputs.items():
                uid = key.uid if isinstance(key, Tensor) else int(key)
                if uid not in final.outputs:
                    raise VariantPackError(
                        f"uid {uid} is not an output of the imported graph",
                        rule="import.outputs",
                        hint=f"outputs are {list(final.outputs)}",
                    )
                out[uid] = value
            return out
        handles = self.outputs
        if len(outputs) != len(handles):
            raise VariantPackError(
                f"got {len(outputs)} output buffers for {len(handles)} outputs",
                rule="import.outputs",
                hint="pass one buffer per entry of .outputs, or a dict",
            )
        return {h.known_uid(): v for h, v in zip(handles, outputs)}

    def _resolve(self, source: Source, cache: dict, params: Mapping[str, Any], device: Any, generator: Any) -> Any:
        """The tensor bound for `source`: its base (module tensor, constant, random draw; one per pack
        and key) with the source's views applied."""
        import torch

        key = (source.kind, source.key)
        if key not in cache:
            if source.key in params and source.kind in ("parameter", "buffer", "constant"):
                base = params[source.key]
            elif source.kind == "parameter":
                base = self.module.get_parameter(source.key)
            elif source.kind == "buffer":
                base = self.module.get_buffer(source.key)
            elif source.kind == "constant":
                base = self._constant(source.key, device)
            elif source.kind == "derived":
                base = self._derive(source.key, cache, params, device, generator)
            else:
                spec = self.randoms[source.key]
                base = _draw(spec, torch.empty(spec.shape, dtype=spec.dtype, device=device or "cpu"), generator)
            cache[key] = base  # the module's own tensor object (derived inputs compare identities)
        base = cache[key]
        return source.apply(base.detach() if isinstance(base, torch.Tensor) and base.requires_grad else base)

    def _derive(self, name: str, cache: dict, params: Mapping[str, Any], device: Any, generator: Any) -> Any:
        spec = self.derived[name]
        tensors = [self._resolve(s, cache, params, device, generator) for s in spec.inputs]
        # the base tensors themselves are kept (so that a freed one's memory cannot alias a new one)
        bases = [cache[(s.kind, s.key)] for s in spec.inputs]
        versions = [b._version for b in bases]
        hit = self._derived_cache.get(name)
        if (
            hit is None
            or len(hit[0]) != len(bases)
            or any(a is not b for a, b in zip(hit[0], bases))
            or hit[1] != versions
        ):
            import torch

            with torch.no_grad():
                hit = (bases, versions, spec.fn(*tensors))
            self._derived_cache[name] = hit
        return hit[2]

    def preload(self, sources: Sequence[Source], device: Any) -> None:
        """The device copies of the constants among `sources`, and the values derived from them alone,
        made now and kept (as the first bind would): not inside a later call (a CUDA-graph recording).
        Random draws, and what is derived from them, are made per call and are left alone."""
        cache: dict = {}
        for source in sources:
            if self._fixed(source):
                self._resolve(source, cache, {}, device, None)

    def _fixed(self, source: Source) -> bool:
        """Whether `source` is a constant, or derived from constants only (its value never changes)."""
        if source.kind == "constant":
            return True
        if source.kind == "derived":
            return all(self._fixed(s) for s in self.derived[source.key].inputs)
        return False

    def _constant(self, name: str, device: Any) -> Any:
        value = self.constants[name]
        if device is None or value.device == device:
            return value
        slot = (name, str(device))
        if slot not in self._device_constants:
            self._device_constants[slot] = value.to(device)
        return self._device_constants[slot]

    # -- running ----------------------------------------------------------------------------------
    def numeric_options(self, allow_tf32: bool | None = None, **build_options: Any) -> dict[str, Any]:
        """`build_options` with the import's float32 precision applied: unless TF32 is allowed
        (`allow_tf32`, else what PyTorch allowed at import: `allow_tf32` of from_torch), configs that
        compute fp32 operands in a narrower type (NumericalNote.DOWN_CONVERT_INPUTS) are deselected."""
        from ..core.config import NumericalNote

        tf32 = self.allow_tf32 if allow_tf32 is None else bool(allow_tf32)
        if tf32:
            return dict(build_options)
        notes = build_options.get("deselect_numeric_notes") or ()
        notes = [notes] if isinstance(notes, (str, NumericalNote)) else list(notes)
        return {**build_options, "deselect_numeric_notes": [*notes, NumericalNote.DOWN_CONVERT_INPUTS]}

    def plan(
        self,
        device: str | None = None,
        engines: Sequence[str] | None = None,
        allow_tf32: bool | None = None,
        **build_options: Any,
    ) -> Any:
        """The graph's ExecutionPlan for `device` and `engines`, built once and cached. fp32 products
        are computed in full precision unless TF32 is allowed (see `numeric_options`)."""
        options = self.numeric_options(allow_tf32, **build_options)
        key = (
            device,
            None if engines is None else tuple(engines),
            tuple(sorted((k, _freeze(v)) for k, v in options.items())),
        )
        if key not in self._plans:
            self._plans[key] = self.graph.build(device=device, engines=engines, **options)
        return self._plans[key]

    def run(
        self,
        *inputs: Any,
        device: str | None = None,
        engines: Sequence[str] | None = None,
        reuse_outputs: bool = False,
        **build_options: Any,
    ) -> Any:
        """Run the imported graph on `inputs` like `module(*inputs)`: builds (once) and executes a plan
        on the inputs' device (or `device`), writes updated running stats back into the module, and
        returns the outputs in the module's structure.

        Repeated calls reuse one variant pack per plan and device (`_RunPack`): the inputs are copied
        into its buffers, the module's tensors stay bound (re-bound only when one is replaced or
        moves), random inputs are drawn in place, so the plan launches from its existing binding. The
        results are copies of the pack's outputs, which the next call overwrites; `reuse_outputs=True`
        returns the pack's output buffers themselves (no copy: valid until the next call)."""
        import torch

        leaves = self._flat_inputs(inputs)
        at = next((x.device for x in leaves if isinstance(x, torch.Tensor)), None)
        if at is None:
            at = next((t.device for t in self.module.parameters()), torch.device("cpu"))
        if device is None:
            device = "cuda" if at.type == "cuda" else "cpu"
        plan = self.plan(device, engines, **build_options)
        env = self.shape_of(leaves)
        slot = (id(plan), str(at), tuple(env.values()))
        state = self._runs.get(slot)
        if state is None or not state.current(self):
            # (a pack of the plan at another shape: its module side serves this one)
            like = next((r for k, r in reversed(self._runs.items()) if k[:2] == slot[:2] and r.current(self)), None)
            state = self._runs[slot] = _RunPack(self, leaves, at, env, like=like)
            while len(self._runs) > RUN_PACKS:  # (one per shape for a dynamic graph: the oldest go)
                self._runs.pop(next(iter(self._runs)))
        pack = state.refresh(self, leaves)
        plan.execute(pack)
        self.write_back(pack)
        out = self.unpack(pack)
        if reuse_outputs:
            return out
        from torch.utils import _pytree as pytree

        return pytree.tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, out)

    def unpack(self, pack: Mapping[int, Buffer]) -> Any:
        """The module-structured outputs (tensors in the torch shapes the module returns) of a pack."""
        from torch.utils import _pytree as pytree

        leaves = [
            leaf.value
            if leaf.tensor is None
            else pack[leaf.tensor.known_uid()]
            if not all(isinstance(d, int) for d in leaf.shape)  # dynamic: the buffer has its shape
            else pack[leaf.tensor.known_uid()].reshape(leaf.shape)
            for leaf in self._output_leaves
        ]
        return pytree.tree_unflatten(leaves, self._output_spec)

    def write_back(self, pack: Mapping[int, Buffer]) -> None:
        """Copy the running-stat outputs of an executed pack into the module's buffers and do the host
        updates (num_batches_tracked += 1). No-op for graphs that update nothing (eval mode)."""
        import torch

        with torch.no_grad():
            for m in self.mutations:
                target = self.module.get_buffer(m.key) if m.kind == "buffer" else self.module.get_parameter(m.key)
                if m.tensor is None:
                    target.add_(m.host_add)
                else:
                    target.copy_(pack[m.tensor.known_uid()].reshape(target.shape))

    def __repr__(self) -> str:
        return (
            f"<ImportedGraph '{self.graph.name}': {len(self.inputs)} input(s), {len(self._bound)} bound, "
            f"{len(self.outputs)} output(s), {len(self.report.custom_ops)} custom op(s)>"
        )
