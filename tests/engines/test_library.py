"""The library engine: a conv/matmul through PyTorch, its prologue and epilogue as generated Triton
kernels. On the CPU the torch part runs PyTorch's CPU ops and the Triton parts Triton's interpreter;
every plan is checked against the reference engine on random data with poisoned outputs."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph import DataType as DT
from opgraph.core.device import CPU
from opgraph.engines import get_engine
from opgraph.core.config import BehaviorNote, NumericalNote
from opgraph.engines.library import LibraryKernel
from opgraph.core.config import HeurMode
from opgraph.build.heuristics import rank_configs
from opgraph.core.piece import make_piece
from opgraph.build.partition import partition
from opgraph.tools.samples import nhwc

from ..helpers import assert_engine_matches, assert_replay_equals_execute, requires_cuda
from .test_triton_conv import conv_graph, sbr_conv_genstats
from .test_triton_conv_bwd import dgrad_graph, wgrad_graph
from .test_triton_matmul import mm_graph

pytestmark = pytest.mark.interpreter  # the gpu mark wins for the GPU tests (conftest)


def roles(plan) -> list[str]:
    (step,) = plan.steps
    assert step.config.engine == "library", plan.describe()
    assert isinstance(step.kernel, LibraryKernel)
    return [role for role, _, _ in step.kernel.parts]


def conv_bias_relu(dt=DT.HALF):
    g, x, w, y = conv_graph((2, 8, 6, 6), (16, 8, 3, 3), dt=dt, padding=[1, 1])
    b = g.tensor(dim=[1, 16, 1, 1], name="b")
    g.relu(g.bias(y, b)).set_output(True)
    return g


@pytest.mark.parametrize("dt", [DT.HALF, DT.FLOAT], ids=lambda d: d.name)
def test_conv_bias_relu(dt, rng):
    plan = assert_engine_matches(conv_bias_relu(dt), rng, engines=("library",), expect_steps=1)
    assert roles(plan) == ["main", "epilogue"]
    # the conv's output lives between the parts, in the kernel's scratch (the plan's workspace)
    assert plan.steps[0].kernel.scratch_bytes >= 2 * 16 * 6 * 6 * 4 and plan.workspace_size > 0


def test_prologue_conv_and_genstats_epilogue(rng):
    plan = assert_engine_matches(sbr_conv_genstats(n=2, c=8, k=16, hw=5), rng, engines=("library",), expect_steps=1)
    assert roles(plan) == ["prologue", "main", "epilogue"]
    source = plan.source(0)
    assert "# -- prologue" in source and "# -- epilogue" in source


def test_matmul_bias_gelu(rng):
    g, _, _, c = mm_graph((2, 32, 48), (2, 48, 24))
    bias = g.tensor(dim=[2, 1, 24], name="bias")
    g.gelu(g.add(c, bias)).set_output(True)
    plan = assert_engine_matches(g, rng, engines=("library",), expect_steps=1)
    assert roles(plan) == ["main", "epilogue"]


def traced_projection(dt=DT.BFLOAT16):
    """An attention output's projection as the torch.compile backend imports it: [B, H, S, D] transposed
    and merged into rows, the weight [N, K] transposed and given a unit batch axis, then the residual add
    and the next norm's mean of squares (the Llama output projection's piece)."""
    g = og.Graph("proj", io_data_type=dt, intermediate_data_type=DT.FLOAT)
    att = g.tensor(dim=[2, 4, 8, 16], name="att")  # B, H, S, D
    w = g.tensor(dim=[64, 64], name="w")
    res = g.tensor(dim=[2, 8, 64], name="res")
    rows = g.reshape(g.transpose(att, [0, 2, 1, 3], name="heads"), [2, 8, 64], name="merge")
    wt = g.reshape(g.transpose(w, [1, 0], name="wt"), [1, 64, 64], name="batch")
    h = g.add(g.matmul(rows, wt, name="o"), res, name="residual")
    h.set_output(True)
    g.reduction(g.mul(h, h, name="sq"), "AVG", name="ms").set_dim([2, 8, 1]).set_output(True)
    return g


def test_operand_views_run_with_the_main_op(rng):
    """Views shaping the matmul's operands out of the piece's inputs (two ways: A's rows, B's batch axis)
    make no one pointwise prologue; they run with the product on the torch engine."""
    from opgraph.engines.library import split

    g = traced_projection()
    piece = make_piece(g.final, 0, list(g.final.nodes))
    parts = split(piece)
    assert [(role, [n.name for n in p.nodes]) for role, p in parts] == [
        ("main", ["heads", "merge", "wt", "batch", "o"]),
        ("epilogue", ["residual", "sq", "ms"]),
    ]
    assert get_engine("library").supports(piece, CPU)
    plan = assert_engine_matches(g, rng, engines=("library",), expect_steps=1, rtol=3e-2, atol=3e-2)
    assert roles(plan) == ["main", "epilogue"]


def test_a_view_a_prologue_op_reads_stays_in_the_prologue():
    from opgraph.engines.library import split

    g = og.Graph("p", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 8, 16], name="x")
    w = g.tensor(dim=[1, 16, 24], name="w")
    xt = g.transpose(g.tensor(dim=[2, 16, 8], name="xt_src"), [0, 2, 1], name="xt")
    a = g.add(x, xt, name="sum")
    g.relu(g.matmul(a, w, name="mm"), name="act").set_output(True)
    piece = make_piece(g.final, 0, list(g.final.nodes))
    assert [(role, [n.name for n in p.nodes]) for role, p in split(piece)] == [
        ("prologue", ["xt", "sum"]),
        ("main", ["mm"]),
        ("epilogue", ["act"]),
    ]


def test_dgrad_drelu_reads_another_input(rng):
    g, _, _, dx = dgrad_graph((2, 8, 6, 6), (16, 8, 3, 3), padding=[1, 1], stride=[2, 2])
    yf = g.tensor(dim=[2, 8, 6, 6], stride=nhwc([2, 8, 6, 6]), name="yf")
    g.relu_backward(dx, yf).set_output(True)
    assert roles(assert_engine_matches(g, rng, engines=("library",), expect_steps=1)) == ["main", "epilogue"]


def test_wgrad_with_a_scale_bias_relu_prologue(rng):
    """Two wgrads of one DY: on the raw image and on its scale+bias+relu (the second's prologue)."""
    g, x, dy, dw = wgrad_graph((2, 8, 6, 6), (16, 8, 3, 3), padding=[1, 1])
    s = g.tensor(dim=[1, 8, 1, 1], name="s")
    b = g.tensor(dim=[1, 8, 1, 1], name="b")
    a = g.relu(g.bias(g.scale(x, s), b))
    dw2 = g.conv_wgrad(a, dy, padding=[1, 1], name="wgrad2").set_dim([16, 8, 3, 3]).set_stride(nhwc([16, 8, 3, 3]))
    dw2.set_output(True)
    dw.set_output(True)
    plan = g.build(device="cpu", engines=["triton", "library", "torch"])
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))
    # the prologue + wgrad piece has the library config among its alternatives
    piece = next(st for st in plan.steps if "wgrad2" in [n.name for n in st.piece.nodes])
    assert any(c.engine == "library" for c in (piece.config, *piece.alternatives)), plan.describe()


def test_declines_a_lone_op_and_two_main_ops():
    lib = get_engine("library")
    cpu = CPU
    g, _, _, y = conv_graph((1, 4, 5, 5), (4, 4, 3, 3), padding=[1, 1])
    y.set_output(True)
    (piece,), _ = partition(g.final, [get_engine("triton")], cpu)
    verdict = lib.supports(piece, cpu)
    assert not verdict and "lone convolution" in verdict.reason
    g, _, _, y = conv_graph((1, 4, 5, 5), (4, 4, 3, 3), padding=[1, 1])
    w2 = g.tensor(dim=[4, 4, 1, 1], stride=nhwc([4, 4, 1, 1]), name="w2")
    g.conv_fprop(g.relu(y), w2).set_output(True)
    with pytest.raises(og.UnsupportedGraphError):
        g.build(device="cpu", engines=["library"], allow_partition=False)


@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
def test_a_lone_16_bit_matmul_is_the_library_call_alone(dt, rng):
    """A lone fp16/bf16 matmul with a result of its type (an LM head: 3-D activations times a transposed
    weight) is a library piece of one part, the library call; a lone fp32 one or one with an fp32 result
    stays the torch engine's."""
    g, _, _, c = mm_graph((2, 24, 40), (1, 40, 56), dt=dt, b_layout="col")
    c.set_output(True)
    plan = assert_engine_matches(g, rng, engines=("library",), expect_steps=1)
    assert roles(plan) == ["main"]
    lib = get_engine("library")
    for dtype, out in ((DT.FLOAT, None), (dt, DT.FLOAT)):
        g, _, _, c = mm_graph((2, 24, 40), (1, 40, 56), dt=dtype)
        c.set_output(True).set_data_type(out or dtype)
        (piece,), _ = partition(g.final, [get_engine("triton")], CPU)
        verdict = lib.supports(piece, CPU)
        assert not verdict and "lone convolution or matmul" in verdict.reason


def test_declines_with_the_part_that_triton_cannot_run(monkeypatch):
    """A conv whose epilogue Triton cannot run as one kernel: the reason names the epilogue."""
    import opgraph.engines.triton as triton_engine

    monkeypatch.setattr(triton_engine, "TEMPLATES", [t for t in triton_engine.TEMPLATES if t.name == "reduction"])
    g = conv_bias_relu()
    fg = g.final
    piece = make_piece(fg, 0, list(fg.nodes))
    verdict = get_engine("library").supports(piece, CPU)
    assert not verdict and "epilogue" in verdict.reason


def test_config_knobs_notes_and_a_plan_file(tmp_path, rng):
    plan = conv_bias_relu().build(device="cpu", engines=["library"])
    config = plan.steps[0].config
    knobs = dict(config.knobs)
    assert knobs["main"] == "torch" and knobs["epilogue.template"] == "pointwise"
    assert BehaviorNote.RUNTIME_COMPILATION in config.behavior_notes
    # a part that cannot be captured makes the whole config not capturable (the torch part on the CPU
    # runs on the host)
    assert BehaviorNote.CUDA_GRAPH_CAPTURABLE not in config.behavior_notes
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = og.load_plan(path)
    assert loaded.steps[0].config == config
    bad = og.testing.check_plan(loaded, rng)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.parametrize(
    "knobs",
    [(("precision", "fast"),), (("main", "torch"), ("precision", "exact"))],
    ids=["unknown_precision", "no_epilogue_knobs"],
)
def test_a_damaged_config_is_a_typed_error(knobs):
    g = conv_bias_relu()
    plan = g.build(device="cpu", engines=["library"])
    config = og.engines.EngineConfig("library", knobs)
    with pytest.raises(og.AttributeValueError) as info:
        get_engine("library").compile(plan.steps[0].piece, config, CPU)
    assert info.value.rule == "library.config"


def test_partition_gives_an_unfusable_conv_its_neighbours(monkeypatch, rng):
    """With only Triton's pointwise template, a conv that Triton cannot run takes its epilogue into a
    library piece (PyTorch conv, then the epilogue's kernel; the prologue stays the Triton piece it
    started, a preferred engine's piece never being handed to a less preferred one); without the
    library engine the conv and its epilogue are two pieces."""
    import opgraph.engines.triton as triton_engine

    monkeypatch.setattr(triton_engine, "TEMPLATES", [t for t in triton_engine.TEMPLATES if t.name == "pointwise"])
    dims, wdims = [2, 4, 5, 5], [6, 4, 3, 3]
    g = og.Graph("mixed", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    w = g.tensor(dim=wdims, name="w")
    s = g.tensor(dim=[1, 4, 1, 1], name="s")
    y = g.conv_fprop(g.relu(g.mul(x, s)), w, padding=1)
    b = g.tensor(dim=[1, 6, 1, 1], name="b")
    g.relu(g.bias(y, b)).set_output(True)
    plan = assert_engine_matches(g, rng, engines=("triton", "library", "torch"))
    assert [st.config.engine for st in plan.steps] == ["triton", "library"], plan.describe()
    assert [role for role, _, _ in plan.steps[1].kernel.parts] == ["main", "epilogue"]
    assert len(plan.steps[1].piece.nodes) == 3  # the conv, its bias and its relu: one epilogue kernel
    plan = assert_engine_matches(g, rng, engines=("triton", "torch"))
    assert [st.config.engine for st in plan.steps] == ["triton", "torch", "triton"], plan.describe()


def test_heuristic_ranks_the_fused_kernel_first_and_library_after():
    g = conv_bias_relu()
    fg = g.final
    engines = [get_engine(n) for n in ("triton", "library", "torch")]
    (piece,), _ = partition(fg, engines, CPU)
    ranked = rank_configs(piece, engines, CPU, [HeurMode.A])
    assert [c.engine for c in ranked.configs] == ["triton", "library", "torch"]


def test_native_precision_is_offered_to_tuning_with_its_note():
    """Mode B adds a config that runs the conv in fp16 (the fp32 intermediate rounded), noted; A and
    fp32 graphs do not."""
    engines = [get_engine(n) for n in ("library",)]
    fg = conv_bias_relu().final
    piece = make_piece(fg, 0, list(fg.nodes))
    a = rank_configs(piece, engines, CPU, [HeurMode.A]).configs
    b = rank_configs(piece, engines, CPU, [HeurMode.B]).configs
    assert [c.knob("precision") for c in a] == ["exact"]
    assert [c.knob("precision") for c in b] == ["exact", "native"]
    assert NumericalNote.ROUNDED_INTERMEDIATE in b[1].numerical_notes
    assert NumericalNote.ROUNDED_INTERMEDIATE not in b[0].numerical_notes
    fg = conv_bias_relu(DT.FLOAT).final
    piece = make_piece(fg, 0, list(fg.nodes))
    assert [c.knob("precision") for c in rank_configs(piece, engines, CPU, [HeurMode.B]).configs] == ["exact"]


def test_native_precision_runs_the_conv_in_fp16(rng):
    g = conv_bias_relu()
    exact = g.build(device="cpu", engines=["library"])
    plan = conv_bias_relu().build(
        device="cpu", engines=["library"], heur_mode=[HeurMode.B], select_numeric_notes=["rounded_intermediate"]
    )
    (step,) = plan.steps
    assert step.config.knob("precision") == "native"
    main = next(sub for role, sub, _ in step.kernel.parts if role == "main")
    (y,) = main.outputs
    assert main.tensor(y).data_type is DT.HALF and exact.steps[0].piece.tensor(y).data_type is DT.FLOAT
    assert step.kernel.scratch_bytes < exact.steps[0].kernel.scratch_bytes
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.gpu
@requires_cuda
def test_gpu_conv_bias_relu_and_capture(rng):
    import torch

    g, x, w, y = conv_graph((8, 64, 28, 28), (64, 64, 3, 3), dt=DT.HALF, padding=[1, 1])
    b = g.tensor(dim=[1, 64, 1, 1], name="b")
    out = g.relu(g.bias(y, b)).set_output(True)
    plan = assert_engine_matches(g, rng, engines=("library",), device="cuda", expect_steps=1, rtol=1e-2, atol=1e-2)
    config = plan.steps[0].config
    assert BehaviorNote.CUDA_GRAPH_CAPTURABLE in config.behavior_notes
    pack = {
        t.uid: torch.randn(*t.dim, device="cuda", dtype=torch.float16).as_strided(t.dim, t.stride) for t in (x, w, b)
    }
    pack[out.uid] = torch.empty_strided(out.dim, out.stride, device="cuda", dtype=torch.float16)
    assert_replay_equals_execute(plan, pack, out.uid)


@pytest.mark.gpu
@requires_cuda
def test_gpu_a_lone_bf16_matmul_is_cublas_into_the_output(rng):
    """On the GPU the default build gives a large lone bf16 matmul to the library engine (policy: cuBLAS
    leads), its one part the torch engine's direct path, checked against the reference."""
    g, _, _, c = mm_graph((8, 1024, 1024), (1, 1024, 2048), dt=DT.BFLOAT16, b_layout="col")  # ~50 µs
    c.set_output(True)
    plan = g.build(device="cuda")
    assert plan.steps[0].config.engine == "library" and roles(plan) == ["main"], plan.describe()
    ((_, _, main),) = plan.steps[0].kernel.parts
    assert main.direct
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.gpu
@requires_cuda
def test_gpu_default_engines_offer_library_after_the_fused_kernel():
    g = conv_bias_relu()
    plan = g.build(device="cuda")
    step = plan.steps[0]
    assert step.config.engine in ("triton", "cudnn"), plan.describe()  # cuDNN's plan first where installed
    assert any(c.engine == "library" for c in step.alternatives), plan.describe()
    order = [c.engine for c in (step.config, *step.alternatives)]
    assert order.index("triton") < order.index("library"), plan.describe()


def head_with_views(dt=DT.BFLOAT16, m=8 * 1024, k=1024, n=2048):
    g = og.Graph("head", io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x, w = g.tensor(dim=[8, m // 8, k], name="x"), g.tensor(dim=[n, k], name="w")
    g.matmul(g.reshape(x, [m, k], name="batch"), g.transpose(w, [1, 0], name="wt"), name="mm").set_output(True)
    return g


def test_a_lone_matmul_after_operand_views_is_the_library_call_alone():
    """AOTAutograd's linear (a batch merged into rows, a transposed weight, the product): one part, the
    torch engine's call with its views, where other views before a GEMM would be refused."""
    from opgraph.engines.library import split

    final = head_with_views().final
    parts = split(make_piece(final, 0, final.nodes))
    assert [(role, [n.name for n in p.nodes]) for role, p in parts] == [("main", ["batch", "wt", "mm"])]


@pytest.mark.gpu
@requires_cuda
def test_gpu_a_lone_bf16_matmul_after_views_is_cublas_into_the_output(rng):
    plan = head_with_views().build(device="cuda")
    assert plan.steps[0].config.engine == "library" and roles(plan) == ["main"], plan.describe()
    ((_, _, main),) = plan.steps[0].kernel.parts
    assert main.direct
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


def weight_gradient(m=24, n=40, tokens=56, dt=DT.BFLOAT16, out_stride=None):
    """AOTAutograd's weight gradient under autocast: dY^T X, the 16-bit product cast to the weight's fp32."""
    g = og.Graph("wgrad", io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    dy, x = g.tensor(dim=[tokens, m], name="dY"), g.tensor(dim=[tokens, n], name="X")
    product = g.matmul(g.transpose(dy, [1, 0], name="dYt"), x, name="mm")
    product.set_data_type(dt)
    dw = g.identity(product, name="cast").set_output(True).set_data_type(DT.FLOAT)
    if out_stride is not None:
        dw.set_stride(out_stride)
    return g, dy, x, dw


def test_wide_precision_is_offered_to_tuning_on_cuda_with_its_note():
    """Mode B on a GPU adds "wide" where a 16-bit product is only cast to fp32: one part (the library call
    writing the cast's output), no epilogue, noted WIDENED_INTERMEDIATE; not in mode A, not on the CPU, not
    where the product is read otherwise or kept as it is."""
    from opgraph.core.device import Device
    from opgraph.engines.library import split, wide_graph

    h200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
    lib = get_engine("library")
    final = weight_gradient()[0].final
    piece = make_piece(final, 0, final.nodes)
    graph, aliases = wide_graph(piece)
    ((role, main),) = split(piece, "wide")
    (product,) = aliases
    assert role == "main" and [n.name for n in main.nodes] == ["dYt", "mm"] and main.outputs == (product,)
    assert graph.tensors[product].data_type is DT.FLOAT and aliases[product] == piece.outputs[0]
    b = lib.configs(piece, h200, HeurMode.B)
    assert [c.knob("precision") for c in b] == ["exact", "wide"]
    assert NumericalNote.WIDENED_INTERMEDIATE in b[1].numerical_notes
    assert NumericalNote.DOWN_CONVERT_INPUTS not in b[1].numerical_notes  # (16-bit operands: nothing converted)
    assert [c.knob("precision") for c in lib.configs(piece, h200, HeurMode.A)] == ["exact"]
    assert [c.knob("precision") for c in lib.configs(piece, CPU, HeurMode.B)] == ["exact"]
    g, dy, x, dw = weight_gradient()
    g.relu(dw).set_output(True)  # (the cast read by another op: an epilogue the library must run)
    final = g.final
    assert wide_graph(make_piece(final, 0, final.nodes)) is None
    g, dy, x, dw = weight_gradient(dt=DT.FLOAT)
    final = g.final
    assert wide_graph(make_piece(final, 0, final.nodes)) is None


def test_wide_precision_writes_the_unrounded_product_into_the_cast_output(rng):
    """The "wide" config, compiled for the CPU (PyTorch's fp32 product of the bf16 operands), writes the
    cast's output (a column-major one) with the fp32 product: within fp32 rounding of float64's, where the
    reference engine (the graph as declared) rounds it to bf16 first; bound, it follows the output to a new
    buffer (the alias rebinds) and writes nothing else."""
    import numpy as np

    from opgraph.core.config import EngineConfig
    from opgraph.engines.base import Binding
    from opgraph.testing import reference_outputs

    m, n = 24, 40
    g, dy, x, dw = weight_gradient(m, n, out_stride=[1, m])
    final = g.final
    piece = make_piece(final, 0, final.nodes)
    kernel = get_engine("library").compile(
        piece, EngineConfig("library", (("main", "torch"), ("precision", "wide"))), CPU
    )
    assert kernel.scratch_bytes == 0
    bf16 = DT.BFLOAT16.numpy
    a = rng.standard_normal((56, m)).astype(bf16)
    b = rng.standard_normal((56, n)).astype(bf16)
    want = a.astype(np.float64).T @ b.astype(np.float64)
    out = np.full(m * n, np.nan, np.float32)
    view = np.lib.stride_tricks.as_strided(out, (m, n), (4, 4 * m))
    kernel.run({dy.uid: a, x.uid: b, dw.uid: view})
    np.testing.assert_allclose(view, want, rtol=1e-5, atol=1e-5)
    rounded = reference_outputs(final, {dy.uid: a, x.uid: b, dw.uid: np.zeros((m, n), np.float32)})[dw.uid]
    assert np.abs(rounded - want).max() > 1e-3  # (the declared rounding, which "wide" skips)
    binding = Binding({dy.uid: a, x.uid: b, dw.uid: view})
    launcher = kernel.bind(binding, None)
    moved = np.full((m, n), np.nan, np.float32).T.copy().T  # (column-major too)
    binding.buffers[dw.uid] = moved
    out[:] = np.nan
    launcher.rebind([dw.uid])
    for fn, args in launcher.calls:
        fn(*args)
    np.testing.assert_allclose(moved, want, rtol=1e-5, atol=1e-5)
    assert np.isnan(out).all()  # (the first buffer untouched since)


@pytest.mark.gpu
@requires_cuda
def test_gpu_weight_gradients_tuned_wide_and_the_default_library_lead(rng):
    """On the GPU: a lone bf16 matmul with an fp32 result runs as cuBLAS's fp32 output (the torch engine's
    direct path); the Llama step's 1024 x 1024 weight gradient goes to the library engine by the default
    policy (cuBLAS then the cast, exact), and mode B offers "wide" (the product unrounded); each checked
    against the reference (wide: within the bf16 rounding the graph declares)."""
    import torch

    g, _, _, c = mm_graph((8, 256, 512), (1, 512, 384), dt=DT.BFLOAT16, b_layout="col")
    c.set_output(True).set_data_type(DT.FLOAT)
    plan = g.build(device="cuda", engines=["torch"])
    assert plan.steps[0].kernel.direct, plan.describe()
    fp32_sums = {"rtol": 1e-3, "atol": 1e-4}  # (fp32 accumulation over K = 512 in cuBLAS's order)
    bad = og.testing.check_plan(plan, rng, **fp32_sums)
    assert not bad, "\n".join(map(str, bad))
    g, _, _, c = mm_graph((4, 128, 256), (4, 256, 96), dt=DT.HALF)  # (batched: torch.bmm's fp32 output)
    c.set_output(True).set_data_type(DT.FLOAT)
    plan = g.build(device="cuda", engines=["torch"])
    bad = og.testing.check_plan(plan, rng, **fp32_sums)
    assert not bad, "\n".join(map(str, bad))
    g, dy, x, dw = weight_gradient(1024, 1024, 4096)
    plan = g.build(device="cuda")
    assert plan.steps[0].config.engine == "library" and roles(plan) == ["main", "epilogue"], plan.describe()
    bad = og.testing.check_plan(plan, rng, rtol=1e-2, atol=1e-2)  # (sums of 4096 in another order, rounded to bf16)
    assert not bad, "\n".join(map(str, bad))
    g, dy, x, dw = weight_gradient(1024, 1024, 4096)
    plan = g.build(device="cuda", heur_mode=[HeurMode.B], select_numeric_notes=["widened_intermediate"])
    assert plan.steps[0].config.knob("precision") == "wide" and roles(plan) == ["main"], plan.describe()
    bad = og.testing.check_plan(plan, rng, rtol=1e-2, atol=1e-2)
    assert not bad, "\n".join(map(str, bad))
    a = torch.randn(4096, 1024, device="cuda").bfloat16()
    b = torch.randn(4096, 1024, device="cuda").bfloat16()
    out = torch.full((1024, 1024), float("nan"), device="cuda")
    plan.execute({dy: a, x: b, dw: out})
    want = a.double().t() @ b.double()
    assert ((out.double() - want).norm() / want.norm()).item() < 1e-5  # (no bf16 rounding: ~2e-3 with it)


def test_an_fp32_result_is_priced_as_cublas_only_for_shapes_it_writes():
    """A lone 16-bit matmul with an fp32 result is a widening GEMM (one cuBLAS call, its estimate) only for the
    operand shapes `torch_engine.gemm.widened` has a call for: not a batch broadcast of A, nor 4-D batches."""
    from opgraph.engines.shared.native_gemm import widening_gemm, widens

    def piece(a, b):
        g, _, _, c = mm_graph(a, b, dt=DT.BFLOAT16)
        c.set_output(True).set_data_type(DT.FLOAT)
        final = g.final
        return make_piece(final, 0, final.nodes)

    assert widening_gemm(piece((2, 24, 40), (1, 40, 56))) and widening_gemm(piece((4, 24, 40), (4, 40, 56)))
    assert not widening_gemm(piece((1, 24, 40), (8, 40, 56)))
    assert widens((24, 40), (40, 56)) and widens((2, 3, 24, 40), (40, 56)) and widens((2, 3, 24, 40), (1, 1, 40, 56))
    assert not widens((2, 3, 24, 40), (2, 3, 40, 56)) and not widens((24, 40), (1, 40, 56))
