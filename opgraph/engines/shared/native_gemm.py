"""A lone 16-bit matmul: one matmul whose operands and result are one fp16 or bf16 type, computed in fp32.
A vendor GEMM (cuBLAS) runs it as it is, accumulating in fp32 and writing the result into the output
buffer: the torch engine's direct path runs it so, the library engine offers it as its vendor-library
piece (PieceFact.NATIVE_GEMM), and the build's policy lets that lead (bench/results/constants.md#lone-matmuls)."""

from __future__ import annotations

from ...core.dtypes import DataType
from ...core.piece import Piece

NATIVE_16 = frozenset({DataType.HALF, DataType.BFLOAT16})  # 16-bit types cuBLAS/cuDNN run as they are


def native_gemm(piece: Piece) -> bool:
    """Whether the piece is one matmul of two operands whose operands and result are one NATIVE_16 type,
    computed in fp32."""
    if len(piece.nodes) != 1 or piece.nodes[0].kind != "matmul":
        return False
    node = piece.nodes[0]
    ins, outs = node.input_uids(), node.output_uids()
    if len(ins) != 2 or len(outs) != 1 or outs[0] not in piece.outputs:
        return False
    tensors = piece.graph.tensors
    a, b = (tensors[u].data_type for u in ins)
    return a in NATIVE_16 and a is b is tensors[outs[0]].data_type and node.compute_data_type is DataType.FLOAT
