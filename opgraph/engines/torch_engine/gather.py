"""Embedding lookup and its backward in torch: F.embedding on clamped indices with out-of-range rows
zeroed, and a scatter-add (index_add_, atomics on CUDA: NONDETERMINISTIC order of the sums) into an
fp32 (fp64 for DOUBLE) table. No host synchronisation: masks multiply instead of selecting."""

from __future__ import annotations

from typing import Any

from ...core.dtypes import DataType
from ...core.errors import expect
from ...ops.gather import EmbeddingBackward
from .common import Call, implements


def _rows(call: Call, num: int) -> tuple[Any, Any]:
    idx = call.raw("indices").long()
    valid = (idx >= 0) & (idx < num)
    return idx.clamp(0, num - 1), valid


@implements("embedding")
def embedding(call: Call) -> list[Any]:
    import torch

    w = call.raw("weight")
    rows, valid = _rows(call, w.shape[0])
    out = torch.nn.functional.embedding(rows, w)
    return [torch.where(valid.unsqueeze(-1), out, torch.zeros((), dtype=out.dtype, device=out.device))]


@implements("embedding_backward")
def embedding_backward(call: Call) -> list[Any]:
    import torch

    op = call.node.op_as(EmbeddingBackward)
    g = call.raw("grad")
    wide = DataType.DOUBLE in (call.tensor_desc("grad").data_type, expect(call.out("dweight"), "dweight").data_type)
    acc = torch.float64 if wide else torch.float32
    rows, valid = _rows(call, op.num_weights)
    if op.padding_idx >= 0:
        valid = valid & (rows != op.padding_idx)
    d = g.shape[-1]
    src = (g.to(acc) * valid.unsqueeze(-1).to(acc)).reshape(-1, d)
    out = torch.zeros((op.num_weights, d), dtype=acc, device=g.device)
    return [out.index_add_(0, rows.reshape(-1), src)]
