"""Custom pointwise ops with a Triton function, fused into generated kernels (pointwise DAGs,
reductions, conv epilogues), against the reference engine (which runs the registered NumPy
reference); ops without one stay on other engines, with the reason."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph import DataType as DT

from ..helpers import assert_engine_matches, requires_interpreter
from .test_triton_conv import conv_graph

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

pytestmark = [pytest.mark.interpreter, requires_interpreter]


@triton.jit
def swiglu_tl(x, g):
    return x * g / (1.0 + tl.exp(-g))


@triton.jit
def scaled_softsign_tl(x, alpha):
    return alpha * x / (1.0 + tl.abs(x))


@pytest.fixture(autouse=True)
def custom_ops(custom_ops_restored):  # (registered anew for each test: the registry refuses another definition)
    og.register_custom_op(
        "swiglu", num_inputs=2, reference=lambda x, g: x * g / (1 + np.exp(-g)), triton=swiglu_tl, pointwise=True
    )
    og.register_custom_op(
        "scaled_softsign",
        num_inputs=1,
        reference=lambda x, alpha: alpha * x / (1 + np.abs(x)),
        triton=scaled_softsign_tl,
        pointwise=True,
    )
    og.register_custom_op(
        "softsign_no_triton",
        num_inputs=1,
        reference=lambda x: x / (1 + np.abs(x)),
        torch=lambda x: x / (1 + x.abs()),
        pointwise=True,
    )


def _templates(plan):
    return [st.config.knob("template") for st in plan.steps]


def test_a_custom_op_inside_a_pointwise_dag(rng):
    g = og.Graph("swiglu", io_data_type=DT.HALF)
    x = g.tensor(dim=[8, 64], name="x")
    gate = g.tensor(dim=[8, 64], name="gate")
    b = g.tensor(dim=[1, 64], name="b")
    g.add(g.custom("swiglu", x, gate), b).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert _templates(plan) == ["pointwise"]
    source = plan.source(0)
    assert "_og_custom_swiglu(" in source and f"import swiglu_tl as _og_custom_swiglu" in source


def test_a_custom_op_with_a_parameter_before_a_reduction(rng):
    g = og.Graph("softsign_sum", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[16, 32], name="x")
    y = g.custom("scaled_softsign", x, params={"alpha": 0.5})
    g.reduction(y, mode="ADD").set_dim([16, 1]).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert _templates(plan) == ["reduction"] and "alpha=0.5" in plan.source(0)


def test_a_custom_op_in_a_conv_epilogue(rng):
    g, _, _, y = conv_graph((2, 8, 6, 6), (16, 8, 3, 3), padding=[1, 1])
    g.custom("scaled_softsign", y, params={"alpha": 2.0}).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert _templates(plan) == ["conv_fprop"]


def test_without_a_triton_function_the_op_is_not_fused_and_says_why(rng):
    g = og.Graph("no_triton", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[4, 16], name="x")
    g.relu(g.custom("softsign_no_triton", g.mul(x, 2.0))).set_output(True)
    plan = assert_engine_matches(g, rng, engines=("triton", "torch"))
    assert [st.config.engine for st in plan.steps] == ["triton", "torch", "triton"], plan.describe()
    text = plan.describe()
    assert "register it with pointwise=True and triton=" in text


def test_a_function_that_cannot_be_imported_by_name_is_not_fused():
    @triton.jit
    def local_tl(x):
        return x * 2.0

    og.register_custom_op("local_double", num_inputs=1, reference=lambda x: 2 * x, triton=local_tl, pointwise=True)
    g = og.Graph("local", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[4, 16], name="x")
    g.custom("local_double", x).set_output(True)
    with pytest.raises(og.UnsupportedGraphError) as info:
        g.build(device="cpu", engines=["triton"])
    assert "define the @triton.jit function at the top level of a module" in str(info.value)
