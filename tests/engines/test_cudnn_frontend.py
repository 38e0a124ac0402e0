"""The cuDNN frontend engine: what it offers to cuDNN and why it declines (CPU), and on a GPU with
nvidia-cudnn-frontend installed, pieces lowered to cuDNN graphs checked against the reference
engine on random data with poisoned outputs."""

from __future__ import annotations

import importlib.util

import pytest

import opgraph as og
from opgraph import DataType as DT
from opgraph.core.device import CPU, Device
from opgraph.engines import engine_names, get_engine
from opgraph.core.config import BehaviorNote, NumericalNote
from opgraph.engines.cost import estimate_us
from opgraph.engines.base import PieceFact
from opgraph.engines.cudnn_frontend import static_problem
from opgraph.core.piece import make_piece
from opgraph.build.planner import all_by_reference, default_engines
from opgraph.tools.samples import nhwc

from ..helpers import assert_candidates_match, assert_engine_matches, assert_replay_equals_execute, cuda_available
from .test_triton_conv import conv_graph, sbr_conv_genstats
from .test_triton_conv_bwd import dgrad_graph, wgrad_graph
from .test_triton_matmul import mm_graph

requires_cudnn = pytest.mark.skipif(
    not cuda_available() or importlib.util.find_spec("cudnn") is None,
    reason="needs a CUDA GPU and nvidia-cudnn-frontend",
)


def whole(g: og.Graph):
    g.validate()
    return make_piece(g.final, 0, list(g.final.nodes))


def conv_bias_relu(n=2, c=8, k=16, hw=6, dt=DT.HALF):
    g, x, w, y = conv_graph((n, c, hw, hw), (k, c, 3, 3), dt=dt, padding=[1, 1])
    b = g.tensor(dim=[1, k, 1, 1], stride=nhwc([1, k, 1, 1]), name="b")
    g.relu(g.bias(y, b)).set_output(True).set_name("out")
    return g


# -- what is offered to cuDNN (no GPU needed) ------------------------------------------------------------


def test_registered_and_preferred_before_torch_on_cuda():
    assert "cudnn" in engine_names()
    order = default_engines(Device("cuda", 0, "test"))
    assert order.index("library") < order.index("cudnn") < order.index("torch")


def test_unavailable_on_the_cpu_with_a_reason():
    verdict = get_engine("cudnn").available(CPU)
    assert not verdict.ok and "CUDA" in verdict.reason
    with pytest.raises(og.UnsupportedGraphError) as info:
        conv_bias_relu().build(device="cpu", engines=["cudnn"])
    assert info.value.rule == "engine.unavailable" and "cudnn" in str(info.value)


def test_a_conv_with_its_epilogue_is_offered():
    assert static_problem(whole(conv_bias_relu())) is None
    assert static_problem(whole(sbr_conv_genstats())) is None


def test_facts_for_the_ranking_policy_the_cost_models_estimate_and_runtime_fused_epilogues():
    """What the engine reports (opgraph.build.policy decides with it; tests/build/test_policy.py)."""
    engine, dev = get_engine("cudnn"), Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
    g = conv_bias_relu(n=32, c=64, k=64, hw=56)
    facts = engine.facts(whole(g), dev)
    assert facts.estimate_us == estimate_us(whole(g), dev) and facts.facts == frozenset()
    assert engine.facts(whole(g), CPU).estimate_us is None
    g, x, w, y = conv_graph((32, 64, 56, 56), (256, 64, 1, 1))
    res = g.tensor(dim=[32, 256, 56, 56], stride=nhwc([32, 256, 56, 56]), name="residual")
    g.relu(g.add(y, res)).set_output(True)
    assert engine.facts(whole(g), dev).facts == {PieceFact.RUNTIME_FUSED_EPILOGUE}
    g, x, w, y = conv_graph((32, 64, 56, 56), (256, 64, 1, 1))
    s = g.tensor(dim=[1, 256, 1, 1], stride=nhwc([1, 256, 1, 1]), name="s")
    g.mul(y, s).set_output(True)
    assert engine.facts(whole(g), dev).facts == {PieceFact.RUNTIME_FUSED_EPILOGUE}
    assert engine.facts(whole(sbr_conv_genstats(n=32, c=64, k=64, hw=56)), dev).facts == frozenset()
    g, _, _, dx = dgrad_graph((32, 64, 56, 56), (64, 64, 3, 3), padding=[1, 1])
    dx.set_output(True)
    assert engine.facts(whole(g), dev).facts == frozenset()  # (forward convs' epilogues only)


def test_pointwise_only_pieces_are_left_to_generated_kernels():
    g = og.Graph("pw", io_data_type=DT.HALF)
    x = g.tensor(dim=[2, 3, 4, 5], name="x")
    g.relu(g.add(x, x)).set_output(True)
    why, node = static_problem(whole(g))
    assert "convolution or matmul" in why and node is None


@pytest.mark.parametrize("case", ["elu_alpha", "relu_tensor_clip", "gen_index", "convolution_mode"])
def test_declines_what_cudnn_cannot_express_naming_the_op(case):
    g, x, w, y = conv_graph(
        (2, 8, 6, 6),
        (16, 8, 3, 3),
        padding=[1, 1],
        **({"convolution_mode": og.ConvolutionMode.CONVOLUTION} if case == "convolution_mode" else {}),
    )
    if case == "elu_alpha":
        out = g.elu(y, alpha=0.5, name="act")
    elif case == "relu_tensor_clip":
        clip = g.tensor(dim=[1, 1, 1, 1], name="clip", data_type=DT.FLOAT)
        out = g.relu(y, upper_clip=clip, name="act")
    elif case == "gen_index":
        out = g.gen_index(y, axis=1, name="act")
    else:
        out = y
    out.set_output(True)
    why, node = static_problem(whole(g))
    assert why and node is not None
    assert node.name == ("conv" if case == "convolution_mode" else "act"), why
    if case == "elu_alpha":
        assert "alpha" in why
    if case == "relu_tensor_clip":
        assert "upper_clip" in why and "number" in why


def test_in_place_update_is_declined():
    g = og.Graph("sgd", io_data_type=DT.HALF)
    a = g.tensor(dim=[1, 8, 8], name="a")
    b = g.tensor(dim=[1, 8, 8], name="b")
    w = g.tensor(dim=[1, 8, 8], name="w", uid=100)
    c = g.matmul(a, b, name="mm")
    g.sub(w, c, name="update").set_uid(100).set_output(True)
    why, node = static_problem(whole(g))
    assert "in-place" in why and node.name == "update"


def test_a_damaged_config_is_a_typed_error():
    from opgraph.core.config import EngineConfig
    from opgraph.engines.cudnn_frontend import CudnnKernel

    piece = whole(conv_bias_relu())
    with pytest.raises(og.GraphError) as info:
        CudnnKernel(piece, EngineConfig("cudnn", (("heuristic", "Z"), ("plan", "x"))), Device("cuda", 0, "test"))
    assert info.value.rule == "cudnn.config"


# -- on the GPU ---------------------------------------------------------------------------------------------


def _cudnn_plan(g, rng, **kw):
    tolerance = {"rtol": 2e-2, "atol": 2e-2, **kw}
    plan = assert_engine_matches(g, rng, engines=("cudnn",), device="cuda", expect_steps=1, **tolerance)
    assert plan.steps[0].config.engine == "cudnn", plan.describe()
    return plan


@pytest.mark.gpu
@requires_cudnn
def test_gpu_conv_bias_relu_one_cudnn_graph(rng):
    plan = _cudnn_plan(conv_bias_relu(n=8, c=64, k=64, hw=28), rng)
    config = plan.steps[0].config
    assert NumericalNote.TENSOR_CORE in config.numerical_notes
    assert BehaviorNote.CUDA_GRAPH_CAPTURABLE in config.behavior_notes
    assert config.knob("name"), config
    kernel = plan.steps[0].kernel
    assert kernel.cpp_index >= 0 or kernel.deserialized, "the backend launch path is not used with this frontend"


@pytest.mark.gpu
@requires_cudnn
def test_gpu_scale_bias_relu_conv_genstats(rng):
    _cudnn_plan(sbr_conv_genstats(n=4, c=32, k=32, hw=14), rng)


@pytest.mark.gpu
@requires_cudnn
def test_gpu_matmul_bias_gelu(rng):
    g, _, _, c = mm_graph((2, 64, 128), (2, 128, 64))
    bias = g.tensor(dim=[2, 1, 64], name="bias")
    g.gelu(g.add(c, bias)).set_output(True)
    _cudnn_plan(g, rng)


@pytest.mark.gpu
@requires_cudnn
def test_gpu_dgrad_drelu_and_wgrad(rng):
    g, _, _, dx = dgrad_graph((4, 32, 14, 14), (32, 32, 3, 3), padding=[1, 1])
    yf = g.tensor(dim=[4, 32, 14, 14], stride=nhwc([4, 32, 14, 14]), name="yf")
    g.relu_backward(dx, yf).set_output(True)
    _cudnn_plan(g, rng)
    g, _, _, dw = wgrad_graph((4, 32, 14, 14), (32, 32, 3, 3), padding=[1, 1])
    dw.set_output(True)
    _cudnn_plan(g, rng, rtol=5e-2, atol=5e-2)


@pytest.mark.gpu
@requires_cudnn
def test_gpu_every_b_mode_plan_runs_and_a_plan_file_names_its_plan(rng, tmp_path):
    g = conv_bias_relu(n=4, c=32, k=32, hw=14)
    plan = g.build(device="cuda", engines=["cudnn"], heur_mode=["B"])
    configs = (plan.steps[0].config, *plan.steps[0].alternatives)
    assert 1 <= len(configs) <= 4 and len({c.knob("name") for c in configs}) == len(configs)
    assert_candidates_match(plan, plan.steps[0], configs, rng, rtol=2e-2, atol=2e-2)
    plan = g.build(device="cuda", engines=["cudnn"])
    plan.save(tmp_path / "plan.json")
    again = og.load_plan(tmp_path / "plan.json")
    assert again.steps[0].config.knobs == plan.steps[0].config.knobs
    assert not og.testing.check_plan(again, rng, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@requires_cudnn
def test_gpu_captured_in_a_cuda_graph(rng):
    import torch

    g = conv_bias_relu(n=4, c=32, k=32, hw=14)
    plan = g.build(device="cuda", engines=["cudnn"])
    final = plan.graph
    pack = {}
    for t in final.tensors.values():
        if not t.is_virtual:
            pack[t.uid] = torch.randn(t.dim, device="cuda").to(t.data_type.to_torch()).as_strided(t.dim, t.stride)
    out = [t for t in final.tensors.values() if t.name == "out"][0]
    assert_replay_equals_execute(plan, pack, out.uid)


@pytest.mark.gpu
@requires_cudnn
def test_gpu_default_engines_offer_cudnn_to_tuning():
    plan = conv_bias_relu(n=4, c=32, k=32, hw=14).build(device="cuda", heur_mode=["A", "B"])
    engines = {plan.steps[0].config.engine, *(c.engine for c in plan.steps[0].alternatives)}
    assert "cudnn" in engines, plan.describe()


def test_batchnorm_fp32_and_by_reference_pieces_are_left_to_generated_kernels():
    g = og.Graph("bn", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    dims = [8, 32, 14, 14]
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    cd = [1, 32, 1, 1]
    s, b = (g.tensor(dim=cd, stride=nhwc(cd), name=n, data_type=DT.FLOAT) for n in ("s", "b"))
    y, mean, inv_var, _, _ = g.batchnorm(x, s, b, epsilon=1e-5)
    for t in (y, mean, inv_var):
        t.set_output(True)
    assert "convolution or matmul" in static_problem(whole(g))[0]
    why, node = static_problem(whole(conv_bias_relu(dt=DT.FLOAT)))
    assert "fp16/bf16" in why and node.kind == "conv_fprop"
    g = conv_bias_relu()
    g.validate()
    by_reference = all_by_reference(g.final)  # what build(by_reference=True) plans
    why, _ = static_problem(make_piece(by_reference, 0, list(by_reference.nodes)))
    assert "by reference" in why


def test_independent_products_are_not_one_cudnn_graph_but_a_chain_is():
    """Two matmuls of one A (a query and a key projection) that a build merged gave wrong results from
    cuDNN's plan on an H200: such a piece is declined; a product of a product stays cuDNN's to judge."""
    g = og.Graph("qk", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[1, 256, 128], name="x")
    wq, wk = (g.tensor(dim=[1, 128, n], name=name) for name, n in (("wq", 128), ("wk", 64)))
    g.matmul(x, wq, name="q").set_output(True)
    g.matmul(x, wk, name="k").set_output(True)
    why, node = static_problem(whole(g))
    assert "side by side" in why and node.name in ("q", "k")
    g = og.Graph("chain", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[1, 256, 128], name="x")
    w1, w2 = g.tensor(dim=[1, 128, 64], name="w1"), g.tensor(dim=[1, 64, 32], name="w2")
    g.matmul(g.relu(g.matmul(x, w1)).set_data_type(DT.BFLOAT16), w2).set_output(True)
    assert static_problem(whole(g)) is None


# -- double precision stays off cuDNN (the GPU fuzzer's seed20261125502833) ---------------------------------


def _mm_double(case: str) -> og.Graph:
    g, _, _, c = mm_graph((1, 3, 4), (1, 4, 7))
    if case == "double_output":  # the fuzz case: fp16 operands, fp32 compute, a DOUBLE result
        c.set_data_type(DT.DOUBLE).set_output(True)
    elif case == "double_epilogue":  # fp32 intermediate, the epilogue's result DOUBLE
        g.relu(c, name="act").set_data_type(DT.DOUBLE).set_output(True)
    elif case == "double_bias":
        bias = g.tensor(dim=[1, 1, 7], name="bias", data_type=DT.DOUBLE)
        g.add(c, bias, name="act").set_data_type(DT.FLOAT).set_output(True)
    elif case == "double_compute":
        g = og.Graph("mm", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
        a = g.tensor(dim=[1, 3, 4], name="A")
        b = g.tensor(dim=[1, 4, 7], name="B")
        g.matmul(a, b, name="mm", compute_data_type=DT.DOUBLE).set_data_type(DT.FLOAT).set_output(True)
    elif case == "int_output":
        c.set_data_type(DT.INT32).set_output(True)
    return g


@pytest.mark.parametrize("case", ["double_output", "double_epilogue", "double_bias", "double_compute"])
def test_double_precision_is_not_offered_to_cudnn(case):
    why, node = static_problem(whole(_mm_double(case)))
    assert why is not None and "DOUBLE" in why, why
    assert node is not None and node.name == ("act" if case in ("double_epilogue", "double_bias") else "mm")


def test_gemm_results_cudnn_does_not_write_are_not_offered():
    why, node = static_problem(whole(_mm_double("int_output")))
    assert why and "INT32" in why and node.name == "mm"
    g, _, _, y = conv_graph((2, 8, 6, 6), (16, 8, 3, 3), padding=[1, 1])
    y.set_data_type(DT.DOUBLE).set_output(True)
    why, node = static_problem(whole(g))
    assert why and "DOUBLE" in why and node.name == "conv"


@pytest.mark.parametrize("out", [DT.HALF, DT.BFLOAT16, DT.FLOAT])
def test_fp16_gemms_with_fp16_bf16_fp32_results_are_still_offered(out):
    g, _, _, c = mm_graph((1, 3, 4), (1, 4, 7))
    c.set_data_type(out).set_output(True)
    assert static_problem(whole(g)) is None


def test_a_double_result_of_an_fp16_matmul_goes_to_the_torch_engine_on_cuda(monkeypatch):
    """The GPU fuzzer's case, planned for an H100 without one: cuDNN is taken to accept everything it is
    asked (its support check passed the piece on the GPU), so only the engine's own rule keeps it off."""
    import opgraph.engines.cudnn_frontend as cf
    from opgraph.build.planner import engine_configs
    from opgraph.core.config import Support

    for name in ("triton", "library", "cudnn", "torch"):
        monkeypatch.setattr(type(get_engine(name)), "available", lambda self, device: Support.yes())
    monkeypatch.setattr(cf, "_verdict", lambda piece, device: (None, ["a cuDNN plan"]))
    g = _mm_double("double_output")
    g.validate()
    dev = Device("cuda", 0, "NVIDIA H100 80GB HBM3", (9, 0), 132)
    (ranked,) = engine_configs(g.final, device=dev, engines=default_engines(dev))
    assert [c.engine for c in ranked.configs] == ["torch"], str(ranked)
    assert any(name == "cudnn" and "DOUBLE" in why for name, why in ranked.declined), str(ranked)


@pytest.mark.gpu
@requires_cudnn
def test_gpu_double_result_of_an_fp16_matmul_is_exact(rng):
    """The fuzz case on the GPU with every default engine: the torch engine computes it in fp64."""
    g = _mm_double("double_output")
    plan = assert_engine_matches(
        g, rng, engines=default_engines(Device("cuda", 0, "gpu")), device="cuda", expect_steps=1, rtol=1e-12, atol=1e-12
    )
    assert plan.steps[0].config.engine == "torch", plan.describe()
