"""fp8 GEMMs through the matmul template: E4M3 and E5M2 operands (and mixed), per-tensor, per-row and
per-column scales in the epilogue, the cast to bf16 or to fp8, the output's amax reduced in the same kernel.

Under the interpreter fp8 tiles are widened to fp16 (exact); on the GPU they go to the fp8 tensor cores as
loaded (`dots.dot_kind(native_fp8=True)`): the Hopper compile test checks the fp8 wgmma instructions, the
GPU tests the results at realistic sizes against the reference engine."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.core.tensor import packed_strides

from ..helpers import assert_engine_close_l2, assert_engine_matches, plan_with, requires_cuda, templates

pytestmark = pytest.mark.interpreter
DT = og.DataType


def scaled_mm_graph(
    m: int,
    n: int,
    k: int,
    *,
    a_dt=DT.FP8_E4M3,
    b_dt=DT.FP8_E4M3,
    b_col: bool = True,
    scales: str = "tensor",
    out_dt=DT.BFLOAT16,
    amax: bool = False,
    batch: int = 1,
) -> og.Graph:
    """D = (A @ B) * scale_a * scale_b cast to `out_dt`, A [batch, M, K] row-major, B [1, K, N] column-major
    (as cuBLAS's fp8 GEMMs take it) or row-major; scales "tensor" ([1, 1, 1] fp32 each), "row" (A's per
    row [batch, M, 1], B's per column [1, 1, N]); with `amax`, max |D| before the cast, one fp32 value."""
    g = og.Graph("fp8mm", io_data_type=a_dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    a = g.tensor(dim=[batch, m, k], name="A")
    b_stride = [k * n, 1, k] if b_col else list(packed_strides([1, k, n]))
    b = g.tensor(dim=[1, k, n], stride=b_stride, data_type=b_dt, name="B")
    sa_dim, sb_dim = ([1, 1, 1], [1, 1, 1]) if scales == "tensor" else ([batch, m, 1], [1, 1, n])
    sa = g.tensor(dim=sa_dim, data_type=DT.FLOAT, name="scale_a")
    sb = g.tensor(dim=sb_dim, data_type=DT.FLOAT, name="scale_b")
    d = g.mul(g.mul(g.matmul(a, b, name="mm"), sa), sb)
    g.identity(d).set_output(True).set_data_type(out_dt)
    if amax:
        g.reduction(d, mode="AMAX").set_output(True).set_dim([1, 1, 1]).set_data_type(DT.FLOAT)
    return g


# -- the interpreter ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a_dt,b_dt",
    [(DT.FP8_E4M3, DT.FP8_E4M3), (DT.FP8_E5M2, DT.FP8_E5M2), (DT.FP8_E4M3, DT.FP8_E5M2)],
    ids=["e4m3", "e5m2", "mixed"],
)
@pytest.mark.parametrize("b_col", [True, False], ids=["b_col", "b_row"])
def test_fp8_operands_and_layouts(a_dt, b_dt, b_col, rng):
    g = scaled_mm_graph(40, 24, 72, a_dt=a_dt, b_dt=b_dt, b_col=b_col)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["matmul"]


@pytest.mark.parametrize("scales", ["tensor", "row"])
@pytest.mark.parametrize("out_dt", [DT.BFLOAT16, DT.FP8_E4M3, DT.FLOAT], ids=lambda d: d.name)
def test_scales_and_output_types(scales, out_dt, rng):
    """Per-tensor and per-row/column scales fused in the epilogue; the output cast to bf16, to fp8 (E4M3's
    exact rounding, saturating at 448 as the reference engine does) or kept in fp32."""
    g = scaled_mm_graph(36, 40, 64, scales=scales, out_dt=out_dt, batch=2)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["matmul"]


# -- compiled for Hopper without a GPU ---------------------------------------------------------------------------


def _first_two(cands):
    return cands[:2]


HOPPER_CASES = {  # the heuristic's first two configs of the 8192^3 product (the benchmark's), per B layout
    "e4m3_b_col": (lambda: scaled_mm_graph(8192, 8192, 8192), "matmul", _first_two),
    "e4m3_b_row": (lambda: scaled_mm_graph(8192, 8192, 8192, b_col=False), "matmul", _first_two),
    "e5m2_rowwise_fp8_out": (
        lambda: scaled_mm_graph(4096, 4096, 4096, a_dt=DT.FP8_E5M2, b_dt=DT.FP8_E5M2, scales="row", out_dt=DT.FP8_E4M3),
        "matmul",
        _first_two,
    ),
}


def test_fp8_kernels_compile_for_hopper_on_fp8_tensor_cores():
    """Every product on Hopper's fp8 tensor cores (wgmma with E4M3/E5M2 operands, B read column- or
    row-major), the heuristic's first config (the fp32 sum joined every main-loop step: a second accumulator)
    with nothing spilled, also where the epilogue scales rows and encodes its output to E4M3 (the cvt
    instruction; in integer arithmetic a 256 x 128 tile spilled 236 bytes of it under Triton 3.9)."""
    from .hopper_compile import compile_for_hopper

    lines = [line for line in compile_for_hopper(__name__).splitlines() if line.startswith("compiled")]
    assert {line.split()[1] for line in lines} == set(HOPPER_CASES), lines
    firsts = {}
    for line in lines:
        w = line.split()
        if w[2] != "kernel":
            continue
        firsts.setdefault(w[1], w)
        assert int(w[w.index("wgmma.fp8") + 1]) > 0 and w[w.index("wgmma") + 1] == w[w.index("wgmma.fp8") + 1], line
    assert all(int(w[w.index("spills") + 1]) == 0 for w in firsts.values()), lines
    assert all("FP8_ACC" not in " ".join(w) for w in firsts.values()), lines  # (promoted: FP8_ACC's default)


# -- amax: a reduction over the whole output in the epilogue ---------------------------------------------------


@pytest.mark.parametrize("out_dt", [DT.BFLOAT16, DT.FP8_E4M3], ids=lambda d: d.name)
@pytest.mark.parametrize("m,n", [(40, 36), (16, 16)], ids=["tiles", "one_tile"])
def test_amax_in_the_same_kernel(out_dt, m, n, rng):
    """The output's amax (every row and column of every batch entry: one value) reduced in the GEMM's
    epilogue, a partial per tile combined in fixed order (or stored directly by a single tile)."""
    g = scaled_mm_graph(m, n, 48, scales="row", out_dt=out_dt, amax=True, batch=2)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["matmul"], plan.describe()


@pytest.mark.parametrize(
    "knobs",
    [
        {"EPILOGUE_SUBTILE": 2, "BLOCK_M": 16, "BLOCK_N": 32},
        {"PERSISTENT": 3, "TMA": 1, "BLOCK_M": 16, "BLOCK_N": 16},
        {"SPLIT_K": 2, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16},
    ],
    ids=["halves", "persistent", "split_k"],
)
@pytest.mark.parametrize("mode", ["AMAX", "ADD", "NORM2"])
def test_whole_reduction_under_every_loop(knobs, mode, rng):
    """A reduction of every axis on the tile's column halves (their partials folded before the one store a
    tile), in a persistent kernel (several tiles a program) and after split-K (the epilogue's launch)."""
    g = og.Graph("whole", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    a, b = g.tensor(dim=[3, 40, 48], name="A"), g.tensor(dim=[3, 48, 72], name="B")
    y = g.matmul(a, b).set_output(True)
    g.reduction(y, mode=mode).set_output(True).set_dim([1, 1, 1]).set_data_type(DT.FLOAT)
    plan = plan_with(g, knobs, engines=("triton", "reference"), allow_partition=False)
    assert templates(plan) == ["matmul"], plan.describe()
    if "EPILOGUE_SUBTILE" in knobs:
        assert "rhalf" in plan.source(0)
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


def test_whole_reduction_per_batch_entry(rng):
    """The amax of each batch entry ([3, 1, 1]): one partial a tile, kept per entry."""
    g = og.Graph("per_batch", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    a, b = g.tensor(dim=[3, 40, 48], name="A"), g.tensor(dim=[3, 48, 72], name="B")
    y = g.matmul(a, b).set_output(True)
    g.reduction(y, mode="AMAX").set_output(True).set_dim([3, 1, 1]).set_data_type(DT.FLOAT)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["matmul"], plan.describe()


def test_other_gemm_templates_refuse_a_whole_reduction():
    """The conv templates' epilogues reduce rows or columns; a reduction of both is their refusal, named."""
    g = og.Graph("conv_sum", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 8, 6, 6], stride=[288, 1, 48, 8], name="x")
    w = g.tensor(dim=[16, 8, 3, 3], stride=[72, 1, 24, 8], name="w")
    y = g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1]).set_output(True)
    g.reduction(y, mode="AMAX").set_output(True).set_dim([1, 1, 1, 1]).set_data_type(DT.FLOAT)
    plan = g.build(device="cpu", engines=["triton", "reference"])
    assert len(plan.steps) == 2, plan.describe()
    assert "reduces the rows and the columns" in plan.describe(), plan.describe()


# -- GPU, realistic sizes ----------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize(
    "a_dt,b_dt,b_col",
    [(DT.FP8_E4M3, DT.FP8_E4M3, True), (DT.FP8_E4M3, DT.FP8_E4M3, False), (DT.FP8_E5M2, DT.FP8_E4M3, True)],
    ids=["e4m3_b_col", "e4m3_b_row", "e5m2_e4m3"],
)
def test_gpu_fp8_on_fp8_tensor_cores(a_dt, b_dt, b_col, rng):
    """fp8 tiles go to tl.dot as loaded (no widening in the source), the result within bf16's rounding."""
    g = scaled_mm_graph(2048, 1536, 4096, a_dt=a_dt, b_dt=b_dt, b_col=b_col)
    plan = assert_engine_close_l2(g, rng, max_rel_l2=1e-2)
    assert templates(plan) == ["matmul"], plan.describe()
    assert ".to(tl.float16)" not in plan.source(0), plan.source(0)


@pytest.mark.gpu
@requires_cuda
def test_gpu_fp8_rowwise_scales_amax_and_fp8_output(rng):
    """Transformer Engine's fp8 GEMM in one kernel: per-row and per-column scales, the output cast to E4M3,
    its amax (before the cast) reduced across every tile."""
    g = scaled_mm_graph(4096, 2048, 2048, scales="row", out_dt=DT.FP8_E4M3, amax=True)
    plan = assert_engine_close_l2(g, rng, max_rel_l2=6e-2)
    assert templates(plan) == ["matmul"], plan.describe()


# -- accumulation: the knob and the candidates ---------------------------------------------------------------


def _h100_match(g):
    from opgraph.core.device import Device
    from opgraph.core.piece import make_piece
    from opgraph.engines.triton.templates import discover

    device = Device("cuda", 0, "H100", (9, 0), 132)
    template = next(t for t in discover() if t.name == "matmul")
    piece = make_piece(g.final, 0, g.final.nodes)
    return template, piece, device


def test_fp8_candidates_promote_the_sum_then_offer_fast_accumulation():
    """On Hopper the heuristic's config joins the fp32 accumulator every main-loop step (max_num_imprecise_acc
    = BLOCK_K: cuBLAS's default precision) in tiles at most 128 wide; the second is the fast accumulation of
    the same product (FP8_ACC=0), noted reduced_precision_reduction; the interpreter widens fp8 to fp16."""
    from opgraph.engines.triton import generate

    template, piece, device = _h100_match(scaled_mm_graph(8192, 8192, 8192))
    match = template.match(piece, device)
    first, second = match.candidates()[:2]
    assert first.FP8_ACC is None and first.BLOCK_N <= 128 and second.FP8_ACC == 0
    assert not match.notes(first) and match.notes(second) == {og.NumericalNote.REDUCED_PRECISION_REDUCTION}
    # (the estimates the build weighs: the joins priced, FP8_JOIN_COST)
    assert match.estimate(first) == pytest.approx(1.25 * match.estimate(first.replace(FP8_ACC=0)))
    assert match.estimate(first.replace(BLOCK_M=128, BLOCK_N=256)) == pytest.approx(
        2.2 * match.estimate(first.replace(BLOCK_M=128, BLOCK_N=256, FP8_ACC=0))
    )
    src = generate(template, piece, dict(first.pairs()), device).source
    assert "max_num_imprecise_acc=BLOCK_K" in src and ".to(tl.float16)" not in src
    fast = generate(template, piece, dict(second.pairs()), device).source
    assert "max_num_imprecise_acc" not in fast
    explicit = generate(template, piece, {**dict(first.pairs()), "FP8_ACC": 64}, device).source
    assert "max_num_imprecise_acc=64" in explicit


@pytest.mark.parametrize("value,words", [(48, "power of two"), (16, "power of two"), (256, "more than BLOCK_K")])
def test_fp8_acc_knob_refusals(value, words):
    from opgraph.engines.triton.knobs import TileKnobs

    with pytest.raises(og.AttributeValueError, match=words):
        TileKnobs(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, FP8_ACC=value)


# -- the graph's builder ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("amax", [False, True])
def test_scaled_matmul_builder_is_one_fused_kernel(amax, rng):
    """g.scaled_matmul: the product, a per-row and a constant scale, the cast, the amax: one matmul step
    against the reference engine, its ops named after the builder's name."""
    g = og.Graph("sm", io_data_type=DT.FP8_E4M3, intermediate_data_type=DT.FLOAT)
    a = g.tensor(dim=[2, 40, 64], name="a")
    b = g.tensor(dim=[1, 64, 24], stride=[64 * 24, 1, 64], name="b")
    sa = g.tensor(dim=[2, 40, 1], data_type=DT.FLOAT, name="sa")
    out = g.scaled_matmul(a, b, sa, 0.125, out_data_type=DT.BFLOAT16, amax=amax, name="proj")
    for t in out if amax else [out]:
        t.set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["matmul"] and "'proj.scale_a'" in plan.describe()
    if amax:
        assert list(out[1].dim) == [1, 1, 1] and out[1].data_type is DT.FLOAT


def whole_reduction_graph(seed: int) -> og.Graph:
    """A random product (batch axes, broadcast B, layouts, fp8/16-bit/fp32 operands) and a reduction of
    every row and column of its output, of the batch too or not."""
    import numpy as np

    from .test_triton_matmul import layout_strides

    r = np.random.default_rng(seed)
    batch = int(r.integers(1, 4))
    m, n, k = (int(r.integers(1, 40)) for _ in range(3))
    dt = [DT.HALF, DT.FLOAT, DT.FP8_E4M3, DT.FP8_E5M2][int(r.integers(0, 4))]
    g = og.Graph(f"whole{seed}", io_data_type=dt, intermediate_data_type=DT.FLOAT)
    ad, bd = [batch, m, k], [1 if r.random() < 0.5 else batch, k, n]
    a = g.tensor(dim=ad, stride=layout_strides(ad, str(r.choice(["row", "col", "gap"]))), name="A")
    b = g.tensor(dim=bd, stride=layout_strides(bd, str(r.choice(["row", "col", "gap"]))), name="B")
    y = g.matmul(a, b)
    if r.random() < 0.5:
        y = g.relu(g.add(y, g.tensor(dim=[1, 1, n], data_type=DT.FLOAT, name="bias")))
    y.set_output(True).set_data_type(DT.FLOAT)
    mode = str(r.choice(["ADD", "MAX", "MIN", "AMAX", "AVG", "NORM1"]))
    keep = bool(r.integers(0, 2))
    g.reduction(y, mode=mode).set_output(True).set_dim([batch if keep else 1, 1, 1]).set_data_type(DT.FLOAT)
    return g


@pytest.mark.parametrize("seed", range(16))
def test_fuzz_whole_reductions(seed, rng):
    """Seeded: small integers, so every engine's sums are exact and any slot or mask slip shows."""
    plan = assert_engine_matches(
        whole_reduction_graph(seed), rng, expect_steps=1, integers=True, low=-2, high=2, rtol=0, atol=0
    )
    assert templates(plan) == ["matmul"], plan.describe()


def test_fp8_accumulation_keeps_the_candidates_shape():
    """The fp8 ordering keeps the fallback last and a promoted config first even where no ranked tile is at
    most 128 wide, and leaves a list of the fallback alone."""
    from opgraph.engines.triton.knobs import TileKnobs

    template, piece, device = _h100_match(scaled_mm_graph(8192, 8192, 8192))
    match = template.match(piece, device)
    wide = TileKnobs(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, num_warps=8, num_stages=3)
    fallback = TileKnobs(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=2)
    assert match._fp8_accumulation([wide, fallback]) == [wide, wide.replace(FP8_ACC=0), fallback]
    assert match._fp8_accumulation([fallback]) == [fallback]
