"""AOTAutograd's attention ops (the torch.compile backend's graphs) -> sdpa and sdpa_backward.

AOTAutograd lowers `F.scaled_dot_product_attention` to the kernel PyTorch picked while tracing, and
its gradient to that kernel's backward:

    _scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, ..., scale)        (CUDA)
    _scaled_dot_product_efficient_attention(q, k, v, attn_bias, compute_lse, dropout_p, is_causal, scale)
    _scaled_dot_product_cudnn_attention(q, k, v, attn_bias, compute_lse, dropout_p, is_causal, ..., scale)
    _scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, attn_mask, scale)
    ... and each one's `_backward(dO, q, k, v, out, logsumexp, ...)`

Each forward returns the output, the rows' log-sum-exp of the scaled scores (natural log: the Stats
sdpa generates, [B, H, Sq], the efficient kernel's padded to a multiple of 32 rows) and the sequence
and RNG state its backward reads. A forward translates where only the output and the log-sum-exp are
read: an inference graph. A training graph also saves that state for the backward; without dropout the
state is no value the backward uses (PyTorch's kernels read the seed and offset only to draw a dropout
mask, and the sequence bounds only for nested tensors), so `free_attention_state(gm)` gives the saved
results fresh placeholders of their own (an uninitialised tensor of the same shape, or the traced int)
and the forward translates too, in one plan with the layer around it. With dropout the forward stays in
PyTorch (its mask is PyTorch's RNG stream), as does a bias's gradient.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from .torch_importer import Args, Importer, Untranslatable, Value, og_dims
from .torch_ops import op
from .torch_ops_attention import attention_operands, attention_options
from .torch_symbolic import to_shape

FORWARD = {  # op -> its mask argument
    "_scaled_dot_product_flash_attention": None,
    "_scaled_dot_product_flash_attention_for_cpu": "attn_mask",
    "_scaled_dot_product_efficient_attention": "attn_bias",
    "_scaled_dot_product_cudnn_attention": "attn_bias",
}
BACKWARD = {f"{name}_backward": mask for name, mask in FORWARD.items()}


def _dropout(node: Any) -> Any:
    """The dropout probability a forward attention node was traced with (None where it is not a number)."""
    schema = node.target._schema
    for i, arg in enumerate(schema.arguments):
        if arg.name == "dropout_p":
            p = node.args[i] if i < len(node.args) else node.kwargs.get("dropout_p", arg.default_value)
            return p if isinstance(p, (int, float)) else None
    return 0.0


FREED = "opgraph_freed_attention_state"  # node.meta key of the placeholders: they stay in PyTorch


def _substitute(reader: Any, old: Any, value: Any) -> None:
    """`reader` (an FX node) reading `value` where it read node `old`."""
    from torch.fx.node import map_arg

    def swap(a: Any) -> Any:
        return value if a is old else a

    reader.args = map_arg(reader.args, swap)
    reader.kwargs = map_arg(reader.kwargs, swap)


def free_attention_state(gm: Any) -> int:
    """Rewrite `gm` (an AOTAutograd graph) so that no forward attention node without dropout has its
    sequence or RNG state read: each such result's readers get a placeholder instead (an `aten.empty`
    of the traced shape and dtype for a tensor, marked `FREED` so that it stays in PyTorch, or the
    traced int for an int); unread results are dropped. Returns how many read results it freed.
    Results whose traced value is symbolic are left alone."""
    import operator

    import torch

    freed = dropped = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or getattr(node.target, "_schema", None) is None:
            continue
        if node.target._schema.name.split("::")[-1] not in FORWARD or _dropout(node) != 0.0:
            continue
        for user in list(node.users):
            if user.target is not operator.getitem or user.args[1] < 2:
                continue
            vals = node.meta.get("val")  # (the tuple's: a getitem of an int may hold no value of its own)
            val = vals[user.args[1]] if isinstance(vals, (tuple, list)) else user.meta.get("val")
            if not user.users:
                gm.graph.erase_node(user)
                dropped += 1
                continue
            if isinstance(val, bool) or not isinstance(val, (int, torch.Tensor)):
                continue
            if isinstance(val, int):
                for reader in list(user.users):
                    _substitute(reader, user, val)
            else:
                if not all(isinstance(d, int) for d in val.shape):
                    continue
                with gm.graph.inserting_after(user):
                    fresh = gm.graph.call_function(
                        torch.ops.aten.empty.memory_format,
                        (list(val.shape),),
                        {"dtype": val.dtype, "device": val.device, "pin_memory": False},
                    )
                fresh.meta = {**user.meta, "val": val, FREED: True}
                user.replace_all_uses_with(fresh)
            gm.graph.erase_node(user)
            freed += 1
    if freed or dropped:
        gm.graph.lint()
        gm.recompile()
    return freed


def _checked(a: Args) -> tuple[Value, Value, Value]:
    q, k, v = attention_operands(a, ranks=(4,))
    if float(a.get("dropout_p") or 0.0) > 0.0:
        raise Untranslatable("attention dropout (its mask is PyTorch's RNG stream)")
    return q, k, v


def _result_shape(node: Any, index: int) -> tuple[int, ...]:
    return to_shape(node.meta["val"][index].shape)


def _forward(imp: Importer, node: Any, a: Args, mask_key: str | None) -> list[Any]:
    q, k, v = _checked(a)
    read = imp.used.get(node, {0})
    if any(i > 1 for i in read):
        raise Untranslatable("its sequence and RNG state are read (saved for a backward in PyTorch's form)")
    mask = a.get(mask_key) if mask_key else None
    kw = attention_options(imp, node, q, k, mask, bool(a.get("is_causal")), a.get("scale"))
    stats_read = 1 in read
    lse_shape = _result_shape(node, 1) if stats_read else ()
    if stats_read and math.prod(lse_shape) != q.shape[0] * q.shape[1] * q.shape[2]:
        raise Untranslatable(f"a log-sum-exp of shape {list(lse_shape)} (padded rows)")
    o, stats = imp.g.sdpa(
        imp.tensor(q), imp.tensor(k), imp.tensor(v), generate_stats=stats_read, name=imp.op_name("sdpa"), **kw
    )
    lse = None
    if stats_read:
        lse = imp.reshape(stats, list(og_dims(lse_shape)), name=imp.op_name("lse"))
        dtype = node.meta["val"][1].dtype
        if dtype != imp.g.intermediate_data_type.to_torch():  # (a float64 graph's: PyTorch's is float32)
            lse = imp.g.identity(lse, name=imp.op_name("lse_cast")).set_data_type(dtype)
    return [o, lse] + [None] * (len(node.meta["val"]) - 2)


def _backward(imp: Importer, node: Any, a: Args, mask_key: str | None) -> list[Any]:
    q, k, v = _checked(a)
    results = len(node.meta["val"])
    if results > 3 and 3 in imp.used.get(node, set()):
        raise Untranslatable("the gradient of an attention bias")
    if any(_result_shape(node, i) != x.shape for i, x in enumerate((q, k, v))):
        raise Untranslatable("gradients of other shapes than q, k and v (heads repeated inside the kernel)")
    lse, sq = a["logsumexp"], q.shape[2]
    stats = imp.tensor(lse)
    if lse.shape == (*q.shape[:3], 1):  # cuDNN's
        pass
    elif lse.rank == 3 and lse.shape[:2] == q.shape[:2] and lse.shape[2] >= sq:
        if lse.shape[2] > sq:  # the efficient kernel's rows padded to a multiple of 32
            stats = imp.g.slice(stats, [slice(None), slice(None), slice(0, sq)], name=imp.op_name("rows"))
        stats = imp.reshape(stats, [*q.shape[:3], 1], name=imp.op_name("stats"))
    else:
        raise Untranslatable(f"a log-sum-exp of shape {list(lse.shape)}")
    mask = a.get(mask_key) if mask_key else None
    kw = attention_options(imp, node, q, k, mask, bool(a.get("is_causal")), a.get("scale"))
    o, do = a["out"], a["grad_out"] if "grad_out" in a else a["grad_out_"]
    dq, dk, dv = imp.g.sdpa_backward(
        imp.tensor(q),
        imp.tensor(k),
        imp.tensor(v),
        imp.tensor(o),
        imp.tensor(do),
        stats,
        name=imp.op_name("sdpa_backward"),
        **kw,
    )
    return [dq, dk, dv] + [None] * (results - 3)


for _name, _mask in FORWARD.items():
    op(_name)(functools.partial(_forward, mask_key=_mask))
for _name, _mask in BACKWARD.items():
    op(_name)(functools.partial(_backward, mask_key=_mask))
