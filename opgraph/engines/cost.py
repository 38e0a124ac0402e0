"""The cost model behind heuristic mode A: the bytes a piece must move and the math it must do,
against the device's bandwidth and math rate (DEVICE_RATES, one row per GPU family). It ranks and
explains; it does not replace timing."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

from ..core.device import Device
from ..core.piece import Piece

EVIDENCE = "bench/results/constants.md"


@dataclass(frozen=True)
class DeviceRates:
    """The measured ceilings of a GPU family: what every cost model divides bytes and flops by."""

    family: str  # a device whose name contains this is of the family
    copy_bytes_per_s: float  # a device-to-device copy (bandwidth)
    gemm_flops_per_s: float  # an fp16 GEMM (math)
    evidence: str = ""  # the results the ceilings were measured in


# the lent machines' GPUs, measured (in order: the first family a device's name contains is its)
DEVICE_RATES: tuple[DeviceRates, ...] = (
    DeviceRates("H200", 4.2e12, 7.0e14, f"{EVIDENCE}#device-rates"),
    DeviceRates("H100", 3.0e12, 7.0e14, f"{EVIDENCE}#device-rates"),
)
DEFAULT_RATES = DeviceRates("other", 1.5e12, 1.5e14)  # other GPUs: conservative, not measured
RATES = MappingProxyType({r.family: (r.copy_bytes_per_s, r.gemm_flops_per_s) for r in DEVICE_RATES})
LAUNCH_US = 3.0  # device µs an estimate adds per kernel launch


def device_rates(device: Device) -> DeviceRates:
    return next((r for r in DEVICE_RATES if r.family in device.name), DEFAULT_RATES)


def rates(device: Device) -> tuple[float, float]:
    """(bytes/s, flop/s) of the device's family (`device_rates`)."""
    r = device_rates(device)
    return r.copy_bytes_per_s, r.gemm_flops_per_s


def piece_bytes(piece: Piece) -> int:
    """Each input read once, each output written once."""
    return sum(piece.tensor(u).nbytes for u in (*piece.inputs, *piece.outputs) if not piece.tensor(u).is_pass_by_value)


def piece_flops(piece: Piece) -> int:
    """2*M*N*K for the GEMM-class ops in the piece; elementwise math is free next to memory."""
    total = 0
    for node in piece.nodes:
        out = [piece.tensor(u) for u in node.output_uids()]
        ins = [piece.tensor(u) for u in node.input_uids()]
        if node.kind == "conv_fprop":  # Y [N, K, P...] from W [K, C/G, R...]
            total += 2 * out[0].numel * ins[1].dim[1] * math.prod(ins[1].dim[2:])
        elif node.kind == "conv_dgrad":  # DX [N, C, H...] from DY [N, K, P...], W [K, C/G, R...]
            k, cg, c = ins[1].dim[0], ins[1].dim[1], out[0].dim[1]
            total += 2 * out[0].numel * (k * cg // c) * math.prod(ins[1].dim[2:])
        elif node.kind == "conv_wgrad":  # DW [K, C/G, R...] from DY [N, K, P...]
            total += 2 * out[0].numel * ins[1].numel // ins[1].dim[1]
        elif node.kind == "matmul":
            total += 2 * out[0].numel * ins[0].dim[-1]
        elif node.kind in ("sdpa", "sdpa_backward"):
            total += attention_flops(node, piece)
    return total


def attention_flops(node, piece: Piece) -> int:
    """QK^T and PV per (b, h, i, j) (backward: those two recomputed or re-read, and dV, dP, dQ, dK),
    halved for a causal mask on a square problem."""
    b, hq, sq, d = piece.tensor(node.input("q")).dim
    skv, dv = piece.tensor(node.input("v")).dim[2], piece.tensor(node.input("v")).dim[3]
    per = (d + dv) if node.kind == "sdpa" else (3 * d + 2 * dv)
    pairs = b * hq * sq * skv
    if (node.op.use_causal_mask or node.op.use_causal_mask_bottom_right) and sq == skv:
        pairs //= 2
    return 2 * pairs * per


def estimate_us(piece: Piece, device: Device, launches: int = 1) -> float | None:
    if not device.is_cuda:
        return None
    bw, peak = rates(device)
    return max(piece_bytes(piece) / bw, piece_flops(piece) / peak) * 1e6 + LAUNCH_US * launches
