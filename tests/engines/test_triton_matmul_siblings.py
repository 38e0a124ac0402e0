"""Products of one A computed side by side in one matmul kernel (GemmPiece.siblings): a Llama block's SwiGLU
(SiLU(x @ Wg) * (x @ Wu)) and its key and value projections, under the interpreter against the reference
engine, on the pointer path and the Hopper path (host descriptors, persistent, column halves)."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.core.device import Device
from opgraph.core.errors import AttributeValueError
from opgraph.core.piece import make_piece

from ..helpers import plan_with, requires_cuda

DT = og.DataType
H200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
HOST = {"TMA": 1, "TMA_HOST": 1, "PERSISTENT": 3, "FLATTEN": 1}


def _swiglu(dt=DT.HALF, batch=(), store_halves=False):
    g = og.Graph("swiglu", io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[*batch, 40, 32], name="x")
    ones = [1] * len(batch)
    wg = g.tensor(dim=[*ones, 32, 72], stride=[*([32 * 72] * len(batch)), 1, 32], name="w_gate")  # [N, K] weights
    wu = g.tensor(dim=[*ones, 32, 72], stride=[*([32 * 72] * len(batch)), 1, 32], name="w_up")
    gate = g.matmul(x, wg, name="gate")
    act = g.swish(gate, name="silu")
    up = g.matmul(x, wu, name="up")
    y = g.mul(act, up, name="y").set_output(True)
    if store_halves:  # (a training step saves both for the backward)
        act.set_output(True).set_data_type(dt)
        up.set_output(True).set_data_type(dt)
    return g, y


def _matmul_template():
    from opgraph.engines.triton import TEMPLATES

    return next(t for t in TEMPLATES if t.name == "matmul")


def _check(plan, rng):
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16, DT.FLOAT], ids=lambda d: d.name)
@pytest.mark.parametrize("store_halves", [False, True])
def test_swiglu_in_one_kernel(dt, store_halves, rng):
    """Ragged M, N, K; SiLU(gate) stays in registers (or is stored with the up projection, as a training
    step saves them)."""
    g, _ = _swiglu(dt, store_halves=store_halves)
    plan = plan_with(
        g, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, engines=("triton", "reference"), allow_partition=False
    )
    source = plan.source(0)
    assert "acc_s0 = tl.dot(a, b_s0, acc_s0" in source.replace("\n", " ") or "b_s0" in source
    assert source.count("tl.store(") == (3 if store_halves else 1)
    _check(plan, rng)


@pytest.mark.parametrize("subtile", [1, 2])
def test_swiglu_on_the_hopper_path(subtile, rng):
    """Host descriptors for A and both weights, a persistent flattened loop, the epilogue on the column
    halves of both accumulators, TMA stores; a batch axis (from_torch's [batch, tokens, d] activations)."""
    g, y = _swiglu(DT.BFLOAT16, batch=(2,))
    knobs = {**HOST, "EPILOGUE_SUBTILE": subtile, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16}
    plan = plan_with(g, knobs, engines=("triton", "reference"), allow_partition=False)
    source = plan.source(0)
    assert "desc_B_s0.load(" in source and "make_tensor_descriptor" not in source
    assert ("acc_s0_h1" in source) == (subtile == 2)
    _check(plan, rng)


def test_key_and_value_projections_store_both(rng):
    """Two plain products of one A (a block's key and value projections): both stored, nothing between."""
    g = og.Graph("kv", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[48, 32], name="x")
    k = g.matmul(x, g.tensor(dim=[32, 24], name="wk")).set_output(True)
    v = g.matmul(x, g.tensor(dim=[32, 24], name="wv")).set_output(True)
    plan = plan_with(
        g, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, engines=("triton", "reference"), allow_partition=False
    )
    assert len(plan.steps) == 1 and {k.uid, v.uid} <= set(plan.steps[0].piece.outputs)
    _check(plan, rng)


def test_products_of_other_operands_or_shapes_are_not_siblings():
    t = _matmul_template()
    g = og.Graph("two", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    x, x2 = g.tensor(dim=[48, 32], name="x"), g.tensor(dim=[48, 32], name="x2")
    g.matmul(x, g.tensor(dim=[32, 24], name="w1")).set_output(True)
    g.matmul(x2, g.tensor(dim=[32, 24], name="w2")).set_output(True)
    gp, verdict = t.analyze(make_piece(g.final, 0, list(g.final.nodes)))
    assert gp is None and "another A" in verdict.reason
    g = og.Graph("qk", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=[48, 32], name="x")
    g.matmul(x, g.tensor(dim=[32, 64], name="wq")).set_output(True)
    g.matmul(x, g.tensor(dim=[32, 16], name="wk")).set_output(True)
    gp, verdict = t.analyze(make_piece(g.final, 0, list(g.final.nodes)))
    assert gp is None and "[32, 16]" in verdict.reason


def test_split_k_is_refused_with_a_typed_error():
    g, _ = _swiglu()
    with pytest.raises(AttributeValueError, match="SPLIT_K=2"):
        plan_with(
            g,
            {"SPLIT_K": 2, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16},
            engines=("triton", "reference"),
            allow_partition=False,
        )


def test_gpu_candidates_tile_the_products_side_by_side():
    """On an H200 the candidates' tiles are as wide as one product's of twice the columns, split between the
    two (128 x 256 becomes 128 x 128 each), unsplit, on the Hopper path with the epilogue on halves, after the
    warp-specialized kernel (test_triton_matmul_ws.py)."""
    g, _ = _swiglu(DT.BFLOAT16)
    t = _matmul_template()
    piece = make_piece(g.final, 0, list(g.final.nodes))
    cands = t.candidates(piece, H200)
    assert all(c.get("SPLIT_K", 1) == 1 for c in cands)
    ws, first = t.candidates(_big_swiglu(), H200)[:2]
    assert ws.get("WS") == 1
    assert (first["BLOCK_M"], first["BLOCK_N"], first.get("TMA_HOST"), first.get("EPILOGUE_SUBTILE")) == (
        128,
        128,
        1,
        2,
    )


def _big_swiglu():
    g = og.Graph("swiglu_big", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[8, 1024, 1024], name="x")
    wg = g.tensor(dim=[1, 1024, 2816], stride=[1024 * 2816, 1, 1024], name="w_gate")
    wu = g.tensor(dim=[1, 1024, 2816], stride=[1024 * 2816, 1, 1024], name="w_up")
    g.mul(g.swish(g.matmul(x, wg)), g.matmul(x, wu)).set_output(True)
    return make_piece(g.final, 0, list(g.final.nodes))


@pytest.mark.gpu
@requires_cuda
def test_gpu_swiglu_and_key_value_plans_match(rng):
    """On the GPU, as the planner builds them: the SwiGLU of Llama-like sizes (ragged: 1000 tokens, 1000
    hidden) and two products of one A merged into one step (or left apart where the estimates say so),
    every output against the reference engine."""
    g = og.Graph("swiglu_gpu", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 500, 512], name="x")
    wg = g.tensor(dim=[1, 512, 1000], stride=[512 * 1000, 1, 512], name="w_gate")
    wu = g.tensor(dim=[1, 512, 1000], stride=[512 * 1000, 1, 512], name="w_up")
    g.mul(g.swish(g.matmul(x, wg)), g.matmul(x, wu)).set_output(True)
    plan = g.build(device="cuda", engines=["triton"])
    assert len(plan.steps) == 1, plan.describe()
    for _ in range(2):  # new buffers: the descriptors encoded again
        _check(plan, rng)
    g = og.Graph("kv_gpu", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[4096, 1024], name="x")
    for name in ("k", "v"):
        g.matmul(x, g.tensor(dim=[1024, 256], stride=[1, 1024], name=f"w_{name}")).set_output(True)
    plan = g.build(device="cuda", engines=["triton"])
    _check(plan, rng)


def test_three_projections_of_one_shape(rng):
    """q, k and v of one width (OPT's, BERT's): three products side by side, each tile's columns a power
    of two (32 columns of the three products: 16 each, not 10)."""
    g = og.Graph("qkv", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[40, 32], name="x")
    for name in ("q", "k", "v"):
        g.matmul(x, g.tensor(dim=[32, 24], name=f"w_{name}")).set_output(True)
    plan = g.build(device="cpu", engines=["triton", "reference"], allow_partition=False)
    assert len(plan.steps) == 1 and plan.steps[0].config.knob("BLOCK_N") == 16
    _check(plan, rng)


def test_gpu_candidates_do_not_flatten_the_loop():
    """The Hopper path's configs for products side by side run the tile loop and the K loop apart (SwiGLU
    at Llama's size: 176 µs flattened, 146 not; bench/results/2026-11-30-h200-swiglu-check.md)."""
    cands = _matmul_template().candidates(_big_swiglu(), H200)
    assert cands[0].get("TMA_HOST") == 1 and not any(c.get("FLATTEN") for c in cands)
