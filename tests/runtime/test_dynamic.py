"""Plans of graphs with dynamic dims (opgraph.runtime.dynamic): built once, executed at many shapes
against the reference engine at each shape (random inputs, poisoned outputs); the per-shape plan
cache; the pack's typed errors."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.runtime.dynamic import DynamicPlan
from tests.helpers import check_rule, random_pack, requires_interpreter

from ..helpers import OneOpEngine, engines_registered, record_allocations, run_at_shape

B, S = og.Dim("batch", 1, 16), og.Dim("seq", 1, 37)
SHAPES = [(1, 1), (2, 3), (3, 5), (7, 13), (16, 17), (5, 31), (16, 37)]  # ones, primes, the range's ends


def mlp_graph() -> og.Graph:
    g = og.Graph("dyn", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[B, S, 8], name="x")
    bias = g.tensor(dim=[1, 1, 8], name="bias")
    g.relu(g.add(x, bias)).set_output(True).set_name("y")
    return g


def run_at(plan: og.ExecutionPlan, env: dict, rng: np.random.Generator, keyed=None) -> None:
    """Execute `plan` on a pack of the shape `env` and compare every output with the reference engine
    run on the static graph of that shape."""
    run_at_shape(plan, env, rng, keyed=keyed)


@pytest.mark.parametrize(
    "engine",
    [
        "reference",
        pytest.param(
            "torch",
            marks=pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"), reason="needs PyTorch"),
        ),
    ],
)
def test_one_build_runs_every_shape(engine):
    g = mlp_graph()
    plan = g.build(device="cpu", engines=[engine])
    assert isinstance(plan, DynamicPlan) and plan.stats["shape_plans"] == 1  # the maximum, at build
    rng = np.random.default_rng(0)
    for b, s in SHAPES:
        run_at(plan, {"batch": b, "seq": s}, rng)
    assert plan.stats["shape_plans"] == len(SHAPES)  # (16, 37) is the maximum built at build
    run_at(plan, {"batch": 3, "seq": 5}, rng)
    assert plan.stats["shape_plans"] == len(SHAPES)  # a shape seen before builds nothing


@requires_interpreter
def test_generated_kernels_per_shape():
    g = mlp_graph()
    plan = g.build(device="cpu", engines=["triton"])
    assert plan.steps[0].config.engine == "triton"
    rng = np.random.default_rng(1)
    for b, s in [(1, 1), (3, 13), (16, 37)]:
        run_at(plan, {"batch": b, "seq": s}, rng)


def test_packs_keyed_by_handle_and_name():
    g = mlp_graph()
    plan = g.build(device="cpu", engines=["reference"])
    rng = np.random.default_rng(2)
    run_at(plan, {"batch": 2, "seq": 7}, rng, keyed=lambda static, u: static.tensors[u].name)
    handles = {g.final.handle_uid(h): h for h, _ in g.final.handles.values()}
    run_at(plan, {"batch": 4, "seq": 9}, rng, keyed=lambda static, u: handles[u])


def test_shape_plans_are_an_lru():
    g = mlp_graph()
    plan = g.build(device="cpu", engines=["reference"], shape_plans=2)
    assert plan.shape_plans == 2
    rng = np.random.default_rng(3)
    for b, s in [(1, 1), (2, 2), (1, 1), (3, 3)]:
        run_at(plan, {"batch": b, "seq": s}, rng)
    # the maximum (built at build) and (2, 2) go; (1, 1) was used again before (3, 3) came
    assert (plan.stats["shape_plans"], plan.stats["evictions"]) == (4, 2)
    assert "batch=1 seq=1; batch=3 seq=3" in plan.describe()


@pytest.mark.parametrize("bad", [0, -1, 2.0, "16"])
def test_shape_plans_is_a_positive_count(bad):
    with pytest.raises(og.BuildOptionError) as info:
        mlp_graph().build(device="cpu", engines=["reference"], shape_plans=bad)
    check_rule(info.value, "build.option")
    assert f"shape_plans={bad!r} is not a positive int" in str(info.value)


def test_describe_says_dynamic_dims_cache_and_shapes():
    g = mlp_graph()
    plan = g.build(device="cpu", engines=["reference"])
    plan.shape_plans = 3
    rng = np.random.default_rng(4)
    for b, s in [(2, 5), (3, 7), (2, 5), (1, 1)]:
        run_at(plan, {"batch": b, "seq": s}, rng)
    lines = plan.describe().splitlines()
    assert lines[0] == "dynamic plan for graph 'dyn': dims batch 1..16, seq 1..37; a plan per shape (keeps 3)"
    assert lines[1] == "  dynamic dims: 'batch' (range 1..16), 'seq' (range 1..37)"
    assert lines[2].startswith("  buckets: 6 (build(buckets=None, max_buckets=8)); ")
    k = 3 + len(plan.buckets)  # a line per bucket (tests/runtime/test_dynamic_kernels.py)
    assert lines[k] == (
        "  planned once per bucket (partition and configs at its hint): 3 bucket(s) planned; at later shapes "
        "0 step(s) whose config was chosen again, 0 shape(s) planned anew (stats: bucket_plans, rechosen, replans)"
    )
    k += 1
    assert lines[k] == (
        "  split-KV decided at each shape: 0 step(s) of a shape's plan with another split than its bucket's "
        "(stats: resplits)"
    )
    k += 1
    assert lines[k] == (
        "  tiles decided at each shape: 0 step(s) of a shape's plan running a tile variant compiled with its "
        "bucket (stats: retiles)"
    )
    k += 1
    assert lines[k] == (
        "  per-shape plans: 3 cached of at most 3 (least recently used dropped first); built 4, dropped 1, "
        "0 of their steps built again rather than re-pointed (stats: shape_plans=4, evictions=1, shape_builds=0)"
    )
    assert lines[k + 1] == "  shapes kept (least recently used first): batch=3 seq=7; batch=2 seq=5; batch=1 seq=1"
    assert lines[k + 2] == (
        "  workspace: one per thread for every shape, 0 bytes (the range's maximum), grown 0 time(s) for a shape "
        "that needed more (stats: workspace_grown)"
    )
    assert lines[k + 3].startswith("  at the range's maximum (batch=16 seq=37, built in ")
    assert lines[k + 4].startswith("    plan for graph 'dyn' on cpu: ")
    assert (plan.stats["shape_plans"], plan.stats["evictions"]) == (4, 1)
    assert "DynamicPlan 'dyn' (batch 1..16, seq 1..37)" in repr(plan)


@pytest.fixture
def one_op():
    with engines_registered(OneOpEngine()):
        yield [OneOpEngine.name]


def chain_graph() -> og.Graph:
    """relu(x + bias) * two, its intermediates virtual: a step per op on OneOpEngine, the intermediates
    in the workspace."""
    g = og.Graph("chain", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[B, S, 8], name="x")
    bias = g.tensor(dim=[1, 1, 8], name="bias")
    g.mul(g.relu(g.add(x, bias)), g.tensor(dim=[1, 1, 1], name="two")).set_output(True).set_name("y")
    return g


def _nbytes(made: list) -> list[int]:
    return [m.nbytes for m in made]


def test_every_shape_runs_in_one_workspace_at_the_ranges_maximum(monkeypatch, one_op):
    plan = chain_graph().build(device="cpu", engines=one_op)
    assert len(plan.steps) > 1 and plan.workspace_size > 0
    made = record_allocations(monkeypatch)
    rng = np.random.default_rng(5)
    for b, s in SHAPES:
        run_at(plan, {"batch": b, "seq": s}, rng)
    assert _nbytes(made) == [plan.workspace_size]  # one, at the first execute, sized for the range's maximum
    assert all(plan.at({"batch": b, "seq": s}).workspace_size <= plan.workspace_size for b, s in SHAPES)
    base = plan._workspaces.buffer
    pack = random_pack(plan.graph.at({"batch": 2, "seq": 3}), rng)
    assert plan.bind(pack).base is base  # a bound plan of any shape sits in it
    mine = np.empty(plan.workspace_size_at({"batch": 2, "seq": 3}), np.uint8)
    assert plan.bind(pack, mine).base is not base  # a workspace the caller passes is used instead
    assert plan.stats["workspace_grown"] == 0


def test_each_thread_has_its_own_shared_workspace(monkeypatch, one_op):
    import threading

    plan = chain_graph().build(device="cpu", engines=one_op)
    made = record_allocations(monkeypatch)
    errors: list[BaseException] = []

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            for b, s in SHAPES[:4]:
                run_at(plan, {"batch": b, "seq": s}, rng)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and _nbytes(made) == [plan.workspace_size] * 3


def test_the_workspace_grows_once_for_a_shape_that_needs_more(monkeypatch, caplog, one_op):
    import logging

    plan = chain_graph().build(device="cpu", engines=one_op)
    small, large = {"batch": 1, "seq": 2}, {"batch": 4, "seq": 30}
    plan.workspace_size = plan.workspace_size_at(small)  # as if the maximum's plan took less than a bucket's
    made = record_allocations(monkeypatch)
    rng = np.random.default_rng(6)
    run_at(plan, small, rng)
    first = plan._workspaces.buffer
    with caplog.at_level(logging.INFO, logger="opgraph.dynamic"):
        run_at(plan, large, rng)
        run_at(plan, small, rng)
        run_at(plan, large, rng)
    need = plan.workspace_size_at(large)
    assert _nbytes(made) == [plan.workspace_size, need] and plan.stats["workspace_grown"] == 1
    assert plan._workspaces.retired == [first]  # kept: CUDA graphs captured on it read it
    assert f"the workspace grew from {plan.workspace_size} to {need} bytes for batch=4 seq=30" in caplog.text


def pack_of(g: og.Graph, x_shape, y_shape=None) -> dict:
    return {
        "x": np.ones(x_shape, np.float32),
        "bias": np.ones((1, 1, 8), np.float32),
        "y": np.zeros(y_shape or x_shape, np.float32),
    }


@pytest.mark.parametrize(
    "x_shape, y_shape, rule, names",
    [
        ((17, 3, 8), None, "pack.dim_range", ("x", "batch")),
        ((2, 38, 8), None, "pack.dim_range", ("x", "seq")),
        ((2, 3, 8), (2, 4, 8), "pack.dim_mismatch", ("y", "x", "seq")),
        ((2, 3), None, "pack.rank", ("x",)),
    ],
)
def test_pack_errors_name_the_tensor_and_the_dim(x_shape, y_shape, rule, names):
    g = mlp_graph()
    plan = g.build(device="cpu", engines=["reference"])
    with pytest.raises(og.VariantPackError) as info:
        plan.execute(pack_of(g, x_shape, y_shape))
    check_rule(info.value, rule, *names)


def test_a_static_axis_of_the_wrong_size_is_refused_by_the_shape_plan():
    g = mlp_graph()
    plan = g.build(device="cpu", engines=["reference"])
    with pytest.raises(og.VariantPackError):
        plan.execute(pack_of(g, (2, 3, 9)))


def test_a_missing_tensor_is_named():
    g = mlp_graph()
    plan = g.build(device="cpu", engines=["reference"])
    pack = pack_of(g, (2, 3, 8))
    del pack["y"]
    with pytest.raises(og.VariantPackError) as info:
        plan.execute(pack)
    check_rule(info.value, "pack.missing", "y")


def test_a_graph_whose_dims_no_buffer_gives_is_refused_at_build():
    g = og.Graph("packed", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[B * S, 8], name="x")
    g.relu(x).set_output(True).set_name("y")
    with pytest.raises(og.ShapeError) as info:
        g.build(device="cpu", engines=["reference"])
    check_rule(info.value, "plan.dim_unknown")


def test_what_needs_one_plan_state_is_refused_with_a_typed_error():
    plan = mlp_graph().build(device="cpu", engines=["reference"])
    with pytest.raises(og.UnsupportedGraphError):
        plan.to_bytes()
    with pytest.raises(og.UnsupportedGraphError):
        _ = plan.address_table
    assert plan.at({"batch": 2, "seq": 3}).graph.tensor("y").dim == (2, 3, 8)
    assert plan.workspace_size == plan.max_plan.workspace_size


def test_graph_execute_runs_the_dynamic_plan():
    g = mlp_graph()
    g.build(device="cpu", engines=["reference"])
    pack = pack_of(g, (2, 3, 8))
    g.execute(pack)
    np.testing.assert_array_equal(pack["y"], np.full((2, 3, 8), 2.0, np.float32))


def test_binaries_compiled_are_read_off_the_build_statistics():
    from types import SimpleNamespace

    from opgraph.runtime.dynamic import _compiled

    stats = {"compile": {"mode": "parallel", "compiled": 2, "ready": 1}, "precompile": {"compiled": 3}}
    assert _compiled(SimpleNamespace(build_stats=stats)) == 5
    assert _compiled(SimpleNamespace(build_stats={"compile": {"mode": "lazy"}})) == 0
