"""The Triton matmul template against the reference engine: layouts (row/column-major, gapped,
broadcast batch, views), data types, prologues, epilogues, row/column reductions, split-K and the
cuDNN frontend's matmul fusion patterns, each one fused piece; a seeded fuzzer on small integers.
Under the interpreter on the CPU with tiny shapes; marked gpu, on CUDA at realistic sizes."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.core.tensor import packed_strides

from ..helpers import (
    assert_candidates_match,
    assert_engine_close_l2,
    assert_engine_matches,
    candidate_configs,
    plan_with,
    requires_cuda,
    requires_interpreter,
    templates,
)

pytestmark = pytest.mark.interpreter
DT = og.DataType


def layout_strides(dims, layout):
    """row: packed row-major; col: the last two axes swapped in memory; gap: row-major with padded rows."""
    dims = list(dims)
    if layout == "row":
        return list(packed_strides(dims))
    if layout == "col":
        order = [*range(len(dims) - 2), len(dims) - 1, len(dims) - 2]
        return list(packed_strides(dims, order))
    assert layout == "gap"
    strides = [0] * len(dims)
    step = 1
    for axis in reversed(range(len(dims))):
        strides[axis] = step
        step *= dims[axis] + (3 if axis == len(dims) - 1 else 1)
    return strides


def mm_graph(a_dims, b_dims, *, dt=DT.HALF, a_layout="row", b_layout="row", name="mm"):
    g = og.Graph(name, io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    a = g.tensor(dim=list(a_dims), stride=layout_strides(a_dims, a_layout), name="A")
    b = g.tensor(dim=list(b_dims), stride=layout_strides(b_dims, b_layout), name="B")
    c = g.matmul(a, b, name="mm")
    return g, a, b, c


# -- layouts ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("a_layout", ["row", "col", "gap"])
@pytest.mark.parametrize("b_layout", ["row", "col", "gap"])
def test_layouts(a_layout, b_layout, rng):
    g, _, _, c = mm_graph((24, 40), (40, 20), a_layout=a_layout, b_layout=b_layout)
    c.set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert templates(plan) == ["matmul"]


@pytest.mark.parametrize(
    "a_dims,b_dims",
    [
        ((3, 17, 24), (3, 24, 9)),  # batched
        ((2, 1, 8, 16), (1, 3, 16, 24)),  # broadcast batch axes in both operands
        ((4, 16, 16), (1, 16, 16)),  # one weight for every batch entry
        ((1, 33, 5), (1, 5, 18)),  # ragged M, N, K smaller than a block
    ],
)
def test_batched_and_broadcast(a_dims, b_dims, rng):
    g, _, _, c = mm_graph(a_dims, b_dims, a_layout="col")
    c.set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


def test_output_in_column_major_and_gapped_layouts(rng):
    g, _, _, c = mm_graph((2, 20, 24), (2, 24, 36))
    c.set_output(True).set_stride(layout_strides((2, 20, 36), "col"))
    g.relu(c).set_output(True).set_stride(layout_strides((2, 20, 36), "gap"))
    assert_engine_matches(g, rng, expect_steps=1)


# -- data types -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16, DT.FLOAT], ids=lambda d: d.name)
def test_dtypes(dt, rng):
    g, _, _, c = mm_graph((2, 24, 48), (2, 48, 40), dt=dt)
    c.set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


def test_int8_int32_accumulation(rng):
    g, _, _, c = mm_graph((32, 64), (64, 24), dt=DT.INT8)
    c.set_output(True).set_data_type(DT.INT32)
    assert_engine_matches(g, rng, expect_steps=1, rtol=0, atol=0)


def test_unsupported_operand_types_are_declined():
    g, _, _, c = mm_graph((16, 16), (16, 16), dt=DT.INT32)
    c.set_output(True)
    plan = g.build(device="cpu", engines=["triton", "reference"])
    assert [s.config.engine for s in plan.steps] == ["reference"]
    assert "INT8" in plan.describe() or plan.cuts == ()


# -- the cuDNN frontend's matmul fusion patterns ------------------------------------------------------------


def test_pattern_matmul_bias(rng):
    g, _, _, c = mm_graph((2, 32, 48), (2, 48, 24))
    bias = g.tensor(dim=[2, 1, 24], name="bias")
    g.add(c, bias).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)
    g.build(device="cpu", engines=["triton"], allow_partition=False)


def test_pattern_mixed_precision_matmul_with_casts(rng):
    """int8 A cast to bf16 (a prologue), times bf16 B, fp32 out; and fp32 A cast to fp16 x fp16 B."""
    g = og.Graph("mixed", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    a = g.tensor(dim=[2, 24, 32], data_type=DT.INT8, name="A")
    b = g.tensor(dim=[2, 32, 16], name="B")
    a16 = g.identity(a).set_data_type(DT.BFLOAT16)
    g.matmul(a16, b).set_output(True).set_data_type(DT.FLOAT)
    assert_engine_matches(g, rng, expect_steps=1)
    g.build(device="cpu", engines=["triton"], allow_partition=False)

    h = og.Graph("mixed16", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    a = h.tensor(dim=[24, 32], data_type=DT.FLOAT, name="A")
    b = h.tensor(dim=[32, 16], name="B")
    h.matmul(h.identity(a).set_data_type(DT.HALF), b).set_output(True)
    assert_engine_matches(h, rng, expect_steps=1)


def _strict_fused(g, rng):
    """Build g as one fused piece (allow_partition=False) and check it against the reference.

    A lone slice/transpose is no Triton kernel, and the greedy partitioner does not let the
    reference engine's piece holding it grow into the matmul, so the default build runs the view
    as its own step; strict mode finds that the matmul template runs the whole graph."""
    plan = g.build(device="cpu", engines=["triton", "reference"], allow_partition=False)
    assert templates(plan) == ["matmul"], plan.describe()
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad)) + "\n" + plan.describe()
    return plan


def test_pattern_slice_matmul(rng):
    """A slice of a graph input, read in place through the operand's addressing."""
    g = og.Graph("slice_mm", io_data_type=DT.HALF, intermediate_data_type=DT.HALF)
    big = g.tensor(dim=[3, 40, 48], name="A_big")
    b = g.tensor(dim=[2, 24, 16], name="B")
    a = g.slice(big, [slice(1, 3), slice(5, 37, 2), slice(8, 32)])
    g.matmul(a, b).set_output(True)
    plan = _strict_fused(g, rng)
    assert "slice" in plan.describe() and "(p1 + " in plan.source(0)


def test_transposed_view_and_prologue(rng):
    """C = relu(A * s) @ transpose(Bt): a per-K scale in the prologue of A, B read transposed."""
    g = og.Graph("tv", io_data_type=DT.HALF)
    a = g.tensor(dim=[2, 20, 24], name="A")
    s = g.tensor(dim=[1, 1, 24], data_type=DT.FLOAT, name="s")
    bt = g.tensor(dim=[2, 16, 24], name="Bt")
    b = g.transpose(bt, [0, 2, 1])
    g.matmul(g.relu(g.mul(a, s)).set_data_type(DT.HALF), b).set_output(True)
    _strict_fused(g, rng)


def test_same_prologue_on_both_operands(rng):
    g = og.Graph("both", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[32, 32], name="x")
    r = g.relu(x)
    g.matmul(r, r).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


# -- epilogues and reductions --------------------------------------------------------------------------------


def test_bias_gelu_and_several_outputs(rng):
    g, _, _, c = mm_graph((40, 32), (32, 48))
    bias = g.tensor(dim=[1, 48], name="bias")
    t = g.add(c, bias)
    g.gelu(t).set_output(True)
    g.cmp_gt(t, 0.0).set_output(True)
    g.identity(t).set_output(True).set_data_type(DT.FLOAT)
    assert_engine_matches(g, rng, expect_steps=1)


@pytest.mark.parametrize("mode", ["ADD", "AVG", "MAX", "AMAX", "NORM2"])
@pytest.mark.parametrize("n", [24, 72])
def test_row_reduction(mode, n, rng):
    """A row reduction of the product (one program per row tile when N fits, partials otherwise)."""
    g, _, _, c = mm_graph((2, 36, 32), (2, 32, n), dt=DT.FLOAT)
    c.set_output(True)
    g.reduction(c, mode=mode).set_output(True).set_dim([2, 36, 1])
    assert_engine_matches(g, rng, expect_steps=1, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch_reduced", [False, True])
def test_column_reduction(batch_reduced, rng):
    g, _, _, c = mm_graph((3, 40, 16), (3, 16, 24), dt=DT.FLOAT)
    r = g.relu(c).set_output(True)
    g.reduction(r, mode="ADD").set_output(True).set_dim([1 if batch_reduced else 3, 1, 24])
    assert_engine_matches(g, rng, expect_steps=1, rtol=1e-4, atol=1e-4)


def test_genstats_of_a_matmul(rng):
    g, _, _, c = mm_graph((48, 32), (32, 24), dt=DT.HALF)
    c.set_output(True)
    s, sq = g.genstats(c)
    s.set_output(True)
    sq.set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


# -- split-K and candidates ------------------------------------------------------------------------------------


def test_long_k_takes_split_k_by_heuristic(rng):
    g, _, _, c = mm_graph((16, 512), (512, 16), dt=DT.FLOAT)
    bias = g.tensor(dim=[1, 16], name="bias")
    y = g.relu(g.add(c, bias)).set_output(True)
    g.reduction(y, mode="ADD").set_output(True).set_dim([16, 1])
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert plan.steps[0].config.knob("SPLIT_K") > 1


def test_int8_split_k(rng):
    g, _, _, c = mm_graph((16, 512), (512, 16), dt=DT.INT8)
    c.set_output(True).set_data_type(DT.INT32)
    plan = assert_engine_matches(g, rng, expect_steps=1, rtol=0, atol=0)
    assert plan.steps[0].config.knob("SPLIT_K") > 1


def test_every_candidate_matches(rng):
    g, _, _, c = mm_graph((2, 40, 48), (1, 48, 36), a_layout="col")
    g.relu(c).set_output(True)
    assert_candidates_match(*candidate_configs(g), rng)


def _plan_with(g, knobs):
    """A plan whose only step runs the matmul template with `knobs` over its heuristic's choice."""
    return plan_with(g, knobs, engines=("triton", "reference"), allow_partition=False)


@pytest.mark.parametrize("persistent,flatten", [(0, 0), (3, 0), (3, 1)])
@pytest.mark.parametrize("a_layout,b_layout", [("row", "row"), ("col", "col"), ("row", "gap"), ("col", "row")])
def test_tma_descriptors_and_persistent_grid(a_layout, b_layout, persistent, flatten, rng):
    """TMA=1 reads the operands through tensor descriptors (zero-filled edges: ragged M, N, K here),
    PERSISTENT loops fewer programs over the tiles (FLATTEN: its loops pipelined as one); batch axes,
    a broadcast B and an epilogue."""
    g, _, _, c = mm_graph((3, 40, 40), (1, 40, 24), a_layout=a_layout, b_layout=b_layout)
    bias = g.tensor(dim=[1, 1, 24], name="bias")
    y = g.relu(g.add(c, bias)).set_output(True)
    g.reduction(y, mode="ADD").set_output(True).set_dim([3, 40, 1])
    knobs = {"TMA": 1, "PERSISTENT": persistent, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}
    plan = _plan_with(g, {**knobs, "FLATTEN": 1} if flatten else knobs)
    source = plan.source(0)
    assert "make_tensor_descriptor" in source
    if persistent:
        assert "for work in tl.range" in source and plan.steps[0].kernel.generated.launches[0].grid == (3,)
        assert f"flatten={bool(flatten)}" in source
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.parametrize("dt", [DT.BFLOAT16, DT.INT8, DT.FLOAT], ids=lambda d: d.name)
def test_tma_dtypes_and_slice_view(dt, rng):
    g = og.Graph("tma_view", io_data_type=dt, intermediate_data_type=DT.FLOAT)
    big = g.tensor(dim=[2, 48, 64], name="A_big")
    b = g.tensor(dim=[2, 32, 16], name="B")
    a = g.slice(big, [slice(None), slice(8, 40), slice(16, 48)])  # offsets keep 16-byte alignment
    c = g.matmul(a, b)
    c.set_output(True).set_data_type(DT.INT32 if dt is DT.INT8 else dt)
    plan = _plan_with(g, {"TMA": 1, "PERSISTENT": 2, "BLOCK_K": 32 if dt is DT.INT8 else 16})
    assert plan.source(0).count("make_tensor_descriptor") == 2
    bad = og.testing.check_plan(plan, rng, rtol=0 if dt is DT.INT8 else None, atol=0 if dt is DT.INT8 else None)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.parametrize("reduce", ["genstats", "rowsum", "rowmax", "mean_of_squares"])
def test_epilogue_subtile(reduce, rng):
    """EPILOGUE_SUBTILE=2: the epilogue on the tile's column halves; a row reduction adds (or takes the max
    of) the halves' partials before its one store per tile (3 column tiles: partials and a combine launch)."""
    g, _, _, c = mm_graph((40, 32), (32, 72))
    bias = g.tensor(dim=[1, 72], name="bias")
    y = g.gelu(g.add(c, bias)).set_output(True)
    if reduce == "genstats":
        s, sq = g.genstats(y)
        s.set_output(True)
        sq.set_output(True)
    elif reduce == "mean_of_squares":  # RMSNorm's, after a residual add (a Llama block's projections)
        g.reduction(g.mul(y, y), mode="AVG").set_output(True).set_dim([40, 1])
    else:
        g.reduction(y, mode="ADD" if reduce == "rowsum" else "MAX").set_output(True).set_dim([40, 1])
    plan = _plan_with(g, {"EPILOGUE_SUBTILE": 2, "BLOCK_M": 16, "BLOCK_N": 32})
    source = plan.source(0)
    assert "tl.split" in source
    assert ("rhalf" in source) == (reduce != "genstats")
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


def test_gpu_heuristic_ranks_tma_persistent_first_for_a_large_gemm():
    from opgraph.core.device import Device
    from opgraph.engines.triton import TEMPLATES
    from opgraph.core.piece import make_piece

    g, _, _, c = mm_graph((8192, 4096), (4096, 4096))
    bias = g.tensor(dim=[1, 4096], name="bias")
    g.gelu(g.add(c, bias)).set_output(True)
    piece = make_piece(g.final, 0, g.final.nodes)
    template = next(t for t in TEMPLATES if t.name == "matmul")
    h200 = Device("cuda", 0, "H200", (9, 0), 132)
    cands = template.candidates(piece, h200)
    first = cands[0]
    assert first["TMA"] == 1 and first["PERSISTENT"] == 132 and (first["BLOCK_M"], first["BLOCK_N"]) == (128, 256)
    assert first["EPILOGUE_SUBTILE"] == 2 and first["TMA_HOST"] == 1  # the Hopper path (test_triton_matmul_hopper)
    device = next(c for c in cands if c.get("PERSISTENT") and not c.get("TMA_HOST"))
    assert cands[cands.index(device) + 1] == {**device, "FLATTEN": 1}  # its pipelined twin, for tuning


def test_flatten_needs_a_persistent_grid():
    from opgraph.core.errors import AttributeValueError
    from opgraph.engines.triton.knobs import TileKnobs

    tile = {"BLOCK_M": 64, "BLOCK_N": 64}
    TileKnobs.parse({**tile, "PERSISTENT": 132, "FLATTEN": 1})
    for bad in ({"FLATTEN": 1}, {"PERSISTENT": 132, "FLATTEN": 2}, {"PERSISTENT": 132, "FLATTEN": 1, "SPLIT_K": 2}):
        with pytest.raises(AttributeValueError, match="FLATTEN"):
            TileKnobs.parse({**tile, **bad})


def _mlp_up():
    """GPT-2's MLP up-projection: [8, 1024, 768] x [768, 3072] + bias, GELU (tanh), bf16."""
    g = og.Graph("mlp_up", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    a, b = g.tensor(dim=[8, 1024, 768], name="a"), g.tensor(dim=[1, 768, 3072], name="b")
    bias = g.tensor(dim=[1, 1, 3072], name="bias")
    g.gelu_approx_tanh(g.add(g.matmul(a, b), bias)).set_output(True)
    return g


HOPPER_CASES = {  # the heuristic's persistent config and its FLATTEN twin
    "mlp_up": (_mlp_up, "matmul", lambda cands: [c for c in cands if c.get("PERSISTENT")][:2]),
}


def test_kernels_compile_for_hopper():
    from .hopper_compile import compile_for_hopper

    lines = [line for line in compile_for_hopper(__name__).splitlines() if line.startswith("compiled")]
    assert len(lines) == 2 and "'FLATTEN': 1" in lines[1], lines
    assert all(line.split()[6] == "0" for line in lines), lines  # no spills


# -- the fuzzer --------------------------------------------------------------------------------------------------


def fuzz_graph(seed: int) -> og.Graph:
    r = np.random.default_rng(seed)
    nb = int(r.integers(0, 3))
    batch = [int(r.integers(1, 4)) for _ in range(nb)]
    a_batch = [b if r.random() < 0.7 else 1 for b in batch]
    b_batch = [b if r.random() < 0.7 else 1 for b in batch]
    m, n, k = (int(r.integers(1, 50)) for _ in range(3))
    dt = r.choice([DT.HALF, DT.BFLOAT16, DT.FLOAT, DT.INT8])
    g = og.Graph(f"mmfuzz{seed}", io_data_type=dt, intermediate_data_type=DT.FLOAT)
    ad, bd = [*a_batch, m, k], [*b_batch, k, n]
    a = g.tensor(dim=ad, stride=layout_strides(ad, r.choice(["row", "col", "gap"])), name="A")
    b = g.tensor(dim=bd, stride=layout_strides(bd, r.choice(["row", "col", "gap"])), name="B")
    c = g.matmul(a, b)
    out_dt = DT.INT32 if dt is DT.INT8 else dt
    cd = [max(x, y) for x, y in zip(a_batch, b_batch)] + [m, n]
    epi = r.choice(["none", "bias_relu", "residual", "rowsum"])
    if epi == "none":
        c.set_output(True).set_data_type(out_dt)
    elif epi == "bias_relu":
        bias = g.tensor(dim=[1] * nb + [1, n], data_type=DT.FLOAT if dt is DT.INT8 else dt, name="bias")
        c.set_data_type(out_dt)
        g.relu(g.add(c, bias)).set_output(True).set_data_type(DT.FLOAT)
    elif epi == "residual":
        res = g.tensor(dim=cd, stride=layout_strides(cd, r.choice(["row", "col"])), name="res", data_type=DT.FLOAT)
        c.set_output(True).set_data_type(out_dt)
        g.add(c, res).set_output(True).set_data_type(DT.FLOAT)
    else:
        c.set_output(True).set_data_type(out_dt)
        g.reduction(c, mode="ADD").set_output(True).set_dim([*cd[:-1], 1])
    return g


@pytest.mark.parametrize("seed", range(24))
def test_fuzz(seed, rng):
    assert_engine_matches(fuzz_graph(seed), rng, expect_steps=1, integers=True, low=-2, high=2, rtol=0, atol=0)


# -- GPU, realistic sizes ----------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16, DT.FLOAT], ids=lambda d: d.name)
def test_gpu_matmul_bias_gelu(dt, rng):
    g, _, _, c = mm_graph((2048, 1024), (1024, 1536), dt=dt)
    bias = g.tensor(dim=[1, 1536], name="bias")
    g.gelu(g.add(c, bias)).set_output(True)
    # fp32 runs as TF32 on the GPU by default (10-bit mantissa operands: ~1e-3 relative per product,
    # summed over K ~ 10^3 terms of magnitude ~1): absolute errors of a few 1e-2 are expected
    rtol, atol = {DT.FLOAT: (2e-2, 2e-1), DT.HALF: (1e-2, 1e-2), DT.BFLOAT16: (5e-2, 5e-2)}[dt]
    plan = assert_engine_matches(g, rng, device="cuda", expect_steps=1, rtol=rtol, atol=atol)
    assert templates(plan) == ["matmul"]


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("a_layout,b_layout", [("row", "col"), ("col", "row"), ("gap", "gap")])
def test_gpu_layouts_batched(a_layout, b_layout, rng):
    g, _, _, c = mm_graph((8, 512, 384), (1, 384, 640), a_layout=a_layout, b_layout=b_layout)
    c.set_output(True)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("twin", [0, 1])
def test_gpu_persistent_flatten_twins(twin, rng):
    """The heuristic's persistent config for GPT-2's MLP up-projection (bias + GELU, bf16; on Hopper
    the flattened host-descriptor loop) and its twin of the other FLATTEN compute the same, compiled
    (the interpreter ignores flatten)."""
    g = _mlp_up()  # (mode B after A: the alternatives hold every candidate, the twin too)
    plan = g.build(device="cuda", engines=["triton"], heur_mode=[og.HeurMode.A, og.HeurMode.B])
    step = plan.steps[0]
    assert step.config.knob("PERSISTENT"), plan.describe()
    if twin:
        from ..helpers import with_step_config

        flat = bool(step.config.knob("FLATTEN"))
        other = next(c for c in step.alternatives if c.knob("PERSISTENT") and bool(c.knob("FLATTEN")) != flat)
        plan = with_step_config(plan, 0, other)
    bad = og.testing.check_plan(plan, rng, rtol=5e-2, atol=5e-2)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.gpu
@requires_cuda
def test_gpu_int8(rng):
    g, _, _, c = mm_graph((1024, 2048), (2048, 512), dt=DT.INT8)
    c.set_output(True).set_data_type(DT.INT32)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1, rtol=0, atol=0)


@pytest.mark.gpu
@requires_cuda
def test_gpu_gelu_backward_and_bias_gradient_in_the_epilogue(rng):
    """GPT-2's MLP data gradient, one kernel: dh = gelu_approx_tanh_backward(dY @ W^T, h) and the bias
    gradient (dh's column sums over all 8192 rows, across programs) in the matmul's epilogue, as
    graph/placement.py lines them up in a training step; bf16 [8, 1024, 768] x [768, 3072]."""
    g, _, _, c = mm_graph((8, 1024, 768), (1, 768, 3072), dt=DT.BFLOAT16)
    h = g.tensor(dim=[8, 1024, 3072], name="h")
    dh = g.gelu_approx_tanh_backward(c, h).set_output(True)
    g.reduction(dh, mode="ADD").set_output(True).set_dim([1, 1, 3072]).set_data_type(DT.FLOAT)
    plan = assert_engine_close_l2(g, rng, max_rel_l2=2e-2)
    assert templates(plan) == ["matmul"], plan.describe()


@pytest.mark.gpu
@requires_cuda
def test_gpu_split_k_small_mn_long_k(rng):
    g, _, _, c = mm_graph((128, 16384), (16384, 128), dt=DT.HALF)
    g.relu(c).set_output(True)
    plan = assert_engine_matches(g, rng, device="cuda", expect_steps=1, rtol=1e-2, atol=5e-2)
    assert plan.steps[0].config.knob("SPLIT_K") > 1


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("seed", range(8))
def test_gpu_fuzz(seed, rng):
    assert_engine_matches(
        fuzz_graph(seed), rng, device="cuda", expect_steps=1, integers=True, low=-2, high=2, rtol=0, atol=0
    )


def test_integer_prologue_and_epilogue_in_an_fp64_gemm_piece(rng):
    """INT32 tensors on both sides of the dot (a mask compare in the prologue, a gen_index compare and
    add in the epilogue): preset values and integer values meet in the compute type they expect."""
    g = og.Graph("mm", io_data_type=DT.FLOAT)
    a, b = g.tensor(dim=[1, 16, 32], name="a"), g.tensor(dim=[1, 32, 24], name="b")
    k = g.tensor(dim=[1, 16, 1], name="k", data_type=DT.INT32)
    kk = g.tensor(dim=[1, 16, 32], name="kk", data_type=DT.INT32)
    y = g.matmul(g.mul(a, g.cmp_gt(kk, 0.0).set_data_type(DT.FLOAT)), b)
    i = g.gen_index(y, axis=2).set_data_type(DT.INT32)
    g.mul(y, g.cmp_lt(i, k).set_data_type(DT.FLOAT)).set_output(True)
    g.add(y, i).set_data_type(DT.FLOAT).set_output(True)

    def ints(pack):
        for v in pack.values():
            if isinstance(v, np.ndarray) and v.dtype.kind == "i":
                v[...] = np.arange(v.size).reshape(v.shape) * 7 % 23 - 3

    plan = assert_engine_matches(g, rng, expect_steps=1, prepare=ints)
    assert plan.steps[0].config.knob("template") == "matmul", plan.describe()
