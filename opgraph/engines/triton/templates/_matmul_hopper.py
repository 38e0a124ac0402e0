"""The matmul template's Hopper path: TMA=1 with TMA_HOST=1, persistent, FLATTEN=1, EPILOGUE_SUBTILE=2.

What changes against TMA=1 alone (device-side descriptors, `tl.make_tensor_descriptor` in the kernel):

- the operands' descriptors are kernel arguments (`ArgKind.DESC`): the launcher encodes each one (a
  128-byte CUtensorMap, `tma_desc.py`) when it binds the kernel and again when the buffer moves, so the
  kernel writes no descriptor to global memory and the launch allocates no scratch for one;
- under FLATTEN the epilogue finds its tile from a second counter (`work_c`) rather than from the loop
  variable, as Triton's persistent-matmul tutorial does: the pipeliner issues the next tile's loads
  before this tile's epilogue without keeping this tile's indices alive across them;
- the stored outputs that allow it (2-D, rows contiguous and 16-byte aligned, fp16 / bf16 / fp32) are
  written by TMA stores through descriptors of their own (`store_descriptors`: no masks, the edges
  clipped by the copy engine), the tile's column halves one after the other under EPILOGUE_SUBTILE=2.

Everything else is the template's: the main loop's descriptor loads (`MatmulMatch.lines`), the tile
header, the fused epilogue (bias, activations, casts, several outputs, reductions) and its column halves.
A buffer read by reference (the plan's address table, for CUDA-graph double buffering) cannot be in a
descriptor encoded at bind: `indirect.make_indirect` turns its parameter into a device-side descriptor
made from the table's address, so those configs stay correct (at TMA=1's speed); the candidates offer
TMA_HOST only where both operands are bound by value.

Why: on an H200 with Triton 3.6 the Hopper lab's persistent host-descriptor kernels with a flattened loop
and a subtiled epilogue reached 0.95-1.00x cuBLAS where device-side descriptors reached 0.69-0.89x (its
results in bench/results/; scripts/hopper_lab/ and scripts/hopper_gemm_check.py measure them).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, cast

from ....core.device import Device
from ....core.dtypes import DataType
from ....core.piece import Piece
from ....core.tensor import TensorDesc
from ....ops.pointwise import PointwiseMode
from ..gemm import Context, GemmPiece, MainLoop, Signature, TileLoop, can_subtile, epilogue, tma_strides
from ..knobs import TileKnobs


class MatmulMatch(Protocol):
    """What this path asks of the matmul template's match (templates/matmul.py)."""

    piece: Piece
    gp: GemmPiece
    device: Device
    sizes: Any

    @property
    def interpret(self) -> bool: ...

    @property
    def problem(self) -> tuple[int, int, int, int]: ...

    @property
    def descriptors(self) -> dict[str, Any]: ...

    @property
    def bucket(self) -> Any: ...

    def geometry(self, role: str, d: Any) -> tuple[list[int], list[int], list[str]]: ...

    def iterations(self, k: TileKnobs) -> int: ...

    def lines(self, ctx: Context, sig: Signature, k: TileKnobs, lo: str, hi: str) -> MainLoop: ...

    def setup(self, ctx: Context, sig: Signature, k: TileKnobs) -> list[str]: ...


HOPPER = (9, 0)  # TMA (cp.async.bulk.tensor) needs compute capability 9.0
# shared memory the operand stages, the TMA stores' staging tiles and the epilogue's scratch may take (the
# compiler refuses a binary over the device's limit: compiler._refuse_oversized; this keeps the first pick valid)
SMEM_BUDGET = 200 * 1024
STORED_TYPES = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT)  # output types stored through descriptors


def host_descriptors(m: MatmulMatch, sig: Signature, k: TileKnobs) -> None:
    """Register the operands' descriptors as kernel parameters desc_A, desc_B (the names the main loop
    loads from): shape, strides and the block in numbers."""
    sizes = {"BLOCK_M": k.BLOCK_M, "BLOCK_N": k.BLOCK_N, "BLOCK_K": k.BLOCK_K, "1": 1}
    for role, d in m.descriptors.items():
        shape, strides, blocks = m.geometry(role, d)
        itemsize = d.desc.data_type.itemsize
        sig.desc(
            f"desc_{role}",
            d.base,
            d.offset,
            shape,
            tma_strides(shape, strides, itemsize),
            [int(sizes[b]) for b in blocks],  # type: ignore[arg-type]
        )


def stage_bytes(m: MatmulMatch, block_m: int, block_n: int, block_k: int) -> int:
    """Shared memory one main-loop stage takes: A's tile and each product's B tile."""
    return (block_m + block_n * len(m.gp.mains)) * block_k * m.problem[3]


def as_matrix(gp: GemmPiece, t: TensorDesc) -> TensorDesc:
    """Output `t` of a space whose columns are split into heads (OutputSpace.cols) as the [M, N] matrix it is
    where it is packed over the rows and over the columns (else as it is): what a 2-D TMA store writes."""
    sp = gp.space
    if not sp.cols or list(t.dim) != list(sp.dims):
        return t
    inner = [(t.dim[a], t.stride[a]) for a in reversed(sp.col_axes)] + [
        (t.dim[a], t.stride[a]) for a in reversed(sp.rows)
    ]
    cols, step = len(sp.col_axes), 1
    for i, (d, s) in enumerate(inner):
        if i == cols:  # (the rows: their innermost stride is the matrix's row stride)
            step = s
        if d != 1 and s != step:
            return t
        step = s * d
    return dataclasses.replace(t, dim=(sp.m, sp.n), stride=(inner[cols][1], 1))


def tma_storable(gp: GemmPiece, t: TensorDesc, uid: int, int_acc: bool = False) -> bool:
    """Whether stored output `uid` (`t`, its view resolved) can go through a TMA store: a 2-D output of the
    tile's space (a split space's packed output as its matrix: `as_matrix`), rows contiguous, 16-byte aligned
    rows, a float type, not a view, not an integer product's exact result (`int_acc`)."""
    t = as_matrix(gp, t)
    size = t.data_type.itemsize
    return not (
        t.data_type not in STORED_TYPES
        or uid in gp.views
        or list(t.dim) != ([gp.space.m, gp.space.n] if gp.space.cols else list(gp.space.dims))
        or t.stride[-1] != 1
        or (t.stride[0] * size) % 16
        or t.stride[0] < t.dim[-1]
        or (uid == gp.out and int_acc)
    )


def store_descriptors(
    m: MatmulMatch, ctx: Context, sig: Signature, k: TileKnobs, budget: int = SMEM_BUDGET, held: int = 0
) -> None:
    """TMA stores of the stored outputs that allow them (ctx.tma_stores): a 2-D output of the tile's
    space, rows contiguous, 16-byte aligned rows, a float type; while the operands' stages, `held` bytes
    of the kernel's other tiles and the staging tiles fit in `budget` bytes of shared memory. The others
    keep pointer stores."""
    gp, sp = m.gp, m.gp.space
    if sp.nbatch * sp.groups != 1 or (len(sp.dims) != 2 and not sp.cols):
        return
    assert k.BLOCK_K is not None
    cols = k.BLOCK_N // 2 if k.subtile == 2 and can_subtile(ctx) else k.BLOCK_N
    smem = held + k.stages * stage_bytes(m, k.BLOCK_M, k.BLOCK_N, k.BLOCK_K)
    if gp.reductions and not ctx.gluon:  # Triton's layout conversion for the tile's sums: an fp32 (sub)tile
        smem += k.BLOCK_M * cols * 4  # (a Gluon kernel sums its accumulator's rows by warp shuffles)
    int_acc = ctx.dot is not None and ctx.dot.is_int
    for uid in gp.stores:
        t = ctx.tensors[uid]
        size = t.data_type.itemsize
        # (a by-reference output's descriptor is made in the kernel from the table's address, its shape spelled
        # out: a bucket kernel's would be the hint's at every shape)
        if (t.is_by_reference and ctx.sizes is not None) or not tma_storable(gp, t, uid, int_acc):
            continue
        smem += k.BLOCK_M * cols * size
        if smem > budget:
            return
        t = as_matrix(gp, t)
        ctx.tma_stores[uid] = sig.desc(
            f"desc_c{uid}", uid, 0, list(t.dim), tma_strides(list(t.dim), list(t.stride), size), [k.BLOCK_M, cols]
        )


def host_tma_ok(m: MatmulMatch, device: Device) -> bool:
    """Whether the candidates offer the Hopper path: a GPU with TMA, both operands readable through a
    descriptor with nested strides, and neither bound by reference (those would be read through
    device-side descriptors)."""
    if not device.is_cuda or device.capability is None or device.capability < HOPPER:
        return False
    if len(m.descriptors) != 1 + len(m.gp.mains):  # (A, and each product's B)
        return False
    for role, d in m.descriptors.items():
        shape, strides, _ = m.geometry(role, d)
        aligned = [cast(int, s) for s in tma_strides(shape, strides, d.desc.data_type.itemsize)]  # (static piece)
        # nested strides, as cuTensorMapEncodeTiled describes a tensor (a broadcast batch axis is not)
        if any(aligned[i] < aligned[i + 1] * shape[i + 1] for i in range(len(shape) - 1)):
            return False
        if m.piece.graph.tensors[d.base].is_by_reference:
            return False
    return True


# pointwise modes whose math takes tens of instructions an element (libdevice polynomials, special-function
# units): in a persistent kernel of one program a multiprocessor the epilogue is not overlapped with the
# next tile's main loop (BERT's up-projection with the erf GELU ran at ~375 TFLOP/s on an H200, the
# same GEMMs without it at ~545; the GELU ~13 fp32 instructions an element in the PTX)
MATH_HEAVY = frozenset(
    PointwiseMode[m]
    for m in ("ERF", "GELU_FWD", "GELU_APPROX_TANH_FWD", "TANH_FWD", "SIGMOID_FWD", "SWISH_FWD", "SOFTPLUS_FWD")
    + ("ELU_FWD", "EXP", "LOG")
)


def math_heavy_epilogue(gp: Any) -> bool:
    """Whether the piece's epilogue runs MATH_HEAVY pointwise ops."""
    return any(n.kind == "pointwise" and n.op.mode in MATH_HEAVY for n in gp.epilogue)


def occupancy_config(c: TileKnobs, device: Device) -> TileKnobs:
    """The Hopper path with two programs a multiprocessor, so that one's epilogue runs beside the other's
    main loop: 128x128x64 tiles of 8 warps, 2 stages, the epilogue on column halves, PERSISTENT twice the
    multiprocessors (ptxas, sm_90, BERT's up-projection with the erf GELU: 121 registers and 82 KB of
    shared memory a program, no spills; 3 stages would take 115 KB). A tuning candidate for math-heavy
    epilogues (scripts/hopper_gemm_check.py --occupancy measures it)."""
    return hopper_config(c, device).replace(
        BLOCK_M=128,
        BLOCK_N=128,
        BLOCK_K=64,
        num_warps=8,
        num_stages=2,
        PERSISTENT=2 * device.sm_count,
        EPILOGUE_SUBTILE=2,
    )


def hopper_config(c: TileKnobs, device: Device) -> TileKnobs:
    """The Hopper-path version of a plain config: host descriptors, persistent, flattened, and the epilogue
    on column halves for the large tiles."""
    return c.replace(
        SPLIT_K=1,
        TMA=1,
        TMA_HOST=1,
        PERSISTENT=device.sm_count,
        FLATTEN=1,
        EPILOGUE_SUBTILE=2 if c.BLOCK_M * c.BLOCK_N >= 32768 else None,
    )


class HopperLoop(TileLoop):
    """The main loop of a TMA_HOST config: the match's own (descriptor loads), in a persistent kernel whose
    flattened tile loop keeps a second tile counter for the epilogue."""

    m: MatmulMatch  # type: ignore[assignment]

    def iterations(self, k: TileKnobs) -> int:
        return self.m.iterations(k)

    def lines(self, ctx: Context, sig: Signature, k: TileKnobs, lo: str, hi: str) -> MainLoop:
        return self.m.lines(ctx, sig, k, lo, hi)

    def body(self, ctx: Context, sig: Signature, k: TileKnobs, partials: int | None) -> list[str]:
        if partials is None:  # (partials: the split-K launch after this one runs the epilogue)
            store_descriptors(self.m, ctx, sig, k)
        if partials is not None or not (k.persistent and k.FLATTEN):
            return super().body(ctx, sig, k, partials)
        tiling = ctx.tiling
        work, programs = tiling.split * tiling.per_split, self.programs(tiling, k)
        loop = self.lines(ctx, sig, k, "0", str(self.iterations(k)))
        tile = [
            *tiling.header(with_split=True, pid="work"),
            *loop.lines,
            f"work_c += {programs}",
            *tiling.header(with_split=True, pid="work_c"),
        ]
        for j, acc in enumerate(loop.accs):
            tile += tiling.tap_lines(j) + epilogue(ctx, sig, acc, k.subtile)
        head = [
            *self.m.setup(ctx, sig, k),
            f"work_c = tl.program_id(0) - {programs}",
            f"for work in tl.range(tl.program_id(0), {tiling.text(work)}, {programs}, flatten=True):",
        ]
        return head + ["    " + line for line in tile]
