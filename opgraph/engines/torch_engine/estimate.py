"""The cost model's view of an op-by-op piece (opgraph.cost, heuristic mode A): unlike a fused
kernel, every op reads its inputs and writes its output in full, in the compute type (float32)
where it upcasts, and each op is a few kernel launches (upcast, math, rounding). Exact-fp32 GEMMs
run at about a tenth of the tensor-core rate."""

from __future__ import annotations

from ...core.device import Device
from ...core.piece import Piece
from ..cost import LAUNCH_US, piece_bytes, piece_flops, rates

LAUNCHES_PER_OP = 3
FP32_GEMM_SLOWDOWN = 10.0


def estimate_us(piece: Piece, device: Device, tensor_cores: bool, native: bool = False) -> float | None:
    """Device µs of the piece op by op; `native`: a lone 16-bit matmul (torch_engine.native_gemm),
    one cuBLAS kernel whose loads overlap its math, writing its output in place."""
    if not device.is_cuda:
        return None
    bw, peak = rates(device)
    if native:
        return max(piece_bytes(piece) / bw, piece_flops(piece) / peak) * 1e6 + LAUNCH_US
    moved = 0
    for node in piece.nodes:
        for uid in (*node.input_uids(), *node.output_uids()):
            t = piece.tensor(uid)
            if not t.is_pass_by_value:
                moved += t.numel * max(t.data_type.itemsize, 4) if uid in node.input_uids() else t.nbytes
    math_rate = peak if tensor_cores else peak / FP32_GEMM_SLOWDOWN
    seconds = moved / bw + piece_flops(piece) / math_rate
    return seconds * 1e6 + LAUNCH_US * LAUNCHES_PER_OP * len(piece.nodes)
