"""The matmul template's warp-specialized Hopper path (WS=1): a Gluon kernel (gluon_prelude.py).

A persistent kernel of `PERSISTENT` programs, each looping over its tiles in two partitions that share a ring
of `num_stages` shared-memory stages through mbarriers:

- the loader, one warp: for every tile and K step, waits until the consumers released the stage, then TMA
  copies A's and each product's B tile into it (the host descriptors of the Hopper path: `host_descriptors`);
  it runs ahead across tiles, so the next tile's first stages load during this tile's last products and its
  epilogue;
- the consumers, the launch's `num_warps` warps: asynchronous wgmma on the stages (one step's products in
  flight while the previous step's stage goes back to the loader), then the shared epilogue (gemm/epilogue.py,
  the same text as every other config) on the accumulators in their wgmma register layout (a residual read
  from the loader's tile in shared memory); TMA-stored outputs go through a shared-memory tile of their own
  (`_og_gl_tma_store`), whose store overlaps the next tile's products.

What it runs: a 2-D product (no batch axis; A and every B through a host descriptor, fp16 or bf16, bound by
value), beside products of the same A (siblings: Llama's gate and up projections, whose SwiGLU is the
epilogue), with an epilogue of pointwise ops, loads and stores and row or column reductions (RMSNorm's mean of
squares: the epilogue stores their partials, their combine launches are Triton kernels of the Gluon module), on
a Hopper GPU (wgmma is sm_90a's); not under the interpreter (Gluon has none), not a dynamic plan's bucket kernel,
not with fused custom ops (Triton functions). Operands the epilogue reads as whole tiles of the output (a
residual) are copied into shared memory by the loader once a tile (`tile_loads`).

Why: the main loop of the Hopper path (TMA_HOST=1) is Triton's software pipeline, one instruction stream issuing
loads, products and epilogue, and with two products a step its flattened loop pipelined badly (the sibling
configs run unflattened: bench/results/triton-preferences.md#sibling-products); the Hopper lab found the
warp-specialized design ahead of it on the Llama's short-K projections. Measured in the library:
bench/results/constants.md#warp-specialized-gemm.
"""

from __future__ import annotations

from ....core.device import Device
from ....core.dtypes import DataType
from ....core.errors import AttributeValueError
from ....ops.pointwise import PointwiseMode
from ..casts import to_storage
from ..gemm import Context, MainLoop, Signature, epilogue, tma_strides
from ..gluon_prelude import gluon_available
from ..knobs import TileKnobs
from ._matmul_hopper import (
    HopperLoop,
    MatmulMatch,
    host_tma_ok,
    math_heavy_epilogue,
    stage_bytes,
    store_descriptors,
    tma_storable,
)

WS_CAPABILITY = (9, 0)  # wgmma (sm_90a); Blackwell's tensor cores are tcgen05's
WS_TILE = (128, 128, 64)  # BLOCK_M, BLOCK_N (of each product), BLOCK_K
_TYPES = (DataType.HALF, DataType.BFLOAT16)
LOADER_WARPS, LOADER_REGS = 1, 24  # the loader partition: one warp issuing TMA copies, few registers
MAX_STAGES = 5  # (the Hopper lab's single-product kernel ran best at 5: constants.md#warp-specialized-gemm)
# the shared memory a block of an H100 / H200 may take (227 KiB): a Gluon kernel has no buffers but those it
# allocates (the stages, the stored tiles, the barriers), so no margin is kept for the compiler's own
WS_SMEM = 227 * 1024
BARRIER_BYTES = 256  # (the rings' and the tile loads' mbarriers, rounded up)
# per operand kind: (the tile's row start, its column start), as the other configs' main loops read them
_STARTS = {"A": ("pid_m * BLOCK_M", "it * BLOCK_K"), "B": ("it * BLOCK_K", "pid_n * BLOCK_N")}


def ws_refusal(m: MatmulMatch) -> str | None:
    """Why the match's piece has no WS=1 config on its device (None: it has)."""
    gp, device = m.gp, m.device
    if m.interpret or not device.is_cuda or device.capability != WS_CAPABILITY:
        return "warp-specialized kernels (Gluon, wgmma) run on sm_90 GPUs, not under the interpreter"
    if not gluon_available():
        return "the installed Triton has no Gluon of 3.6's API (install triton>=3.6)"
    if m.sizes is not None or m.bucket is not None:
        return "a dynamic plan's bucket kernel takes its sizes at run time; the Gluon kernel is made per shape"
    if not host_tma_ok(m, device) or any(d.batch is not None for d in m.descriptors.values()):
        return "A and each B must be read through 2-D host descriptors"
    sp = gp.space
    if sp.nbatch * sp.groups != 1 or len(sp.dims) != 2:
        return "the product has batch axes"
    types = {gp.tensor(n.input(r)).data_type for n in gp.mains for r in ("A", "B")}  # type: ignore[arg-type]
    if len(types) != 1 or not types <= set(_TYPES):
        return "the operands are not all fp16 or all bf16"
    for r in gp.reductions:
        if r.along == "all":
            return "the epilogue reduces the whole tile (an fp8 amax; the WS kernel reduces rows or columns)"
        if any(
            u is not None and "_og_" in to_storage("r", gp.tensor(u).data_type, "tl.float32") for u in r.node.outputs
        ):
            return (
                "a reduction's result is stored through a helper (bf16, integers, fp8), which its combine launch "
                "cannot call"
            )
    if WS_SMEM - BARRIER_BYTES - 2 * stage_bytes(m, *WS_TILE) - _row_sums_scratch(m) < 0:
        return "two stages of the operands' tiles and the epilogue's sums do not fit in shared memory"
    tensors = gp.piece.graph.tensors
    if any(tensors[u].is_by_reference for u in (*gp.piece.inputs, *gp.piece.outputs)):
        return "a tensor is bound by reference (read through the plan's address table)"
    if any(n.kind == "custom" for n in gp.epilogue):
        return "a custom op is fused (a Triton function)"
    return None


# the gradients of MATH_HEAVY activations (a data gradient's epilogue: ViT's fc1 with the GELU backward): as much
# math as the activations, not measured with this kernel, so tuning weighs it (second) where a residual ranks it first
_HEAVY_GRADIENTS = frozenset(
    PointwiseMode[n]
    for n in ("GELU_BWD", "GELU_APPROX_TANH_BWD", "TANH_BWD", "SIGMOID_BWD", "SWISH_BWD", "SOFTPLUS_BWD", "ELU_BWD")
)


def ws_rank(m: MatmulMatch) -> int | None:
    """Where the WS=1 config goes among the piece's configs: first (0) for products side by side (the SwiGLU's
    gate and up projections, whose Hopper-path configs run unflattened) and for one product whose epilogue reads
    a tile of the output's shape (a residual, which the loader copies while the products run: the output and down
    projections, with or without the next RMSNorm's mean of squares, ran 1-16% faster than on the Hopper path) but
    no activation's gradient (`_HEAVY_GRADIENTS`); second (1) for another product, for tuning to weigh (the
    flattened Hopper path was as fast or faster on the plain ones measured); not at all (None) for one product with
    a heavy epilogue (GELU, SiLU, tanh: slower, and with more math its consumers spill). The measurements:
    bench/results/constants.md#warp-specialized-gemm."""
    if len(m.gp.mains) > 1:
        return 0
    if math_heavy_epilogue(m.gp):
        return None
    gradients = any(getattr(n.op, "mode", None) in _HEAVY_GRADIENTS for n in m.gp.epilogue)
    return 0 if tile_loads(m) and not gradients else 1


def tma_stores(m: MatmulMatch) -> list[int]:
    """The stored outputs the WS kernel writes through TMA (a shared-memory tile each): those `tma_storable`, in
    order, while they fit beside two stages of operands and the sums' scratch; the others keep pointer stores
    (`store_descriptors` decides alike with the config's stages, which `ws_config` fits to these tiles)."""
    gp = m.gp
    return _fitting(m, [u for u in gp.stores if tma_storable(gp, gp.tensor(u), u)], _spare_tile_bytes(m))


def tile_loads(m: MatmulMatch) -> list[int]:
    """The tensors the epilogue reads as whole tiles of the output's space (a residual) that TMA can copy
    (`tma_storable`'s conditions): the loader partition copies each into shared memory once a tile, after
    issuing the tile's operand loads, so the epilogue reads it from there in the accumulator's layout (a
    pointer load in that layout, one element a thread-instruction, slowed the output projection: 45 µs
    against the Hopper path's 36, constants.md#warp-specialized-gemm)."""
    gp = m.gp
    operands = {n.input(r) for n in gp.mains for r in ("A", "B")}
    inputs = set(gp.piece.inputs)
    read = dict.fromkeys(u for n in gp.epilogue for u in n.input_uids())
    # (those that fit beside two stages, the sums' scratch and the TMA-stored outputs' tiles: the others are
    # read through pointers; a Llama's RMSNorm weight gradient, whose data gradient stores an fp32 tile and
    # loads two, came to 233,532 bytes in Triton 3.6 when the stored tile was left out of this count)
    room = _spare_tile_bytes(m) - sum(_tile_bytes(m, u) for u in tma_stores(m))
    tiles = [
        u
        for u in read
        if u in inputs and u not in operands and not gp.tensor(u).is_pass_by_value and tma_storable(gp, gp.tensor(u), u)
    ]
    return _fitting(m, tiles, room)


def _spare_tile_bytes(m: MatmulMatch) -> int:
    """Shared memory beside two stages of operands, the barriers and the row sums' scratch (WS_TILE)."""
    return WS_SMEM - BARRIER_BYTES - 2 * stage_bytes(m, *WS_TILE) - _row_sums_scratch(m)


def _fitting(m: MatmulMatch, uids: list[int], room: int) -> list[int]:
    """The first of `uids` whose tiles (WS_TILE's) fit in `room` bytes together, in order."""
    out = []
    for u in uids:
        room -= _tile_bytes(m, u)
        if room < 0:
            break
        out.append(u)
    return out


def _tile_bytes(m: MatmulMatch, uid: int, block_m: int = WS_TILE[0], block_n: int = WS_TILE[1]) -> int:
    """Shared memory a tile of tensor `uid` takes (a TMA-stored output's, a TMA-loaded operand's; WS_TILE's by
    default)."""
    return block_m * block_n * m.gp.tensor(uid).data_type.itemsize


def _row_sums_scratch(m: MatmulMatch) -> int:
    """The compiler's scratch for a sum over the tile's rows (a bias gradient): the rows cross the warps stacked
    along them, an fp32 row of the tile a warp (ViT's fc1 data gradient at five stages, 230,012 bytes in Triton
    3.9's ptxas, was refused on the GPU by Triton 3.6)."""
    return sum(WS_TILE[1] * _consumer_warps(m) * 4 for r in m.gp.reductions if r.along == "rows")


def _consumer_warps(m: MatmulMatch) -> int:
    """4 consumer warps for one product and no epilogue (the lab's best), else 8 (each warpgroup then holds 64
    rows of every product's accumulator: at 4 an erf GELU on one 128 x 128 accumulator spilled 132 bytes in
    ptxas)."""
    return 4 if len(m.gp.mains) == 1 and not m.gp.epilogue else 8


def acc_layout(block_m: int, block_n: int, warps: int) -> str:
    """The accumulator's wgmma register layout: warpgroups stacked along M (16-row atoms of 4 warps) until
    BLOCK_M is covered, then along N; the widest wgmma N (<= 256, a multiple of 8) that tiles each share."""
    w = [4, 1]
    while w[0] * w[1] < warps:
        if block_m > 16 * w[0]:
            w[0] *= 2
        else:
            w[1] *= 2
    share = max(block_n // w[1], 8)
    n = 256
    while n > share or block_n % n:
        n -= 8
    return f"gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta={w}, instr_shape=[16, {n}, 16])"


def ws_config(m: MatmulMatch, c: TileKnobs, device: Device) -> TileKnobs:
    """The WS=1 version of a config: 128 x 128 x 64 tiles (of each product), `_consumer_warps`, as many stages as
    shared memory holds next to the tiles of the TMA-stored outputs and of the epilogue's TMA-loaded operands (and
    the compiler's scratch for sums over the rows)."""
    bm, bn, bk = WS_TILE
    held = sum(_tile_bytes(m, u) for u in (*tma_stores(m), *tile_loads(m))) + _row_sums_scratch(m)
    stages = min(MAX_STAGES, (WS_SMEM - held - BARRIER_BYTES) // stage_bytes(m, bm, bn, bk))
    assert stages >= 2, "tma_stores and tile_loads leave room for two stages"
    return c.replace(
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        SPLIT_K=1,
        TMA=1,
        TMA_HOST=1,
        WS=1,
        PERSISTENT=device.sm_count,
        FLATTEN=None,
        EPILOGUE_SUBTILE=None,
        num_warps=_consumer_warps(m),
        num_stages=stages,
    )


class WarpSpecLoop(HopperLoop):
    """A WS=1 config's kernel: the loader and consumer partitions (module-level functions, `ctx.functions`)
    and the kernel that allocates their shared memory and barriers and starts them."""

    def check_knobs(self, k: TileKnobs) -> None:
        super().check_knobs(k)
        if k.warps % 4 or (k.BLOCK_M // 16) % (k.warps // 4 or 1):
            raise AttributeValueError(
                f"WS=1 with num_warps={k.warps}, BLOCK_M={k.BLOCK_M}: the consumers are whole warpgroups (4 warps), "
                "each 16 rows of the tile at least",
                op=self.m.gp.main.label(),
                rule="triton.gemm.ws",
                hint="use num_warps=4 or 8 with BLOCK_M=128",
            )
        why = ws_refusal(self.m)
        if why is not None:
            raise AttributeValueError(
                f"WS=1 is not offered for this piece: {why}",
                op=self.m.gp.main.label(),
                rule="triton.gemm.ws",
                hint="drop WS (the Hopper path, TMA_HOST=1, runs it)",
            )

    def body(self, ctx: Context, sig: Signature, k: TileKnobs, partials: int | None) -> list[str]:
        assert partials is None and k.BLOCK_K is not None
        m, tiling = self.m, ctx.tiling
        ctx.gluon = True
        loaded = {u: f"desc_l{u}" for u in tile_loads(m)}
        held = sum(_tile_bytes(m, u, k.BLOCK_M, k.BLOCK_N) for u in loaded) + _row_sums_scratch(m)
        store_descriptors(m, ctx, sig, k, budget=WS_SMEM - BARRIER_BYTES, held=held)
        layout = acc_layout(k.BLOCK_M, k.BLOCK_N, k.warps)
        for u, d in loaded.items():
            t = m.gp.tensor(u)
            shape, size = list(t.dim), t.data_type.itemsize
            sig.desc(d, u, 0, shape, tma_strides(shape, list(t.stride), size), [k.BLOCK_M, k.BLOCK_N])
            ctx.tile_loads[u] = f"smem_{d}.load({layout})"
        roles = list(m.descriptors)
        work, programs = tiling.text(tiling.per_split), self.programs(tiling, k)
        header = tiling.header(with_split=False, pid="work")
        stages = k.stages
        iters = self.iterations(k)
        accs = ["acc", *(f"acc_s{i}" for i in range(len(roles) - 2))]
        epi = epilogue(ctx, sig, "acc", 1)
        m.setup(ctx, sig, k)  # (the operands' descriptors: desc_A, desc_B, desc_B_s0, ...)
        bufs = [f"smem_{r}" for r in roles]
        tile_bufs = [f"smem_{d}" for d in (*ctx.tma_stores.values(), *loaded.values())]
        tile_bars = ["tready", "tempty"] if loaded else []
        shared = [*sig.names, *bufs, *tile_bufs, "ready", "empty", *tile_bars]
        blocks = ["BLOCK_M", "BLOCK_N", "BLOCK_K"]
        params = ", ".join([*shared, *(f"{b}: tl.constexpr" for b in blocks)])

        def operand(role: str) -> str:  # (a stage holds the descriptor's block: [rows, K] or [K, cols] if transposed)
            return f"smem_{role}.index(ws_s)" + (".permute((1, 0))" if m.descriptors[role].transposed else "")

        loads = []
        for role in roles:
            rows, cols = _STARTS[role[0]]
            coords = [cols, rows] if m.descriptors[role].transposed else [rows, cols]
            loads.append(f"tma_load(desc_{role}, [{', '.join(coords)}], ws_bar, smem_{role}.index(ws_s))")
        nbytes = " + ".join(f"desc_{r}.block_type.nbytes" for r in roles)
        loader = [
            f"def kernel_ws_loader({params}):",
            "    ws_p = 0",
            f"    for work in range(tl.program_id(0), {work}, {programs}):",
            *(f"        {line}" for line in header),
            f"        for it in range(0, {iters}):",
            f"            ws_s = ws_p % {stages}",
            f"            mbarrier.wait(empty.index(ws_s), ((ws_p // {stages}) & 1) ^ 1)",
            "            ws_bar = ready.index(ws_s)",
            f"            mbarrier.expect(ws_bar, {nbytes})",
            *(f"            {line}" for line in loads),
            "            ws_p += 1",
        ]
        if loaded:  # (after the tile's operand copies: the ring's run-ahead does not wait for the last epilogue)
            tile_bytes = " + ".join(f"{d}.block_type.nbytes" for d in loaded.values())
            loader += [
                "        mbarrier.wait(tempty, (ws_t & 1) ^ 1)",
                f"        mbarrier.expect(tready, {tile_bytes})",
                *(
                    f"        tma_load({d}, [pid_m * BLOCK_M, pid_n * BLOCK_N], tready, smem_{d})"
                    for d in loaded.values()
                ),
                "        ws_t += 1",
            ]
            loader.insert(2, "    ws_t = 0")
        issued = [
            f"t{j} = warpgroup_mma({operand('A')}, {operand(role)}, {acc}, use_acc=it > 0, is_async=True)"
            for j, (role, acc) in enumerate(zip(roles[1:], accs, strict=True))
        ]
        tokens = ", ".join(f"t{j}" for j in range(len(accs)))
        names = ", ".join(accs)
        consumer = [
            f"def kernel_ws_consumer({params}):",
            "    ws_c = 0",
            f"    for work in range(tl.program_id(0), {work}, {programs}):",
            *(f"        {line}" for line in header),
            *(f"        {acc} = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, layout={layout})" for acc in accs),
            f"        for it in range(0, {iters}):",
            f"            ws_s = ws_c % {stages}",
            f"            mbarrier.wait(ready.index(ws_s), (ws_c // {stages}) & 1)",
            *(f"            {line}" for line in issued),
            # the step before's products are done (this step's run on): its stage goes back to the loader once
            # every consumer warp is past the wait
            f"            {names} = warpgroup_mma_wait({len(accs)}, ({tokens},))",
            "            sync_warps()",
            f"            mbarrier.arrive(empty.index((ws_c + {stages - 1}) % {stages}), pred=it > 0)",
            "            ws_c += 1",
            f"        {names} = warpgroup_mma_wait(0, ({names},))",
            "        sync_warps()",
            f"        mbarrier.arrive(empty.index((ws_c + {stages - 1}) % {stages}))",
            *(["        mbarrier.wait(tready, ws_t & 1)"] if loaded else []),
            *(f"        {line}" for line in epi),
            *(["        sync_warps()", "        mbarrier.arrive(tempty)", "        ws_t += 1"] if loaded else []),
            "    tma.store_wait(0)",
        ]
        if loaded:
            consumer.insert(2, "    ws_t = 0")
        ctx.functions += ["\n".join(loader) + "\n", "\n".join(consumer) + "\n"]
        lines = [
            f"smem_{r} = gl.allocate_shared_memory(desc_{r}.dtype, [{stages}] + desc_{r}.block_type.shape, "
            f"desc_{r}.layout)"
            for r in roles
        ]
        lines += [
            f"smem_{d} = gl.allocate_shared_memory({d}.dtype, {d}.block_type.shape, {d}.layout)"
            for d in (*ctx.tma_stores.values(), *loaded.values())
        ]
        lines += [
            f"ready = gl.allocate_shared_memory(gl.int64, [{stages}, 1], mbarrier.MBarrierLayout())",
            f"empty = gl.allocate_shared_memory(gl.int64, [{stages}, 1], mbarrier.MBarrierLayout())",
            f"for i in gl.static_range({stages}):",
            "    mbarrier.init(ready.index(i), count=1)",
            "    mbarrier.init(empty.index(i), count=1)",
        ]
        if loaded:
            lines += [
                "tready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())",
                "tempty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())",
                "mbarrier.init(tready, count=1)",
                "mbarrier.init(tempty, count=1)",
            ]
        args = ", ".join([*shared, *blocks])
        lines.append(
            f"gl.warp_specialize([(kernel_ws_consumer, ({args})), (kernel_ws_loader, ({args}))], "
            f"[{LOADER_WARPS}], [{LOADER_REGS}])"
        )
        return lines

    def lines(self, ctx: Context, sig: Signature, k: TileKnobs, lo: str, hi: str) -> MainLoop:
        raise AssertionError("a WS=1 kernel's main loop is its consumer partition's (body)")
