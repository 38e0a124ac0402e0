"""An RMSNorm written out as ops, recognised as the op before translation.

Hugging Face's language models (Llama, Mistral, Qwen2, Gemma, ...) write their RMSNorm as

    x32 = x.to(float32); r = rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps); y = x32 * r

then cast y back and multiply by the weight. Translated op by op, the mean becomes a reduction that the
partitioner fuses into the producing GEMM's epilogue as partial sums (a second launch adds them), and the
normalisation a pointwise kernel after it: three launches a norm. As `rms_norm(x32, [D], None, eps)`
(the weight left to the multiply after the cast, so the values and their roundings are the model's; a
16-bit x's widening cast taken in, rmsnorm computing in float32) it is one rmsnorm op, which the rownorm template runs as one kernel with the cast and the weight as its
epilogue: x read once, y written once.

`recognise_rms_norms(gm)` rewrites the FX graph in place; the ops it removes have no other readers.
"""

from __future__ import annotations

import math
from typing import Any


def _target(node: Any) -> str:
    return str(getattr(node, "target", ""))


def _only_reader(node: Any, reader: Any) -> bool:
    return list(node.users) == [reader]


def _squared_base(node: Any) -> Any:
    """x where `node` is x ** 2 or x * x (else None)."""
    t = _target(node)
    if t in ("aten.pow.Tensor_Scalar",) and len(node.args) == 2 and node.args[1] in (2, 2.0):
        return node.args[0]
    if t == "aten.mul.Tensor" and len(node.args) == 2 and node.args[0] is node.args[1]:
        return node.args[0]
    return None


def _last_axes(dims: Any, rank: int) -> int | None:
    """How many trailing axes `dims` names (all of them, each once), else None."""
    if not isinstance(dims, (list, tuple)) or not dims:
        return None
    axes = sorted({d % rank for d in dims if isinstance(d, int)})
    if len(axes) != len(dims) or axes != list(range(rank - len(axes), rank)):
        return None
    return len(axes)


def _rank_and_shape(node: Any) -> tuple[int, tuple[int, ...]] | None:
    val = node.meta.get("val") if hasattr(node, "meta") else None
    shape = getattr(val, "shape", None)
    if shape is None or not all(isinstance(s, int) for s in shape):
        return None
    return len(shape), tuple(int(s) for s in shape)


def _match(mul: Any) -> tuple[Any, list[int], float, list[Any]] | None:
    """(x, normalized shape, eps, the ops replaced) where `mul` is x * rsqrt(mean(x^2, trailing axes,
    keepdim) + eps) with each op between read by the next alone."""
    if _target(mul) != "aten.mul.Tensor" or len(mul.args) != 2:
        return None
    for x, rsqrt in (mul.args, mul.args[::-1]):
        if _target(rsqrt) != "aten.rsqrt.default" or not _only_reader(rsqrt, mul):
            continue
        add = rsqrt.args[0]
        if _target(add) != "aten.add.Tensor" or not _only_reader(add, rsqrt) or len(add.args) != 2:
            continue
        mean, eps = add.args
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or add.kwargs.get("alpha", 1) != 1:
            continue
        if not math.isfinite(eps) or eps < 0:  # (rmsnorm's epsilon: finite, >= 0; the ops stay as written)
            continue
        if _target(mean) != "aten.mean.dim" or not _only_reader(mean, add) or mean.kwargs.get("dtype") is not None:
            continue
        keepdim = mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)
        square = mean.args[0]
        if not keepdim or not _only_reader(square, mean) or _squared_base(square) is not x:
            continue
        found = _rank_and_shape(x)
        if found is None or found[0] == 0 or _rank_and_shape(mul) != found:
            continue
        rank, shape = found
        n = _last_axes(mean.args[1], rank)
        if n is None:
            continue
        dead = [rsqrt, add, mean, square]
        source = _widened(x, {square, mul})
        if source is not None and _narrowed_back(mul, _dtype(source)):
            # the norm reads the narrow tensor and widens it itself: its result is then in the narrow type
            # (aten.rms_norm's), which only casts back to that type may read
            return source, list(shape[rank - n :]), float(eps), [*dead, x]
        if str(_dtype(x)) not in ("torch.float32", "torch.float64"):  # (16-bit ops round each step; rmsnorm
            # would compute in fp32)
            continue
        return x, list(shape[rank - n :]), float(eps), dead
    return None


_CASTS = ("aten.to.dtype", "aten._to_copy.default", "prims.convert_element_type.default")


def _dtype(node: Any) -> Any:
    return getattr(getattr(node, "meta", {}).get("val"), "dtype", None)


_ASSERT = "aten._assert_tensor_metadata.default"  # (torch.export's check of a cast's input: not a use)


def _narrowed_back(node: Any, dtype: Any) -> bool:
    """Whether every reader of `node` is a cast of it to `dtype` alone (or export's check of its metadata)."""
    casts = [u for u in node.users if _target(u) != _ASSERT]
    return bool(casts) and all(
        _target(u) in _CASTS and u.args and u.args[0] is node and _dtype(u) == dtype and _plain_cast(u) for u in casts
    )


def _plain_cast(cast: Any) -> bool:
    """Whether the cast changes the type alone (no device, layout or memory format of its own)."""
    return all(v is None or k in ("dtype", "copy", "non_blocking") for k, v in cast.kwargs.items())


def _widened(x: Any, readers: set[Any]) -> Any:
    """The 16-bit tensor `x` widens to float32, where `x` is that cast and read by `readers` alone (else None):
    left in, the cast would be written out as a float32 tensor between the producer and the norm."""
    import torch

    if _target(x) not in _CASTS or set(x.users) != readers or not x.args or not _plain_cast(x):
        return None
    source = x.args[0]
    if _dtype(x) != torch.float32 or _dtype(source) not in (torch.float16, torch.bfloat16):
        return None
    return source


def recognise_rms_norms(gm: Any, notes: list[str] | None = None) -> int:
    """Replace each written-out RMSNorm of `gm`'s graph (module docstring) by aten.rms_norm; how many."""
    import torch

    graph = gm.graph
    count = 0
    for mul in list(graph.nodes):
        if mul.op != "call_function":
            continue
        found = _match(mul)
        if found is None:
            continue
        x, shape, eps, dead = found
        with graph.inserting_before(mul):
            norm = graph.call_function(torch.ops.aten.rms_norm.default, (x, shape, None, eps))
        norm.meta = dict(mul.meta)
        for check in [u for u in mul.users if _target(u) == _ASSERT]:  # (of the fp32 value the norm no longer makes)
            graph.erase_node(check)
        mul.replace_all_uses_with(norm)
        graph.erase_node(mul)
        for node in dead:  # (each read only by the ops erased before it)
            graph.erase_node(node)
        count += 1
    if count:
        graph.lint()
        gm.recompile()
        if notes is not None:
            notes.append(f"{count} RMSNorm(s) written out as ops imported as rmsnorm (frontends/fx_norms.py)")
    return count
