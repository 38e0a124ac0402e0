"""Planning once per bucket (opgraph.build.bucket_plan): a dynamic plan partitions and chooses configs
once per bucket, at its hint; a new shape of a bucket already planned gets that plan carried to it
(no partition, no ranking; kernels taking their sizes at run time re-pointed, others compiled at the
shape with the bucket's config), and runs equal to the reference engine at 1, primes and the range's
ends (random inputs, outputs poisoned)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
import opgraph.build.bucket_plan as bucket_plan
import opgraph.build.planner as planner
from opgraph.core.errors import UnsupportedGraphError
from opgraph.engines import get_engine
from opgraph.runtime.dynamic import DynamicPlan
from opgraph.testing import compare, random_pack, reference_outputs
from tests.helpers import record_generations, requires_interpreter

B, S = og.Dim("batch", 1, 16), og.Dim("seq", 1, 37)
# ones, primes and the range's ends, all in the bucket batch 2..16 x seq 17..37 but the first two
SHAPES = [(1, 1), (1, 37), (2, 17), (3, 19), (5, 23), (16, 37), (13, 31), (7, 29), (11, 17)]


def block(g: og.Graph) -> None:
    """A residual layernorm, a matmul with a pointwise epilogue, a concatenation along the dynamic
    axis and a reverse cumsum along it with a prologue and an epilogue (all run-time-size kernels;
    tests/engines/test_triton_matmul_dynamic.py has configs generated at each shape)."""
    x = g.tensor(dim=[B, S, 8], name="x")
    r = g.tensor(dim=[B, S, 8], name="r")
    scale = g.tensor(dim=[1, 1, 8], name="scale")
    bias = g.tensor(dim=[1, 1, 8], name="bias")
    w = g.tensor(dim=[1, 8, 4], name="w")
    y, mean, inv = g.layernorm("training", g.add(x, r), scale, bias, epsilon=1e-5)
    mean.set_output(True).set_name("mean")
    inv.set_output(True).set_name("inv")
    h = g.relu(g.matmul(y, w))
    g.exp(g.concatenate([h, h], axis=1)).set_output(True).set_name("y")
    g.add(g.cumsum(g.mul(x, r), 1, reverse=True, name="cumsum"), r).set_output(True).set_name("c")


def graph() -> og.Graph:
    g = og.Graph("block", io_data_type=og.DataType.FLOAT, compute_data_type=og.DataType.FLOAT)
    block(g)
    return g


class Counts:
    """Calls of the planner's partition and ranking, counted (the real ones run)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.partition = self.rank = 0
        self.on = True
        real_partition, real_rank = planner.partition, planner.rank_configs

        def partition(*a, **k):
            self.partition += self.on
            return real_partition(*a, **k)

        def rank(*a, **k):
            self.rank += self.on
            return real_rank(*a, **k)

        monkeypatch.setattr(planner, "partition", partition)
        monkeypatch.setattr(planner, "rank_configs", rank)
        monkeypatch.setattr(bucket_plan, "rank_configs", rank)


def run_at(plan: DynamicPlan, b: int, s: int, rng: np.random.Generator, counts: Counts | None = None) -> None:
    static = plan.graph.at({"batch": b, "seq": s})
    pack = random_pack(static, rng)
    want = reference_outputs(static, pack)  # (a static build: not counted)
    if counts is not None:
        counts.on = True
    plan.execute(pack)
    if counts is not None:
        counts.on = False
    bad = [m for u in static.outputs if (m := compare(static.tensors[u], pack[u], want[u])) is not None]
    assert not bad, f"batch={b} seq={s}: " + "\n".join(map(str, bad))


ENGINES = [
    pytest.param(["reference"], id="reference"),
    pytest.param(["torch"], id="torch"),
    pytest.param(["triton"], id="triton", marks=requires_interpreter),
]


@pytest.mark.parametrize("engines", ENGINES)
def test_a_new_shape_of_a_used_bucket_is_not_partitioned_or_chosen_again(engines, monkeypatch):
    pytest.importorskip("torch") if engines != ["reference"] else None
    counts = Counts(monkeypatch)
    plan = graph().build(device="cpu", engines=engines)
    assert isinstance(plan, DynamicPlan)
    assert counts.partition == 1 and plan.stats["bucket_plans"] == 1  # the range's maximum's bucket, at build
    counts.on = False
    rng = np.random.default_rng(0)
    buckets = set()
    for b, s in SHAPES:
        before = counts.partition, counts.rank
        first = plan.buckets.of((b, s)).index not in buckets | {plan.buckets.of((16, 37)).index}
        run_at(plan, b, s, rng, counts)
        buckets.add(plan.buckets.of((b, s)).index)
        if not first:
            assert (counts.partition, counts.rank) == before, (b, s)  # nothing partitioned or ranked
    used = buckets | {plan.buckets.of((16, 37)).index}
    assert counts.partition == plan.stats["bucket_plans"] == len(used)
    assert plan.stats["shape_plans"] == len(SHAPES)  # (the range's maximum among them)
    assert plan.stats["rechosen"] == plan.stats["replans"] == 0
    assert "planned once per bucket" in plan.describe()


@requires_interpreter
def test_a_run_time_size_kernel_is_re_pointed_not_generated(monkeypatch):
    plan = graph().build(device="cpu", engines=["triton"], buckets="one")
    generated = record_generations(monkeypatch)
    rng = np.random.default_rng(1)
    run_at(plan, 3, 5, rng)
    run_at(plan, 7, 29, rng)
    at, other, top = plan.at({"batch": 3, "seq": 5}), plan.at({"batch": 7, "seq": 29}), plan.max_plan
    sized = [i for i, s in enumerate(top.steps) if s.kernel.generated.sized]
    per_shape = [i for i in range(len(top.steps)) if i not in sized]
    # the layernorm, the matmul with its epilogue, the concatenation and the scan all take sizes at run time
    assert sized and not per_shape
    assert any(s.config.knob("template") == "scan" for s in top.steps)
    assert len(generated) == 2 * len(per_shape)  # generated again: the per-shape steps only (none here)
    for i in sized:
        k, k2 = at.steps[i].kernel, other.steps[i].kernel
        assert k.module is k2.module is top.steps[i].kernel.module  # one module (and binary) for the bucket
        assert k.generated.launches[0].grid != k2.generated.launches[0].grid  # each shape's grid
    assert [s.config for s in at.steps] == [s.config for s in other.steps] == [s.config for s in top.steps]


@pytest.mark.parametrize("engines", ENGINES[1:])
def test_choices_do_not_depend_on_which_shape_of_a_bucket_came_first(engines):
    pytest.importorskip("torch")
    order = [(2, 17), (11, 31), (5, 23)]
    plans = [graph().build(device="cpu", engines=engines) for _ in range(2)]
    rng = np.random.default_rng(2)
    for plan, shapes in zip(plans, (order, order[::-1])):
        for b, s in shapes:
            run_at(plan, b, s, rng)
    for b, s in order:
        a, z = (p.at({"batch": b, "seq": s}) for p in plans)
        assert [st.config for st in a.steps] == [st.config for st in z.steps]


def test_a_config_that_does_not_run_at_a_shape_is_chosen_again(monkeypatch):
    pytest.importorskip("torch")
    plan = graph().build(device="cpu", engines=["torch"])
    engine = get_engine("torch")
    monkeypatch.setattr(type(engine), "kernel_at", lambda self, kernel, piece, device: None)
    rng = np.random.default_rng(3)
    run_at(plan, 3, 19, rng)
    steps = len(plan.at({"batch": 3, "seq": 19}).steps)
    assert plan.stats["rechosen"] == steps and plan.stats["replans"] == 0


def test_a_piece_no_engine_runs_at_a_shape_plans_the_shape_anew(monkeypatch):
    pytest.importorskip("torch")
    plan = graph().build(device="cpu", engines=["torch"])
    monkeypatch.setattr(type(get_engine("torch")), "kernel_at", lambda self, kernel, piece, device: None)

    def refuse(*a, **k):
        raise UnsupportedGraphError("no engine runs it here", rule="engine.no_config")

    monkeypatch.setattr(bucket_plan, "choose_step", refuse)
    rng = np.random.default_rng(4)
    run_at(plan, 5, 23, rng)
    assert plan.stats["replans"] == 1


def test_static_plans_are_planned_as_before(monkeypatch):
    counts = Counts(monkeypatch)
    g = og.Graph("static", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[2, 3, 8], name="x")
    g.relu(x).set_output(True).set_name("y")
    plan = g.build(device="cpu", engines=["reference"])
    assert counts.partition == 1 and not isinstance(plan, DynamicPlan)
