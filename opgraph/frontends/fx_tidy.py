"""AOTAutograd graphs tidied before they are partitioned (the torch.compile backend).

opgraph's partitioner cuts runs of a graph's order into kernels, so what AOTAutograd's default
partition leaves in a training graph cuts runs that `from_torch`'s import of the same model keeps
whole. `tidy(gm, user_outputs)` rewrites the FX graph, in place, so that the layer reaches the
importer as `from_torch` imports it:

- `drop_empty_concats`: a concatenation's empty inputs dropped, and one of a single input left is that
  input where nothing tells them apart (type, layout, a graph input's version counter). A Hugging Face
  model traced with its KV cache concatenates each layer's keys and values to the cache's empty
  tensors: a copy of both.
- `merge_duplicates`: one node for identical pure ops on the same inputs. Autocast casts a linear
  layer's input once per layer reading it: a Llama block's q, k and v projections cast the same normed
  activations three times, three kernels each reading them in fp32.
- `cancel_transposes`: a transpose of a transpose that restores the layout is its input. A weight's
  gradient comes out of the product transposed and is transposed back before its cast to the weight's
  dtype; a view between them keeps the cast out of the GEMM's epilogue.
- `casts_after_sources`: a dtype cast moved to just after what it casts (a saved weight's cast to the
  graph's start), so that it joins the kernel making its source instead of standing between that
  kernel and the matmul reading the cast (where a weight's cast, of other dims, splits the run in two).
- `views_outside`: a chain of views the graph returns (a forward saving q transposed for the backward)
  made again for the output, so that the partition returns the base and PyTorch makes the view, where
  the plan would copy the view out and cut the chain reading it.

The result computes the same values: these are rewrites of dataflow only, on ops without side effects.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from .fx_linear import aten_name as _name

VIEWS = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "t",
        "transpose",
        "permute",
        "expand",
        "alias",
        "squeeze",
        "unsqueeze",
        "slice",
        "select",
    }
)
_RESHAPES = frozenset({"view", "_unsafe_view"})  # (made again as reshape: its input may be laid out otherwise)


def _rank(node: Any) -> int | None:
    val = getattr(node, "meta", {}).get("val")
    shape = getattr(val, "shape", None)
    return None if shape is None else len(shape)


def tidy(gm: Any, user_outputs: Collection[int] | None = None) -> int:
    """Apply the module's rewrites to `gm`; `user_outputs` are the positions of the graph's results that
    its caller sees (None: all of them), which are never merged with another result. Returns how many
    nodes were rewritten."""
    done = drop_empty_concats(gm, user_outputs)
    done += merge_duplicates(gm, user_outputs)
    done += cancel_transposes(gm)
    done += casts_after_sources(gm)
    done += views_outside(gm)
    if done:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return done


def _output(gm: Any) -> Any:
    return next(n for n in reversed(gm.graph.nodes) if n.op == "output")


def _results(gm: Any) -> list[Any]:
    args = _output(gm).args[0]
    return list(args) if isinstance(args, (tuple, list)) else [args]


def _user_results(gm: Any, user_outputs: Collection[int] | None) -> set[int]:
    return {id(n) for i, n in enumerate(_results(gm)) if user_outputs is None or i in user_outputs}


def _empty_along(node: Any, dim: int) -> bool:
    shape = getattr(getattr(node, "meta", {}).get("val"), "shape", None)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return False
    return (len(shape) == 1 and shape[0] == 0) or (len(shape) > dim and shape[dim] == 0)


def _promoted(nodes: list[Any]) -> Any:
    import functools

    import torch

    return functools.reduce(torch.promote_types, (n.meta["val"].dtype for n in nodes))


def drop_empty_concats(gm: Any, user_outputs: Collection[int] | None = None) -> int:
    """A concatenation's inputs that are empty along its axis dropped (where the others promote to the
    result's type without them); a concatenation of one input left is that input, where that input is
    laid out as the result was traced (not for a result the caller sees, which must stay a tensor of its
    own, nor for a graph input)."""
    seen = _user_results(gm, user_outputs)
    changed = 0
    for node in list(gm.graph.nodes):
        if _name(node) != "cat" or not isinstance(node.args[0], (list, tuple)) or _rank(node) is None:
            continue
        rank = _rank(node)
        dim = int(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % rank  # type: ignore[operator]
        inputs = node.args[0]
        if not all(hasattr(x, "op") for x in inputs):
            continue
        val = node.meta.get("val")
        kept = [x for x in inputs if not _empty_along(x, dim)]
        if len(kept) == len(inputs) or not kept or _promoted(kept) != val.dtype:
            continue  # (nothing empty, all of it, or an empty input that takes part in the type promotion)
        only = kept[0].meta.get("val")
        if (
            len(kept) == 1
            and id(node) not in seen
            and kept[0].op != "placeholder"  # (a saved input would share the caller's version counter)
            and only.shape == val.shape
            and only.stride() == val.stride()  # (later views were traced against the fresh result's layout)
        ):
            node.replace_all_uses_with(kept[0])
            gm.graph.erase_node(node)
        else:
            node.args = (kept, *node.args[1:])
        changed += 1
    return changed


def _pure(node: Any) -> bool:
    import torch

    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False
    if torch.Tag.nondeterministic_seeded in target.tags or "empty" in schema.name or "rand" in schema.name:
        return False
    return isinstance(node.meta.get("val"), torch.Tensor)


def _frozen(value: Any) -> Any:
    """`value` as a key that tells apart what compares equal across types (1, 1.0 and True; 0.0 and -0.0)."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (bool, int, float, complex)):
        return (type(value).__name__, repr(value))
    hash(value)  # (TypeError: not a key)
    return value if hasattr(value, "op") else (type(value).__name__, value)


def _reaches(node: Any, results: set[int]) -> bool:
    """Whether `node`, or a view of it (through views), is one of `results` (ids of nodes)."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if id(n) in results:
            return True
        seen.add(id(n))
        stack.extend(u for u in n.users if _name(u) in VIEWS and id(u) not in seen)
    return False


def merge_duplicates(gm: Any, user_outputs: Collection[int] | None = None) -> int:
    """Identical pure ops on the same inputs become one node (common subexpressions). A node the caller
    sees as a result (`user_outputs`, None: every result), or views it through, is neither dropped nor
    made to stand for another result (a saved tensor must not become a view of what the caller may
    change in place)."""
    seen_as_result = _user_results(gm, user_outputs)
    returned = {id(n) for n in _results(gm)}
    first: dict[Any, Any] = {}
    merged = 0
    for node in list(gm.graph.nodes):
        if not _pure(node):
            continue
        try:
            key = (node.target, _frozen(node.args), _frozen(node.kwargs))
        except TypeError:
            continue
        twin = first.get(key)
        if twin is None:
            first[key] = node
            continue
        if _reaches(node, seen_as_result) or (_reaches(node, returned) and _reaches(twin, seen_as_result)):
            continue
        node.replace_all_uses_with(twin)
        gm.graph.erase_node(node)
        merged += 1
    return merged


def _permutation(node: Any) -> list[int] | None:
    """The axes `node` (t, transpose or permute) puts in each place, or None."""
    rank, name = _rank(node), _name(node)
    if rank is None:
        return None
    if name == "t" and rank == 2:
        return [1, 0]
    if name == "transpose" and len(node.args) == 3:
        a, b = (int(d) % rank for d in node.args[1:3])
        axes = list(range(rank))
        axes[a], axes[b] = axes[b], axes[a]
        return axes
    if name == "permute":
        return [int(d) % rank for d in node.args[1]]
    return None


def cancel_transposes(gm: Any) -> int:
    """A transpose (t, transpose, permute) of a transpose whose axes compose to none is its input."""
    cancelled = 0
    for node in list(gm.graph.nodes):
        outer = _permutation(node)
        if outer is None or not hasattr(node.args[0], "op"):
            continue
        inner_node = node.args[0]
        inner = _permutation(inner_node)
        if inner is None or [inner[i] for i in outer] != list(range(len(outer))):
            continue
        node.replace_all_uses_with(inner_node.args[0])
        gm.graph.erase_node(node)
        if not inner_node.users:
            gm.graph.erase_node(inner_node)
        cancelled += 1
    return cancelled


def _cast_source(node: Any) -> Any:
    """What `node` casts, when it is a dtype cast alone (`_to_copy` with a dtype and nothing else that
    changes), else None."""
    if _name(node) != "_to_copy" or len(node.args) != 1 or set(node.kwargs) - {"dtype", "layout", "device"}:
        return None
    source = node.args[0]
    val, before = node.meta.get("val"), getattr(source, "meta", {}).get("val")
    if val is None or before is None or getattr(val, "device", None) != getattr(before, "device", None):
        return None
    return source


def casts_after_sources(gm: Any) -> int:
    """Each dtype cast placed just after its source: after the last placeholder for a cast of an input
    that the graph returns too (a weight's cast a training forward saves: live to the end whatever its
    place), else after the node making its source."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    returned = {id(n) for n in _results(gm)}
    moved = 0
    anchor = placeholders[-1] if placeholders else None
    for node in nodes:
        source = _cast_source(node)
        if source is None or source.op not in ("placeholder", "call_function"):
            continue
        if source.op == "placeholder":
            if anchor is None or id(node) not in returned:
                continue
            if node.prev is not anchor:
                anchor.append(node)
                moved += 1
            anchor = node
        elif node.prev is not source:
            source.append(node)
            moved += 1
    return moved


def _view_chain(node: Any) -> list[Any]:
    """`node` and the views it is made by, up to (not including) the first node that is no view."""
    chain = []
    while (
        _name(node) in VIEWS
        and getattr(node.target, "_overloadname", "") != "dtype"  # (a reinterpretation, not a view of the dims)
        and node.args
        and hasattr(node.args[0], "op")
    ):
        chain.append(node)
        node = node.args[0]
    return chain


def views_outside(gm: Any) -> int:
    """Each view chain the graph returns that another node also reads, made again for the output."""
    import torch

    output = _output(gm)
    results = _results(gm)
    made = 0
    for i, node in enumerate(results):
        chain = _view_chain(node) if hasattr(node, "op") else []
        if not chain or all(list(v.users) == [output] for v in chain):
            continue
        value = chain[-1].args[0]
        with gm.graph.inserting_before(output):
            for view in reversed(chain):
                target, args = view.target, (value, *view.args[1:])
                if _name(view) in _RESHAPES:
                    target = torch.ops.aten.reshape.default
                value = gm.graph.call_function(target, args, dict(view.kwargs))
                value.meta = dict(view.meta)
        results[i] = value
        made += 1
    if made:
        args = output.args[0]
        output.args = (type(args)(results) if isinstance(args, (tuple, list)) else results[0],)
    return made
