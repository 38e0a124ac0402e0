"""Matmul: C = A @ B over the last two axes, batch axes broadcast.

    A [b..., M, K],  B [b'..., K, N]  ->  C [B..., M, N],   C[i, m, n] = sum_k A[i, m, k] * B[i, k, n]

A and B have the same rank (>= 2); each batch axis is equal in both or 1 in one of them, which
broadcasts (the pointwise rule: a batch of weights shared by every batch entry is dims [1, K, N]).
Operands may have any strides (row-major, column-major i.e. transposed, gapped); dims are logical.
C is packed row-major by default.

Types: floating operands of any (possibly mixed) float types, or integer operands (INT8, UINT8,
INT32, INT64) which accumulate exactly (the reference is exact while |partial sums| < 2**53; an
engine must accumulate in a wide integer). Integer and float operands do not mix and BOOLEAN is
rejected. C's type follows the graph defaults (io type for an output, intermediate type when
virtual); int8 GEMMs usually set C to INT32.

NaN and infinities (docs/concepts.md, "NaN, infinities and overflow"): IEEE arithmetic of the sum.
A NaN in row m of A or column n of B makes C[m, n] NaN; inf * 0 is NaN; +inf and -inf among the
products give NaN; an exact sum beyond C's type is +-inf. Where the order of the sum decides (a
partial sum that passes the compute type's range in some orders only) either answer is correct.

cuDNN's `padding` attribute (the value of out-of-bound elements of ragged operands) is accepted
only as 0.0: opgraph has no ragged tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.dtypes import DataType
from ..core.errors import AttributeValueError, DataTypeError, ShapeError
from ..core.op import NodeContext, Op, TensorSpec, graph_method, register_op
from ..core.tensor import packed_strides
from .base import broadcast_pair


@register_op
@dataclass(frozen=True, kw_only=True)
class Matmul(Op):
    """C = A @ B with broadcast batch axes (see the module docstring)."""

    kind = "matmul"
    DYNAMIC = True
    INPUTS = ("A", "B")
    OUTPUTS = ("C",)

    def infer(self, ctx: NodeContext) -> list[TensorSpec]:
        a = ctx.tensor("A")
        b = ctx.tensor("B")
        for role, t in (("A", a), ("B", b)):
            if len(t.dim) < 2:
                ctx.error(
                    ShapeError,
                    f"input '{role}' dims {list(t.dim)} have rank {len(t.dim)}; matmul needs rank >= 2",
                    tensor=role,
                    rule="matmul.rank",
                    hint="give a vector a unit axis: [K] becomes [1, K] (A) or [K, 1] (B)",
                )
            if t.data_type is DataType.BOOLEAN:
                ctx.error(
                    DataTypeError,
                    f"input '{role}' is BOOLEAN; matmul multiplies numbers",
                    tensor=role,
                    rule="matmul.bool",
                    hint="cast it to a float or integer type first",
                )
        if a.data_type.is_integer != b.data_type.is_integer:
            ctx.error(
                DataTypeError,
                f"input 'A' is {a.data_type.name} but 'B' is {b.data_type.name}: integer and float operands do not mix",
                tensor="B",
                rule="matmul.dtype_mix",
                hint="cast one operand so both are integer (int8 GEMM) or both floating",
            )
        if len(a.dim) != len(b.dim):
            ctx.error(
                ShapeError,
                f"input 'B' has rank {len(b.dim)} (dims {list(b.dim)}) but 'A' has rank {len(a.dim)} "
                f"(dims {list(a.dim)})",
                tensor="B",
                rule="matmul.batch_rank",
                hint="give both operands the same rank, with 1 in broadcast batch axes",
            )
        m, k = a.dim[-2:]
        k2, n = b.dim[-2:]
        if k != k2:
            ctx.error(
                ShapeError,
                f"input 'A' dims {list(a.dim)} have K = {k} (last axis) but 'B' dims {list(b.dim)} "
                f"have K = {k2} (second-to-last axis)",
                tensor="B",
                rule="matmul.k",
                hint="A is [..., M, K] and B [..., K, N]; to use B's transpose, give B transposed strides",
            )
        batch = []
        for axis, (x, y) in enumerate(zip(a.dim[:-2], b.dim[:-2])):
            if x != y and x != 1 and y != 1:
                ctx.error(
                    ShapeError,
                    f"batch axis {axis} of 'A' {list(a.dim)} and 'B' {list(b.dim)} do not broadcast ({x} vs {y})",
                    tensor="B",
                    rule="matmul.batch",
                    hint="make batch axes equal, or 1 in one operand",
                )
            batch.append(broadcast_pair(x, y))
        dim = (*batch, m, n)
        return [TensorSpec(dim, packed_strides(dim))]

    def reference(self, ins, outs):
        a, b = ins
        assert a is not None and b is not None
        return [np.matmul(a, b)]


@graph_method
def matmul(self, A, B, compute_data_type=None, padding=0.0, name=""):
    """C = A @ B over the last two axes, batch axes broadcast.

    Shapes: A [b..., M, K] and B [b'..., K, N] of the same rank (>= 2; a plain GEMM is rank 3 with
    batch 1) -> C [B..., M, N]; each batch axis is equal in both or 1 in one (a weight shared by the
    whole batch is [1, K, N]).

    Layouts: any strides: row-major, column-major (a transposed operand: strides [.., 1, K]), gapped
    or sliced; the GEMM templates read them in place. C is packed row-major unless set.

    Types: float operands (HALF, BFLOAT16, FLOAT, DOUBLE, FP8; may be mixed), summed in
    `compute_data_type` (default FLOAT; FLOAT products may use TF32 on the GPU, noted
    `down_convert_inputs`), or integer operands summed exactly (set C to INT32 for int8 GEMMs).

    Formula: `C[i, m, n] = sum_k A[i, m, k] * B[i, k, n]`.

    Args:
        A: the left operand [b..., M, K].
        B: the right operand [b'..., K, N].
        compute_data_type: the type products are summed in.
        padding: cuDNN's value for out-of-bound elements of ragged operands; opgraph has no ragged
            tensors, so only 0.0 is accepted (kept for cuDNN frontend compatibility).
        name: the op's name.

    Returns:
        C, a virtual tensor.

    Example:
        ```python
        x = g.tensor(dim=[1, 4096, 1024], name="x")
        w = g.tensor(dim=[1, 1024, 4096], stride=[4194304, 1, 1024], name="w")   # stored transposed
        y = g.gelu(g.matmul(x, w)).set_output(True)    # [1, 4096, 4096], one fused kernel
        ```
    """
    if not isinstance(padding, (int, float)) or isinstance(padding, bool) or padding != 0:
        raise AttributeValueError(
            f"padding={padding!r} is not supported; opgraph's matmul has no ragged operands to pad",
            op=f"matmul '{name}'",
            rule="matmul.padding",
            hint="leave padding at 0.0",
        )
    return self._add_op(Matmul(), [A, B], name=name, compute_data_type=compute_data_type)[0]


@graph_method
def scaled_matmul(
    self,
    A,
    B,
    scale_a=None,
    scale_b=None,
    out_data_type=None,
    amax: bool = False,
    name: str = "",
):
    """D = (A @ B) * scale_a * scale_b, cast to `out_data_type`, and optionally amax(|D|) before the cast:
    an fp8 GEMM as Transformer Engine and `torch._scaled_mm` run it, expressed in the graph's own ops (a
    matmul, pointwise muls and a cast, a reduction of mode AMAX), which the matmul template fuses into one
    kernel (on Hopper and Ada on the fp8 tensor cores).

    Shapes: A [b..., M, K] and B [b'..., K, N] as `matmul`; scale_a a 1-element tensor (per tensor) or
    [b..., M, 1] (per row of A), scale_b 1-element or [1..., 1, N] (per column of B), each of D's rank; a
    Python number is a constant scale. amax has D's rank with every dim 1.

    Layouts: as `matmul` (any strides; fp8 GEMMs run fastest with A row-major and B column-major, as
    cuBLAS's fp8 GEMMs take them); D packed row-major unless set.

    Types: fp8 (E4M3, E5M2) operands, and any the matmul takes; the product and the scales in FLOAT; D in
    `out_data_type` (default: the graph's intermediate type while virtual); amax in FLOAT.

    Formula: `D = (sum_k A[m, k] * B[k, n]) * scale_a * scale_b`, `amax = max |D|` (before the cast).

    Args:
        A: the left operand.
        B: the right operand.
        scale_a: A's dequantization scale (None: 1).
        scale_b: B's dequantization scale (None: 1).
        out_data_type: D's type (an E4M3 output is the cast of D: quantize with a scale of your own first).
        amax: also return the amax of D.
        name: a prefix of the ops' names.

    Returns:
        D, or [D, amax] with `amax`.

    Example:
        ```python
        g = og.Graph("fp8", io_data_type=og.DataType.FP8_E4M3, intermediate_data_type=og.DataType.FLOAT)
        a = g.tensor(dim=[1, 8192, 8192], name="a")
        b = g.tensor(dim=[1, 8192, 8192], stride=[8192 * 8192, 1, 8192], name="b")   # column-major
        sa = g.tensor(dim=[1, 1, 1], data_type=og.DataType.FLOAT, name="sa")
        sb = g.tensor(dim=[1, 1, 1], data_type=og.DataType.FLOAT, name="sb")
        d, amax = g.scaled_matmul(a, b, sa, sb, out_data_type=og.DataType.BFLOAT16, amax=True)
        d.set_output(True)
        amax.set_output(True)
        ```
    """

    def called(part: str) -> str:
        return f"{name}.{part}" if name else ""

    d = self.matmul(A, B, compute_data_type=DataType.FLOAT, name=called("matmul")).set_data_type(DataType.FLOAT)
    for scale, role in ((scale_a, "scale_a"), (scale_b, "scale_b")):
        if scale is not None:
            d = self.mul(d, scale, name=called(role)).set_data_type(DataType.FLOAT)
    out = self.identity(d, name=called("cast"))
    if out_data_type is not None:
        out.set_data_type(out_data_type)
    if not amax:
        return out
    ranks = [len(t.dim) for t in (A, B) if getattr(t, "dim", None) is not None]
    if not ranks:  # (both operands computed: their ranks are known once the graph is inferred)
        self.validate()
        ranks = [len(d.dim)]
    dims = [1] * max(ranks)
    peak = self.reduction(d, mode="AMAX", name=called("amax")).set_dim(dims)
    return [out, peak.set_data_type(DataType.FLOAT)]
