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
from typing import Any

from ..core.errors import AttributeValueError, GraphError, UnsupportedGraphError
from ..core.symbolic import free_symbols
from ..core.tensor import Tensor, packed_strides
from .fx_norms import recognise_rms_norms
from .torch_fold import constant_nodes, evaluate
from .torch_hops import inline_wrappers
from .torch_importer import (
    Args,
    Importer,
    Untranslatable,
    Value,
    dynamic_refusal,
    is_tensor,
    node_location,
    node_meta,
    node_sizes,
    og_dims,
    symbolic,
)
from .torch_mutations import (
    Versions,
    analyze_mutations,
    mutation_target,
    op_key,
    param_only_nodes,
    placeholder_kinds,
    used_outputs,
)
from .torch_runtime import (
    ImportedGraph,
    Mutation,
    OutputLeaf,
    ReportEntry,
    Source,
)
from .torch_symbolic import SymbolTable, active, is_dynamic, symbol_table, to_shape, to_symint

# -- tracing and the main loop -----------------------------------------------------------------------


def from_torch(
    module: Any,
    example_inputs: Any,
    *,
    name: str | None = None,
    strict: bool = False,
    eval_batchnorm: str = "folded",
    allow_tf32: bool | None = None,
    dynamic_shapes: Any = None,
) -> ImportedGraph:
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
        'op': batchnorm_inference(x, running_mean, rsqrt(running_var + eps), weight, bias).
    allow_tf32: whether plans may compute fp32 products with TF32 inputs (NumericalNote
        DOWN_CONVERT_INPUTS); None (default) does what PyTorch does at import: TF32 only where
        torch.get_float32_matmul_precision() is not 'highest' and torch.backends.cudnn.allow_tf32 is
        set. `ImportedGraph.plan`/`run` take allow_tf32= to override it per plan.
    dynamic_shapes: torch.export's argument, passed to it as it is: per argument a dict {axis: Dim} (or
        a tuple per axis, None for static), `torch.export.Dim("batch", min=1, max=64)` entries. The
        imported graph's inputs then have `opgraph.Dim`s named after them, with the ranges
        torch.export inferred (a max is required: Dim.AUTO / Dim.DYNAMIC and Dim without max= are
        refused), every size computed from them an expression; its plan is a `DynamicPlan` (one
        build, any shape in the ranges), `run` and `variant_pack` take inputs of any such shape.
        A node whose translation needs a static size where the program has a dynamic one is an
        `UnsupportedGraphError` (rule import.dynamic_op) naming the node and its sizes."""
    import torch

    if eval_batchnorm not in ("folded", "scale_shift", "op"):
        raise AttributeValueError(
            f"eval_batchnorm={eval_batchnorm!r} is not 'folded', 'scale_shift' or 'op'",
            rule="import.option",
            hint="pass eval_batchnorm='folded', 'scale_shift' or 'op'",
        )

    if not isinstance(module, torch.nn.Module):
        raise UnsupportedGraphError(
            f"from_torch takes a torch.nn.Module, got {type(module).__name__}",
            rule="import.module",
            hint="pass the model (an nn.Module)",
        )
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    try:
        program = torch.export.export(module, args, strict=strict, dynamic_shapes=dynamic_shapes)
    except Exception as err:  # noqa: BLE001 - torch.export raises many types; report one
        dynamic = (
            " With dynamic_shapes: give examples of size >= 2 on dynamic axes (torch.export "
            "specialises sizes 0 and 1), and ranges the module's code allows (torch.export's message "
            "suggests fixes)."
            if dynamic_shapes is not None
            else ""
        )
        raise UnsupportedGraphError(
            f"torch.export could not trace the module: {type(err).__name__}: {_first_line(err)}"
            + "".join(f" {line.strip()}" for line in str(err).splitlines() if line.strip().startswith("- "))[:600],
            rule="import.trace",
            hint="make the forward traceable by torch.export (no data-dependent Python "
            "control flow), or pass strict=True/False to try the other tracer." + dynamic,
        ) from err
    tensors = [*program.state_dict.values(), *(a for a in args if isinstance(a, torch.Tensor))]
    wide = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    options = {"eval_batchnorm": eval_batchnorm, "recast_widening": not _trains(module)}
    imp = Importer(module, program, name or type(module).__name__, wide, options)
    imp.allow_tf32 = _pytorch_allows_tf32(torch) if allow_tf32 is None else bool(allow_tf32)
    imp.note(
        "fp32 products: "
        + (
            "TF32 allowed"
            if imp.allow_tf32
            else "full precision (plans deselect NumericalNote.DOWN_CONVERT_INPUTS, TF32)"
        )
        + (" as PyTorch's settings at import" if allow_tf32 is None else " (allow_tf32 of from_torch)")
    )
    params = frozenset(n for n, (kind, _) in placeholder_kinds(program).items() if kind == "parameter")
    inline_wrappers(program.graph_module, imp.report.notes, node_location, params)
    recognise_rms_norms(program.graph_module, imp.report.notes)
    table = _symbols(program, module, args, dynamic_shapes)
    for text in table.notes:
        imp.note(text)
    if table.dims:
        imp.note("dynamic dims: " + ", ".join(d.describe() for d in table.dims.values()))
    with active(table):
        return _translate(imp, args)


def _trains(module: Any) -> bool:
    """Whether a module that holds parameters or buffers is in train mode (a wrapper's own mode aside)."""
    return any(
        m.training
        and (next(m.parameters(recurse=False), None) is not None or next(m.buffers(recurse=False), None) is not None)
        for m in module.modules()
    )


def _first_line(err: Exception) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _symbols(program: Any, module: Any, args: tuple, dynamic_shapes: Any) -> SymbolTable:
    """The Dims of the program's shape symbols, named after the user's `dynamic_shapes` entries."""
    kinds = placeholder_kinds(program)
    inputs = [
        (n.name, node_meta(n))
        for n in program.graph_module.graph.nodes
        if n.op == "placeholder" and kinds.get(n.name, ("input", n.name))[0] == "input"
    ]
    return symbol_table(program, module, args, dynamic_shapes, inputs)


def _pytorch_allows_tf32(torch: Any) -> bool:
    """Whether PyTorch computes fp32 matmuls and convolutions with TF32 (both must: opgraph's choice
    is per plan, PyTorch's per op kind). PyTorch >= 2.9's per-backend flags are read first: its legacy
    getters raise once the two APIs were mixed (as the torch engine's pinning of cuDNN convs does)."""
    try:
        matmul = torch.get_float32_matmul_precision() != "highest"
    except RuntimeError:
        matmul = getattr(torch.backends.cuda.matmul, "fp32_precision", "ieee") == "tf32"
    precision = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", None)
    if precision in ("tf32", "ieee"):
        return matmul and precision == "tf32"
    try:
        return matmul and bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:
        return False


def _translate(imp: Importer, args: tuple) -> ImportedGraph:
    from torch.utils import _pytree as pytree

    from . import torch_ops
    from .torch_custom import custom_node

    torch_ops.load_translators()

    program = imp.program
    graph = program.graph_module.graph
    nodes = list(graph.nodes)
    kinds = placeholder_kinds(program)
    folded = evaluate(nodes, constant_nodes(nodes, kinds), kinds, program)
    live, host, state = analyze_mutations(imp, nodes, kinds, folded)
    imp.used = used_outputs(nodes, live)

    # placeholders
    leaves, in_spec = pytree.tree_flatten((args, {}))
    user_slots: list[Tensor | None] = []
    user_leaf = iter(leaves)
    state_dict = program.state_dict
    shown = _shown_dims(nodes, kinds, folded) if is_dynamic() else frozenset()
    for n in nodes:
        if n.op != "placeholder" or n in folded:
            continue
        kind, key = kinds.get(n.name, ("input", n.name))
        if kind == "input":
            value = next(user_leaf)
            if is_tensor(value):
                meta = node_meta(n) if is_dynamic() else None
                traced: Any = meta if is_tensor(meta) else value  # symbolic sizes where dynamic
                shape = to_shape(traced.shape)
                stride = to_shape(traced.stride()) or (1,)
                if is_dynamic() and frozenset().union(*(free_symbols(v) for v in stride)) - shown:
                    # a view whose stride holds a size no input shows ([B, S, D]'s rows at one position, made
                    # by a node PyTorch runs: stride S*D): declared packed, so the plan can lay it out (the
                    # caller's value copied in) where it could not read the size
                    stride = packed_strides(shape) or (1,)
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
            raise UnsupportedGraphError(
                f"input '{n.name}' of kind {kind} is not supported",
                rule="import.input_kind",
                hint="import modules whose inputs are tensors, parameters and buffers",
            )
        example = example.detach()
        imp.env[n] = Value(tuple(example.shape), example.dtype, source=Source(kind, key), example=example)
    if len(user_slots) != len(leaves):
        raise UnsupportedGraphError(
            f"the traced program has {len(user_slots)} user inputs but the example has {len(leaves)} leaves",
            rule="import.inputs",
            hint="pass the example inputs as the module's positional arguments",
        )

    # translation: parameter-only nodes first, then batchnorm preparations, then the rest; arguments
    # are resolved through in-place writes in program order whatever the translation order
    versions = Versions()
    resolved_args: dict[Any, tuple[Any, Any]] = {}
    for n in nodes:
        if n.op != "call_function":
            continue
        resolved_args[n] = _resolve_args(n, versions)
        if hasattr(n.target, "_schema"):
            target = mutation_target(n)
            if target is not None:
                versions.written(target, n)
    _bind_folded(imp, nodes, folded)
    only = param_only_nodes(nodes, live, kinds, folded)
    calls = [n for n in nodes if n in live and n.op == "call_function" and n not in folded]
    for n in calls:
        if n in only:
            imp.node = n
            _located(n, _translate_node, imp, n, resolved_args[n], torch_ops, custom_node)
    for n in calls:
        if n not in only and hasattr(n.target, "_schema"):
            prepare = torch_ops.PREPARE.get(op_key(n.target)[0])
            if prepare is not None:
                imp.node = n
                imp.prepared[n] = prepare(imp, n, _bind(imp, n, resolved_args[n], lenient=True))
    for n in calls:
        if n not in only:
            imp.node = n
            _located(n, _translate_node, imp, n, resolved_args[n], torch_ops, custom_node)
    imp.node = None

    # outputs and module-state updates
    from torch.export.graph_signature import OutputKind

    output_node = next(n for n in nodes if n.op == "output")
    specs = program.graph_signature.output_specs
    out_nodes = list(output_node.args[0])
    final_versions = Versions()
    for n in nodes:
        if n.op == "call_function" and hasattr(n.target, "_schema"):
            target = mutation_target(n)
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
            raise UnsupportedGraphError(
                f"output kind {spec.kind} is not supported",
                rule="import.output_kind",
                hint="import modules that return tensors (and update only buffers)",
            )
    for kind, key, final in state:
        value = imp.env.get(final)
        if not isinstance(value, Value):
            continue
        t = _as_output(imp, value, made, f"{key}@next")
        imp.mutations.append(Mutation(kind, key, t))
        imp.report.entries.append(
            ReportEntry(
                final.name,
                f"{kind} {key}",
                "translated",
                (),
                f"updated by the graph: output '{key}@next', copied back by write_back",
            )
        )
    for final, (kind, key, amount) in host.items():
        imp.mutations.append(Mutation(kind, key, None, amount))
        imp.report.entries.append(
            ReportEntry(final.name, str(final.target), "host", (), f"{key} += {amount} on the host by write_back")
        )
    if is_dynamic():
        _drop_unread(imp)
    try:
        imp.g.validate()
    except GraphError as err:
        raise UnsupportedGraphError(
            f"the imported graph is not valid: {err}",
            rule="import.invalid",
            hint="report this as an importer bug, with the module",
        ) from err
    return ImportedGraph(
        graph=imp.g,
        module=imp.module,
        inputs=user_slots,
        input_spec=in_spec,
        output_leaves=leaves_out,
        output_spec=program.call_spec.out_spec,
        bound=imp.bound,
        constants=imp.constants,
        randoms=imp.randoms,
        derived=imp.derived,
        mutations=imp.mutations,
        report=imp.report,
        allow_tf32=imp.allow_tf32,
    )


def _drop_unread(imp: Importer) -> None:
    """Drop ops whose results nothing reads (an arange whose positions an index op read off its node,
    not its tensor), repeatedly."""
    while True:
        read = {id(t) for r in imp.g._records for t in r.inputs if t is not None}
        dead = [
            r for r in imp.g._records if all(o is None or (not o.is_output and id(o) not in read) for o in r.outputs)
        ]
        if not dead:
            return
        gone = {id(r) for r in dead}
        outs = {id(o) for r in dead for o in r.outputs if o is not None}
        imp.g._records[:] = [r for r in imp.g._records if id(r) not in gone]
        imp.g._tensors[:] = [t for t in imp.g._tensors if id(t) not in outs]
        imp.g._invalidate()


def _bind_folded(imp: Importer, nodes: list[Any], folded: dict[Any, Any]) -> None:
    """The values of folded nodes: constant inputs for those a translated node (or the output) reads,
    and for in-place writes (a reader of their target reads them)."""
    import torch

    needed = {a for n in nodes if n not in folded for a in n.all_input_nodes if a in folded}
    needed |= {
        n for n in folded if n.op == "call_function" and hasattr(n.target, "_schema") and mutation_target(n) is not None
    }
    for n in nodes:
        if n not in needed:
            continue
        value = folded[n]
        if isinstance(value, torch.Tensor):
            imp.env[n] = imp.constant_value(value.clone(), n.name)
        elif isinstance(value, (list, tuple)):
            imp.env[n] = [
                imp.constant_value(v.clone(), f"{n.name}.{i}") if isinstance(v, torch.Tensor) else v
                for i, v in enumerate(value)
            ]
        else:
            imp.env[n] = value
        if n.op == "call_function":
            imp.report.entries.append(ReportEntry(n.name, str(n.target), "constant", (), "folded at import"))


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


def _located(node: Any, fn: Callable, *args: Any) -> None:
    """fn(*args), an error raised by it naming the node's module and source line."""
    try:
        fn(*args)
    except GraphError as err:
        where = node_location(node)
        if not where or where in err.detail:
            raise
        raise type(err)(
            f"{err.detail} (node '{node.name}', {str(node.target)}){where}",
            op=err.op,
            tensor=err.tensor,
            rule=err.rule,
            hint=err.hint,
        ) from err


def _resolve_args(node: Any, versions: Versions) -> tuple[Any, Any]:
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
            raise UnsupportedGraphError(
                f"node '{v.name}' is read before it was translated",
                rule="import.internal",
                hint="report this as an importer bug",
            )
        meta = node_meta(v)  # not translated yet: a value with its shape only
        return Value(to_shape(meta.shape), meta.dtype) if is_tensor(meta) else None
    if isinstance(v, (list, tuple)):
        return type(v)(_values(imp, x, lenient) for x in v)
    return v


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
    meta = node_meta(node)
    if _is_size(meta):  # a size (aten.sym_size, arithmetic on sizes): its expression of the dims
        imp.env[node] = to_symint(meta)
        imp.report.entries.append(ReportEntry(node.name, str(target), "size", (), f"= {imp.env[node]}"))
        return
    if meta is None and _is_assertion(target):  # torch.export's runtime checks of sizes: the ranges say it
        imp.report.entries.append(ReportEntry(node.name, str(target), "alias", (), "a size assertion (dropped)"))
        return
    if target is operator.getitem:
        src, index = resolved[0]
        value = imp.env[src]
        imp.env[node] = value[index]
        return
    before = len(imp.g._records)
    if not isinstance(target, torch._ops.OpOverload):
        raise UnsupportedGraphError(
            f"node '{node.name}' calls {target!r}, which is not an aten op{node_location(node)}",
            rule="import.unsupported_call",
            hint="export the module with torch.export (aten ops only)",
        )
    base, _ = op_key(target)
    args = _bind(imp, node, resolved)
    translator = torch_ops.TRANSLATORS.get(base)
    status, note = "translated", ""
    if translator is None and _no_tensor_inputs(args):
        out, status, note = torch_ops.factory(imp, node, args)
    elif translator is None:
        out, status, note = _fallback(imp, node, args, f"no translation for {target}", custom_node)
    else:
        mark = imp.checkpoint()
        try:
            out = translator(imp, node, args)
        except TypeError as err:
            if not is_dynamic() or not (symbolic(node_sizes(node)) or _symbolic_args(args)):
                raise
            raise dynamic_refusal(node, f"needs a static size ({_first_line(err)})", node_sizes(node)) from None
        except Untranslatable as why:
            imp.rollback(mark)
            out, status, note = _fallback(imp, node, args, str(why), custom_node)
        else:
            if len(imp.g._records) > before and _bound_only(args):  # graph ops on buffers alone: bind time
                from .torch_custom import derived_node

                derived = derived_node(imp, node, args)
                if derived is not None:
                    imp.rollback(mark)
                    out, status, note = derived, "derived", "buffers and constants alone: computed at bind time"
    imp.env[node] = _wrap(imp, node, out)
    kinds = tuple(r.op.kind for r in imp.g._records[before:])
    if status == "translated" and not kinds:
        status = "alias"
    if status == "custom":
        note = note or f"no translation for {target}"
    imp.report.entries.append(ReportEntry(node.name, str(target), status, kinds, note))


def _fallback(imp: Importer, node: Any, args: Args, why: str, custom_node: Callable) -> tuple[Any, str, str]:
    """An untranslated node: computed at bind time when it reads buffers and constants alone, else a
    custom op running the aten op."""
    from .torch_custom import derived_node

    out = derived_node(imp, node, args) if _bound_only(args) else None
    if out is not None:
        return out, "derived", f"{why}: computed at bind time from buffers and constants"
    if is_dynamic() and (symbolic(node_sizes(node)) or _symbolic_args(args)):
        raise dynamic_refusal(node, f"has no translation ({why}); custom ops take static sizes", node_sizes(node))
    return custom_node(imp, node, args, why), "custom", why


def _symbolic_args(args: Args) -> bool:
    def walk(v: Any) -> bool:
        if isinstance(v, Value):
            return symbolic(v.shape)
        if isinstance(v, (list, tuple)):
            return any(walk(x) for x in v)
        return symbolic(v)

    return any(walk(v) for v in args.values())


def _is_size(meta: Any) -> bool:
    import torch

    return isinstance(meta, torch.SymInt)


def _is_assertion(target: Any) -> bool:
    name = getattr(target, "__name__", "") or str(target)
    return any(k in name for k in ("_assert_scalar", "sym_constrain_range", "_assert_async", "_assert_tensor_metadata"))


def _bound_only(args: Args) -> bool:
    """Whether every tensor argument is a buffer, a constant or computed from those at bind time (not
    a parameter, which may need a gradient; not a random draw)."""

    def walk(v: Any) -> list[Value]:
        if isinstance(v, Value):
            return [v]
        if isinstance(v, (list, tuple)):
            return [x for item in v for x in walk(item)]
        return []

    values = walk(list(args.values()))
    return bool(values) and all(
        v.source is not None and v.source.kind in ("buffer", "constant", "derived") for v in values
    )


def _no_tensor_inputs(args: Args) -> bool:
    def walk(v: Any) -> bool:
        if isinstance(v, Value):
            return False
        if isinstance(v, (list, tuple)):
            return all(walk(x) for x in v)
        return True

    return all(walk(v) for v in args.values())


def _wrap(imp: Importer, node: Any, out: Any) -> Any:
    meta = node_meta(node)
    if isinstance(out, Tensor):
        return imp.result(out, meta)
    if isinstance(out, (list, tuple)):
        metas = list(meta) if isinstance(meta, (list, tuple)) else [meta] * len(out)
        return [imp.result(o, m) if isinstance(o, Tensor) else o for o, m in zip(out, metas)]
    return out


def _shown_dims(nodes: Any, kinds: Any, folded: Any) -> frozenset[Any]:
    """The dynamic dims the user inputs show: in a tensor's sizes, or as a size argument."""
    found: set[Any] = set()
    for n in nodes:
        if n.op != "placeholder" or n in folded or kinds.get(n.name, ("input", n.name))[0] != "input":
            continue
        meta = node_meta(n)
        if hasattr(meta, "shape"):
            found.update(*(free_symbols(d) for d in to_shape(meta.shape)))
        elif meta is not None and not isinstance(meta, (bool, float)):
            found.update(free_symbols(to_symint(meta)))
    return frozenset(found)
