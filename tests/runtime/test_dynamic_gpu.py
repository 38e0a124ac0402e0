"""Dynamic plans on the GPU: every op family of tests/ops/test_dynamic_inference.py built once on
CUDA (default engines) and run at several shapes against the reference engine (og.testing's
CUDA path: the pack copied to the device with its strides)."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.testing import compare, random_pack, reference_outputs
from tests.helpers import record_allocations, requires_cuda, run_at_shape
from tests.ops.test_dynamic_inference import FAMILIES, N, T, build
from tests.runtime.test_dynamic_kernels import GRAPHS, graph_of

pytestmark = [pytest.mark.gpu, requires_cuda]
SHAPES = [{"n": 1, "t": 1}, {"n": 3, "t": 13}, {"n": 9, "t": 5}, {"n": 2, "t": 7}]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_build_matches_the_reference_on_cuda(family):
    from opgraph.core.torch_interop import pack_to_device, torch_to_numpy

    g = build(FAMILIES[family], N, T)
    plan = g.build(device="cuda", deselect_numeric_notes=["DOWN_CONVERT_INPUTS"])  # fp32 as the reference: no TF32
    rng = np.random.default_rng(11)
    for env in SHAPES:
        static = g.final.at(env)
        pack = random_pack(static, rng)
        want = reference_outputs(static, pack)
        dev = pack_to_device(pack, plan.device.torch_name)
        plan.execute(dev)
        bad = [
            m for u in static.outputs if (m := compare(static.tensors[u], torch_to_numpy(dev[u]), want[u])) is not None
        ]
        assert not bad, f"{env}: " + "\n".join(map(str, bad)) + "\n" + plan.at(env).describe()


PW_SHAPES = [(1, 1), (1, 2), (2, 1), (2, 3), (3, 5), (5, 7), (7, 13), (13, 31), (16, 17), (11, 2), (16, 37), (1, 37)]


def _run_cuda(plan, env, rng):
    run_at_shape(plan, env, rng)


@pytest.mark.parametrize("name", list(GRAPHS))
def test_kernels_compile_once_per_bucket_on_cuda(name):
    """Compiled kernels taking their sizes at run time (pointwise, views, rotary, lookups, row norms,
    reductions), run at many sizes: right at each, and no compilation after a bucket's first shape
    (the compiler's counter, and the plan's)."""
    from opgraph.engines.triton import compiler

    plan = graph_of(GRAPHS[name]).build(device="cuda", engines=["triton"])
    rng = np.random.default_rng(12)
    start = compiler.compilations()
    used: set[int] = set()
    for b, s in PW_SHAPES * 2:
        bucket = plan.buckets.of((b, s)).index
        before = compiler.compilations()
        _run_cuda(plan, {"batch": b, "seq": s}, rng)
        if bucket in used:
            assert compiler.compilations() == before, (b, s)
        used.add(bucket)
        at = plan.at({"batch": b, "seq": s})
        assert all("_OG_SIZES" in at.source(i) for i in range(len(at.steps)))
    assert plan.stats["shape_kernels"] == 0
    compiled = compiler.compilations() - start  # each bucket's first shape's
    assert plan.stats["compiled"] == compiled, (plan.stats, dict(compiler.STATS), plan.max_plan.build_stats)


def test_pointwise_jit_launch_does_not_specialise_on_sizes(monkeypatch):
    """OPGRAPH_LAUNCH=jit (Triton's own launcher): size arguments are do_not_specialize, so sizes 1,
    16 and 17 of one bucket share one JIT compilation."""
    import triton

    monkeypatch.setenv("OPGRAPH_LAUNCH", "jit")
    plan = graph_of(GRAPHS["bias_relu"]).build(device="cuda", engines=["triton"], buckets="one")
    rng = np.random.default_rng(13)
    _run_cuda(plan, {"batch": 3, "seq": 5}, rng)
    compiles = []
    previous = triton.knobs.compilation.listener

    def listener(**kwargs):
        compiles.append(kwargs)
        if previous is not None:
            previous(**kwargs)

    monkeypatch.setattr(triton.knobs.compilation, "listener", listener)
    for b, s in [(1, 1), (16, 1), (2, 16), (16, 17), (1, 32), (7, 37)]:
        _run_cuda(plan, {"batch": b, "seq": s}, rng)
    assert compiles == []


def test_one_workspace_for_every_shape_and_graphs_of_two_shapes(monkeypatch):
    """A dynamic plan whose intermediates live in the workspace (a row norm, then a projection) executed at
    several shapes on CUDA allocates one workspace (the range's maximum); CUDA graphs populated at two
    shapes in it both replay right after new data is written into their inputs."""
    import opgraph as og
    from opgraph.core.torch_interop import pack_to_device, torch_to_numpy

    b, s = og.Dim("batch", 1, 8), og.Dim("seq", 1, 256)
    g = og.Graph("ws_shared", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[b, s, 64], name="x")
    gamma, beta = g.tensor(dim=[1, 1, 64], name="gamma"), g.tensor(dim=[1, 1, 64], name="beta")
    normed = g.layernorm("INFERENCE", x, gamma, beta, epsilon=1e-5)[0]
    w = g.tensor(dim=[1, 64, 48], name="w")
    g.relu(g.matmul(normed, w)).set_output(True).set_name("y")
    plan = g.build(device="cuda", deselect_numeric_notes=["DOWN_CONVERT_INPUTS"])
    assert plan.workspace_size > 0, plan.describe()
    made = record_allocations(monkeypatch)
    rng = np.random.default_rng(16)
    for env in [{"batch": 1, "seq": 1}, {"batch": 3, "seq": 131}, {"batch": 8, "seq": 256}, {"batch": 2, "seq": 7}]:
        run_at_shape(plan, env, rng)
    sizes = [m.numel() for m in made]
    assert sizes.count(plan.workspace_size) == 1 and plan.stats["workspace_grown"] == 0, sizes
    graphs = []
    for env in [{"batch": 2, "seq": 9}, {"batch": 5, "seq": 200}]:
        static = g.final.at(env)
        pack = pack_to_device(random_pack(static, rng), "cuda")
        graphs.append((static, pack, plan.populate_cuda_graph(pack)))
    for static, pack, graph in graphs:
        host = {u: torch_to_numpy(t) for u, t in pack.items()}
        fresh = random_pack(static, rng)
        for u in static.inputs:
            pack[u].copy_(pack_to_device({u: fresh[u]}, "cuda")[u])
            host[u] = fresh[u]
        graph.replay()
        want = reference_outputs(static, host)
        bad = [
            m for u in static.outputs if (m := compare(static.tensors[u], torch_to_numpy(pack[u]), want[u])) is not None
        ]
        assert not bad, bad


def test_a_lone_16_bit_matmul_of_a_bucket_is_cublas_at_every_shape():
    """A bf16 projection over batch 2-16 x seq 257-2048 (an LM head's form): the library call leads in the
    bucket (the policy's lone-matmul rule) and is re-pointed at each shape, nothing built; right at each
    against the reference engine."""
    import opgraph as og

    batch, seq = og.Dim("batch", 2, 16), og.Dim("seq", 257, 2048)
    g = og.Graph("head", io_data_type=og.DataType.BFLOAT16, intermediate_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[batch, seq, 1024], name="x")
    w = g.tensor(dim=[1, 1024, 4096], stride=[0, 1, 1024], name="w")
    g.matmul(x, w).set_output(True).set_name("y")
    plan = g.build(device="cuda", buckets="one")
    rng = np.random.default_rng(14)
    for b, s in [(2, 257), (3, 263), (2, 400)]:
        run_at_shape(plan, {"batch": b, "seq": s}, rng, relative_to_scale=True)
        (step,) = plan.at({"batch": b, "seq": s}).steps
        assert step.config.engine == "library", step.config
    assert plan.stats["shape_builds"] == 0 and plan.stats["shape_kernels"] == 0
