"""The matmul template's warp-specialized Gluon path (WS=1: templates/_matmul_ws.py, gluon_prelude.py): which
pieces are offered it and where it ranks on a simulated H200, the generated Gluon module, the knobs' errors, the
kernels compiled for sm_90a without a GPU (partitions, wgmma, TMA, no spills); marked gpu, every case against the
reference engine on a Hopper GPU. Gluon has no interpreter: under it the path is never offered."""

from __future__ import annotations

import re

import pytest

import opgraph as og
from opgraph.core.config import EngineConfig
from opgraph.core.device import Device
from opgraph.core.errors import AttributeValueError
from opgraph.core.piece import make_piece
from opgraph.engines.triton import generate
from opgraph.engines.triton.knobs import TileKnobs
from opgraph.engines.triton.templates._matmul_ws import acc_layout

from ..helpers import requires_cuda, step_plan
from .test_triton_matmul import layout_strides

DT = og.DataType
H200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
A100 = Device("cuda", 0, "NVIDIA A100", (8, 0), 108)
B200 = Device("cuda", 0, "NVIDIA B200", (10, 0), 148)


def _template():
    from opgraph.engines.triton import TEMPLATES

    return next(t for t in TEMPLATES if t.name == "matmul")


def _graph(name, dt):
    return og.Graph(name, io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)


def swiglu(m=8192, k=1024, n=2816, dt=DT.BFLOAT16, kv=False):
    """A Llama block's SwiGLU (SiLU(x @ Wg) * (x @ Wu), nn.Linear weights [N, K] read transposed), or with
    `kv` its key and value projections (two products, both stored)."""
    g = _graph("swiglu", dt)
    x = g.tensor(dim=[m, k], name="x")
    wg = g.tensor(dim=[k, n], stride=[1, k], name="w_gate")
    wu = g.tensor(dim=[k, n], stride=[1, k], name="w_up")
    if kv:
        g.matmul(x, wg, name="k").set_output(True)
        g.matmul(x, wu, name="v").set_output(True)
        return g
    g.mul(g.swish(g.matmul(x, wg, name="gate")), g.matmul(x, wu, name="up")).set_output(True)
    return g


def bias_gelu(m=8192, k=1024, n=4096, dt=DT.BFLOAT16, a_layout="row", b_layout="col", out_layout="row"):
    """Bias + erf GELU; `out_layout` "col": the output column-major (pointer stores, not TMA), in fp32."""
    g = _graph("bias_gelu", dt)
    a = g.tensor(dim=[m, k], stride=layout_strides((m, k), a_layout), name="A")
    b = g.tensor(dim=[k, n], stride=layout_strides((k, n), b_layout), name="B")
    bias = g.tensor(dim=[1, n], name="bias")
    y = g.gelu(g.add(g.matmul(a, b), bias)).set_output(True)
    if out_layout == "col":
        y.set_stride(layout_strides((m, n), "col")).set_data_type(DT.FLOAT)
    return g


def residual(m=8192, k=1024, n=1024, dt=DT.BFLOAT16, stats=False):
    """The output projection with the residual added (an [M, N] operand read in the epilogue); `stats`: and
    the next RMSNorm's mean of squares (a row reduction)."""
    g = _graph("residual", dt)
    a = g.tensor(dim=[m, k], name="A")
    w = g.tensor(dim=[k, n], stride=[1, k], name="W")
    r = g.tensor(dim=[m, n], name="R")
    y = g.add(g.matmul(a, w), r).set_output(True).set_data_type(dt)
    if stats:
        ms = g.reduction(g.mul(y, y), "AVG").set_dim([m, 1]).set_output(True)
        if stats == "bf16":
            ms.set_data_type(DT.BFLOAT16)
    return g


def fp32_residuals(count, m=8192, k=1024, n=1024):
    """The product plus `count` fp32 [M, N] operands (64 KiB a 128 x 128 tile)."""
    g = _graph("fp32_residuals", DT.BFLOAT16)
    y = g.matmul(g.tensor(dim=[m, k], name="A"), g.tensor(dim=[k, n], stride=[1, k], name="W"))
    for i in range(count):
        y = g.add(y, g.tensor(dim=[m, n], name=f"R{i}").set_data_type(DT.FLOAT))
    y.set_output(True).set_data_type(DT.BFLOAT16)
    return g


def column_sums(m=8192, k=1024, n=1024, dt=DT.BFLOAT16):
    """A bias gradient's kind of reduction: the product's column sums (one per column, over the tile's rows)."""
    g = _graph("column_sums", dt)
    y = g.matmul(g.tensor(dim=[m, k], name="A"), g.tensor(dim=[k, n], stride=[1, k], name="B")).set_output(True)
    g.reduction(y, "ADD").set_dim([1, n]).set_output(True).set_data_type(DT.FLOAT)
    return g


def norm_weight_gradient(m=4096, k=2816, n=1024):
    """An RMSNorm's backward in a data gradient's epilogue (a Llama's up projection, training): the product plus
    the incoming fp32 gradient, stored in fp32, and the norm weight's gradient, the column sums of its product with
    the saved bf16 input (an fp32 tile stored, an fp32 and a bf16 tile read, a sum over the rows)."""
    g = _graph("norm_weight_gradient", DT.BFLOAT16)
    a = g.tensor(dim=[m, k], name="dY")
    w = g.tensor(dim=[k, n], name="W")
    incoming = g.tensor(dim=[m, n], name="dR").set_data_type(DT.FLOAT)
    x = g.tensor(dim=[m, n], name="x")
    d = g.add(g.matmul(a, w), incoming).set_output(True).set_data_type(DT.FLOAT)
    g.reduction(g.mul(d, x), "ADD").set_dim([1, n]).set_output(True).set_data_type(DT.FLOAT)
    return g


def amax(m=8192, k=1024, n=1024, dt=DT.BFLOAT16):
    """The product's absolute maximum (an fp8 scale's amax): one result of the whole tile."""
    g = _graph("amax", dt)
    y = g.matmul(g.tensor(dim=[m, k], name="A"), g.tensor(dim=[k, n], stride=[1, k], name="B")).set_output(True)
    g.reduction(y, "AMAX").set_dim([1, 1]).set_output(True).set_data_type(DT.FLOAT)
    return g


def plain(m=8192, k=1024, n=4096, dt=DT.BFLOAT16):
    g = _graph("plain", dt)
    g.matmul(g.tensor(dim=[m, k], name="A"), g.tensor(dim=[k, n], stride=[1, k], name="B")).set_output(True)
    return g


def max_min(m=8192, k=1024, n=2816, dt=DT.BFLOAT16):
    """The SwiGLU clipped: min(max(SiLU(gate) * up, lo), hi), and a ReLU with an upper clip on a second output
    (maximum / minimum name tl.PropagateNan)."""
    g = _graph("max_min", dt)
    x = g.tensor(dim=[m, k], name="x")
    wg = g.tensor(dim=[k, n], stride=[1, k], name="w_gate")
    wu = g.tensor(dim=[k, n], stride=[1, k], name="w_up")
    gate = g.matmul(x, wg, name="gate")
    y = g.mul(g.swish(gate), g.matmul(x, wu, name="up"))
    lo, hi = g.tensor(dim=[1, n], name="lo"), g.tensor(dim=[1, n], name="hi")
    g.min(g.max(y, lo), hi).set_output(True)
    g.relu(gate, upper_clip=6.0).set_output(True).set_data_type(dt)
    return g


def _piece(g):
    return make_piece(g.final, 0, list(g.final.nodes))


def _cands(g, device=H200):
    return [TileKnobs(**c) for c in _template().candidates(_piece(g), device)]


def _ws(cands):
    return [c for c in cands if c.WS]


# -- where the path is offered ------------------------------------------------------------------------------------


def test_products_side_by_side_rank_it_first():
    """The SwiGLU's gate and up projections: the Gluon kernel first (measured faster than the Hopper path's
    unflattened sibling loop), 128 x 128 tiles of each product, two consumer warpgroups, four stages (3 x 48 KiB
    of operands and the bf16 output's 32 KiB tile within 227 KiB)."""
    cands = _cands(swiglu())
    first = cands[0]
    assert first.WS == 1 and first.TMA_HOST == 1 and first.PERSISTENT == 132, cands[:3]
    assert (first.BLOCK_M, first.BLOCK_N, first.BLOCK_K, first.num_warps, first.num_stages) == (128, 128, 64, 8, 4)
    assert not first.FLATTEN and not first.EPILOGUE_SUBTILE
    assert len(_ws(cands)) == 1
    assert _cands(swiglu(kv=True))[0].WS == 1


def test_reductions_of_rows_and_columns_are_offered_it():
    """RMSNorm's mean of squares after the output projection (a row reduction) and column sums: offered."""
    for g in (residual(stats=True), column_sums()):
        assert _ws(_cands(g)), g


def test_one_product_offers_it_second():
    """One plain product: the Hopper path first, the Gluon kernel second, for tuning to weigh, with one consumer
    warpgroup for a plain store (the lab's best)."""
    cands = _cands(plain())
    assert not cands[0].WS and cands[1].WS == 1 and cands[1].num_warps == 4, cands[:3]
    # a heavy epilogue of one product (GELU: measured slower than the Hopper path; with more math it spills at
    # 8 warps): not offered
    assert not _ws(_cands(bias_gelu())) and not _ws(_cands(bias_gelu(k=2048)))


def test_an_activation_gradient_reading_a_tile_offers_it_second():
    """ViT's fc1 data gradient (the GELU backward reading the saved pre-activation tile, the bias gradient summing
    the rows): the Hopper path first, the Gluon kernel second at four stages (the sum over the tile's rows crosses
    the warps: the compiler's scratch for it beside the two 32 KiB tiles; at five stages Triton 3.6 refused it and
    the build fell back to the last config)."""
    from .test_triton_matmul_fold import data_gradient

    cands = _cands(data_gradient((8, 197, 768), 3072))
    assert not cands[0].WS and cands[1].WS == 1 and cands[1].num_stages == 4, cands[:2]


def test_one_product_reading_a_residual_ranks_it_first():
    """The output and down projections (the residual read in the epilogue, with or without the next RMSNorm's mean
    of squares): the Gluon kernel first, two consumer warpgroups, five stages (5 x 32 KiB of operands beside the
    residual's and the output's 32 KiB tiles)."""
    for g in (residual(), residual(stats=True), residual(k=2816)):
        first = _cands(g)[0]
        assert first.WS == 1 and first.num_warps == 8 and first.num_stages == 5, first
    assert not _cands(column_sums())[0].WS  # (no tile read: second, as a plain product)


@pytest.mark.parametrize(
    "name,g,device",
    [
        ("an A100 (no wgmma)", plain(), A100),
        ("a B200 (tcgen05, not wgmma)", plain(), B200),
        ("the CPU (the interpreter)", plain(), Device("cpu")),
        ("fewer tiles than SMs", plain(m=1024, n=1024), H200),
        ("fp32 operands", plain(dt=DT.FLOAT), H200),
        ("a reduction of the whole tile", amax(), H200),
        ("a bf16 mean of squares (its combine would store through a helper)", residual(stats="bf16"), H200),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_not_offered(name, g, device):
    assert not _ws(_cands(g, device)), name


def test_batch_axes_are_not_offered_it():
    g = _graph("batched", DT.BFLOAT16)
    a = g.tensor(dim=[4, 2048, 1024], name="A")
    b = g.tensor(dim=[4, 1024, 2048], name="B")
    g.matmul(a, b).set_output(True)
    assert not _ws(_cands(g))


def test_refusals_say_why():
    from opgraph.engines.triton.templates._matmul_ws import ws_refusal

    t = _template()
    for g, device, why in [
        (plain(), A100, "sm_90"),
        (plain(dt=DT.FLOAT), H200, "fp16 or all bf16"),
        (amax(), H200, "whole tile"),
    ]:
        m = t.matched(_piece(g), device)
        assert why in (ws_refusal(m) or ""), why


def test_a_dynamic_plans_bucket_piece_is_not_offered_it():
    """A bucket piece's kernels take their sizes at run time; the Gluon kernel is made per shape (offered first for
    the SwiGLU, it failed the bucket's build before the refusal)."""
    from opgraph.build.buckets import choose

    batch, seq = og.Dim("batch", 1, 8), og.Dim("seq", 512, 4096)
    g = _graph("swiglu_dyn", DT.BFLOAT16)
    x = g.tensor(dim=[batch, seq, 1024], name="x")
    wg = g.tensor(dim=[1, 1024, 2816], stride=[2816 << 10, 1, 1024], name="wg")
    wu = g.tensor(dim=[1, 1024, 2816], stride=[2816 << 10, 1, 1024], name="wu")
    g.mul(g.swish(g.matmul(x, wg)), g.matmul(x, wu)).set_output(True)
    final = g.final
    (bucket,) = choose(final, "one").buckets
    hint = final.in_bucket(bucket.hint_map, bucket)
    piece = make_piece(hint, 0, hint.nodes)
    t = _template()
    m = t.matched(piece, H200)
    assert m.bucket is not None and not _ws([TileKnobs(**c) for c in t.candidates(piece, H200)])
    from opgraph.engines.triton.templates._matmul_ws import ws_refusal

    assert "bucket" in (ws_refusal(m) or "")
    assert not t.sized_knobs(TileKnobs(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, TMA=1, TMA_HOST=1, PERSISTENT=132, WS=1))


def test_every_tl_name_the_epilogue_writes_resolves_in_gluon():
    """The prelude's `tl` is Gluon's functions under tl's names, and what Gluon lacks written (WRITTEN): every
    `tl.<name>` of the shared epilogue's emitters and HELPERS must resolve there (MAX / MIN name
    tl.PropagateNan, which Gluon does not have)."""
    import pathlib

    from triton.experimental.gluon import language as gl

    from opgraph.engines.triton import expr
    from opgraph.engines.triton.gluon_prelude import WRITTEN

    root = pathlib.Path(expr.__file__).parent
    text = expr.HELPERS + "".join(
        (root / f).read_text() for f in ("expr.py", "casts.py", "gemm/epilogue.py", "gemm/indexing.py")
    )
    # (the main loop's and split-K's names are not the epilogue's: the Gluon kernel has its own main loop)
    names = set(re.findall(r"\btl\.([A-Za-z_]\w*)", text)) - {"dot", "range", "make_tensor_descriptor", "core"}
    missing = sorted(n for n in names if not hasattr(gl, n) and n not in WRITTEN)
    assert not missing, missing


def test_a_refused_gluon_is_said():
    from opgraph.engines.triton import gluon_prelude
    from opgraph.engines.triton.templates._matmul_ws import ws_refusal

    t = _template()
    m = t.matched(_piece(swiglu()), H200)
    gluon_prelude.gluon_available.cache_clear()
    try:
        import triton

        real = triton.__version__
        triton.__version__ = "3.3.1"
        assert "triton>=3.6" in (ws_refusal(m) or "")
    finally:
        triton.__version__ = real
        gluon_prelude.gluon_available.cache_clear()
    assert ws_refusal(m) is None


def test_descriptor_objects_for_gluon_name_their_layout():
    """Triton's own launch (OPGRAPH_LAUNCH=jit, an unaligned argument) takes descriptor objects: a Gluon kernel's
    carry the shared layout its signature names."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    from opgraph.engines.triton.templates.base import Arg, ArgKind
    from opgraph.engines.triton.tma_desc import descriptor_object, gluon_layout

    buffer = torch.zeros(256 * 64, dtype=torch.bfloat16)
    arg = Arg(ArgKind.DESC, 0, 0, shape=(256, 64), strides=(64, 1), block=(128, 64))
    d = descriptor_object(arg, buffer, gluon=True)
    assert isinstance(d, GluonDescriptor) and repr(d.layout) == gluon_layout("bf16", (128, 64))
    assert not isinstance(descriptor_object(arg, buffer), GluonDescriptor)


# -- the knobs ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "knobs,what",
    [
        ({"WS": 1, "TMA": 1, "PERSISTENT": 132}, "TMA_HOST"),
        ({"WS": 1, "TMA": 1, "TMA_HOST": 1}, "PERSISTENT"),
        ({"WS": 1, "TMA": 1, "TMA_HOST": 1, "PERSISTENT": 132, "FLATTEN": 1}, "FLATTEN"),
        ({"WS": 1, "TMA": 1, "TMA_HOST": 1, "PERSISTENT": 132, "SPLIT_K": 2}, "SPLIT_K"),
        ({"WS": 2, "TMA": 1, "TMA_HOST": 1, "PERSISTENT": 132}, "WS=2"),
    ],
)
def test_knob_errors(knobs, what):
    with pytest.raises(AttributeValueError, match=what):
        TileKnobs(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, **knobs)


def test_warps_that_are_not_whole_warpgroups_are_a_typed_error():
    ws = _ws(_cands(swiglu()))[0]
    with pytest.raises(AttributeValueError, match="whole warpgroups"):
        generate(_template(), _piece(swiglu()), dict(ws.replace(num_warps=2).pairs()), H200)


def test_other_templates_refuse_it():
    from opgraph.engines.triton import TEMPLATES

    conv = next(t for t in TEMPLATES if t.name == "conv_fprop")
    g = _graph("conv", DT.BFLOAT16)
    x = g.tensor(dim=[2, 64, 16, 16], name="x")
    w = g.tensor(dim=[64, 64, 3, 3], name="w")
    g.conv_fprop(x, w, padding=[1, 1]).set_output(True)
    knobs = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "TMA": 1, "TMA_HOST": 1, "PERSISTENT": 132, "WS": 1}
    with pytest.raises(AttributeValueError, match="WS is a knob of the matmul template"):
        generate(conv, _piece(g), knobs, H200)


def test_forcing_it_on_a_piece_it_does_not_run_is_a_typed_error():
    ws = _ws(_cands(swiglu()))[0]
    with pytest.raises(AttributeValueError, match="WS=1 is not offered.*fp16 or all bf16"):
        generate(_template(), _piece(bias_gelu(dt=DT.FLOAT)), dict(ws.pairs()), H200)


# -- the generated module -----------------------------------------------------------------------------------------


def _forced(g, device=H200):
    """The piece's WS=1 config (ws_config of its first Hopper-path candidate), offered or not (one product's
    heavy epilogue is not: the tests still compile and run it)."""
    from opgraph.engines.triton.templates._matmul_ws import ws_config

    host = next(c for c in _cands(g, device) if c.TMA_HOST)
    return ws_config(_template().matched(_piece(g), device), host, device)


def _source(g, device=H200):
    return generate(_template(), _piece(g), dict(_forced(g, device).pairs()), device).source


def test_the_module_is_gluon_and_partitioned():
    src = _source(swiglu())
    assert "_OG_GLUON = True" in src and "import triton.language as tl" not in src
    assert "gl.warp_specialize([(kernel_ws_consumer" in src and "(kernel_ws_loader" in src
    loader = src[src.index("def kernel_ws_loader") : src.index("def kernel_ws_consumer")]
    consumer = src[src.index("def kernel_ws_consumer") : src.index("\ndef kernel(")]
    # the loader: three TMA copies a step into the stage the consumers released; no products
    assert loader.count("tma_load(") == 3 and "warpgroup_mma" not in loader and "mbarrier.wait(empty" in loader
    # the consumers: two products a step (the weights' [N, K] blocks read transposed), one step in flight
    assert consumer.count("warpgroup_mma(") == 2 and consumer.count(".permute((1, 0))") == 2
    assert "warpgroup_mma_wait(2, (t0, t1,))" in consumer and "mbarrier.arrive(empty" in consumer
    # the shared epilogue in tl names, its store through the tile's shared memory
    assert "tl.sigmoid(" in consumer and "_og_gl_tma_store(desc_c" in consumer and "tl.store(" not in consumer
    assert acc_layout(128, 128, 8) in consumer


def test_the_residual_tile_is_copied_by_the_loader():
    """The residual (an [M, N] operand of the epilogue): the loader copies its tile into shared memory by TMA once a
    tile, after the tile's operand copies; the consumers read it there in the accumulator's layout, between a wait
    on `tready` and the release of `tempty`; no pointer load; the output through its own TMA tile."""
    src = _source(residual())
    loader = src[src.index("def kernel_ws_loader") : src.index("def kernel_ws_consumer")]
    consumer = src[src.index("def kernel_ws_consumer") : src.index("\ndef kernel(")]
    assert loader.count("tma_load(") == 3 and loader.index("tma_load(desc_l") > loader.index("tma_load(desc_B")
    assert "mbarrier.wait(tempty, (ws_t & 1) ^ 1)" in loader
    wait, load = consumer.index("mbarrier.wait(tready, ws_t & 1)"), consumer.index(f".load({acc_layout(128, 128, 8)})")
    assert wait < load < consumer.index("mbarrier.arrive(tempty)")
    assert "tl.load(" not in consumer and "_og_gl_tma_store(desc_c" in consumer
    assert "gl.allocate_shared_memory(desc_l" in src and "mbarrier.init(tready, count=1)" in src


def test_tile_loads_take_what_fits_beside_two_stages():
    """Three fp32 residuals (64 KiB a tile each) do not all fit beside two 32 KiB stages in 227 KiB: the loader
    copies those that do, the others are read through pointers (the kernel asked 262,396 bytes when all were)."""
    from opgraph.engines.triton.templates._matmul_ws import tile_loads

    for count, loaded in ((1, 1), (2, 2), (3, 2)):
        g = fp32_residuals(count)
        assert len(tile_loads(_template().matched(_piece(g), H200))) == loaded, count
    src = _source(fp32_residuals(3))
    consumer = src[src.index("def kernel_ws_consumer") : src.index("\ndef kernel(")]
    assert consumer.count(".load(gl.NVMMADistributedLayout") == 2 and consumer.count("tl.load(") == 1


def test_shared_memory_holds_the_tiles_and_stages_counted():
    """The tiles the kernel allocates (two or more stages, the TMA-stored outputs', the loaded operands') and the
    compiler's scratch for sums over the rows fit in 227 KiB, whichever way a piece mixes them: the RMSNorm
    backward's fp32 store beside two tile loads asked 233,532 bytes in Triton 3.6 (its H200 build fell back to
    PyTorch) when the stored tile was not counted against the loads."""
    from opgraph.engines.triton.templates._matmul_hopper import stage_bytes
    from opgraph.engines.triton.templates._matmul_ws import (
        BARRIER_BYTES,
        WS_SMEM,
        _row_sums_scratch,
        _tile_bytes,
        tile_loads,
        tma_stores,
    )

    for g in (norm_weight_gradient(), fp32_residuals(3), residual(stats=True), column_sums(), swiglu()):
        m, k = _template().matched(_piece(g), H200), _forced(g)
        tiles = sum(_tile_bytes(m, u) for u in (*tma_stores(m), *tile_loads(m))) + _row_sums_scratch(m)
        used = tiles + k.stages * stage_bytes(m, k.BLOCK_M, k.BLOCK_N, k.BLOCK_K) + BARRIER_BYTES
        assert k.stages >= 2 and used <= WS_SMEM, (g.name, k.stages, used)
        # what the generated kernel allocates, read from its source and its descriptors' blocks
        allocated = _allocated_bytes(g)
        assert allocated == used - _row_sums_scratch(m) - BARRIER_BYTES, (g.name, allocated, used)
    m = _template().matched(_piece(norm_weight_gradient()), H200)
    assert len(tma_stores(m)) == 1 and len(tile_loads(m)) == 1  # (the bf16 input then read through pointers)
    consumer = (src := _source(norm_weight_gradient()))[
        src.index("def kernel_ws_consumer") : src.index("\ndef kernel(")
    ]
    assert "_og_gl_tma_store(desc_c" in consumer and consumer.count("tl.load(") == 1


def _allocated_bytes(g) -> int:
    """The shared memory the WS=1 kernel's source allocates for tiles: each `gl.allocate_shared_memory` of a
    descriptor's block (times its stages), the block and element type read from the launch's descriptor."""
    import math
    import re

    piece = _piece(g)
    gen = generate(_template(), piece, dict(_forced(g).pairs()), H200)
    launch = next(l for l in gen.launches if l.kernel == "kernel")
    head = gen.source[gen.source.index("\ndef kernel(") :]
    names = [p.split(":")[0].strip() for p in head[head.index("(") + 1 : head.index(")")].split(",")]
    blocks = {
        n: (a.block, piece.graph.tensors[a.uid].data_type.itemsize)
        for n, a in zip(names, launch.args)
        if a.kind == "desc"
    }
    total = 0
    for found in re.finditer(r"gl\.allocate_shared_memory\((\w+)\.dtype, (\[(\d+)\] \+ )?", gen.source):
        block, size = blocks[found.group(1)]
        total += int(found.group(3) or 1) * math.prod(block) * size
    return total


def test_a_row_reduction_stores_partials_and_combines_in_triton():
    """The mean of squares over the output's rows: each tile's row sums stored as partials (8 tiles a row), summed by
    a combine launch that is a Triton kernel of the Gluon module (`_OG_TRITON`), in Triton's own language."""
    from opgraph.engines.triton.loader import load_module

    gen = generate(_template(), _piece(residual(stats=True)), dict(_forced(residual(stats=True)).pairs()), H200)
    src = gen.source
    consumer = src[src.index("def kernel_ws_consumer") : src.index("\ndef kernel(")]
    assert "tl.sum(" in consumer and re.search(r"tl\.store\(ws\d+ \+ \(pid_n\) \* 8192 \+ rm", consumer)
    combine = src[src.index("def kernel_combine0") :]
    assert "_og_tl.load(" in combine and not re.search(r"(?<!_og_)\btl\.", combine)
    assert [launch.kernel for launch in gen.launches] == ["kernel", "kernel_combine0"]
    module = load_module(src, interpret=False)
    assert module.kernel.is_gluon() and not getattr(module.kernel_combine0, "is_gluon", lambda: False)()


def test_a_triton_kernel_in_a_gluon_module_names_triton():
    from opgraph.engines.triton.gluon_prelude import triton_kernel

    text = triton_kernel("def kernel_combine1(p):\n    x = tl.load(p + tl.arange(0, 4))\n", "kernel_combine1")
    assert "_og_tl.load(p + _og_tl.arange(0, 4))" in text and "_OG_TRITON = _OG_TRITON + ('kernel_combine1',)" in text
    with pytest.raises(AssertionError, match="helper"):
        triton_kernel("def kernel_combine1(p):\n    x = _og_round_bf16(tl.load(p))\n", "kernel_combine1")


@pytest.mark.parametrize(
    "a_layout,b_layout,permutes", [("row", "col", 1), ("row", "row", 0), ("col", "row", 1), ("col", "col", 2)]
)
def test_operand_layouts(a_layout, b_layout, permutes):
    """A stage holds the descriptor's block; an operand whose rows are contiguous (transposed) is read through
    a permuted view of it, as wgmma takes either major order of 16-bit operands."""
    src = _source(bias_gelu(a_layout=a_layout, b_layout=b_layout))
    consumer = src[src.index("def kernel_ws_consumer") : src.index("\ndef kernel(")]
    assert consumer.count(".permute((1, 0))") == permutes


def test_acc_layout():
    """Warpgroups stacked along the rows first: 8 warps on 128 rows are two 64-row groups, the wgmma N the
    tile's width."""
    assert "warps_per_cta=[8, 1], instr_shape=[16, 128, 16]" in acc_layout(128, 128, 8)
    assert "warps_per_cta=[4, 1], instr_shape=[16, 128, 16]" in acc_layout(128, 128, 4)
    assert "warps_per_cta=[4, 2], instr_shape=[16, 64, 16]" in acc_layout(64, 128, 8)


def test_the_module_loads_as_gluon():
    from opgraph.engines.triton.loader import load_module

    module = load_module(_source(swiglu()), interpret=False)
    assert all(getattr(module, k).is_gluon() for k in ("kernel", "kernel_ws_loader", "kernel_ws_consumer"))


def test_gluon_descriptor_types_name_the_layout():
    from opgraph.engines.triton.tma_desc import rank_of, signature_type

    ty = signature_type("bf16", (128, 64), gluon=True)
    assert ty.startswith("tensordesc<bf16[128, 64],NVMMASharedLayout(") and "swizzle_byte_width=128" in ty
    assert rank_of(ty) == 2 and signature_type("bf16", (128, 64)) == "tensordesc<bf16[128, 64]>"


# -- compiled for Hopper without a GPU ------------------------------------------------------------------------------

HOPPER_CASES = {
    "plain": (plain, "matmul", lambda cands: [c for c in cands if c.get("WS")]),
    "swiglu": (swiglu, "matmul", lambda cands: [c for c in cands if c.get("WS")]),
    "kv": (lambda: swiglu(kv=True), "matmul", lambda cands: [c for c in cands if c.get("WS")]),
    "bias_gelu": (bias_gelu, "matmul", [dict(_forced(bias_gelu()).pairs())]),
    "bias_gelu_fp16_col_a": (
        lambda: bias_gelu(dt=DT.HALF, a_layout="col", b_layout="row"),
        "matmul",
        [dict(_forced(bias_gelu(dt=DT.HALF, a_layout="col", b_layout="row")).pairs())],
    ),
    "residual": (residual, "matmul", lambda cands: [c for c in cands if c.get("WS")]),
    "residual_stats": (lambda: residual(stats=True), "matmul", lambda cands: [c for c in cands if c.get("WS")]),
    "column_sums": (column_sums, "matmul", lambda cands: [c for c in cands if c.get("WS")]),
    "fp32_residuals": (lambda: fp32_residuals(3), "matmul", lambda cands: [c for c in cands if c.get("WS")]),
    "data_gradient": (
        lambda: __import__("tests.engines.test_triton_matmul_fold", fromlist=["x"]).data_gradient((8, 197, 768), 3072),
        "matmul",
        lambda cands: [c for c in cands if c.get("WS")],
    ),
    "pointer_store": (
        lambda: bias_gelu(out_layout="col"),
        "matmul",
        [dict(_forced(bias_gelu(out_layout="col")).pairs())],
    ),
    "max_min": (lambda: max_min(), "matmul", lambda cands: [c for c in cands if c.get("WS")]),
    "norm_weight_gradient": (norm_weight_gradient, "matmul", [dict(_forced(norm_weight_gradient()).pairs())]),
}


def test_kernels_compile_for_hopper():
    """sm_90a, the installed Triton: a loader warp beside the consumers (4 or 8 warps, rounded up to whole
    warpgroups), registers resized per partition (setmaxnreg), wgmma products, TMA copies, no spills."""
    from .hopper_compile import compile_for_hopper

    out = compile_for_hopper(__name__, gpu="H200")
    lines = [line for line in out.splitlines() if line.startswith("compiled")]
    assert {line.split()[1] for line in lines} == set(HOPPER_CASES), out
    assert "tl.store(" in _source(bias_gelu(out_layout="col"))  # (the pointer_store case: no TMA store)
    # (the reductions' combine launches: Triton kernels of the Gluon module, compiled beside it)
    assert {line.split()[1] for line in lines if line.split()[2] == "kernel_combine0"} == {
        "residual_stats",
        "column_sums",
        "data_gradient",
        "norm_weight_gradient",
    }
    for line in lines:
        w = line.split()
        if w[2] != "kernel":
            continue
        field = {w[i]: w[i + 1] for i in range(3, len(w) - 1, 2) if not w[i].startswith("{")}
        knobs = eval(line[line.index("{") :])  # noqa: S307 - the harness's own dict
        assert int(field["spills"]) == 0 and int(field["wgmma"]) > 0 and int(field["tma"]) > 0, line
        assert int(field["setmaxnreg"]) > 0 and int(field["warps"]) == knobs["num_warps"] + 4, line
        assert int(field["smem"]) <= 227 * 1024, line


# -- on a Hopper GPU ------------------------------------------------------------------------------------------------


def _own_sums(plan, rng):
    """The product against the reference; its column sums against the float64 sums of the plan's own bf16 product
    (the reference's product rounds an element here and there to the neighbouring bf16 value, and sums of signed
    terms cancel to near zero, where that ulp is no small part of them)."""
    import numpy as np

    from opgraph.core.torch_interop import pack_to_device, torch_to_numpy
    from opgraph.testing import compare, random_pack, reference_outputs

    graph = plan.graph
    pack = random_pack(graph, rng)
    want = reference_outputs(graph, pack)
    dev = pack_to_device(pack, "cuda")
    plan.execute(dev)
    y, sums = (next(u for u in graph.outputs if graph.tensors[u].data_type is dt) for dt in (DT.BFLOAT16, DT.FLOAT))
    got = torch_to_numpy(dev[y])
    bad = [m for m in (compare(graph.tensors[y], got, want[y], atol=2e-2),) if m is not None]
    own = got.astype(np.float64).sum(axis=0, keepdims=True)
    np.testing.assert_allclose(torch_to_numpy(dev[sums]), own, rtol=1e-4, atol=1e-3)
    return bad


def _gpu_check(g, rng, rtol=None, check=None):
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs an sm_90 GPU")
    built = g.build(device="cuda", engines=["triton"], allow_partition=False)
    (step,) = built.steps
    cands = [TileKnobs(**c) for c in _template().candidates(step.piece, built.device)]
    ws = _ws(cands)
    if not ws:  # (a small case: the tiles fill the GPU less than once, so the candidates leave it out; a GELU)
        from opgraph.engines.triton.templates._matmul_ws import ws_config

        host = next(c for c in cands if c.TMA_HOST)
        ws = [ws_config(_template().matched(step.piece, built.device), host, built.device)]
    # the config as offered (a program a tile where the tiles are fewer than the SMs), then 7 programs, each of
    # several tiles, unevenly (the loader running ahead into the next tile, the ring's phases across tiles, the
    # stored tile's buffer reused)
    for knobs in (ws[0], ws[0].replace(PERSISTENT=7)):
        config = EngineConfig("triton", tuple(sorted({**dict(knobs.pairs()), "template": "matmul"}.items())))
        plan = step_plan(built, step, config)
        assert "warp_specialize" in plan.source(0)
        for _ in range(2):  # (new buffers: the descriptors encoded again)
            # (sums over K ~ 1000 of unit products: an element near zero is as exact as their fp32 rounding, ~1e-3
            # of the output's scale; a wrong tile, stage or store is off by the scale itself)
            bad = check(plan, rng) if check else og.testing.check_plan(plan, rng, atol=2e-2, rtol=rtol)
            assert not bad, "\n".join(map(str, bad))
    return plan


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
@pytest.mark.parametrize("kv", [False, True])
def test_gpu_siblings(dt, kv, rng):
    """Ragged M, N and K (the descriptors' zero-filled edges, the stores clipped), one and several tiles a program."""
    _gpu_check(swiglu(m=1000, k=1000, n=520, dt=dt, kv=kv), rng)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("a_layout,b_layout", [("row", "col"), ("row", "row"), ("col", "row"), ("col", "col")])
def test_gpu_bias_gelu_layouts(a_layout, b_layout, rng):
    _gpu_check(bias_gelu(m=1000, k=520, n=776, dt=DT.BFLOAT16, a_layout=a_layout, b_layout=b_layout), rng)


@pytest.mark.gpu
@requires_cuda
def test_gpu_max_min(rng):
    _gpu_check(max_min(m=1000, k=520, n=392), rng)


@pytest.mark.gpu
@requires_cuda
def test_gpu_pointer_stores(rng):
    """An output no TMA store writes (column-major, fp32): pointer stores in the accumulator's layout."""
    plan = _gpu_check(bias_gelu(m=1000, k=520, n=776, out_layout="col"), rng)
    assert "tl.store(" in plan.source(0) and "_og_gl_tma_store(desc_c" not in plan.source(0)


@pytest.mark.gpu
@requires_cuda
def test_gpu_residual(rng):
    """An [M, N] operand loaded in the epilogue (the loader's TMA copy into shared memory), a bf16 output."""
    _gpu_check(residual(m=1000, k=1000, n=392), rng)


# sums of the bf16-rounded outputs: where the fp32 product and the reference's float64 one round an element to
# neighbouring bf16 values (one ulp, 2^-8 of it: 0.25-0.5 measured on outputs ~30-80), the output and the sum move by
# that much (0.25-0.31 of sums ~700-1800); a wrong tile, slot or combine is off by a whole term or more
_SUMS_RTOL = 1e-2


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("n", [392, 1024])
def test_gpu_residual_and_mean_of_squares(n, rng):
    """The residual by TMA and the next RMSNorm's mean of squares: partials of 4 or 8 tiles a row, the combine
    launch (a Triton kernel of the Gluon module)."""
    plan = _gpu_check(residual(m=1000, k=1000, n=n, stats=True), rng, rtol=_SUMS_RTOL)
    assert "kernel_combine0" in plan.source(0)


@pytest.mark.gpu
@requires_cuda
def test_gpu_column_sums(rng):
    _gpu_check(column_sums(m=1000, k=520, n=776), rng, check=_own_sums)


@pytest.mark.gpu
@requires_cuda
def test_gpu_heuristic_picks_it_for_the_llama_swiglu(rng):
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs an sm_90 GPU")
    g = swiglu(m=4096, k=1024, n=2816)
    plan = g.build(device="cuda", engines=["triton"], allow_partition=False)
    assert plan.steps[0].config.knob("WS") == 1 and re.search(r"warpgroup_mma\(", plan.source(0))
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))
