"""Graphs with attention cut into pieces sensibly and run on every engine list: an sdpa node makes a
piece alone or with pointwise neighbours (a q/k/v prologue, an O epilogue) where one engine takes them
together; the pieces match the reference engine, forward and backward (opgraph.grad). GPU: the
default engines and autotuning on fp16 attention blocks."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.autodiff import grad
from opgraph.testing import check_plan

from ..helpers import requires_cuda, requires_interpreter

DT = og.DataType


def block(io=DT.FLOAT, b=1, h=2, s=16, d=16, causal=True):
    """x * w -> sdpa (causal) -> tanh, k and v plain inputs."""
    g = og.Graph("block", io_data_type=io, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=[b, h, s, d], name="x")
    w = g.tensor(dim=[1, h, 1, d], name="w")
    k, v = (g.tensor(dim=[b, h, s, d], name=n) for n in "kv")
    # q, k and v share one type: the prologue's result (virtual, the intermediate type by default) takes io's
    q = g.mul(x, w).set_data_type(io)
    o, _ = g.sdpa(q, k, v, attn_scale=0.25, generate_stats=False, use_causal_mask=causal)
    g.tanh(o).set_output(True).set_name("y")
    return g, (x, w, k, v)


def _pieces_are_sensible(plan) -> None:
    """A fused kernel (any engine but the op-by-op ones) holding attention holds one attention node
    and pointwise ops at most."""
    for step in plan.steps:
        kinds = [n.kind for n in step.piece.nodes]
        attention = [k for k in kinds if k in ("sdpa", "sdpa_backward")]
        if attention and step.config.engine not in ("torch", "reference"):
            assert len(attention) == 1 and set(kinds) - {"sdpa", "sdpa_backward"} <= {"pointwise"}, plan.describe()


@pytest.mark.parametrize("engines", [["torch"], ["reference"], None])
def test_block_runs_on_every_engine_list(engines):
    g, _ = block()
    plan = g.build(device="cpu", engines=engines)
    assert not check_plan(plan, np.random.default_rng(0)), plan.describe()


@requires_interpreter
def test_block_with_generated_kernels_cuts_around_attention():
    g, _ = block()
    plan = g.build(device="cpu", engines=["triton", "torch"])
    _pieces_are_sensible(plan)
    kinds = [[n.kind for n in s.piece.nodes] for s in plan.steps]
    assert sum(k.count("sdpa") for k in kinds) == 1
    assert not check_plan(plan, np.random.default_rng(1)), plan.describe()


@pytest.mark.parametrize("engines", [["torch"], ["reference"]])
def test_backward_graph_runs(engines):
    g, (x, w, k, v) = block()
    res = grad(g, g.final.tensor("y").uid, [x, w, k, v], combined=True)
    plan = res.graph.build(device="cpu", engines=engines)
    assert "sdpa_backward" in [n.kind for s in plan.steps for n in s.piece.nodes]
    assert not check_plan(plan, np.random.default_rng(2), rtol=1e-3, atol=1e-4), plan.describe()


@requires_interpreter
def test_backward_graph_with_generated_kernels():
    g, (x, w, k, v) = block()
    res = grad(g, g.final.tensor("y").uid, [x, w, k, v], combined=True)
    plan = res.graph.build(device="cpu", engines=["triton", "torch"])
    _pieces_are_sensible(plan)
    assert not check_plan(plan, np.random.default_rng(3), rtol=1e-3, atol=1e-4), plan.describe()


def test_two_attention_layers_make_separate_pieces():
    g = og.Graph("two", io_data_type=DT.FLOAT)
    q, k, v = (g.tensor(dim=[1, 2, 8, 16], name=n) for n in "qkv")
    o1, _ = g.sdpa(q, k, v, generate_stats=False)
    o2, _ = g.sdpa(o1, k, v, generate_stats=False, use_causal_mask=True)
    o2.set_output(True)
    plan = g.build(device="cpu", engines=["torch"])
    assert not check_plan(plan, np.random.default_rng(4)), plan.describe()


# -- GPU -------------------------------------------------------------------------------------------------


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("autotune", [False, True])
def test_gpu_default_engines_fp16_block(autotune):
    g, (x, w, k, v) = block(DT.HALF, b=2, h=8, s=512, d=64)
    plan = g.build(autotune=autotune)
    print(plan.describe())
    _pieces_are_sensible(plan)
    assert not check_plan(plan, np.random.default_rng(5), rtol=3e-2, atol=3e-2, low=-1.0, high=1.0), plan.describe()
    res = grad(g, g.final.tensor("y").uid, [x, w, k, v], combined=True)
    plan = res.graph.build(autotune=autotune)
    print(plan.describe())
    assert not check_plan(plan, np.random.default_rng(6), rtol=5e-2, atol=5e-2, low=-1.0, high=1.0), plan.describe()
