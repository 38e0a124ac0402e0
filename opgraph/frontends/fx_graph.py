"""Import an FX graph of aten ops (what AOTAutograd gives a torch.compile backend, or a partition of
one) with the translator `from_torch` uses: `import_fx(graph_module)`.

`from_torch` hands the translator a `torch.export` program, whose signature says which placeholders
are parameters, buffers and user inputs. An AOTAutograd graph has no such signature: parameters come
in as ordinary arguments (`primals_*`), tangents as more (`tangents_*`), and the graph returns its
results, the inputs it mutated and, for a forward graph, what the backward graph reads. So here every
placeholder is a user input, every output a user output, and the program handed to the translator is
a stand-in with exactly that signature (`FxProgram`). The examples are the placeholders' traced
values (`node.meta["val"]`, fake tensors under torch.compile): the dims, strides and dtypes the
graph is built for.

`translatable(node)` is the cheap half of "can opgraph run this node": the translation table has an
entry (or the node is a constant or a getitem of one). The other half is the import itself: a
translator may still decline its arguments (`Untranslatable`: the report says 'custom'), which the
torch.compile backend (opgraph.frontends.dynamo_partition) treats as "leave it to PyTorch".
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import UnsupportedGraphError
from ..core.torch_interop import is_dense
from .torch_runtime import ImportedGraph
from .torch_symbolic import SymbolTable, active, to_shape


@dataclass(frozen=True)
class _CallSpec:
    out_spec: Any


@dataclass(frozen=True)
class _Signature:
    input_specs: list[Any]
    output_specs: list[Any]


@dataclass
class FxProgram:
    """The parts of a `torch.export.ExportedProgram` the translator reads, for a plain GraphModule:
    every placeholder a user input, every output a user output, no parameters, buffers or constants."""

    graph_module: Any
    graph_signature: _Signature
    call_spec: _CallSpec
    state_dict: dict[str, Any] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, gm: Any) -> FxProgram:
        from torch.export.graph_signature import InputKind, InputSpec, OutputKind, OutputSpec, TensorArgument
        from torch.utils import _pytree as pytree

        nodes = list(gm.graph.nodes)
        inputs = [InputSpec(InputKind.USER_INPUT, TensorArgument(n.name), None) for n in nodes if n.op == "placeholder"]
        outs = _outputs(gm)
        outputs = [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(getattr(o, "name", "")), None) for o in outs]
        spec = pytree.tree_flatten(tuple(range(len(outs))))[1]
        return cls(gm, _Signature(inputs, outputs), _CallSpec(spec))


def _outputs(gm: Any) -> list[Any]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    value = out.args[0]
    return list(value) if isinstance(value, (list, tuple)) else [value]


def examples(gm: Any) -> list[Any]:
    """The traced value of every placeholder (a tensor, fake under torch.compile, or a number)."""
    values = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        if "val" not in n.meta:
            raise UnsupportedGraphError(
                f"placeholder '{n.name}' has no traced value (meta['val'])",
                rule="import.fx_meta",
                hint="import graphs traced with fake tensors "
                "(AOTAutograd, make_fx, torch.export), which record each node's value",
            )
        values.append(n.meta["val"])
    return values


def import_fx(
    gm: Any,
    example_inputs: Sequence[Any] | None = None,
    *,
    name: str | None = None,
    symbols: SymbolTable | None = None,
) -> ImportedGraph:
    """Translate an FX GraphModule of aten ops into an `ImportedGraph` whose inputs are the graph's
    placeholders, in order, and whose outputs are the graph's outputs, as a flat tuple (`run` and
    `unpack` give a tuple; a non-tensor output, e.g. AOTAutograd's None gradient, stays as it is).
    `example_inputs`: the placeholders' values (default: their traced `meta['val']`). `symbols`: the
    Dims of the graph's shape symbols (`fx_symbol_table`) for a graph torch.compile made dynamic: its
    symbolic sizes become the graph's dynamic dims."""
    with active(symbols):
        return _import_fx(gm, example_inputs, name)


def _import_fx(gm: Any, example_inputs: Sequence[Any] | None, name: str | None) -> ImportedGraph:
    args = list(examples(gm) if example_inputs is None else example_inputs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # an argument the graph does not read (a backward graph's input used for its size only, or read by
    # an output nobody asked for) is no graph input: a shape-only value stands for it (translators see
    # its shape and dtype), and `variant_pack` skips what is passed there. So is an empty tensor (an
    # eval-mode batch norm's saved statistics), which no opgraph tensor can hold.
    args = [a if n.users and not _empty(a) else _unread(a) for n, a in zip(placeholders, args)]
    program = FxProgram.of(gm)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    bare = not isinstance(output.args[0], (tuple, list))
    if bare:  # the translator reads a tuple of outputs; a graph returning one value bare gets one
        output.args = ((output.args[0],),)
    try:
        return _import(gm, program, args, placeholders, name)
    finally:
        if bare:
            output.args = (output.args[0][0],)


def _import(gm: Any, program: FxProgram, args: list[Any], placeholders: list[Any], name: str | None) -> ImportedGraph:
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    from .torch_import import _translate
    from .torch_importer import Importer
    from .torch_ops import load_translators

    load_translators(aot=True)  # (the AOTAutograd-only ops join the table)
    with _disable_current_modes():  # constants the translator folds are real tensors, not fake ones
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        wide = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
        for _attempt in range(2):
            holder = torch.nn.Module()  # no parameters: everything the graph reads is an argument
            # (recasts: AOTAutograd differentiates these graphs, not opgraph)
            imp = Importer(holder, program, name or "fx_graph", wide, {"eval_batchnorm": "op", "recast_widening": True})
            try:
                imported = _translate(imp, tuple(args))
            except Exception as err:  # noqa: BLE001 - a translator's failure, named by its node
                node = imp.node
                if node is not None:
                    raise UnsupportedGraphError(
                        f"node '{node.name}' ({node.target}) failed to translate: {type(err).__name__}: "
                        f"{str(err).splitlines()[0] if str(err) else ''}",
                        op=node.name,
                        rule="import.fx_node",
                        hint="report this as an importer bug, with the graph (gm.print_readable())",
                    ) from err
                unread = _unread_inputs(imp, placeholders)
                if not unread or not isinstance(err, UnsupportedGraphError):
                    raise
                args = [_unread(a) if i in unread else a for i, a in enumerate(args)]
                continue
            _torch_strides(imported, gm)
            return imported
        raise AssertionError("unreachable: the second import reads every input it declares")


def _torch_strides(imported: ImportedGraph, gm: Any) -> None:
    """Give each output the strides PyTorch gives that node (its traced value's), where they are
    dense: code after the graph may view the result as PyTorch laid it out."""
    final = imported.graph.final
    restride = []  # decided on the validated graph first: a set_stride invalidates it
    for leaf, node in zip(imported._output_leaves, _outputs(gm)):
        meta = node.meta.get("val") if hasattr(node, "meta") else None
        if leaf.tensor is None or meta is None or not hasattr(meta, "stride") or not _dense(meta):
            continue
        desc = final.tensors[leaf.tensor.known_uid()]
        stride = to_shape(meta.stride()) or (1,)
        if desc.dim == (to_shape(meta.shape) or (1,)) and desc.stride != stride:
            restride.append((leaf.tensor, stride))
    for tensor, stride in restride:
        tensor.set_stride(stride)
    if restride:
        imported.graph.validate()


def _dense(meta: Any) -> bool:
    """`is_dense` of a traced value, its symbolic sizes (a graph torch.compile made dynamic) judged at
    their hints: its layout is the same at every size, and int() of a size would add a guard."""
    import torch

    return is_dense(meta, lambda d: int(d.node.hint) if isinstance(d, torch.SymInt) else int(d))


def _empty(example: Any) -> bool:
    # (a symbolic size is never 0: torch.compile specializes 0 and 1; int() of it would add a guard)
    return hasattr(example, "shape") and any(isinstance(d, int) and d == 0 for d in example.shape)


def _unread(example: Any) -> Any:
    from .torch_importer import Value

    if isinstance(example, Value) or not hasattr(example, "shape"):
        return example
    return Value(to_shape(example.shape), example.dtype)


def _unread_inputs(imp: Any, placeholders: list[Any]) -> set[int]:
    """Indices of placeholders declared as graph inputs that no translated op reads."""
    read = {id(t) for r in imp.g._records for t in r.inputs if t is not None}
    out = set()
    for i, n in enumerate(placeholders):
        value = imp.env.get(n)
        t = getattr(value, "tensor", None)
        if t is not None and id(t) not in read:
            out.add(i)
    return out


def translatable(node: Any) -> bool:
    """Whether the translation table covers `node` (its arguments may still be declined at import)."""
    import torch

    from .torch_mutations import op_key
    from .torch_ops import load_translators

    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        parent = node.args[0]
        return hasattr(parent, "op") and translatable(parent)
    if not isinstance(node.target, torch._ops.OpOverload):
        return False
    base, _ = op_key(node.target)
    if base in load_translators(aot=True):
        return True
    # a factory (folded into a constant or a random input; of a dynamic size, an index along a dim):
    # its inputs, if any, are sizes
    return all(isinstance(n.meta.get("val"), torch.SymInt) for n in node.all_input_nodes)
