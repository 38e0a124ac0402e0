"""Gather ops: embedding lookup (rows of a table picked by integer indices) and its backward.

    embedding(weight [V, D], indices [i...])  ->  output [i..., D]
        output[i..., :] = weight[indices[i...], :]    an index outside [0, V) reads a row of zeros
    embedding_backward(grad [i..., D], indices [i...], num_weights=V)  ->  dweight [V, D]
        dweight[v, :] = sum of grad[i..., :] over the positions i with indices[i...] == v
        (a scatter-add), except v == padding_idx, whose row stays zero; indices outside [0, V) add
        nothing

`padding_idx` (-1: none, PyTorch's convention for aten.embedding) does not change the forward: it
is carried so that the backward leaves that row's gradient zero, as torch.nn.Embedding does.
Out-of-range indices are defined (zeros, nothing added) rather than undefined so that no engine
reads or writes outside the table, whatever the indices hold.

Types: integer indices (INT8, UINT8, INT32, INT64), floating weight and grad. The outputs take the
graph's defaults (io type for an output, intermediate type when virtual) unless set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import AttributeValueError, DataTypeError, ShapeError
from ..core.op import NodeContext, Op, TensorSpec, graph_method, register_op
from ..core.tensor import packed_strides


def _check_indices(ctx: NodeContext, role: str) -> None:
    t = ctx.tensor(role)
    if not t.data_type.is_integer:
        ctx.error(
            DataTypeError,
            f"input '{role}' is {t.data_type.name}; indices must be an integer type",
            tensor=role,
            rule="gather.index_type",
            hint="pass the indices as INT64 or INT32",
        )


def _check_float(ctx: NodeContext, role: str) -> None:
    t = ctx.tensor(role)
    if not t.data_type.is_floating:
        ctx.error(
            DataTypeError,
            f"input '{role}' is {t.data_type.name}; it must be a floating type",
            tensor=role,
            rule="gather.float",
            hint="cast it to a float type first",
        )


def _rows(idx: np.ndarray, num: int) -> tuple[np.ndarray, np.ndarray]:
    """(row numbers with out-of-range ones replaced by 0, mask of the in-range ones)."""
    i = np.nan_to_num(idx, nan=-1.0).astype(np.int64)
    valid = (i >= 0) & (i < num)
    return np.where(valid, i, 0), valid


@register_op
@dataclass(frozen=True, kw_only=True)
class Embedding(Op):
    """output[i..., :] = weight[indices[i...], :]; zeros for indices outside [0, V)."""

    kind = "embedding"
    DYNAMIC = True
    INPUTS = ("weight", "indices")
    OUTPUTS = ("output",)
    padding_idx: int = -1

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        w, idx = ctx.tensor("weight"), ctx.tensor("indices")
        if len(w.dim) != 2:
            ctx.error(
                ShapeError,
                f"input 'weight' dims {list(w.dim)} are not [num_weights, embedding_dim]",
                tensor="weight",
                rule="embedding.weight_rank",
                hint="pass a 2-D table [V, D]",
            )
        dim = (*idx.dim, w.dim[1])
        return [TensorSpec(dim, packed_strides(dim))]

    def check(self, ctx: NodeContext) -> None:
        _check_float(ctx, "weight")
        _check_indices(ctx, "indices")
        if self.padding_idx < -1 or self.padding_idx >= ctx.tensor("weight").dim[0]:
            ctx.error(
                AttributeValueError,
                f"padding_idx {self.padding_idx} is not a row of the table ({ctx.tensor('weight').dim[0]} rows) or -1",
                tensor="weight",
                rule="embedding.padding_idx",
                hint="pass a row number in [0, V), or -1 for none",
            )

    def reference(self, ins, outs):
        w, idx = ins
        rows, valid = _rows(idx, w.shape[0])
        return [np.where(valid[..., None], w[rows], 0.0)]


@register_op
@dataclass(frozen=True, kw_only=True)
class EmbeddingBackward(Op):
    """dweight[v, :] = sum of grad[i..., :] where indices[i...] == v (v != padding_idx)."""

    kind = "embedding_backward"
    DYNAMIC = True
    INPUTS = ("grad", "indices")
    OUTPUTS = ("dweight",)
    num_weights: int
    padding_idx: int = -1

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        g, idx = ctx.tensor("grad"), ctx.tensor("indices")
        if tuple(g.dim[:-1]) != tuple(idx.dim):
            ctx.error(
                ShapeError,
                f"input 'grad' dims {list(g.dim)} are not the indices' dims {list(idx.dim)} plus the embedding axis",
                tensor="grad",
                rule="embedding_backward.dims",
                hint="pass the gradient of embedding's output, dims [*indices.dim, D]",
            )
        if self.num_weights < 1:
            ctx.error(
                AttributeValueError,
                f"num_weights {self.num_weights} must be >= 1",
                tensor="grad",
                rule="embedding_backward.num_weights",
                hint="pass the table's row count V",
            )
        dim = (self.num_weights, g.dim[-1])
        return [TensorSpec(dim, packed_strides(dim))]

    def check(self, ctx: NodeContext) -> None:
        _check_float(ctx, "grad")
        _check_indices(ctx, "indices")
        if self.padding_idx < -1 or self.padding_idx >= self.num_weights:
            ctx.error(
                AttributeValueError,
                f"padding_idx {self.padding_idx} is not a row of the table ({self.num_weights} rows) or -1",
                tensor="grad",
                rule="embedding.padding_idx",
                hint="pass a row number in [0, V), or -1 for none",
            )

    def reference(self, ins, outs):
        g, idx = ins
        d = g.shape[-1]
        rows, valid = _rows(idx, self.num_weights)
        if self.padding_idx >= 0:
            valid &= rows != self.padding_idx
        out = np.zeros((self.num_weights, d), dtype=np.float64)
        np.add.at(out, rows[valid], g.reshape(*idx.shape, d)[valid])
        return [out]


@graph_method
def embedding(self, weight, indices, padding_idx: int = -1, compute_data_type=None, name: str = ""):
    """Embedding lookup: the rows of `weight` picked by integer `indices`.

    Shapes: weight [V, D], indices [...] (any rank); output [..., D].

    Layouts: any strides; the output is packed row-major.

    Types: weight any floating type; indices INT32 or INT64; the output takes weight's type.

    Formula: `y[..., :] = weight[indices[...], :]`; an index outside [0, V) reads zeros.

    Args:
        weight: the table [V, D].
        indices: integer positions into the table.
        padding_idx: an index whose row gets no gradient in the backward (-1: none), as torch's.
        compute_data_type: the compute type.
        name: the op's name.

    Returns:
        The gathered rows [..., D].

    Example:
        ```python
        wte = g.tensor(dim=[50304, 768], name="wte")
        idx = g.tensor(dim=[8, 1024], name="idx", data_type=og.DataType.INT64)
        x = g.embedding(wte, idx)
        ```
    """
    return self._add_op(
        Embedding(padding_idx=int(padding_idx)), [weight, indices], name=name, compute_data_type=compute_data_type
    )[0]


@graph_method
def embedding_backward(
    self, grad, indices, num_weights: int, padding_idx: int = -1, compute_data_type=None, name: str = ""
):
    """The gradient of an embedding's table: the rows of `grad` scatter-added by index.

    Shapes: grad [..., D], indices [...] (grad's dims without the last); output [num_weights, D].

    Layouts: any strides; the output is packed row-major.

    Types: grad any floating type (accumulated in FLOAT); indices INT32 or INT64.

    Formula: `dW = 0; dW[indices[...], :] += grad[..., :]`, skipping padding_idx and indices outside
    [0, num_weights).

    Args:
        grad: the gradient arriving at the embedding's output.
        indices: the forward's indices.
        num_weights: V, the table's row count.
        padding_idx: an index whose row gets no gradient (-1: none).
        compute_data_type: the accumulation type.
        name: the op's name.

    Returns:
        dW [num_weights, D].

    Example:
        ```python
        dy = g.tensor(dim=[8, 1024, 768], name="dy")
        dw = g.embedding_backward(dy, idx, num_weights=50304)
        ```
    """
    op = EmbeddingBackward(num_weights=int(num_weights), padding_idx=int(padding_idx))
    return self._add_op(op, [grad, indices], name=name, compute_data_type=compute_data_type)[0]
