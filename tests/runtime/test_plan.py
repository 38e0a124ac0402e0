"""Plans on the reference engine: build, execute, describe, engine configs per heuristic mode,
workspace, partitioning, and the testing helpers every other test leans on."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.core.config import EngineConfig, Support
from opgraph.engines import get_engine, register_engine
from opgraph.memory.workspace import ALIGN
from opgraph.testing import compare, poison, random_pack, random_values, reference_outputs

from ..helpers import OneOpEngine, engines_registered

D = og.DataType
H = og.HeurMode


@pytest.fixture(autouse=True, scope="module")
def test_engines():
    """The test engines exist while this module runs, and only then."""
    with engines_registered(OneOpEngine(), NoExpEngine()):
        yield


def chain_graph() -> tuple[og.Graph, dict]:
    """x -> exp (HALF intermediate) -> *b -> relu = y; t also feeds z = t + 1. Four ops, two outputs."""
    g = og.Graph(name="chain", io_data_type=D.FLOAT)
    x = g.tensor(dim=[3, 5, 7], name="x")
    b = g.tensor(dim=[1, 5, 1], name="b")
    t = g.exp(x, name="e").set_data_type(D.HALF)
    u = g.mul(t, b, name="m")
    y = g.relu(u, name="r").set_output(True).set_name("y")
    z = g.add(t, 1.0, name="a").set_output(True).set_name("z")
    return g, dict(x=x, b=b, t=t, u=u, y=y, z=z)


def expected(g, h, pack):
    x = pack[h["x"].uid].astype(np.float64)
    b = pack[h["b"].uid].astype(np.float64)
    t = np.exp(x).astype(np.float16).astype(np.float64)  # the HALF intermediate
    u = (t * b).astype(np.float32).astype(np.float64)
    return {h["y"].uid: np.maximum(u, 0), h["z"].uid: t + 1.0}


def check(g, h, pack):
    for uid, want in expected(g, h, pack).items():
        assert compare(g.final.tensors[uid], pack[uid], want) is None, compare(g.final.tensors[uid], pack[uid], want)


# -- build and execute -----------------------------------------------------------------------------


def test_build_cpu_uses_the_reference_engine(rng):
    g, h = chain_graph()
    plan = g.build(device="cpu")
    assert isinstance(plan, og.ExecutionPlan)
    assert [s.config.engine for s in plan.steps] == ["reference"]
    assert plan.workspace_size == 0 and g.get_workspace_size() == 0
    assert str(plan.device) == "cpu"
    pack = random_pack(g.final, rng)
    g.execute(pack)
    check(g, h, pack)


def test_default_device_without_gpu_is_cpu(rng):
    from tests.helpers import cuda_available

    if cuda_available():
        pytest.skip("a GPU is present")
    g, h = chain_graph()
    plan = g.build()
    assert str(plan.device) == "cpu"


def test_describe_lists_steps_ops_and_engine():
    g, h = chain_graph()
    plan = g.build(device="cpu")
    text = plan.describe()
    for needle in (
        "plan for graph 'chain'",
        "cpu",
        "1 step(s)",
        "step 0",
        "reference",
        "'e'",
        "'m'",
        "'r'",
        "'a'",
        "EXP",
        "RELU_FWD",
        f"%{h['y'].uid}",
        "reads",
        "writes",
    ):
        assert needle in text, (needle, text)
    assert str(plan) == text
    assert "reference" in repr(plan) and "1 step(s)" in repr(plan)


class EagerOneOpEngine(OneOpEngine):
    """OneOpEngine, which a policy rule puts first on single-op pieces (opgraph.build.policy)."""

    name = "test_eager_one_op"

    def configs(self, piece, device, mode):
        return [EngineConfig(self.name, (("mode", mode.name),))]


def test_a_policy_rule_puts_a_later_engines_configs_first_except_in_fallback():
    from opgraph.build.heuristics import rank_configs
    from opgraph.build.policy import Match, Policy, Rule
    from opgraph.core.piece import make_piece

    policy = Policy((Rule(EagerOneOpEngine.name, Match(max_ops=1), True, "single ops"),), {})
    g, _ = chain_graph()
    g.validate()
    piece = make_piece(g.final, 0, [g.final.nodes[0]])
    engines = [get_engine("reference"), EagerOneOpEngine()]
    ranked = rank_configs(piece, engines, og.core.device.CPU, [H.A], policy)
    assert [c.engine for c in ranked.configs] == ["test_eager_one_op", "reference"], ranked
    ranked = rank_configs(piece, engines, og.core.device.CPU, [H.FALLBACK], policy)
    assert ranked.configs[0].engine == "reference", ranked
    whole = make_piece(g.final, 0, list(g.final.nodes))
    assert rank_configs(whole, engines, og.core.device.CPU, [H.A], policy).configs[0].engine == "reference"


class FailingFirstEngine(OneOpEngine):
    """Offers two configs per piece; the first fails to compile (as a cuDNN plan can after its
    support check passed)."""

    name = "test_failing_first"

    def configs(self, piece, device, mode):
        return [EngineConfig(self.name, (("which", "broken"),)), EngineConfig(self.name, (("which", "good"),))]

    def compile(self, piece, config, device):
        if config.knob("which") == "broken":
            raise og.ExecutionError("cannot build this plan", rule="test.build")
        return super().compile(piece, config, device)


def test_a_config_that_fails_to_compile_gives_way_to_the_next(rng):
    from opgraph.engines import ENGINES

    register_engine(FailingFirstEngine())
    try:
        g, h = chain_graph()
        plan = g.build(device="cpu", engines=["test_failing_first"])
        assert all(s.config.knob("which") == "good" for s in plan.steps)
        pack = random_pack(plan.graph, rng)
        plan.execute(pack)
        check(g, h, pack)
    finally:
        ENGINES.pop("test_failing_first", None)


def test_profile_steps_times_every_step_and_leaves_the_outputs_right(rng):
    g, h = chain_graph()
    plan = g.build(device="cpu", engines=["test_one_op"])
    pack = random_pack(plan.graph, rng)
    rows = plan.profile_steps(pack, repeat=2)
    assert [r.step for r in rows] == list(range(len(plan.steps))) and len(rows) > 1
    assert all(r.engine == "test_one_op" and r.ops == 1 and r.device_us > 0 and r.host_us > 0 for r in rows)
    assert "step    0 test_one_op" in str(rows[0])
    want = reference_outputs(plan.graph, pack)
    for uid, arr in want.items():
        assert not compare(plan.graph.tensors[uid], pack[uid], arr), uid


@pytest.mark.parametrize(
    "modes",
    [[H.INSTANT], [H.A], [H.B], [H.FALLBACK], H.A, "fallback", ["INSTANT", H.B], None, [H.A, H.FALLBACK]],
    ids=repr,
)
def test_engine_configs_per_heuristic_mode(modes):
    g, _ = chain_graph()
    pieces = g.engine_configs(heur_mode=modes, device="cpu")
    assert len(pieces) == 1
    configs = pieces[0].configs
    assert [c.engine for c in configs] == ["reference"]
    assert og.NumericalNote.FP64_ACCUMULATION in configs[0].numerical_notes
    assert og.BehaviorNote.HOST_EXECUTION in configs[0].behavior_notes
    assert "reference" in str(pieces[0]) and pieces[0].piece.kinds == ("pointwise",) * 4
    plan = g.build(heur_mode=modes, device="cpu")
    assert plan.steps[0].config == configs[0]


def test_engine_configs_rank_per_mode_for_each_engine():
    g, _ = chain_graph()
    pieces = g.engine_configs(heur_mode=[H.B, H.INSTANT], device="cpu", engines=["reference", "test_one_op"])
    assert len(pieces) == 1  # the preferred reference engine runs the whole graph as one piece
    assert [c.engine for c in pieces[0].configs] == ["reference"]
    assert pieces[0].declined == (("test_one_op", "one op per kernel"),)
    # engines are in order of preference: a preferred one-op engine gets one piece per op
    pieces = g.engine_configs(heur_mode=[H.B], device="cpu", engines=["test_one_op", "reference"])
    assert [p.configs[0].engine for p in pieces] == ["test_one_op"] * 4


def test_bad_heuristic_modes():
    g, _ = chain_graph()
    for bad in ("nope", [3], [None]):
        with pytest.raises(og.AttributeValueError) as ei:
            g.build(heur_mode=bad, device="cpu")
        assert ei.value.rule == "heur_mode.unknown"
    with pytest.raises(og.UnsupportedGraphError) as ei:
        g.build(heur_mode=[], device="cpu")
    assert ei.value.rule == "engine.no_config"


def test_execute_requires_build(rng):
    g, h = chain_graph()
    pack = random_pack(g.final, rng)
    with pytest.raises(og.GraphError) as ei:
        g.execute(pack)
    assert ei.value.rule == "plan.missing" and "build" in ei.value.hint
    with pytest.raises(og.GraphError):
        g.get_workspace_size()
    g.build(device="cpu")
    g.execute(pack)
    h["z"].set_name("z2")  # any change drops the plan
    with pytest.raises(og.GraphError) as ei:
        g.execute(pack)
    assert ei.value.rule == "plan.missing"


def test_unknown_engine_names_the_known_ones():
    g, _ = chain_graph()
    with pytest.raises(og.UnsupportedGraphError) as ei:
        g.build(engines=["nope"], device="cpu")
    assert ei.value.rule == "engine.unknown" and "'nope'" in str(ei.value) and "reference" in str(ei.value)
    with pytest.raises(og.UnsupportedGraphError) as ei:
        g.build(engines=[], device="cpu")
    assert ei.value.rule == "engine.none"
    assert g.build(engines="reference", device="cpu").steps[0].config.engine == "reference"


def test_bad_device_and_options():
    g, _ = chain_graph()
    with pytest.raises(og.GraphError) as ei:
        g.build(device="tpu")
    assert ei.value.rule == "device.unknown"
    with pytest.raises(TypeError):
        g.build(device="cpu", fast=True)


def test_source_of_steps():
    g, _ = chain_graph()
    plan = g.build(device="cpu")
    assert plan.source(0) is None  # the reference engine generates no code
    for bad in (1, -1, 99):
        with pytest.raises(og.GraphError) as ei:
            plan.source(bad)
        assert ei.value.rule == "plan.step" and "0..0" in ei.value.hint


def test_repeated_execute_reuses_the_plan(rng):
    g, h = chain_graph()
    plan = g.build(device="cpu")
    kernels = [s.kernel for s in plan.steps]
    for _ in range(3):
        pack = random_pack(g.final, rng)
        plan.execute(pack)
        check(g, h, pack)
        g.execute(random_pack(g.final, rng))
    assert [s.kernel for s in plan.steps] == kernels
    assert g.build(device="cpu") is not plan  # a new build is a new plan


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_inplace_single_op_graph(rng, layout):
    g = og.Graph(io_data_type=D.FLOAT)
    stride = [60, 20, 5, 1] if layout == "nchw" else [60, 1, 15, 3]
    x = g.tensor(dim=[2, 3, 4, 5], stride=stride, name="x", uid=7)
    g.relu(x, negative_slope=0.25).set_uid(7).set_output(True)
    plan = g.build(device="cpu")
    buf = random_values(g.final.tensors[7], rng)
    old = buf.astype(np.float64)
    plan.execute({7: buf})
    np.testing.assert_allclose(buf, np.where(old < 0, 0.25 * old, old), rtol=1e-6)
    plan.execute({x: buf})  # by handle too; runs again on the updated values
    np.testing.assert_allclose(buf, np.where(old < 0, 0.0625 * old, old), rtol=1e-6)


# -- partitioning and the workspace --------------------------------------------------------------------


def test_partitioned_plan_uses_the_workspace(rng):
    g, h = chain_graph()
    plan = g.build(device="cpu", engines=["test_one_op"])
    assert len(plan.steps) == 4 and {s.config.engine for s in plan.steps} == {"test_one_op"}
    t, u = h["t"].uid, h["u"].uid
    assert set(plan.workspace_layout) == {t, u}  # the virtual tensors crossing kernels
    for uid, (offset, nbytes) in plan.workspace_layout.items():
        assert offset % ALIGN == 0 and nbytes == 3 * 5 * 7 * g.final.tensors[uid].data_type.itemsize
    assert plan.workspace_size >= sum(n for _, n in plan.workspace_layout.values())
    text = plan.describe()
    assert "4 step(s)" in text and "(workspace)" in text and "not fused" in text and "one op per kernel" in text
    pack = random_pack(g.final, rng)
    plan.execute(pack)  # the plan allocates its own workspace
    check(g, h, pack)
    ws = np.empty(plan.workspace_size + 13, np.uint8)
    pack = random_pack(g.final, rng)
    plan.execute(pack, workspace=ws)
    check(g, h, pack)
    # the partitioned plan agrees with the single-kernel one exactly
    ref = reference_outputs(g.final, pack)
    for uid in g.final.outputs:
        np.testing.assert_array_equal(pack[uid], ref[uid])


def test_allow_partition_false():
    g, _ = chain_graph()
    with pytest.raises(og.UnsupportedGraphError) as ei:
        g.build(device="cpu", engines=["test_one_op"], allow_partition=False)
    assert ei.value.rule == "partition.strict" and "one op per kernel" in str(ei.value)
    assert len(g.build(device="cpu", engines=["test_one_op", "reference"], allow_partition=False).steps) == 1


def test_partition_falls_back_per_piece():
    g, _ = chain_graph()
    pieces = g.engine_configs(device="cpu", engines=["test_one_op"])
    assert [len(p.piece.nodes) for p in pieces] == [1, 1, 1, 1]
    assert [p.configs[0].knob("mode") for p in pieces] == ["a"] * 4  # default modes A, FALLBACK
    assert all(p.piece.signature() == p.piece.signature() for p in pieces)
    assert get_engine("test_one_op").name == "test_one_op"


def _bad_workspaces(plan, pack):
    n = plan.workspace_size
    return {
        "too small": (np.empty(n - 1, np.uint8), "pack.workspace_size"),
        "wrong dtype": (np.empty(n, np.float32), "pack.workspace"),
        "2-D": (np.empty((1, n), np.uint8), "pack.workspace"),
        "strided": (np.empty(2 * n, np.uint8)[::2], "pack.workspace"),
        "a list": ([0] * n, "pack.workspace"),
        "read-only": (np.lib.stride_tricks.as_strided(np.empty(n, np.uint8), writeable=False), "pack.workspace"),
    }


@pytest.mark.parametrize(
    "which",
    ["too small", "wrong dtype", "2-D", "strided", "a list", "read-only", "overlaps an input", "overlaps an output"],
)
def test_bad_workspace_writes_nothing(rng, which):
    g, h = chain_graph()
    plan = g.build(device="cpu", engines=["test_one_op"])
    pack = random_pack(g.final, rng)
    if which.startswith("overlaps"):
        # the tensor's buffer lives in the last bytes of the workspace
        uid = h["x" if which.endswith("input") else "y"].uid
        arr = pack[uid]
        ws = np.empty(plan.workspace_size + arr.nbytes, np.uint8)
        pack[uid] = ws[plan.workspace_size - 4 :][: arr.nbytes].view(arr.dtype).reshape(arr.shape)
        pack[uid][...] = arr
        rule = "pack.workspace_overlap"
    else:
        ws, rule = _bad_workspaces(plan, pack)[which]
    snap = [(v, np.array(v, copy=True)) for v in pack.values() if isinstance(v, np.ndarray)]
    with pytest.raises(og.VariantPackError) as ei:
        plan.execute(pack, workspace=ws)
    assert ei.value.rule == rule, str(ei.value)
    for arr, before in snap:
        np.testing.assert_array_equal(arr, before)


def test_workspace_ignored_when_none_is_needed(rng):
    g, h = chain_graph()
    plan = g.build(device="cpu")
    assert plan.workspace_size == 0
    pack = random_pack(g.final, rng)
    plan.execute(pack, workspace=np.empty(0, np.uint8))
    check(g, h, pack)
    with pytest.raises(og.VariantPackError):
        plan.execute(random_pack(g.final, rng), workspace="nope")


# -- the testing helpers -------------------------------------------------------------------------------


def test_random_pack_poisons_outputs_and_fills_inputs(rng):
    g, h = chain_graph()
    pack = random_pack(g.final, rng)
    assert np.isnan(pack[h["y"].uid]).all() and np.isnan(pack[h["z"].uid]).all()
    x = pack[h["x"].uid]
    assert x.dtype == np.float32 and (x != 0).all() and len(np.unique(x)) > x.size // 2
    assert set(pack) == set(g.final.inputs) | set(g.final.outputs)


def test_random_values_keep_layout_and_type(rng):
    desc = og.TensorDesc(1, "t", (2, 3, 4, 5), (60, 1, 15, 3), D.INT8)
    v = random_values(desc, rng)
    assert v.strides == (60, 1, 15, 3) and v.dtype == np.int8 and (v != 0).all()
    assert poison(v.copy()).max() == 127


def test_compare_catches_errors_and_unwritten_outputs():
    desc = og.TensorDesc(1, "out", (4,), (1,), D.HALF)
    want = np.array([1.0, 2.0, 3.0, 4.0])
    assert compare(desc, want.astype(np.float16), want) is None
    bad = compare(desc, np.array([1.0, 2.0, 3.5, 4.0], np.float16), want)
    assert bad is not None and bad.worst_index == (2,) and "'out' (uid 1)" in str(bad)
    unwritten = compare(desc, np.array([1.0, np.nan, np.nan, 4.0], np.float16), want)
    assert unwritten is not None and unwritten.unwritten == 2 and "never written" in str(unwritten)
    assert compare(desc, np.array([np.nan, np.inf]), np.array([np.nan, np.inf])) is None
    assert compare(desc, np.array([np.inf]), np.array([-np.inf])) is not None


@pytest.mark.parametrize("dt", [D.FP8_E5M2, D.FP8_E4M3, D.BFLOAT16, D.BOOLEAN, D.INT64], ids=lambda d: d.name)
def test_workspace_intermediates_of_every_width(rng, dt):
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=[3, 4], stride=[1, 3], name="x")
    t = g.identity(x).set_data_type(dt)  # virtual, crosses kernels through the workspace
    y = g.add(t, 1.0).set_output(True)
    plan = g.build(device="cpu", engines=["test_one_op"])
    assert list(plan.workspace_layout) == [t.uid]
    pack = random_pack(g.final, rng)
    plan.execute(pack)
    from opgraph.core.rounding import round_to

    want = round_to(pack[x.uid].astype(np.float64), dt).astype(np.float64) + 1.0
    np.testing.assert_array_equal(pack[y.uid], want.astype(np.float32))


def test_random_pack_and_reference_for_an_inplace_graph(rng):
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=[3, 4], name="x", uid=7)
    g.mul(x, 2.0).set_uid(7).set_output(True)
    pack = random_pack(g.final, rng)
    before = pack[7].copy()
    assert not np.isnan(before).any()  # read by the op: data, not poison
    want = reference_outputs(g.final, pack)[7]
    np.testing.assert_array_equal(pack[7], before)  # the reference ran on a copy
    g.build(device="cpu").execute(pack)
    np.testing.assert_array_equal(pack[7], 2 * before)
    np.testing.assert_array_equal(want, 2 * before)


class NoExpEngine(OneOpEngine):
    """Runs any run of ops without an EXP in it."""

    name = "test_no_exp"

    def supports(self, piece, device):
        for n in piece.nodes:
            if n.op.mode is og.PointwiseMode.EXP:
                return Support.no("no exp here", n)
        return Support.yes()


def test_op_no_engine_runs_is_refused_with_reasons():
    g, _ = chain_graph()
    with pytest.raises(og.UnsupportedGraphError) as ei:
        g.build(device="cpu", engines=["test_no_exp"])
    assert ei.value.rule == "engine.no_support" and "'e'" in str(ei.value) and "no exp here" in str(ei.value)


def test_mixed_engines_split_where_needed(rng):
    g, h = chain_graph()
    plan = g.build(device="cpu", engines=["test_no_exp", "reference"])
    # [e] can only be the reference engine; the ops after it go back to the preferred engine
    assert [s.config.engine for s in plan.steps] == ["reference", "test_no_exp"]
    assert "preferred engine 'test_no_exp'" in plan.describe()
    g2 = og.Graph(io_data_type=D.FLOAT)
    x = g2.tensor(dim=[8], name="x")
    y = g2.exp(g2.neg(x), name="e").set_output(True)
    with pytest.raises(og.UnsupportedGraphError):
        g2.build(device="cpu", engines=["test_no_exp"])
    plan = g2.build(device="cpu", engines=["test_no_exp", "test_one_op"])
    assert [s.config.engine for s in plan.steps] == ["test_no_exp", "test_one_op"]
    assert plan.cuts and plan.cuts[0].node.name == "e"
    pack = random_pack(g2.final, rng)
    plan.execute(pack)
    np.testing.assert_allclose(pack[y.uid], np.exp(-pack[x.uid].astype(np.float64)), rtol=1e-6)
