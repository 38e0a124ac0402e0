"""The gradient of an embedding's table (ops/gather.py `embedding_backward`) as generated kernels, two
launches of one module:

    zero      dweight = 0, ZERO elements a program
    scatter   ROWS gradient rows (tokens) x BLOCK columns a program: each row's index loaded once, the
              rows whose index names a table row (in [0, V), not padding_idx) added to that row by
              atomic adds, in fp32

The sums of a table row that several tokens name are made in the order the programs' atomics reach it,
which varies from run to run on a GPU (NumericalNote.NONDETERMINISTIC), as PyTorch's `index_add_` on
CUDA (the torch engine's kernel) makes them. Under the interpreter the programs run one after another.
Any strides: the indices of any rank, the gradient's leading axes walked as the indices' coordinates.
The table's gradient is fp32 (mixed precision's accumulation type): other types stay with the torch
engine (atomics of 16-bit types would round each addition).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ....core.config import NumericalNote, Support
from ....core.device import Device
from ....core.dtypes import DataType
from ....core.ir import Node
from ....core.piece import Piece
from ....core.tensor import TensorDesc
from ....ops.gather import EmbeddingBackward
from ..casts import from_storage
from ..knobs import ScatterKnobs
from .base import (
    Generated,
    Launch,
    Match,
    Template,
    external_params,
    indent,
    module_source,
    offsets_need_int64,
    program_id,
    unique,
)

KIND = EmbeddingBackward.kind


@dataclass(frozen=True)
class Scatter:
    node: Node
    op: EmbeddingBackward
    grad: TensorDesc
    indices: TensorDesc
    dweight: TensorDesc

    @property
    def tokens(self) -> int:
        return math.prod(self.indices.dim)

    @property
    def width(self) -> int:
        return self.grad.dim[-1]


def analyze(piece: Piece) -> Scatter | Support:
    if len(piece.nodes) != 1 or piece.nodes[0].kind != KIND:
        return Support.no("the embedding_backward template runs one embedding_backward op alone")
    node = piece.nodes[0]
    grad, indices = (piece.tensor(node.input(r)) for r in ("grad", "indices"))  # type: ignore[arg-type]
    dweight = piece.tensor(node.output_uids()[0])
    for t in (grad, indices, dweight):
        if t.is_pass_by_value or not all(isinstance(d, int) for d in t.dim):
            return Support.no(f"{t.label()} is a pass-by-value scalar or has dynamic dims", node)
    if grad.data_type is DataType.DOUBLE:
        return Support.no(f"{grad.label()} is float64, which the torch engine sums in float64", node)
    if dweight.data_type is not DataType.FLOAT:
        return Support.no(
            f"the table's gradient {dweight.label()} is {dweight.data_type.value}; the scatter adds in fp32 by "
            "atomics (other types would round each addition)",
            node,
        )
    return Scatter(node, node.op_as(EmbeddingBackward), grad, indices, dweight)


def candidate_knobs(s: Scatter, device: Device) -> list[ScatterKnobs]:
    """GPU: 16 tokens x up to 1024 columns a program (a row's 4 KiB of fp32 adds in flight per token),
    then 4 tokens; the zeroing launch 4096 elements a program. Interpreter: small tiles, several programs
    along both axes, so the masks and the grid all run."""
    cols = 1 << max(0, math.ceil(math.log2(max(s.width, 1))))
    if not device.is_cuda:
        return unique(
            [ScatterKnobs(ROWS=4, BLOCK=min(cols, 16), ZERO=64), ScatterKnobs(ROWS=2, BLOCK=min(cols, 8), ZERO=32)]
        )
    return unique(
        [
            ScatterKnobs(ROWS=16, BLOCK=min(cols, 1024), ZERO=4096, num_warps=8),
            ScatterKnobs(ROWS=4, BLOCK=min(cols, 1024), ZERO=4096, num_warps=4),
        ]
    )


def _coords(s: Scatter, t: str) -> tuple[str, str]:
    """The offsets of token `t`'s index and of its gradient row (expressions of `t`, the flat token number
    in the indices' row-major order)."""
    dims = s.indices.dim
    idx_terms, grad_terms = [], []
    for k, size in enumerate(dims):
        if size == 1:
            continue
        inner = math.prod(dims[k + 1 :])
        c = t if inner == 1 else f"({t} // {inner})"
        if k > 0 and math.prod(dims[:k]) > 1:
            c = f"({c} % {size})"
        idx_terms.append(f"{c} * {s.indices.stride[k]}")
        grad_terms.append(f"{c} * {s.grad.stride[k]}")
    return " + ".join(idx_terms) or "0", " + ".join(grad_terms) or "0"


class EmbeddingBackwardTemplate(Template):
    name = "embedding_backward"
    priority = 20
    main_kinds = (KIND,)
    knob_class = ScatterKnobs

    def match(self, piece: Piece, device: Device) -> Support | EmbeddingBackwardMatch:
        s = analyze(piece)
        return s if isinstance(s, Support) else EmbeddingBackwardMatch(self, piece, device, s)


class EmbeddingBackwardMatch(Match[ScatterKnobs]):
    def __init__(self, template: EmbeddingBackwardTemplate, piece: Piece, device: Device, scatter: Scatter) -> None:
        super().__init__(template, piece, device)
        self.s = scatter

    def candidates(self) -> list[ScatterKnobs]:
        return candidate_knobs(self.s, self.device)

    def notes(self, knobs: ScatterKnobs) -> frozenset[NumericalNote]:
        return frozenset({NumericalNote.NONDETERMINISTIC})

    def launches(self, knobs: ScatterKnobs) -> int:
        return 2

    def generate(self, knobs: ScatterKnobs) -> Generated:
        s = self.s
        params, args = external_params(self.piece, [*self.piece.inputs, *self.piece.outputs])
        g, idx, w = (f"p{t.uid}" for t in (s.grad, s.indices, s.dweight))
        rows, width = s.dweight.dim
        w0, w1 = s.dweight.stride
        # the zeroing launch: the table's elements in row-major order
        big = offsets_need_int64((s.dweight,), lanes=knobs.ZERO)
        zero = [
            f"lin = {program_id(0, big)} * {knobs.ZERO} + tl.arange(0, {knobs.ZERO})",
            f"mask = lin < {rows * width}",
            f"tl.store({w} + (lin // {width}) * {w0} + (lin % {width}) * {w1}, tl.zeros([{knobs.ZERO}], tl.float32), "
            "mask=mask)",
        ]
        idx_off, grad_off = _coords(s, "t")
        valid = ["tmask", "(row >= 0)", f"(row < {rows})"]
        if s.op.padding_idx >= 0:
            valid.append(f"(row != {s.op.padding_idx})")
        grad_value = from_storage(
            f"tl.load({g} + goff[:, None] + d[None, :] * {s.grad.stride[-1]}, mask=both, other=0)",
            s.grad.data_type,
            "tl.float32",
        )
        scatter = [
            f"t = tl.program_id(0).to(tl.int64) * {knobs.ROWS} + tl.arange(0, {knobs.ROWS})",
            f"tmask = t < {s.tokens}",
            f"row = tl.load({idx} + {idx_off}, mask=tmask, other=-1).to(tl.int64)",
            f"ok = {' & '.join(valid)}",
            f"goff = {grad_off}",
            f"d = tl.program_id(1).to(tl.int64) * {knobs.BLOCK} + tl.arange(0, {knobs.BLOCK})",
            f"both = ok[:, None] & (d < {width})[None, :]",
            f"tl.atomic_add({w} + row[:, None] * {w0} + d[None, :] * {w1}, {grad_value}, mask=both)",
        ]
        kernels = [
            f"def kernel_zero({', '.join(params)}):\n{indent(zero)}\n",
            f"def kernel_scatter({', '.join(params)}):\n{indent(scatter)}\n",
        ]
        warps = (("num_warps", knobs.warps),)
        launches = (
            Launch("kernel_zero", (-(-rows * width // knobs.ZERO),), tuple(args), warps),
            Launch("kernel_scatter", (-(-s.tokens // knobs.ROWS), -(-width // knobs.BLOCK)), tuple(args), warps),
        )
        return Generated(module_source(*kernels), launches)


TEMPLATE = EmbeddingBackwardTemplate()
