"""In-place ops made functional, and which nodes an import needs: the versions of mutated tensors
(a later reader reads the mutating op's result), module-state updates (batchnorm running statistics),
writes through views, the outputs each node's users read, and the computations on parameters alone."""

from __future__ import annotations

import operator
from typing import Any

from ..core.errors import UnsupportedGraphError
from .torch_importer import Importer

_EFFECTFUL = ("batch_norm", "native_batch_norm", "_native_batch_norm_legit", "cudnn_batch_norm", "miopen_batch_norm")


def op_key(target: Any) -> tuple[str, str]:
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


class Versions:
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


def mutation_target(node: Any) -> Any:
    """The argument node an in-place op writes, if any."""
    idx = _mutated_args(node.target)
    if not idx:
        return None
    schema = node.target._schema
    arg = node.args[idx[0]] if idx[0] < len(node.args) else node.kwargs.get(schema.arguments[idx[0]].name)
    return arg if hasattr(arg, "op") else None


def analyze_mutations(
    imp: Importer, nodes: list[Any], kinds: dict[str, tuple[str, str]], folded: Any = frozenset()
) -> tuple[set[Any], dict, list]:
    """Liveness with in-place aliasing resolved. Returns (live nodes, host updates {buffer node:
    (key, amount)}, [(kind, key, final node)] module-state mutations translated in the graph).
    `folded` nodes (constants evaluated at import) may write into views of what they made."""
    versions = Versions()
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
            target = mutation_target(n)
            if target is not None and n not in folded:
                _check_view_write(n, target, position)
                versions.written(target, n)
            if op_key(n.target)[0] in _EFFECTFUL:
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
            imp.note(
                f"input '{n.name}' is updated in place by the module; the graph does not write the "
                "caller's tensor (its outputs are the module's results only)"
            )
            continue
        final = versions.final(n)
        kind, key = kinds[n.name]
        # `buf += k` on a buffer nothing else reads (num_batches_tracked): done on the host
        if (
            final.op == "call_function"
            and op_key(final.target)[0] == "add"
            and final.args[0] is n
            and not _flat_nodes(final.args[1:])
            and readers.get(n, 0) == 1
            and readers.get(final, 0) == 0
        ):
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
    from .torch_importer import node_location

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
            f"'{later[0].name}' reads afterwards{node_location(node)}",
            op=node.name,
            rule="import.view_mutation",
            hint="write that line of the forward out of place (y = x.clone(); y[...] = ... or torch.cat); writes "
            "into tensors made from constants alone (a mask built from zeros) are folded at import",
        )


def used_outputs(nodes: list[Any], live: set[Any]) -> dict[Any, set[int]]:
    used: dict[Any, set[int]] = {}
    for n in nodes:
        if n in live and n.op == "call_function" and n.target is operator.getitem:
            used.setdefault(n.args[0], set()).add(int(n.args[1]))
    return used


def placeholder_kinds(program: Any) -> dict[str, tuple[str, str]]:
    from torch.export.graph_signature import InputKind

    kinds = {}
    names = {
        InputKind.PARAMETER: "parameter",
        InputKind.BUFFER: "buffer",
        InputKind.CONSTANT_TENSOR: "constant",
        InputKind.USER_INPUT: "input",
    }
    for spec in program.graph_signature.input_specs:
        kinds[spec.arg.name] = (names.get(spec.kind, str(spec.kind)), spec.target or spec.arg.name)
    return kinds


def param_only_nodes(
    nodes: list[Any], live: set[Any], kinds: dict[str, tuple[str, str]], folded: Any = frozenset()
) -> set[Any]:
    """Live nodes computed from parameters, buffers and constants alone (not random draws); `folded`
    nodes count as constants."""
    import torch

    only: set[Any] = set(folded)
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
