"""Constant folding at import: nodes computed from constants alone are evaluated with PyTorch on the
CPU and become constant graph inputs instead of graph ops.

Constants are factory calls (arange, new_zeros, full, ...; not random draws), tensors the module holds
as constants, and everything computed from them alone: the position ids and causal masks a language
model builds from `arange`, a window-attention mask written in place into slices of a `new_zeros`
tensor (torchvision's Swin). In-place writes are evaluated as PyTorch runs them, on real tensors, so
writes through views need no functionalization here. Parameters and buffers are not constants (a
graph reads them at every run and follows their updates); user inputs neither.

A storage that a non-constant value is written into, or that a non-constant node reads before a
later in-place write into it, is not folded (the translation then sees those writes as usual).
An uninitialised allocation (`empty`) folds as zeros.
"""

from __future__ import annotations

import operator
from typing import Any

from .torch_mutations import mutation_target

_UNINITIALISED = ("empty", "empty_like", "new_empty", "empty_strided", "empty_permuted")
# ops that read only their tensor argument's shape, dtype and device (x.new_zeros(...), zeros_like(x))
_SHAPE_ONLY = (
    "new_zeros",
    "new_ones",
    "new_full",
    "new_empty",
    "new_empty_strided",
    "zeros_like",
    "ones_like",
    "full_like",
    "empty_like",
)


def _base(node: Any) -> str:
    schema = getattr(node.target, "_schema", None)
    return schema.name.split("::")[-1] if schema is not None else ""


def _is_view(node: Any) -> bool:
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.returns:
        return False
    alias = schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def _inputs(node: Any) -> list[Any]:
    """The nodes whose values `node` reads (not those it takes only the shape of)."""
    if node.op == "call_function" and _base(node) in _SHAPE_ONLY:
        return [a for a in node.all_input_nodes if a is not node.args[0]]
    return list(node.all_input_nodes)


class _Families:
    """Union-find over nodes sharing storage (a view and its base, an in-place op and its target)."""

    def __init__(self) -> None:
        self.parent: dict[Any, Any] = {}

    def find(self, n: Any) -> Any:
        while self.parent.get(n, n) is not n:
            n = self.parent[n]
        return n

    def union(self, a: Any, b: Any) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra is not rb:
            self.parent[ra] = rb


def constant_nodes(nodes: list[Any], kinds: dict[str, tuple[str, str]]) -> set[Any]:
    """The nodes computed from constants alone (see the module docstring)."""
    import torch

    families = _Families()
    for n in nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        if _is_view(n) and n.args and hasattr(n.args[0], "op"):
            families.union(n, n.args[0])
        target = mutation_target(n)
        if target is not None:
            families.union(n, target)
    position = {n: i for i, n in enumerate(nodes)}
    excluded: set[Any] = set()  # family roots that are not folded
    while True:
        const = _closure(nodes, kinds, families, excluded)
        poisoned = set()
        last_write: dict[Any, int] = {}
        for n in nodes:
            target = mutation_target(n) if n.op == "call_function" and hasattr(n.target, "_schema") else None
            if target is None:
                continue
            root = families.find(target)
            if target in const and n not in const:
                poisoned.add(root)
            last_write[root] = position[n]
        for n in nodes:
            if n in const or n.op == "output":
                continue
            for a in _inputs(n):
                root = families.find(a)
                if a in const and position[n] < last_write.get(root, -1):
                    poisoned.add(root)
        if not poisoned - excluded:
            return const
        excluded |= poisoned


def _closure(nodes: list[Any], kinds: dict[str, tuple[str, str]], families: _Families, excluded: set[Any]) -> set[Any]:
    import torch

    const: set[Any] = set()
    for n in nodes:
        if families.find(n) in excluded:
            continue
        if n.op == "placeholder":
            if kinds.get(n.name, ("input", ""))[0] == "constant":
                const.add(n)
            continue
        if n.op != "call_function":
            continue
        if n.target is operator.getitem:
            if n.args[0] in const:
                const.add(n)
            continue
        if not isinstance(n.target, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded in n.target.tags:
            continue
        if all(a in const for a in _inputs(n)):
            const.add(n)
    return const


def evaluate(nodes: list[Any], const: set[Any], kinds: dict[str, tuple[str, str]], program: Any) -> dict[Any, Any]:
    """{node: value} of the constant nodes, computed in program order (in-place writes as PyTorch does
    them). A node whose evaluation fails is left out, with the nodes that read it: the folded nodes are
    the keys of the result."""
    import torch

    values: dict[Any, Any] = {}
    cpu = torch.device("cpu")

    def arg(v: Any) -> Any:
        if hasattr(v, "op"):
            if v in values:
                return values[v]
            meta = v.meta["val"]  # the shape-only argument of new_zeros and the like
            return torch.zeros(meta.shape, dtype=meta.dtype)
        if isinstance(v, torch.device):
            return cpu
        if isinstance(v, (list, tuple)):
            return type(v)(arg(x) for x in v)
        return v

    for n in nodes:
        if n not in const or any(a not in values for a in _inputs(n)):
            continue
        if n.op == "placeholder":
            values[n] = program.constants[kinds[n.name][1]].detach().to(cpu).clone()
            continue
        if n.target is operator.getitem:
            values[n] = values[n.args[0]][n.args[1]]
            continue
        kwargs = {k: arg(v) for k, v in n.kwargs.items()}
        if "pin_memory" in kwargs:
            kwargs["pin_memory"] = False
        try:
            out = n.target(*arg(n.args), **kwargs)
        except Exception:  # noqa: BLE001 - any op may refuse these arguments; the node is then translated
            continue
        if _base(n) in _UNINITIALISED and isinstance(out, torch.Tensor):
            out.zero_()
        values[n] = out
    return values
