"""opgraph.ops.collective: all_reduce / all_reduce_wait on one process (the reduction is the identity;
two ranks over gloo are tests/training/test_distributed.py): the bucket is the inputs flattened in
row-major order of logical dims whatever their strides, the wait cuts it back, on the reference and the
torch engines (a collective is a piece of its own there); every rule's typed error; an unregistered
group key is refused when run."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.ops.collective import WORLD, register_group, resolve_group

from ..helpers import check_rule

torch = pytest.importorskip("torch")


def bucket_graph(group: str = WORLD):
    g = og.Graph("bucket", io_data_type=og.DataType.FLOAT)
    a = g.tensor(dim=[2, 3, 4], stride=[12, 1, 3], name="a")  # not row-major: flattened by logical dims
    b = g.tensor(dim=[5], name="b")
    flat = g.all_reduce([g.mul(a, 2.0), g.neg(b)], group=group)
    flat.set_output(True).set_name("flat")
    ra, rb = g.all_reduce_wait(flat, [[2, 3, 4], [5]])
    ra.set_output(True).set_name("ra")
    rb.set_output(True).set_name("rb")
    return g


@pytest.mark.parametrize("engines", [["reference"], ["torch"]])
def test_one_process_bucket_is_the_flattened_inputs_and_the_wait_cuts_it_back(engines):
    if dist_initialized():
        pytest.skip("a process group is initialized in this process")
    g = bucket_graph()
    plan = g.build(device="cpu", engines=engines)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 4, 3)).astype(np.float32).transpose(0, 2, 1)  # strides [12, 1, 3]
    b = rng.standard_normal(5).astype(np.float32)
    flat = np.full(29, np.nan, np.float32)
    ra = np.full((2, 3, 4), np.nan, np.float32)
    rb = np.full(5, np.nan, np.float32)
    plan.execute({"a": a, "b": b, "flat": flat, "ra": ra, "rb": rb})
    np.testing.assert_array_equal(flat, np.concatenate([(2 * a).reshape(-1), -b]))
    np.testing.assert_array_equal(ra, 2 * a)
    np.testing.assert_array_equal(rb, -b)
    if engines == ["torch"]:
        assert len(plan.steps) == 3  # the collectives are pieces of their own
        assert "a collective runs as a kernel of its own" in plan.describe()


def dist_initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def test_the_world_without_torch_distributed_is_one_process():
    if dist_initialized():
        pytest.skip("a process group is initialized in this process")
    assert resolve_group(WORLD) == (None, 1)
    assert register_group(None) == WORLD


def test_an_unregistered_group_is_refused_when_run():
    g = bucket_graph(group="group99")
    plan = g.build(device="cpu", engines=["reference"])
    pack = {
        "a": np.ones((2, 4, 3), np.float32).transpose(0, 2, 1),
        "b": np.ones(5, np.float32),
        "flat": np.zeros(29, np.float32),
        "ra": np.zeros((2, 3, 4), np.float32),
        "rb": np.zeros(5, np.float32),
    }
    with pytest.raises(og.ExecutionError, match="group99") as info:
        plan.execute(pack)
    assert info.value.rule == "collective.group"


def expect_rule(g, cls, rule, *names):
    with pytest.raises(cls) as info:
        g.validate()
    check_rule(info.value, rule, *names)


def test_rules():
    g = og.Graph("types", io_data_type=og.DataType.FLOAT)
    a = g.tensor(dim=[4], name="a")
    h = g.tensor(dim=[4], name="h", data_type=og.DataType.HALF)
    g.all_reduce([a, h]).set_output(True)
    expect_rule(g, og.DataTypeError, "all_reduce.data_type", "h")

    g = og.Graph("size", io_data_type=og.DataType.FLOAT)
    a = g.tensor(dim=[4], name="a")
    for t in g.all_reduce_wait(g.all_reduce([a], name="ar"), [[2], [3]]):
        t.set_output(True)
    expect_rule(g, og.ShapeError, "all_reduce_wait.size", "ar::bucket")

    g = og.Graph("shapes", io_data_type=og.DataType.FLOAT)
    a = g.tensor(dim=[4], name="a")
    for t in g.all_reduce_wait(g.all_reduce([a], name="ar"), [[4, 0]]):
        t.set_output(True)
    expect_rule(g, og.AttributeValueError, "all_reduce_wait.shapes", "ar::bucket")

    with pytest.raises(og.AttributeValueError) as info:
        og.Graph("empty").all_reduce([])
    assert info.value.rule == "all_reduce.count"
    with pytest.raises(og.AttributeValueError) as info:
        og.Graph("empty").all_reduce_wait(a, [])
    assert info.value.rule == "all_reduce_wait.count"


def test_the_graph_round_trips_through_json():
    g = bucket_graph(group="group3")
    back = og.Graph.from_json(g.to_json())
    assert back.to_json() == g.to_json()
    node = next(n for n in back.final.nodes if n.kind == "all_reduce")
    assert node.op.group == "group3" and node.op.average and node.op.num_inputs == 2


def test_autotune_does_not_time_a_collective(monkeypatch, tmp_path):
    """A rank that timed its collective alone (another rank's tuning cache hit) would hang the group."""
    import opgraph.build.planner as planner

    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path))
    timed = []
    real = planner.tune
    monkeypatch.setattr(planner, "tune", lambda piece, *a, **k: timed.append(piece) or real(piece, *a, **k))
    plan = bucket_graph().build(device="cpu", engines=["torch"], autotune=True)
    assert len(plan.steps) == 3 and len(timed) == 1  # the mul/neg piece only
    assert all(n.kind == "pointwise" for n in timed[0].nodes)
