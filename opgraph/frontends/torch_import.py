"""Import a PyTorch module into an opgraph graph: `from_torch(module, example_inputs)`.

How it works:
1. `torch.export.export` traces the module (non-strict, the training IR: aten ops such as conv2d,
   batch_norm, linear, relu_, in the module's eval or train mode) with the example inputs' shapes,
   dtypes and strides. Shapes are static, as in every opgraph graph.
2. In-place ops are made functional: a later reader of a tensor that an op mutated (relu_, add_ of a
   residual) reads that op's result. Nodes that no output, no module-state update needs are dropped.
3. Parameters, buffers and constants become graph inputs named by their state_dict key with the
   tensor's own dims, strides and dtype (see `torch_runtime.Source`); view ops on them (the transpose
   of a linear weight, a bias reshaped to [1, C, 1, 1]) become views at bind time, not graph ops.
   Computations on parameters alone (a model's own weight arithmetic; eval batchnorm's coefficients
   when computed in the graph) are emitted before any activation op, so that they do not cut the
   activation chain into extra pieces; by default eval batchnorm's coefficients are computed at bind
   time instead (`torch_runtime.DerivedSpec`).
4. Every other node goes through the translation table in `torch_ops.py` (one aten op -> one or more
   opgraph ops; each node's result gets the dtype PyTorch gives it, composite internals are FLOAT).
   A node the table does not cover becomes a custom op running the aten op itself
   (`torch_custom.py`); the report lists those.
User inputs keep the example tensors' strides (channels_last stays NHWC); intermediates are virtual.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.errors import AttributeValueError, GraphError, UnsupportedGraphError
from ..core.tensor import Tensor
from ..graph.builder import Graph
from .torch_runtime import (
    DerivedSpec,
    ImportedGraph,
    ImportReport,
    Mutation,
    OutputLeaf,
    RandomSpec,
    ReportEntry,
    Source,
)


class Untranslatable(Exception):
    """Raised by a translator for arguments it does not cover; the node becomes a custom op."""


@dataclass
class Value:
    """A traced tensor: its torch shape and dtype, and either the graph tensor holding it (`tensor`),
    a bound input not declared yet (`source` + `example`, the example tensor with the source's
    views applied), or an uninitialised allocation (`uninit`, from aten.empty)."""

    shape: tuple[int, ...]
    dtype: Any
    tensor: Tensor | None = None
    source: Source | None = None
    example: Any = None
    uninit: bool = False

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def dims(self) -> tuple[int, ...]:
        return og_dims(self.shape)

    @property
    def is_bound(self) -> bool:
        """A parameter, buffer, constant or random input whose views can be taken at bind time."""
        return self.source is not None


def og_dims(shape: Any) -> tuple[int, ...]:
    """opgraph dims of a torch shape: a 0-d tensor is held as [1]."""
    return tuple(int(d) for d in shape) or (1,)


def _meta(node: Any) -> Any:
    return node.meta.get("val") if hasattr(node, "meta") else None


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


class Importer:
    """Translation state: the graph, the value of every traced node, and the bound inputs."""

    def __init__(self, module: Any, program: Any, name: str, wide: Any, options: dict[str, Any]) -> None:
        import torch

        self.torch = torch
        self.options = options
        self.module = module
        self.program = program
        # composite internals (a softmax's exp, a hardswish's relu6) are computed at least in fp32, in
        # fp64 for fp64 models; each traced node's own result gets PyTorch's dtype
        self.g = Graph(name, io_data_type=wide, intermediate_data_type=wide, compute_data_type=wide)
        self.env: dict[Any, Any] = {}
        self.report = ImportReport()
        self.constants: dict[str, Any] = {}
        self.randoms: dict[str, RandomSpec] = {}
        self.derived: dict[str, DerivedSpec] = {}
        self.bound: list[tuple[Tensor, Source]] = []
        self.mutations: list[Mutation] = []
        self._declared: dict[Source, Tensor] = {}
        self._names: dict[str, int] = {}
        self.prepared: dict[Any, Any] = {}  # node -> what its PREPARE hook computed
        self.used: dict[Any, set[int]] = {}  # multi-output node -> the getitem indices read
        self.node: Any = None  # the node being translated

    # -- values -------------------------------------------------------------------------------------
    def tensor(self, v: Value) -> Tensor:
        """The graph tensor of a value, declaring a bound input on first use (looked up, not cached on
        the value, so that a rolled-back translation leaves no stale handle behind)."""
        if v.tensor is not None:
            return v.tensor
        if v.uninit:
            zeros = self.torch.zeros(v.shape, dtype=v.dtype)
            self.note(f"{self.node.name}: reads an uninitialised tensor (aten.empty); bound as zeros")
            v.source, v.example = self.constant(zeros, "uninit"), zeros
            v.uninit = False
        if v.source is None:
            raise UnsupportedGraphError(f"node '{self.node.name}' reads a value the importer has not translated",
                                        rule="import.internal", hint="report this as an importer bug")
        source = v.source
        if source not in self._declared:
            ex = v.example
            stride = tuple(int(s) for s in ex.stride()) or (1,)
            t = self.g.tensor(dim=v.dims, stride=stride, data_type=v.dtype, name=self._unique(self._name(source)))
            self._declared[source] = t
            self.bound.append((t, source))
        return self._declared[source]

    def checkpoint(self) -> tuple[int, int, int, int]:
        return len(self.g._records), len(self.g._tensors), len(self.bound), len(self.mutations)

    def rollback(self, mark: tuple[int, int, int, int]) -> None:
        """Forget the ops, tensors and bound inputs made since `mark` (a translator gave up)."""
        records, tensors, bound, mutations = mark
        del self.g._records[records:]
        del self.g._tensors[tensors:]
        for _t, source in self.bound[bound:]:
            self._declared.pop(source, None)
        del self.bound[bound:]
        del self.mutations[mutations:]
        self.g._invalidate()

    def _name(self, source: Source) -> str:
        if source.kind in ("parameter", "buffer"):
            return source.key
        if source.kind == "derived":
            return source.key.removeprefix("derived:")
        return f"{source.kind}:{source.key}"

    def _unique(self, name: str) -> str:
        n = self._names.get(name, 0)
        self._names[name] = n + 1
        return name if n == 0 else f"{name}#{n}"

    def constant(self, value: Any, hint: str) -> Source:
        """A constant graph input holding `value` (a CPU torch tensor)."""
        key = self._unique(f"{hint}")
        self.constants[key] = value.detach().cpu()
        return Source("constant", key)

    def constant_value(self, value: Any, hint: str) -> Value:
        source = self.constant(value, hint)
        return Value(tuple(value.shape), value.dtype, source=source, example=self.constants[source.key])

    def random_value(self, dist: str, shape: tuple[int, ...], dtype: Any, p: float = 0.5) -> Value:
        key = self._unique(f"{self.node.name}")
        self.randoms[key] = RandomSpec(dist, tuple(shape), dtype, float(p))
        example = self.torch.empty(shape, dtype=dtype)
        return Value(tuple(shape), dtype, source=Source("random", key), example=example)

    def derived_value(self, fn: Any, inputs: list[Value], name: str) -> Value:
        """A bound input computed at bind time as fn(*inputs) from bound values (see DerivedSpec)."""
        key = self._unique(f"derived:{name}")
        self.derived[key] = DerivedSpec(fn, tuple(v.source for v in inputs))
        with self.torch.no_grad():
            example = fn(*[v.example for v in inputs])
        return Value(tuple(example.shape), example.dtype, source=Source("derived", key), example=example)

    def view(self, v: Value, op: Any, *args: Any) -> Value | None:
        """For a bound value, the same input seen through aten view op `op(*args)` (applied at bind
        time, zero-copy); None for other values (the caller emits a graph op)."""
        if not v.is_bound:
            return None
        example = op(v.example, *args)
        return Value(tuple(example.shape), example.dtype, source=v.source.view(op, *args), example=example)

    def reshaped(self, v: Value, shape: tuple[int, ...]) -> Tensor:
        """The value's tensor with torch shape `shape` (same elements): a bind-time view for bound
        values, a reshape op otherwise, nothing when the opgraph dims already match."""
        shape = tuple(int(d) for d in shape)
        if og_dims(shape) == v.dims:
            return self.tensor(v)
        viewed = self.view(v, self.torch.ops.aten.view.default, list(shape))
        if viewed is not None:
            return self.tensor(viewed)
        return self.g.reshape(self.tensor(v), list(og_dims(shape)), name=self.op_name("reshape"))

    def at_rank(self, v: Any, rank: int) -> Any:
        """A pointwise operand for an output of `rank`: numbers stay numbers, 1-element tensors
        broadcast as they are, others get leading 1s (torch aligns shapes on the right)."""
        if not isinstance(v, Value):
            return v
        if v.rank >= rank or v.dims == (1,):
            return self.tensor(v)
        return self.reshaped(v, (1,) * (rank - v.rank) + v.shape)

    def reduction(self, t: Tensor, mode: Any, dims: Any, name: str) -> Tensor:
        """A reduction to opgraph dims `dims`, in the graph's intermediate type (not FLOAT, the
        reduction's own default, which would round fp64 models)."""
        out = self.g.reduction(t, mode, name=name)
        return out.set_dim(list(dims)).set_data_type(self.g.intermediate_data_type)

    def op_name(self, what: str = "") -> str:
        base = self.node.name if self.node is not None else "op"
        return self._unique(f"{base}.{what}" if what else base)

    def note(self, text: str) -> None:
        if text not in self.report.notes:
            self.report.notes.append(text)

    def result(self, tensor: Tensor, meta: Any) -> Value:
        """Wrap a new graph tensor as the value of a traced tensor (its dtype set to PyTorch's)."""
        tensor.set_data_type(meta.dtype)
        return Value(tuple(int(d) for d in meta.shape), meta.dtype, tensor=tensor)


# -- tracing and the main loop -----------------------------------------------------------------------


def from_torch(module: Any, example_inputs: Any, *, name: str | None = None, strict: bool = False,
               eval_batchnorm: str = "folded") -> ImportedGraph:
    """Trace `module` with `example_inputs` (a tensor or a tuple of arguments) and translate it into an
    opgraph graph. Returns an `ImportedGraph` (graph, inputs, outputs, params, report, variant_pack,
    run, write_back). The module's mode (eval/train) at call time is what is imported; train mode
    imports batchnorm in training form, with running-stat updates written back by `run`.

    strict: torch.export's strict (TorchDynamo) tracing instead of the default non-strict one.
    eval_batchnorm: how eval-mode batchnorm is expressed. All forms follow the module's current
        parameters and running stats.
        'folded' (default): y = x * s + t, two pointwise ops (which generated conv/matmul kernels fuse
            into their epilogue), with s = weight * rsqrt(running_var + eps) and
            t = bias - running_mean * s bound as inputs computed at bind time (recomputed only when
            one of the four tensors changes);
        'scale_shift': the same, with s and t computed by graph ops from the bound parameters (run at
            every execute, before the activations);
        'op': batchnorm_inference(x, running_mean, rsqrt(running_var + eps), weight, bias)."""
    import torch

    if eval_batchnorm not in ("folded", "scale_shift", "op"):
        raise AttributeValueError(f"eval_batchnorm={eval_batchnorm!r} is not 'folded', 'scale_shift' or 'op'",
                                  rule="import.option", hint="pass eval_batchnorm='folded', 'scale_shift' or 'op'")

    if not isinstance(module, torch.nn.Module):
        raise UnsupportedGraphError(f"from_torch takes a torch.nn.Module, got {type(module).__name__}",
                                    rule="import.module", hint="pass the model (an nn.Module)")
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    try:
        program = torch.export.export(module, args, strict=strict)
    except Exception as err:  # noqa: BLE001 - torch.export raises many types; report one
        raise UnsupportedGraphError(
            f"torch.export could not trace the module: {type(err).__name__}: {str(err).splitlines()[0]}",
            rule="import.trace", hint="make the forward traceable by torch.export (no data-dependent Python "
            "control flow), or pass strict=True/False to try the other tracer",
        ) from err
    tensors = [*program.state_dict.values(), *(a for a in args if isinstance(a, torch.Tensor))]
    wide = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    imp = Importer(module, program, name or type(module).__name__, wide, {"eval_batchnorm": eval_batchnorm})
    return _translate(imp, args)


_EFFECTFUL = ("batch_norm", "native_batch_norm", "_native_batch_norm_legit", "cudnn_batch_norm",
              "miopen_batch_norm")


def _op_key(target: Any) -> tuple[str, str]:
    """(base name, overload) of an aten op, in-place variants named as their functional op; ops of
    other namespaces (torch.library custom ops) keep their qualified name, which no table entry has."""
    schema = target._schema
    namespace, _, base = schema.name.rpartition("::")
    if namespace != "aten":
        return schema.name, target._overloadname
    if base.endswith("_") and not base.endswith("__"):
        base = base[:-1]
    return base, target._overloadname


def _mutated_args(target: Any) -> list[int]:
    schema = getattr(target, "_schema", None)
    if schema is None:
        return []
    return [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def _flat_nodes(value: Any) -> list[Any]:
    import torch.fx

    out: list[Any] = []
    if isinstance(value, torch.fx.Node):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            out += _flat_nodes(v)
    elif isinstance(value, dict):
        for v in value.values():
            out += _flat_nodes(v)
    return out


class _Versions:
    """Aliasing through in-place ops: an op that writes its argument makes its result the current
    version of that argument's storage; every later read of any alias reads the current version."""

    def __init__(self) -> None:
        self.storage: dict[Any, Any] = {}
        self.current: dict[Any, Any] = {}

    def resolve(self, node: Any) -> Any:
        root = self.storage.get(node, node)
        return self.current.get(root, node)

    def written(self, arg: Any, result: Any) -> None:
        root = self.storage.get(arg, arg)
        self.storage[result] = root
        self.current[root] = result

    def final(self, node: Any) -> Any:
        return self.current.get(self.storage.get(node, node), node)


def _mutation_target(node: Any) -> Any:
    """The argument node an in-place op writes, if any."""
    idx = _mutated_args(node.target)
    if not idx:
        return None
    schema = node.target._schema
    arg = node.args[idx[0]] if idx[0] < len(node.args) else node.kwargs.get(schema.arguments[idx[0]].name)
    return arg if hasattr(arg, "op") else None


def _analyze(imp: Importer, nodes: list[Any], kinds: dict[str, tuple[str, str]]) -> tuple[set[Any], dict, list]:
    """Liveness with in-place aliasing resolved. Returns (live nodes, host updates {buffer node:
    (key, amount)}, [(kind, key, final node)] module-state mutations translated in the graph)."""
    versions = _Versions()
    deps: dict[Any, list[Any]] = {}
    roots: list[Any] = []
    output_node = None
    position = {n: i for i, n in enumerate(nodes)}
    for n in nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            output_node = n
            deps[n] = [versions.resolve(a) for a in _flat_nodes(n.args)]
            continue
        deps[n] = [versions.resolve(a) for a in _flat_nodes((n.args, n.kwargs))]
        if n.op == "call_function" and hasattr(n.target, "_schema"):
            target = _mutation_target(n)
            if target is not None:
                _check_view_write(n, target, position)
                versions.written(target, n)
            if _op_key(n.target)[0] in _EFFECTFUL:
                roots.append(n)
    assert output_node is not None
    roots += deps[output_node]
    state: list[tuple[str, str, Any]] = []
    host: dict[Any, tuple[str, str, float]] = {}
    readers: dict[Any, int] = {}
    for ds in deps.values():
        for d in ds:
            readers[d] = readers.get(d, 0) + 1
    for n in nodes:
        if n.op != "placeholder" or versions.final(n) is n:
            continue
        if kinds.get(n.name, ("input", ""))[0] not in ("parameter", "buffer"):
            imp.note(f"input '{n.name}' is updated in place by the module; the graph does not write the "
                     "caller's tensor (its outputs are the module's results only)")
            continue
        final = versions.final(n)
        kind, key = kinds[n.name]
        # `buf += k` on a buffer nothing else reads (num_batches_tracked): done on the host
        if (final.op == "call_function" and _op_key(final.target)[0] == "add" and final.args[0] is n
                and not _flat_nodes(final.args[1:]) and readers.get(n, 0) == 1 and readers.get(final, 0) == 0):
            alpha = final.kwargs.get("alpha", 1)
            host[final] = (kind, key, final.args[1] * alpha)
            continue
        state.append((kind, key, final))
        roots.append(final)
    live: set[Any] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in live or n in host:
            continue
        live.add(n)
        stack += deps.get(n, [])
    return live, host, state


def _is_view(node: Any) -> bool:
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    if schema is None or not schema.returns:
        return False
    alias = schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def _check_view_write(node: Any, target: Any, position: dict[Any, int]) -> None:
    """An in-place write into a view changes its base too: refuse when the base is read afterwards
    (functionalizing it would give those readers the old values)."""
    base = target
    while _is_view(base):
        base = base.args[0]
    if base is target:
        return
    later = [u for u in base.users if position.get(u, -1) > position[node]]
    if later:
        raise UnsupportedGraphError(
            f"node '{node.name}' ({node.target}) writes in place into a view of '{base.name}', which "
            f"'{later[0].name}' reads afterwards", op=node.name, rule="import.view_mutation",
            hint="write the module's forward out of place (y = x.clone(); y[...] = ... or torch.cat)",
        )


def _used_outputs(nodes: list[Any], live: set[Any]) -> dict[Any, set[int]]:
    used: dict[Any, set[int]] = {}
    for n in nodes:
        if n in live and n.op == "call_function" and n.target is operator.getitem:
            used.setdefault(n.args[0], set()).add(int(n.args[1]))
    return used


def _placeholder_kinds(program: Any) -> dict[str, tuple[str, str]]:
    from torch.export.graph_signature import InputKind

    kinds = {}
    names = {InputKind.PARAMETER: "parameter", InputKind.BUFFER: "buffer", InputKind.CONSTANT_TENSOR: "constant",
             InputKind.USER_INPUT: "input"}
    for spec in program.graph_signature.input_specs:
        kinds[spec.arg.name] = (names.get(spec.kind, str(spec.kind)), spec.target or spec.arg.name)
    return kinds


def _param_only(nodes: list[Any], live: set[Any], kinds: dict[str, tuple[str, str]]) -> set[Any]:
    """Live nodes computed from parameters, buffers and constants alone (not random draws)."""
    import torch

    only: set[Any] = set()
    for n in nodes:
        if n.op == "placeholder":
            if kinds.get(n.name, ("input",))[0] in ("parameter", "buffer", "constant"):
                only.add(n)
            continue
        if n not in live or n.op != "call_function":
            continue
        if isinstance(n.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in n.target.tags:
            continue
        ins = _flat_nodes((n.args, n.kwargs))
        if ins and all(i in only for i in ins):
            only.add(n)
    return only


def _translate(imp: Importer, args: tuple) -> ImportedGraph:
    from torch.utils import _pytree as pytree

    from . import torch_ops, torch_ops_attention, torch_ops_lm, torch_ops_nn  # noqa: F401  (the translators register on import)
    from .torch_custom import custom_node

    program = imp.program
    graph = program.graph_module.graph
    nodes = list(graph.nodes)
    kinds = _placeholder_kinds(program)
    live, host, state = _analyze(imp, nodes, kinds)
    imp.used = _used_outputs(nodes, live)

    # placeholders
    leaves, in_spec = pytree.tree_flatten((args, {}))
    user_slots: list[Tensor | None] = []
    user_leaf = iter(leaves)
    state_dict = program.state_dict
    for n in nodes:
        if n.op != "placeholder":
            continue
        kind, key = kinds.get(n.name, ("input", n.name))
        if kind == "input":
            value = next(user_leaf)
            if _is_tensor(value):
                shape = tuple(int(d) for d in value.shape)
                stride = tuple(int(s) for s in value.stride()) or (1,)
                t = imp.g.tensor(dim=og_dims(shape), stride=stride, data_type=value.dtype, name=imp._unique(n.name))
                imp.env[n] = Value(shape, value.dtype, tensor=t)
                user_slots.append(t)
            else:
                imp.env[n] = value
                user_slots.append(None)
            continue
        if kind in ("parameter", "buffer"):
            example = state_dict[key] if key in state_dict else program.constants[key]
        elif kind == "constant":
            example = program.constants[key]
            imp.constants[key] = example.detach().cpu()
        else:
            raise UnsupportedGraphError(f"input '{n.name}' of kind {kind} is not supported", rule="import.input_kind",
                                        hint="import modules whose inputs are tensors, parameters and buffers")
        example = example.detach()
        imp.env[n] = Value(tuple(example.shape), example.dtype, source=Source(kind, key), example=example)
    if len(user_slots) != len(leaves):
        raise UnsupportedGraphError(f"the traced program has {len(user_slots)} user inputs but the example has "
                                    f"{len(leaves)} leaves", rule="import.inputs",
                                    hint="pass the example inputs as the module's positional arguments")

    # translation: parameter-only nodes first, then batchnorm preparations, then the rest; arguments
    # are resolved through in-place writes in program order whatever the translation order
    versions = _Versions()
    resolved_args: dict[Any, tuple[Any, Any]] = {}
    for n in nodes:
        if n.op != "call_function":
            continue
        resolved_args[n] = _resolve_args(n, versions)
        if hasattr(n.target, "_schema"):
            target = _mutation_target(n)
            if target is not None:
                versions.written(target, n)
    only = _param_only(nodes, live, kinds)
    calls = [n for n in nodes if n in live and n.op == "call_function"]
    for n in calls:
        if n in only:
            imp.node = n
            _translate_node(imp, n, resolved_args[n], torch_ops, custom_node)
    for n in calls:
        if n not in only and hasattr(n.target, "_schema"):
            prepare = torch_ops.PREPARE.get(_op_key(n.target)[0])
            if prepare is not None:
                imp.node = n
                imp.prepared[n] = prepare(imp, n, _bind(imp, n, resolved_args[n], lenient=True))
    for n in calls:
        if n not in only:
            imp.node = n
            _translate_node(imp, n, resolved_args[n], torch_ops, custom_node)
    imp.node = None

    # outputs and module-state updates
    from torch.export.graph_signature import OutputKind

    output_node = next(n for n in nodes if n.op == "output")
    specs = program.graph_signature.output_specs
    out_nodes = list(output_node.args[0])
    final_versions = _Versions()
    for n in nodes:
        if n.op == "call_function" and hasattr(n.target, "_schema"):
            target = _mutation_target(n)
            if target is not None:
                final_versions.written(target, n)
    leaves_out: list[OutputLeaf] = []
    made: dict[int, Tensor] = {}
    for spec, out in zip(specs, out_nodes):
        if spec.kind == OutputKind.USER_OUTPUT:
            if not hasattr(out, "op"):
                leaves_out.append(OutputLeaf(None, value=out))
                continue
            value = imp.env[final_versions.final(out)]
            if not isinstance(value, Value):
                leaves_out.append(OutputLeaf(None, value=value))
                continue
            t = _as_output(imp, value, made, f"output{len(leaves_out)}")
            leaves_out.append(OutputLeaf(t, value.shape))
        elif spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION):
            kind = "buffer" if spec.kind == OutputKind.BUFFER_MUTATION else "parameter"
            state.append((kind, spec.target, out))
        else:
            raise UnsupportedGraphError(f"output kind {spec.kind} is not supported", rule="import.output_kind",
                                        hint="import modules that return tensors (and update only buffers)")
    for kind, key, final in state:
        value = imp.env.get(final)
        if not isinstance(value, Value):
            continue
        t = _as_output(imp, value, made, f"{key}@next")
        imp.mutations.append(Mutation(kind, key, t))
        imp.report.entries.append(ReportEntry(final.name, f"{kind} {key}", "translated", (),
                                              f"updated by the graph: output '{key}@next', copied back by write_back"))
    for final, (kind, key, amount) in host.items():
        imp.mutations.append(Mutation(kind, key, None, amount))
        imp.report.entries.append(ReportEntry(final.name, str(final.target), "host", (),
                                              f"{key} += {amount} on the host by write_back"))
    try:
        imp.g.validate()
    except GraphError as err:
        raise UnsupportedGraphError(f"the imported graph is not valid: {err}", rule="import.invalid",
                                    hint="report this as an importer bug, with the module") from err
    return ImportedGraph(
        graph=imp.g, module=imp.module, inputs=user_slots, input_spec=in_spec, output_leaves=leaves_out,
        output_spec=program.call_spec.out_spec, bound=imp.bound, constants=imp.constants, randoms=imp.randoms,
        derived=imp.derived, mutations=imp.mutations, report=imp.report,
    )


def _as_output(imp: Importer, value: Value, made: dict[int, Tensor], name: str) -> Tensor:
    """A non-virtual graph tensor holding `value`: the op output itself, or an identity op's output
    when the value is a graph input. A tensor returned twice is one output."""
    t = imp.tensor(value)
    if id(t) in made:
        return made[id(t)]
    produced = any(o is t for r in imp.g._records for o in r.outputs)
    out = t if produced else imp.g.identity(t, name=imp._unique(f"{name}.copy")).set_data_type(value.dtype)
    out.set_output(True).set_name(imp._unique(name))
    made[id(t)] = out
    return out


def _resolve_args(node: Any, versions: _Versions) -> tuple[Any, Any]:
    import torch.fx

    def walk(v: Any) -> Any:
        if isinstance(v, torch.fx.Node):
            return versions.resolve(v)
        if isinstance(v, (list, tuple)):
            return type(v)(walk(x) for x in v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        return v

    return walk(node.args), walk(node.kwargs)


def _values(imp: Importer, v: Any, lenient: bool) -> Any:
    import torch.fx

    if isinstance(v, torch.fx.Node):
        if v in imp.env:
            return imp.env[v]
        if not lenient:
            raise UnsupportedGraphError(f"node '{v.name}' is read before it was translated", rule="import.internal",
                                        hint="report this as an importer bug")
        meta = _meta(v)  # not translated yet: a value with its shape only
        return Value(tuple(int(d) for d in meta.shape), meta.dtype) if _is_tensor(meta) else None
    if isinstance(v, (list, tuple)):
        return type(v)(_values(imp, x, lenient) for x in v)
    return v


class Args(dict):
    """A node's arguments by schema name (defaults filled in), FX nodes replaced by their values."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _bind(imp: Importer, node: Any, resolved: tuple[Any, Any], lenient: bool = False) -> Args:
    args, kwargs = resolved
    schema = node.target._schema
    out = Args()
    for i, a in enumerate(schema.arguments):
        if i < len(args):
            value = args[i]
        elif a.name in kwargs:
            value = kwargs[a.name]
        else:
            value = a.default_value if a.has_default_value() else None
        out[a.name] = _values(imp, value, lenient)
    return out


def _translate_node(imp: Importer, node: Any, resolved: tuple[Any, Any], torch_ops: Any, custom_node: Callable) -> None:
    import torch

    target = node.target
    if target is operator.getitem:
        src, index = resolved[0]
        value = imp.env[src]
        imp.env[node] = value[index]
        return
    before = len(imp.g._records)
    if not isinstance(target, torch._ops.OpOverload):
        raise UnsupportedGraphError(f"node '{node.name}' calls {target!r}, which is not an aten op",
                                    rule="import.unsupported_call",
                                    hint="export the module with torch.export (aten ops only)")
    base, _ = _op_key(target)
    args = _bind(imp, node, resolved)
    translator = torch_ops.TRANSLATORS.get(base)
    status, note = "translated", ""
    if translator is None and _no_tensor_inputs(args):
        out, status, note = torch_ops.factory(imp, node, args)
    elif translator is None:
        out, status, note = custom_node(imp, node, args, f"no translation for {target}"), "custom", ""
    else:
        mark = imp.checkpoint()
        try:
            out = translator(imp, node, args)
        except Untranslatable as why:
            imp.rollback(mark)
            out, status, note = custom_node(imp, node, args, str(why)), "custom", str(why)
    imp.env[node] = _wrap(imp, node, out)
    kinds = tuple(r.op.kind for r in imp.g._records[before:])
    if status == "translated" and not kinds:
        status = "alias"
    if status == "custom":
        note = note or f"no translation for {target}"
    imp.report.entries.append(ReportEntry(node.name, str(target), status, kinds, note))


def _no_tensor_inputs(args: Args) -> bool:
    def walk(v: Any) -> bool:
        if isinstance(v, Value):
            return False
        if isinstance(v, (list, tuple)):
            return all(walk(x) for x in v)
        return True

    return all(walk(v) for v in args.values())


def _wrap(imp: Importer, node: Any, out: Any) -> Any:
    meta = _meta(node)
    if isinstance(out, Tensor):
        return imp.result(out, meta)
    if isinstance(out, (list, tuple)):
        metas = list(meta) if isinstance(meta, (list, tuple)) else [meta] * len(out)
        return [imp.result(o, m) if isinstance(o, Tensor) else o for o, m in zip(out, metas)]
    return out
