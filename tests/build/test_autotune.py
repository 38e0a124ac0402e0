"""Autotuning: candidates timed whole, the fastest kept, the answer cached on disk by a key of
everything that can change it; a second build times nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest

import opgraph as og
from opgraph.build import autotune

from ..helpers import requires_interpreter

pytestmark = pytest.mark.interpreter


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path))
    return tmp_path


def _graph(width=64):
    g = og.Graph("tune", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, width], name="x")
    b = g.tensor(dim=[1, width], name="b")
    g.relu(g.add(x, b)).set_output(True).set_name("y")
    return g


def test_first_build_times_every_candidate_and_caches(cache_dir, rng, monkeypatch):
    timed = []
    real = autotune.time_kernel
    monkeypatch.setattr(autotune, "time_kernel", lambda k, *a: timed.append(k.config) or real(k, *a))
    plan = _graph().build(device="cpu", engines=["triton"], autotune=True)
    assert len(timed) >= 2 and len(set(timed)) == len(timed)  # each candidate once
    step = plan.steps[0]
    assert step.config.measured_us is not None
    assert all(c.measured_us is None or c.measured_us >= step.config.measured_us for c in step.alternatives)
    data = json.loads((cache_dir / "tuning.json").read_text())
    (entry,) = data.values()
    assert entry["engine"] == "triton" and len(entry["times"]) == len(timed)
    assert not og.testing.check_plan(plan, rng)


def test_second_build_times_nothing(monkeypatch):
    first = _graph().build(device="cpu", engines=["triton"], autotune=True)

    def boom(*a, **k):
        raise AssertionError("timed again")

    monkeypatch.setattr(autotune, "time_kernel", boom)
    second = _graph().build(device="cpu", engines=["triton"], autotune=True)
    assert second.steps[0].config == first.steps[0].config
    assert second.steps[0].config.measured_us == pytest.approx(first.steps[0].config.measured_us)


def test_key_depends_on_the_piece_not_on_names():
    dev = og.Device("cpu")
    a = _graph(64).build(device="cpu", engines=["triton"]).steps[0].piece
    b = _graph(128).build(device="cpu", engines=["triton"]).steps[0].piece
    g = _graph(64)
    g.final.tensor("x")  # same structure, same names -> same key; renamed tensors too
    c = g.build(device="cpu", engines=["triton"]).steps[0].piece
    key = autotune.cache_key
    assert key(a, dev, ["triton"]) == key(c, dev, ["triton"])
    assert key(a, dev, ["triton"]) != key(b, dev, ["triton"])
    assert key(a, dev, ["triton"]) != key(a, og.Device("cpu", name="other"), ["triton"])


def test_a_buckets_piece_is_tuned_apart_from_the_static_piece_of_its_hint():
    """A bucket's candidates are decided over its ranges (a matmul ranks one kernel for the bucket first):
    its answer and the static piece's of the same shape do not share a key."""
    from opgraph.build.buckets import choose
    from opgraph.core.piece import make_piece

    seq = og.Dim("seq", 1, 512)
    g = og.Graph("tune", io_data_type=og.DataType.FLOAT)
    g.relu(g.tensor(dim=[seq, 64], name="x")).set_output(True)
    final = g.final
    (bucket,) = choose(final, "one").buckets
    pieces = [make_piece(f, 0, f.nodes) for f in (final.in_bucket(bucket.hint_map, bucket), final.at(bucket.hint_map))]
    dev = og.Device("cpu")
    assert autotune.cache_key(pieces[0], dev, ["triton"]) != autotune.cache_key(pieces[1], dev, ["triton"])


def test_corrupt_cache_file_is_ignored(cache_dir, rng):
    (cache_dir / "tuning.json").write_text("{ not json")
    plan = _graph().build(device="cpu", engines=["triton"], autotune=True)
    assert not og.testing.check_plan(plan, rng)
    assert json.loads((cache_dir / "tuning.json").read_text())


def test_failing_candidates_are_skipped(monkeypatch, rng):
    real = autotune.time_kernel
    calls = []

    def flaky(kernel, *a):
        calls.append(kernel)
        if len(calls) == 1:
            raise RuntimeError("this config does not compile here")
        return real(kernel, *a)

    monkeypatch.setattr(autotune, "time_kernel", flaky)
    plan = _graph().build(device="cpu", engines=["triton"], autotune=True)
    assert plan.steps[0].config.measured_us is not None
    assert not og.testing.check_plan(plan, np.random.default_rng(0))


def test_tuning_skips_failing_configs_but_not_our_own_bugs(monkeypatch, rng):
    """A candidate that fails to build (a typed error, a runtime error, a Triton error) is skipped; a
    TypeError or AssertionError is opgraph's own bug and reaches the caller (issue 15)."""
    from opgraph.build.autotune import config_failure
    from opgraph.core.errors import ExecutionError

    assert config_failure(ExecutionError("no", rule="x")) and config_failure(RuntimeError("CUDA error"))
    triton_like = type("CompilationError", (Exception,), {"__module__": "triton.compiler.errors"})
    assert config_failure(triton_like("bad config"))
    assert not config_failure(TypeError("bug")) and not config_failure(AssertionError("bug"))
    assert not config_failure(KeyError("bug"))


def test_candidates_of_every_piece_compile_at_once_before_timing(cache_dir, monkeypatch):
    """On a GPU, build(autotune=True) hands every candidate kernel of the pieces to tune to the compiler
    pool in one batch (Triton's compiler needs no GPU; compile_all is replaced here): each distinct
    kernel once although the piece repeats, none for a piece the cache already answers."""
    from opgraph.core.config import HeurMode
    from opgraph.core.device import Device
    from opgraph.core.piece import make_piece
    from opgraph.engines import get_engine
    from opgraph.engines.triton import compiler

    h100 = Device("cuda", 0, "NVIDIA H100 80GB HBM3", (9, 0), 132)
    g = og.Graph("tune_mm", io_data_type=og.DataType.BFLOAT16, intermediate_data_type=og.DataType.FLOAT)
    a, b = g.tensor(dim=[1, 256, 128], name="a"), g.tensor(dim=[1, 128, 192], name="b")
    g.relu(g.matmul(a, b)).set_output(True)
    final = g.final
    piece = make_piece(final, 0, final.nodes)
    configs = get_engine("triton").configs(piece, h100, HeurMode.B)
    assert len(configs) >= 3
    batches = []

    def compile_all(specs, **kw):
        batches.append(dict(specs))
        return compiler.CompileReport(kernels=len(specs))

    monkeypatch.setattr(compiler, "compile_all", compile_all)
    cache = autotune.TuningCache()
    stats = autotune.precompile([(piece, configs), (piece, configs)], h100, ["triton"], cache)
    (specs,) = batches
    kernels = {spec.key for c in configs for spec, _ in get_engine("triton").compile(piece, c, h100).compile_specs()}
    assert set(specs) == kernels and len(kernels) >= len(configs)
    assert stats["pieces"] == 1 and stats["kernels"] == len(kernels)
    cache.put(autotune.cache_key(piece, h100, ["triton"], autotune.ConfigFilter().key()), {"engine": "triton"})
    autotune.precompile([(piece, configs)], h100, ["triton"], cache)
    assert len(batches) == 1  # the cached piece compiles nothing (its compiler is not even called)


def test_later_passes_time_every_candidate_round_robin(monkeypatch):
    """On a GPU each candidate is timed once per pass, the passes round-robin over the candidates (the
    median of TUNE_PASSES measurements decides): a drift of the clocks during tuning, such as a first
    candidate timed on a GPU still idle after the compiles, weighs on all alike. A candidate that
    fails in a later pass is dropped and recorded as failed."""
    import types

    order = []

    bursts = {}

    def fake(kernel, piece, device, bufs, warmup=3, burst=10):
        order.append(kernel)
        bursts.setdefault(str(kernel), set()).add(burst)
        if kernel == "kc" and len(order) > 3:
            raise RuntimeError("launch failed")
        return 1.0

    class K(str):
        dropped = False

        def drop_cached_buffers(self):
            self.dropped = True

    monkeypatch.setattr(autotune, "time_kernel", fake)
    piece = types.SimpleNamespace(label=lambda: "piece")
    ka, kb, kc, kd = K("ka"), K("kb"), K("kc"), K("kd")
    timed = [([9.0], "a", ka), ([2.0], "b", kb), ([2.0], "c", kc), ([3500.0], "d", kd)]
    failed = []
    autotune._more_passes(timed, piece, types.SimpleNamespace(is_cuda=True), {}, failed)
    assert order[:3] == ["ka", "kb", "kc"] and order[3:5] == ["ka", "kb"]  # round-robin, c dropped
    assert kc.dropped and not ka.dropped
    assert failed == ["c"] and [t[1] for t in timed] == ["a", "b", "d"]
    # d, 1750x the fastest, is pruned after the first pass (its one time kept); a, timed first, never is
    assert [len(t[0]) for t in timed] == [autotune.TUNE_PASSES] * 2 + [1] and "kd" not in order
    assert timed[0][0][0] == 9.0 and sorted(timed[0][0])[len(timed[0][0]) // 2] == 1.0  # the slow first pass outvoted
    assert bursts["kb"] == {10} and bursts["ka"] == {10}  # ~2 ms a burst: 10 calls at most
    slow = [([30000.0], "a", K("ka")), ([31000.0], "b", K("kb"))]  # a 30-ms kernel: one call a measurement
    bursts.clear()
    autotune._more_passes(slow, piece, types.SimpleNamespace(is_cuda=True), {}, failed)
    assert bursts == {"ka": {1}, "kb": {1}}
    timed = timed[:2]
    autotune._more_passes(timed, piece, types.SimpleNamespace(is_cuda=False), {}, failed)  # the CPU: one pass
    one = [([3.0], "a", ka)]
    autotune._more_passes(one, piece, types.SimpleNamespace(is_cuda=True), {}, failed)  # nothing to compare
    assert [len(t[0]) for t in timed] == [autotune.TUNE_PASSES] * 2 and one[0][0] == [3.0]


class _Recorded:
    """A kernel whose self-contained `run` must not be what tuning times: its bound launcher records
    the prelude and the call, with the binding it was given; the launcher's life is watched (a native
    launch's calls point into memory their launcher owns)."""

    scratch_bytes = 0

    def __init__(self, rc=None):
        from opgraph.core.config import EngineConfig

        self.config = EngineConfig("fake", (("k", 1),))
        self.rc, self.log, self.binding, self.launcher = rc, [], None, None

    def run(self, *a, **k):
        raise AssertionError("tuning timed Kernel.run, not the path a plan runs")

    def bind(self, binding, scratch):
        import weakref

        from opgraph.engines.base import Launcher

        self.binding = binding
        binding.preludes["p"] = (self.log.append, ("prelude",))
        launcher = Launcher()
        alive = weakref.ref(launcher)
        launcher.calls = [(lambda: self.log.append("call" if alive() is not None else "freed") or self.rc, ())]
        return launcher


def _piece(by_reference=False):
    from opgraph.core.piece import make_piece

    g = _graph()
    g.validate()
    final = g.final
    if by_reference:
        final = g.build(device="cpu", by_reference=True).graph
    return make_piece(final, 0, list(final.nodes))


def test_candidates_are_timed_through_the_bound_path_a_plan_runs():
    import gc

    from opgraph.core.device import CPU

    piece = _piece()
    x = np.ones((4, 8), np.float32)
    kernel = _Recorded()
    run = autotune.bound_run(kernel, piece, {1: x, 2: 0.5}, None, CPU)
    gc.collect()
    run()
    assert kernel.log == ["prelude", "call"]  # the launcher lives as long as the run
    assert kernel.binding.buffers == {1: x, 2: 0.5}
    assert kernel.binding.pointers == {1: x.__array_interface__["data"][0]}  # no pointer for a scalar
    assert autotune.time_kernel(_Recorded(), piece, CPU, {1: x}) >= 0


def test_a_bound_launch_failing_with_a_code_is_the_candidates_failure():
    from opgraph.core.device import CPU

    with pytest.raises(og.ExecutionError) as info:
        autotune.bound_run(_Recorded(rc=700), _piece(), {}, None, CPU)()
    assert info.value.rule == "autotune.launch" and "700" in str(info.value)
    assert autotune.config_failure(info.value)


def test_a_by_reference_graph_tunes_its_kernels_through_the_address_table(rng):
    """By-reference tensors are read through the plan's address table: the tuner binds one too (it
    failed with a KeyError before), and the tuned plan's results are right."""
    plan = _graph().build(device="cpu", engines=["triton"], autotune=True, by_reference=True)
    assert plan.steps[0].config.measured_us is not None
    assert not og.testing.check_plan(plan, rng)


# -- the inputs configs are timed on ----------------------------------------------------------------------


def _named(g: og.Graph, values: dict[int, np.ndarray]) -> dict[str, np.ndarray]:
    return {g.final.tensors[u].name: v for u, v in values.items()}


def _whole(g: og.Graph):
    from opgraph.core.piece import make_piece

    final = g.final
    return make_piece(final, 0, final.nodes)


def test_a_packed_attention_is_timed_on_sequences_that_fill_its_rows():
    """Lengths and ragged offsets (in elements, as cuDNN's) of every sequence of one length, as the packed
    tensors' rows allow; before, random integers in [-8, 8) were the lengths and offsets."""
    from ..engines.test_triton_attention_ragged import HQ, graph

    lq, lkv = (5, 9, 30), (7, 12, 40)  # T: 52 query rows, 67 key rows (offsets with gaps)
    g = graph(lq, lkv, per_row=True)
    got = _named(g, autotune.tuning_inputs(_whole(g)))
    assert got["seq_len_q"].ravel().tolist() == [17] * 3 and got["seq_len_kv"].ravel().tolist() == [22] * 3
    assert got["off_q"].ravel().tolist() == [i * 17 * HQ * 16 for i in range(4)]  # (a row: HQ heads x 16)
    assert got["off_kv"].ravel().tolist() == [i * 22 * 2 * 16 for i in range(4)]
    pack = og.testing.random_pack(g.final, np.random.default_rng(0))
    for uid, value in autotune.tuning_inputs(_whole(g)).items():
        pack[uid][...] = value
    g.build(device="cpu").execute(pack)  # (valid: the reference engine runs them)


def test_a_paged_attention_is_timed_on_pages_in_order_and_whole_lengths():
    from ..engines.test_triton_attention_paged import graph

    g = graph(3, 4, 20, 8, lens=((1, 2, 3), (5, 6, 7)))  # 4 slots a sequence, 15 pages
    got = _named(g, autotune.tuning_inputs(_whole(g)))
    assert got["table_k"].ravel().tolist() == list(range(12))
    assert got["seq_len_q"].ravel().tolist() == [4] * 3 and got["seq_len_kv"].ravel().tolist() == [20] * 3


def test_ops_without_such_inputs_are_timed_on_random_data():
    assert autotune.tuning_inputs(_whole(_graph())) == {}
