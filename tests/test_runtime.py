"""The runtime at model scale (issue 14), CPU tier: a plan binds once per workspace (no view or scratch
slice made per call, no cache keeping an old workspace alive), the stream is interpreted once, profile
runs execute's prelude, pass-by-value scalars are rounded on every binding path, plan files are
checksummed and carry compiled kernels, and kernels compile in worker processes, each distinct one
once, reused from Triton's disk cache and from plan files. The GPU tier is test_runtime_gpu.py."""

from __future__ import annotations

import gc
import hashlib
import json
import weakref

import numpy as np
import pytest

import opgraph as og
from opgraph.engines import artifacts
from opgraph.memory import workspace as wsp
from opgraph.runtime.plan_io import MAGIC
from opgraph.tools.samples import batchnorm_relu, conv_bias_relu

from .helpers import random_pack, reference_outputs, requires_interpreter


def _poisoned(plan, rng):
    pack = random_pack(plan.graph, rng)
    for u in plan.graph.outputs:
        if u not in plan.graph.inputs:
            pack[u][...] = np.nan
    return pack


@requires_interpreter
def test_a_workspace_the_user_drops_is_freed(rng):
    """Kernels used to cache views of every scratch slice by address (up to 64 of them), keeping each
    workspace a caller passed alive. Now a plan holds the binding of the last workspace only."""
    plan = batchnorm_relu(n=2, c=4, hw=5).build(device="cpu", engines=["triton"])
    assert plan.workspace_size and any(s.kernel.scratch_bytes for s in plan.steps)
    pack = _poisoned(plan, np.random.default_rng(0))
    ws = np.zeros(plan.workspace_size, np.uint8)
    alive = weakref.ref(ws)
    plan.execute(pack, workspace=ws)
    plan.execute(pack, workspace=np.zeros(plan.workspace_size, np.uint8))
    del ws
    gc.collect()
    assert alive() is None


@requires_interpreter
def test_scratch_views_are_made_once_per_workspace(rng, monkeypatch):
    plan = batchnorm_relu(n=2, c=4, hw=5).build(device="cpu", engines=["triton"])
    pack = _poisoned(plan, rng)
    plan.execute(pack)
    made = []
    real = wsp.scratch_view
    monkeypatch.setattr(wsp, "scratch_view", lambda *a: made.append(a[2]) or real(*a))
    for _ in range(3):
        plan.execute(pack)
    assert made == [], f"scratch slices made per execute: {made}"
    want = reference_outputs(plan.graph, pack)
    plan.execute(pack)
    for u, w in want.items():
        np.testing.assert_allclose(pack[u].astype(np.float64), w, rtol=2e-2, atol=2e-2)


def test_a_cpu_plan_refuses_a_stream_before_writing_anything(rng):
    plan = conv_bias_relu(n=1, c=2, k=2, hw=4).build(device="cpu")
    pack = _poisoned(plan, rng)
    for bad in (object(), "default", 3):
        with pytest.raises(og.VariantPackError) as err:
            plan.execute(pack, stream=bad)
        assert err.value.rule == "execute.stream"
    for u in plan.graph.outputs:
        assert np.isnan(pack[u].astype(np.float64)).all()
    plan.execute(pack, stream=None)
    assert not np.isnan(pack[plan.graph.outputs[0]].astype(np.float64)).any()


@requires_interpreter
def test_profile_runs_the_prelude_execute_runs(rng):
    """Kernels read by-reference tensors through the address table, which the shared prelude writes:
    profile used to skip it and ran on the previous pack's buffers."""
    g = og.Graph("pw", io_data_type=og.DataType.HALF)
    x = g.tensor(dim=[4, 32], name="x")
    g.sigmoid(g.mul(x, 3.0)).set_output(True).set_name("y")
    plan = g.build(device="cpu", engines=["triton"], by_reference=True)
    first = _poisoned(plan, rng)
    plan.execute(first)
    second = _poisoned(plan, rng)
    plan.profile(second)
    want = reference_outputs(plan.graph, second)
    for u, w in want.items():
        np.testing.assert_allclose(second[u].astype(np.float64), w, rtol=2e-3, atol=2e-3)


def test_pass_by_value_scalars_are_rounded_on_every_binding_path():
    """One semantics: the host number, rounded to the tensor's declared type, on the first execute,
    the same pack again (the identity path) and a new dict alike."""
    g = og.Graph("scale", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[8], name="x")
    s = g.tensor(dim=[1], data_type=og.DataType.HALF, is_pass_by_value=True, name="s")
    y = g.mul(x, s).set_output(True).set_name("y")
    plan = g.build(device="cpu")
    xs = np.linspace(1, 2, 8, dtype=np.float32)
    out = np.full(8, np.nan, np.float32)
    pack = {x: xs, s: 1 / 3, y: out}
    want = (xs.astype(np.float64) * float(np.float16(1 / 3))).astype(np.float32)
    for p in (pack, pack, dict(pack)):
        out[...] = np.nan
        plan.execute(p)
        np.testing.assert_array_equal(out, want)
    assert plan.local_state().binder.values[s.uid] == float(np.float16(1 / 3))


def test_any_damaged_byte_is_a_serialization_error(rng):
    plan = conv_bias_relu(n=1, c=2, k=2, hw=4).build(device="cpu")
    good = plan.to_bytes()
    og.ExecutionPlan.from_bytes(good)
    for pos in rng.choice(len(good), size=40, replace=False):
        bad = bytearray(good)
        bad[pos] ^= 0x5A
        with pytest.raises(og.SerializationError):
            og.ExecutionPlan.from_bytes(bytes(bad))
    for cut in rng.choice(len(good), size=10, replace=False):
        with pytest.raises(og.SerializationError):
            og.ExecutionPlan.from_bytes(good[:cut])


def _rewrap(body: bytes) -> bytes:
    return MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def test_plan_files_carry_compiled_kernels_checked_by_hash(rng):
    plan = conv_bias_relu(n=1, c=2, k=2, hw=4).build(device="cpu")
    blob = bytes(range(256)) * 4
    art = artifacts.Artifact("triton", "k" * 32, blob, {"metadata": {"name": "kernel"}})
    plan.steps[0].kernel.artifacts = lambda: [art, art]  # one artifact, however many launches use it
    data = plan.to_bytes()
    doc = json.loads(data.split(b"\n", 1)[1])
    assert len(doc["artifacts"]) == 1 and doc["artifacts"][0]["sha256"] == hashlib.sha256(blob).hexdigest()
    loaded = og.ExecutionPlan.from_bytes(data)
    assert artifacts.get("triton", "k" * 32) is None  # nothing from a file is registered process-wide
    assert len(loaded.state.kernels) == 0 and loaded.build_stats["compile"]["embedded"] == 0  # no step used it
    assert json.loads(plan.to_bytes(embed_kernels=False).split(b"\n", 1)[1])["artifacts"] == []
    for damage, rule in (
        (lambda a: a.update(data=a["data"][:-8] + "AAAAAAA="), "plan.artifact"),
        (lambda a: a.update(data="not base64!"), "plan.artifact"),
        (lambda a: a.update(sha256="0" * 64), "plan.artifact"),
        (lambda a: a.update(meta=[]), "plan.schema"),
        (lambda a: a.pop("kind"), "plan.schema"),
    ):
        d = json.loads(json.dumps(doc))
        damage(d["artifacts"][0])
        with pytest.raises(og.SerializationError) as err:
            og.ExecutionPlan.from_bytes(_rewrap(json.dumps(d).encode()))
        assert err.value.rule == rule and "plan.artifacts[0]" in str(err.value)
    assert artifacts.get("triton", "k" * 32) is None


def test_version_1_files_still_load(rng):
    plan = conv_bias_relu(n=1, c=2, k=2, hw=4).build(device="cpu")
    doc = json.loads(plan.to_bytes().split(b"\n", 1)[1])
    doc["version"] = 1
    doc.pop("artifacts")
    loaded = og.ExecutionPlan.from_bytes(b"OPGRAPH-PLAN 1\n" + json.dumps(doc).encode())
    assert [s.config for s in loaded.steps] == [s.config for s in plan.steps]


def test_the_progress_bar_appears_only_for_long_compiles(monkeypatch, capsys):
    from opgraph.build import compile as build_compile

    quick = build_compile.LazyProgress("compiling 3 kernels")
    quick(1, 3)
    assert quick.bar is None  # under PROGRESS_AFTER seconds: nothing shown
    monkeypatch.setattr(build_compile, "PROGRESS_AFTER", 0.0)
    slow = build_compile.LazyProgress("compiling 3 kernels")
    slow(1, 3)
    assert slow.bar is not None
    slow(3, 3)
    slow.close()
    assert "compiling 3 kernels" in capsys.readouterr().err


def _specs(graphs, target=("cuda", 90, 32)):
    """The compile specs a CUDA build would make of each graph's generated kernels (built here for
    Triton's interpreter, specialised for `target`)."""
    from opgraph.engines.triton import compiler
    from opgraph.engines.triton.compile_worker import exec_generated
    from opgraph.engines.triton.loader import module_file, module_name

    out = []
    for g in graphs:
        for step in g.build(device="cpu", engines=["triton"]).steps:
            k = step.kernel
            src = k.generated.source
            module = exec_generated(str(module_file(src)), module_name(src, False), jit=True)
            for launch in k.generated.launches:
                fn = getattr(module, launch.kernel)
                out.append(
                    (
                        compiler.make_spec(
                            fn,
                            str(module_file(src)),
                            module_name(src, False),
                            launch.kernel,
                            [k._arg_type(a) for a in launch.args],
                            dict(launch.meta),
                            target,
                            compiler.canonical_digest(src),
                        ),
                        fn,
                    )
                )
    return out


@requires_interpreter
def test_kernels_compile_in_workers_each_once_and_are_reused(tmp_path, monkeypatch):
    """Parallel compilation for real (Triton compiles for a GPU target without one): two distinct
    kernels among three launches compile once each in worker processes; this process then reads them
    from Triton's disk cache without compiling; with an empty cache, kernels embedded in a plan file
    (artifacts) are used as they are."""
    from opgraph.engines.triton import compiler
    from opgraph.engines.triton.pool import WorkerPool

    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path / "og"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    graphs = []
    for name, build in (
        ("a", lambda g, x: g.sigmoid(g.mul(x, 3.0))),
        ("b", lambda g, x: g.relu(g.add(x, 1.0))),
        ("a2", lambda g, x: g.sigmoid(g.mul(x, 3.0))),
    ):
        g = og.Graph(name, io_data_type=og.DataType.HALF)
        build(g, g.tensor(dim=[4, 32], name="x")).set_output(True)
        graphs.append(g)
    specs = _specs(graphs)
    distinct = {spec.key: (spec, fn) for spec, fn in specs}
    assert len(specs) == 3 and len(distinct) == 2  # identical kernels share a spec
    compiler._BINARIES.clear()
    pool = WorkerPool(2)
    try:
        before = compiler.STATS["compiled"]
        seen = []
        report = compiler.compile_all(distinct, pool=pool, progress=lambda d, n: seen.append((d, n)))
        assert not report.failed, report.failed
        assert report.compiled == 2 and compiler.STATS["compiled"] == before + 2 and report.workers == 2
        assert seen[-1] == (2, 2)
        binaries = {k: compiler.registered(s) for k, (s, _) in distinct.items()}
        assert all(b is not None and b.cubin[:4] == b"\x7fELF" for b in binaries.values())
        compiler._BINARIES.clear()  # as a new process would start
        again = compiler.compile_all(distinct, pool=pool)
        assert (again.cached, again.compiled) == (2, 0) and compiler.STATS["compiled"] == before + 2
        arts = artifacts.Scope(b.artifact() for b in binaries.values())
        compiler._BINARIES.clear()
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "empty"))
        monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path / "og_empty"))
        with arts.visible():  # as while a plan file loads
            embedded = compiler.compile_all(distinct, pool=pool)
            assert (embedded.ready, embedded.compiled) == (2, 0) and compiler.STATS["compiled"] == before + 2
            for key, b in binaries.items():
                assert compiler.registered(distinct[key][0]).cubin == b.cubin
        assert not compiler._BINARIES and all(compiler.registered(s) is None for s, _ in distinct.values())
    finally:
        pool.close()
        compiler._BINARIES.clear()


@requires_interpreter
def test_a_saved_training_step_runs_like_the_built_one(rng):
    """A training step updates parameters and velocities in place, and later ops read the updated
    value under the same UID. Plan files lost that: the graph file's reader gave every op the old
    value, so a loaded step differed (caught by the kernel-source check) or did not load."""
    from .test_training import _tiny, feed, init_pack, new_batch, param_uids, sgd_step

    g, loss, params = _tiny()
    step = sgd_step(g, loss, params)
    f = step.graph.final
    plan = step.graph.build(device="cpu", engines=["triton"])
    loaded = og.ExecutionPlan.from_bytes(plan.to_bytes())
    assert [loaded.source(i) for i in range(len(loaded.steps))] == [plan.source(i) for i in range(len(plan.steps))]
    start = init_pack(step, rng)
    packs = [{u: og.testing.clone(v) for u, v in start.items()} for _ in range(2)]
    for _ in range(2):
        x, _, onehot = new_batch(f, rng)
        for p, pack in zip((plan, loaded), packs):
            feed(pack, step, x, onehot)
            p.execute(pack)
    for uid in (*param_uids(step), step.loss_uid):
        np.testing.assert_array_equal(packs[1][uid], packs[0][uid])


@requires_interpreter
def test_kernels_that_differ_in_names_only_are_one_kernel(tmp_path, monkeypatch):
    """Generated code names values by UID: the same block at two places of a network generates two
    sources that differ in names only. They share one spec (one compilation); another computation
    does not."""
    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path))

    def graph(shift: int, op: str) -> og.Graph:
        g = og.Graph("blk", io_data_type=og.DataType.HALF)
        x = g.tensor(dim=[4, 32], name="x", uid=1 + 100 * shift)  # another UID, as deeper in a network
        getattr(g, op)(g.mul(x, 3.0)).set_output(True)
        return g

    specs = _specs([graph(0, "sigmoid"), graph(3, "sigmoid"), graph(0, "relu")])
    sources = {fn.fn.__code__.co_filename for _, fn in specs}
    assert len(sources) == 3  # three generated modules
    keys = [spec.key for spec, _ in specs]
    assert keys[0] == keys[1] != keys[2]
