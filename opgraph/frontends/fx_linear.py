"""Linear layers as AOTAutograd traces them, given back their batch axes.

`nn.Linear` on an input of rank 3 or more reaches an AOTAutograd graph as three nodes: a view that
collapses the leading axes into rows, `mm` (or `addmm` with the bias), and a view that splits the rows
again (`x.view(B*S, K) @ w.t()` then `.view(B, S, N)`). Translated as they stand, the matmul's output
is a 2-D tensor between two reshapes: the epilogue that follows (a residual add, the next norm's
statistics) is reached through a reshape, which the library engine's generated epilogue cannot take,
and the graph no longer says what `from_torch` says of the same model (one matmul over [B, S, K]).
`fold_linear_views(gm)` rewrites each such triple into `aten.linear(x, W, bias)` where the product's
right operand is a transposed weight (the bias, if any, added before the product is rounded, as addmm
adds it), else `aten.matmul(x, B)`: PyTorch runs them the same and the translator imports them as
`from_torch` imports the linear layer. The
collapsing view stays where something else reads it (a forward graph saving it for the backward).
"""

from __future__ import annotations

import math
from typing import Any

_RESHAPES = frozenset({"view", "_unsafe_view", "reshape"})


def aten_name(node: Any) -> str:
    """The aten op a call node runs, without namespace or overload ('' for any other node)."""
    schema = getattr(node.target, "_schema", None)
    return schema.name.split("::")[-1] if node.op == "call_function" and schema is not None else ""


def _shape(node: Any) -> tuple[int, ...] | None:
    val = node.meta.get("val") if hasattr(node, "meta") else None
    shape = getattr(val, "shape", None)
    if shape is None:
        return None
    if not all(isinstance(d, int) for d in shape):  # a symbolic size (no int(): that would guard on it)
        return None
    return tuple(shape)


def _collapsed(view: Any) -> Any:
    """The tensor `view` collapses into rows ([*lead, K] -> [prod(lead), K], at least two lead axes), or None."""
    if aten_name(view) not in _RESHAPES:
        return None
    source = view.args[0]
    before, after = _shape(source), _shape(view)
    if before is None or after is None or len(before) < 3 or len(after) != 2:
        return None
    if after != (math.prod(before[:-1]), before[-1]):
        return None
    return source


def _expanded_users(mm: Any, lead: tuple[int, ...]) -> list[Any] | None:
    """The views splitting `mm`'s rows back into `lead` (its only readers), or None."""
    shape = _shape(mm)
    if shape is None or len(shape) != 2 or not mm.users:
        return None
    want = (*lead, shape[1])
    users = list(mm.users)
    if all(aten_name(u) in _RESHAPES and u.args[0] is mm and _shape(u) == want for u in users):
        return users
    return None


def _operands(node: Any) -> tuple[Any, Any, Any] | None:
    """(bias or None, mat1, mat2) of an mm, or of an addmm with beta = alpha = 1 and a bias of one row
    (linear broadcasts its bias over the leading axes, addmm over the rows: the same only for a row);
    else None."""
    import torch

    aten = torch.ops.aten
    if node.op != "call_function":
        return None
    if node.target is aten.mm.default and len(node.args) == 2 and not node.kwargs:
        return None, node.args[0], node.args[1]
    if node.target is aten.addmm.default and len(node.args) == 3:
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return None
        bias, b = node.args[0], node.args[2]
        b_shape = _shape(b) if hasattr(b, "meta") else None
        bias_shape = _shape(bias) if hasattr(bias, "meta") else None
        if b_shape is None or bias_shape not in ((b_shape[-1],), (1, b_shape[-1])):
            return None
        return bias, node.args[1], b
    return None


def _untransposed(b: Any) -> Any:
    """The [N, K] weight that `b` ([K, N]) transposes (`t`, or a permute / transpose of its two axes), or None.
    linear reads the weight itself: no transposed view is left between partitions, where PyTorch would make
    it at every call (BERT-base: 144 of them)."""
    import torch

    aten = torch.ops.aten
    if getattr(b, "op", None) != "call_function" or len(b.args) < 1:
        return None
    if b.target is aten.t.default:
        return b.args[0]
    if b.target is aten.permute.default and list(b.args[1]) == [1, 0]:
        return b.args[0]
    if b.target is aten.transpose.int and sorted(int(d) % 2 for d in b.args[1:3]) == [0, 1]:
        return b.args[0]
    return None


def _fake(fn: Any, *nodes: Any) -> Any:
    """fn over the nodes' traced values, under their fake mode (the new node's meta['val'])."""
    from torch._guards import detect_fake_mode

    vals = [n.meta["val"] for n in nodes]
    mode = detect_fake_mode(vals)
    if mode is None:
        return fn(*vals)
    with mode:
        return fn(*vals)


def fold_linear_views(gm: Any) -> int:
    """Rewrite `gm` (in place) so that each linear layer over rows of a batch is one batched matmul
    (module docstring); returns how many were rewritten."""
    import torch

    aten = torch.ops.aten
    done = 0
    for node in list(gm.graph.nodes):
        found = _operands(node)
        if found is None:
            continue
        bias, a, b = found
        x = _collapsed(a)
        b_shape = _shape(b)
        if x is None or b_shape is None or len(b_shape) != 2:
            continue
        lead = _shape(x)[:-1]  # type: ignore[index]
        users = _expanded_users(node, lead)
        if users is None:
            continue
        weight = _untransposed(b)
        with gm.graph.inserting_before(node):
            if weight is None and bias is None:
                out = gm.graph.call_function(aten.matmul.default, (x, b))
                out.meta["val"] = _fake(aten.matmul.default, x, b)
            else:  # (linear: the bias added to the product before it is rounded, as addmm does)
                if weight is None:
                    weight = gm.graph.call_function(aten.t.default, (b,))
                    weight.meta["val"] = _fake(aten.t.default, b)
                args = (x, weight) if bias is None else (x, weight, bias)
                out = gm.graph.call_function(aten.linear.default, args)
                out.meta["val"] = _fake(aten.linear.default, *args)
        for u in users:
            u.replace_all_uses_with(out)
            gm.graph.erase_node(u)
        gm.graph.erase_node(node)
        for view in (a, b):
            if not view.users and view.op == "call_function":
                gm.graph.erase_node(view)
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done
