"""A lone 16-bit matmul: one matmul whose operands and result are one fp16 or bf16 type, computed in fp32,
after nothing but views that shape its operands out of the piece's inputs (a transposed weight, a batch
merged into rows, as AOTAutograd's linear layers read them). A vendor GEMM (cuBLAS) runs it as it is,
accumulating in fp32 and writing the result into the output buffer: the torch engine's direct path runs
it so (PyTorch makes the views, copying only where a reshape must), the library engine offers it as its
vendor-library piece (PieceFact.NATIVE_GEMM), and the build's policy lets that lead
(bench/results/constants.md#lone-matmuls)."""

from __future__ import annotations

from ...core.dtypes import DataType
from ...core.piece import Piece
from ...ops.layout import VIEW_KINDS

NATIVE_16 = frozenset({DataType.HALF, DataType.BFLOAT16})  # 16-bit types cuBLAS/cuDNN run as they are


def native_gemm(piece: Piece) -> bool:
    """Whether the piece is one matmul of two operands whose operands and result are one NATIVE_16 type,
    computed in fp32, after views of the piece's inputs read by nothing else (`operand_views`)."""
    return _lone_gemm_result(piece) == "native"


def widening_gemm(piece: Piece) -> bool:
    """Whether the piece is such a matmul (`native_gemm`) but for its fp32 result, which cuBLAS writes as
    it accumulates (PyTorch's `out_dtype=torch.float32`): exact, without the operands' fp32 copies. Only
    for the operand shapes PyTorch has that call for (`widens`)."""
    if _lone_gemm_result(piece) != "fp32":
        return False
    tensors = piece.graph.tensors
    a, b = (tensors[u].dim for u in piece.nodes[-1].input_uids())
    return widens(a, b)


def widens(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether operands of dims `a` @ `b` have a PyTorch call that writes an fp32 product of 16-bit ones
    (torch_engine.gemm.widened): a 2-D B under any batch axes of A (B's unit batch axes dropped where A has as
    many), or 3-D operands of one batch."""
    if len(b) == 2 or (len(b) <= len(a) and all(d == 1 for d in b[:-2])):
        return len(a) >= 2
    return len(a) == len(b) == 3 and a[0] == b[0]


def widening_types(a: DataType, b: DataType, out: DataType) -> bool:
    """Whether a product of `a` and `b` operands into an `out` result is 16-bit of one type into fp32."""
    return a in NATIVE_16 and a is b and out is DataType.FLOAT


def _lone_gemm_result(piece: Piece) -> str | None:
    node = piece.nodes[-1]
    if node.kind != "matmul" or not operand_views(piece):
        return None
    ins, outs = node.input_uids(), node.output_uids()
    if len(ins) != 2 or len(outs) != 1 or outs[0] not in piece.outputs:
        return None
    tensors = piece.graph.tensors
    a, b = (tensors[u].data_type for u in ins)
    if a not in NATIVE_16 or a is not b or node.compute_data_type is not DataType.FLOAT:
        return None
    out = tensors[outs[0]].data_type
    return "native" if out is a else "fp32" if widening_types(a, b, out) else None


def operand_views(piece: Piece) -> bool:
    """Whether every op before the piece's last is a view reading the piece's inputs or such views, whose
    result only those views or the last op read (and is no output of the piece)."""
    made: set[int] = set()
    readers: dict[int, int] = {}
    for n in piece.nodes:
        for u in n.input_uids():
            readers[u] = readers.get(u, 0) + 1
    for n in piece.nodes[:-1]:
        if n.kind not in VIEW_KINDS or any(u not in piece.inputs and u not in made for u in n.input_uids()):
            return False
        if any(u in piece.outputs or readers.get(u, 0) != 1 for u in n.output_uids()):
            return False
        made.update(n.output_uids())
    return True
