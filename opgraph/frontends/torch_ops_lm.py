"""Translators of the ops language models add to the table: embedding lookup, boolean not, RMSNorm
(masked_fill is torch_ops.py's, beside where).

    embedding(W, idx)          -> embedding (opgraph.ops.gather), padding_idx carried for the backward
    bitwise_not(mask), bool    -> logical_not
    rms_norm(x, shape, w, eps) -> rmsnorm (inference form; eps None is finfo(x.dtype).eps, PyTorch's)
"""

from __future__ import annotations

from typing import Any

from ..core.tensor import Tensor
from .torch_importer import Args, Importer, Untranslatable
from .torch_ops import _shape, op


@op("embedding")
def _embedding(imp: Importer, node: Any, a: Args) -> Tensor:
    w, idx = a["weight"], a["indices"]
    if a.get("scale_grad_by_freq") or a.get("sparse"):
        raise Untranslatable("embedding with scale_grad_by_freq or sparse gradients")
    if w.rank != 2 or idx.dtype.is_floating_point:
        raise Untranslatable("embedding of a table that is not 2-D, or with floating indices")
    pad = int(a.get("padding_idx", -1))
    pad = pad + w.shape[0] if pad < -1 else pad  # aten keeps -1 for none; other negatives count back
    t = imp.g.embedding(imp.tensor(w), imp.reshaped(idx, idx.shape or (1,)), padding_idx=pad, name=imp.op_name())
    return t if idx.rank else imp.g.reshape(t, [w.shape[1]], name=imp.op_name("squeeze"))


@op("bitwise_not")
def _bitwise_not(imp: Importer, node: Any, a: Args) -> Tensor:
    x = a["self"]
    if x.dtype != imp.torch.bool:
        raise Untranslatable("bitwise_not of an integer tensor")
    return imp.g.logical_not(imp.tensor(x), name=imp.op_name())


@op("rms_norm")
def _rms_norm(imp: Importer, node: Any, a: Args) -> Tensor:
    x, shape, w = a["input"], list(a["normalized_shape"]), a.get("weight")
    full = (1,) * (x.rank - len(shape)) + tuple(shape)
    eps = a.get("eps")
    if eps is None:
        eps = imp.torch.finfo(x.dtype).eps
    if not isinstance(eps, (int, float)):
        raise Untranslatable("rms_norm with a tensor eps")
    torch = imp.torch
    scale = imp.reshaped(w, full) if w is not None else imp.tensor(
        imp.constant_value(torch.ones(full, dtype=imp.g.intermediate_data_type.to_torch()), "ones"))
    if tuple(_shape(node)) != x.shape:
        raise Untranslatable("rms_norm whose result is not the input's shape")
    return imp.g.rmsnorm("inference", imp.tensor(x), scale, epsilon=float(eps), name=imp.op_name())[0]
