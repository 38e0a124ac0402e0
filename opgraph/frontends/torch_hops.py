"""torch.export's higher-order ops inlined into the program's graph before translation.

The training IR keeps regions of a forward that run under another autograd or autocast state as
calls of a submodule: `wrap_with_set_grad_enabled(enabled, submod, *args)` (a `torch.no_grad()`
block: transformers' rotary embedding) and `wrap_with_autocast(device, dtype, enabled, cache,
submod, *args)` (a `torch.autocast(..., enabled=False)` block that keeps fp32). Their bodies are
ordinary aten nodes, copied here into the calling graph in place of the call (node meta, with the
module path and source line, kept); `wrap` and `tag_activation_checkpoint` (a checkpointed block:
the same values, recomputation being a training-memory choice) likewise.

What the inlined graph does not keep: a no-grad region's outputs are not cut from the backward (a
train_step differentiates through them); the import notes it when such a region reads a tensor that
may need a gradient. An enabled autocast region would compute in another dtype than its nodes were
traced in: refused, with the module and source line named.
"""

from __future__ import annotations

import operator
from typing import Any

from ..core.errors import UnsupportedGraphError

_WRAPPERS = ("wrap_with_set_grad_enabled", "wrap_with_autocast", "wrap", "tag_activation_checkpoint")


def _hop_name(node: Any) -> str | None:
    import torch

    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.HigherOrderOperator):
        return None
    return target.name()


def inline_wrappers(gm: Any, notes: list[str], where: Any, params: frozenset[str] = frozenset()) -> int:
    """Inline every wrapper call of `gm` (and of its submodules, recursively) in place; returns how
    many were inlined. `where(node)` describes a node for errors (its module and source line); `params`
    names the placeholders that are parameters; `notes` collect what changed."""
    count = 0
    for node in list(gm.graph.nodes):
        name = _hop_name(node)
        if name is None:
            continue
        if name not in _WRAPPERS:
            raise UnsupportedGraphError(
                f"node '{node.name}' calls the higher-order op {name}{where(node)}",
                op=node.name,
                rule="import.higher_order",
                hint="write that region of the forward without torch control-flow ops (cond, while_loop, map, "
                "scan), or import the model in a mode that does not take it",
            )
        sub_pos = next(i for i, a in enumerate(node.args) if getattr(a, "op", None) == "get_attr")
        sub = getattr(gm, node.args[sub_pos].target)
        if name == "wrap_with_autocast" and node.args[2]:
            raise UnsupportedGraphError(
                f"node '{node.name}' runs a region under torch.autocast({node.args[0]!r}, {node.args[1]})"
                f"{_where(node, sub, where)}",
                op=node.name,
                rule="import.autocast",
                hint="import the model without autocast inside its forward (cast the model to the dtype you want "
                "instead); regions with autocast(enabled=False) import as they are",
            )
        count += inline_wrappers(sub, notes, where)
        if (
            name == "wrap_with_set_grad_enabled"
            and not node.args[0]
            and _reads_parameters(node.args[sub_pos + 1 :], params)
        ):
            notes.append(
                f"{node.name}: a torch.no_grad() region{_where(node, sub, where)} is inlined; a training step "
                "differentiates through it (PyTorch does not)"
            )
        _inline(gm, node, sub, list(node.args[sub_pos + 1 :]), node.kwargs if name == "wrap" else {})
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return count


def _where(node: Any, sub: Any, where: Any) -> str:
    """The call's location, or its region's first node's (a wrapper call carries no source line)."""
    inner = next((n for n in sub.graph.nodes if n.op == "call_function" and n.meta.get("stack_trace")), None)
    return where(inner) if inner is not None else where(node)


def _reads_parameters(operands: Any, params: frozenset[str]) -> bool:
    stack = [a for a in operands if hasattr(a, "op")]
    seen: set[Any] = set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder" and n.name in params:
            return True
        stack += [a for a in n.all_input_nodes]
    return False


def _inline(gm: Any, call: Any, sub: Any, operands: list[Any], kwargs: dict[str, Any]) -> None:
    graph = gm.graph
    env: dict[Any, Any] = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for ph, value in zip(placeholders, operands):
        env[ph] = value
    results: Any = None
    with graph.inserting_before(call):
        for n in sub.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                results = [env[a] if hasattr(a, "op") else a for a in n.args[0]]
                continue
            if n.op == "get_attr":  # a nested submodule or constant: moved to the caller's module
                attr = f"_og_inlined_{n.target}"
                while hasattr(gm, attr):
                    attr += "_"
                setattr(gm, attr, getattr(sub, n.target))
                copied = graph.get_attr(attr)
                copied.meta = dict(n.meta)
                env[n] = copied
                continue
            env[n] = graph.node_copy(n, lambda a: env[a])
    assert results is not None
    for user in list(call.users):
        if user.op == "call_function" and user.target is operator.getitem:
            user.replace_all_uses_with(results[user.args[1]])
            graph.erase_node(user)
    if call.users:
        raise UnsupportedGraphError(
            f"node '{call.name}' (a wrapped region) is read other than by its results",
            op=call.name,
            rule="import.internal",
            hint="report this as an importer bug",
        )
    graph.erase_node(call)
