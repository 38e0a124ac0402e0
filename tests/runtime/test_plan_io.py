"""Saving and loading plans: round trips, and damaged, truncated or foreign files."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

import opgraph as og
from opgraph.runtime.plan_io import MAGIC
from opgraph.tools.samples import batchnorm_relu, conv_bias_relu

from ..helpers import requires_interpreter


def _same_results(a, b, rng):
    pack = og.testing.random_pack(a.graph, rng)
    pack_b = {u: (og.testing.clone(v) if isinstance(v, np.ndarray) else v) for u, v in pack.items()}
    a.execute(pack)
    b.execute(pack_b)
    for u in a.graph.outputs:
        np.testing.assert_array_equal(pack[u], pack_b[u])


@pytest.mark.parametrize("make", [lambda: conv_bias_relu(n=2, c=4, k=4, hw=6), lambda: batchnorm_relu(n=2, c=4, hw=5)])
def test_reference_plan_round_trip(make, tmp_path, rng):
    plan = make().build(device="cpu")
    path = tmp_path / "p.ogplan"
    plan.save(path)
    loaded = og.load_plan(path)
    assert [s.config for s in loaded.steps] == [s.config for s in plan.steps]
    assert loaded.graph == plan.graph
    assert loaded.describe() == plan.describe()
    _same_results(plan, loaded, rng)


@requires_interpreter
def test_triton_plan_round_trip_keeps_tuned_configs(tmp_path, rng, monkeypatch):
    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path))
    g = og.Graph("pw", io_data_type=og.DataType.HALF)
    x = g.tensor(dim=[4, 32], name="x")
    g.sigmoid(g.mul(x, 3.0)).set_output(True)
    plan = g.build(device="cpu", engines=["triton"], autotune=True)
    loaded = og.ExecutionPlan.from_bytes(plan.to_bytes())
    assert loaded.steps[0].config == plan.steps[0].config
    assert loaded.steps[0].config.measured_us == plan.steps[0].config.measured_us
    assert loaded.source(0) == plan.source(0)
    _same_results(plan, loaded, rng)


def _doc(plan):
    return json.loads(plan.to_bytes().split(b"\n", 1)[1])


def _bytes(doc):
    """A well-formed file around `doc` (a header with the body's checksum), to test the document's checks."""
    body = json.dumps(doc).encode()
    return MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def test_damaged_files_raise_serialization_errors():
    plan = conv_bias_relu(n=1, c=2, k=2, hw=4).build(device="cpu")
    good = plan.to_bytes()
    bad_inputs = [b"", b"garbage", good[: len(good) // 2], MAGIC + b"[1, 2]", good.replace(b"opgraph.plan", b"x")]
    doc = _doc(plan)
    for mutate in [
        lambda d: d.update(version=99),
        lambda d: d["steps"][0].update(nodes=[0, 7]),
        lambda d: d["steps"][0].update(nodes=[2, 1, 0]),
        lambda d: d["steps"][0]["config"].update(engine="nope"),
        lambda d: d["steps"][0]["config"].update(knobs=[["a", {"x": 1}]]),
        lambda d: d.update(steps=[]),
        lambda d: d["graph"]["ops"][0].update(op="nope"),
        lambda d: d.update(device={"kind": "tpu", "index": 0}),
        lambda d: d["graph"]["tensors"][0].update(dim="big"),
    ]:
        d = json.loads(json.dumps(doc))
        mutate(d)
        bad_inputs.append(_bytes(d))
    for data in bad_inputs:
        with pytest.raises(og.GraphError) as err:
            og.ExecutionPlan.from_bytes(data)
        assert isinstance(err.value, (og.SerializationError, og.UnsupportedGraphError)), (data[:80], err.value)


def test_environment_mismatch_is_an_error_or_a_recompile(rng):
    plan = conv_bias_relu(n=1, c=2, k=2, hw=4).build(device="cpu")
    doc = _doc(plan)
    doc["environment"]["device"] = "NVIDIA H100 80GB HBM3"
    doc["environment"]["opgraph"] = "0.0.1"
    with pytest.raises(og.SerializationError) as err:
        og.ExecutionPlan.from_bytes(_bytes(doc))
    assert err.value.rule == "plan.environment" and "H100" in str(err.value) and "0.0.1" in str(err.value)
    again = og.ExecutionPlan.from_bytes(_bytes(doc), on_mismatch="recompile")
    _same_results(plan, again, rng)


def test_missing_file():
    with pytest.raises(og.SerializationError):
        og.load_plan("/nonexistent/plan.ogplan")


def _pool_backward():
    g = og.Graph("pool", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[1, 2, 6, 6], name="x")
    y = g.resample(x, mode="MAX", window=[3, 3], stride=[2, 2], pre_padding=[1, 1], post_padding=[1, 1])[0]
    return og.grad(g, y.set_output(True), x).graph


def _slice_backward():
    g = og.Graph("slice", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 6], name="x")
    y = g.slice(x, [slice(1, 3), slice(0, 6, 2)]).set_output(True)
    return og.grad(g, g.mul(y, y).set_output(True), x).graph


def _stop_gradient():
    from opgraph.training.losses import stop_gradient

    g = og.Graph("sg", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[3, 4], name="x")
    g.exp(stop_gradient(g, x)).set_output(True)
    return g


@pytest.mark.parametrize(
    "make",
    [_pool_backward, _slice_backward, _stop_gradient],
    ids=["pooling-backward", "slice-backward", "stop-gradient"],
)
def test_plans_with_built_in_custom_ops_load_in_a_fresh_process(make, tmp_path, rng):
    """The ops opgraph emits itself (pooling's and slice's backward, stop_gradient in every
    cross-entropy training step; custom ops once, typed ops now) register with the op families: a
    plan file holding them loads and runs in a process that only imported opgraph."""
    import subprocess
    import sys

    plan = make().build(device="cpu")
    kinds = {"resample_max_backward", "slice_backward", "stop_gradient"}
    assert any(n.kind in kinds for n in plan.graph.nodes)
    path = tmp_path / "p.ogplan"
    plan.save(path)
    pack = og.testing.random_pack(plan.graph, rng)
    np.savez(tmp_path / "pack.npz", **{str(u): v for u, v in pack.items()})
    plan.execute(pack)
    script = (
        "import sys, numpy as np, opgraph as og\n"
        f"plan = og.load_plan({str(path)!r})\n"
        f"pack = {{int(k): v for k, v in np.load({str(tmp_path / 'pack.npz')!r}).items()}}\n"
        "plan.execute(pack)\n"
        f"np.savez({str(tmp_path / 'out.npz')!r}, **{{str(u): pack[u] for u in plan.graph.outputs}})\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = np.load(tmp_path / "out.npz")
    for u in plan.graph.outputs:
        np.testing.assert_array_equal(out[str(u)], pack[u])


# -- the plan schema, and files written by earlier versions -------------------------------------------------

FIXTURES = __import__("pathlib").Path(__file__).with_name("fixtures")


@pytest.mark.parametrize("name", ["main_reference", "main_triton"])
def test_plan_files_written_by_main_still_load_and_run(name, rng):
    """Written at aee2b8b (the commit before the plan schema) by ExecutionPlan.save: a reference plan,
    and a Triton plan with a cut, fallbacks and stored source hashes. Loaded here (compiled anew where
    this machine's environment differs from the one recorded), they run like a plan built now."""
    from opgraph.runtime.plan_schema import plan_schema_errors

    if name == "main_triton":
        pytest.importorskip("triton")
    data = (FIXTURES / f"{name}.ogplan").read_bytes()
    assert plan_schema_errors(json.loads(data.split(b"\n", 1)[1])) == []
    loaded = og.ExecutionPlan.from_bytes(data, on_mismatch="recompile")
    fresh = og.Graph.from_json(json.dumps(json.loads(data.split(b"\n", 1)[1])["graph"]))
    built = fresh.build(
        device="cpu", engines=sorted({s.config.engine for s in loaded.steps}), heur_mode=["A", "FALLBACK"]
    )
    _same_results(built, loaded, rng)


def _doc_and_file(plan):
    doc = json.loads(plan.to_bytes().split(b"\n", 1)[1])

    def rewrap(d):
        body = json.dumps(d).encode()
        return MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body

    return doc, rewrap


def test_a_document_breaking_the_schema_is_refused_naming_every_json_path():
    plan = conv_bias_relu(n=1, c=2, k=2, hw=4).build(device="cpu")
    doc, rewrap = _doc_and_file(plan)
    doc["steps"][0]["config"]["knobs"] = [["mode"]]
    doc["device"]["kind"] = "tpu"
    doc["steps"][0]["nodes"] = [0, "1"]
    doc["extra"] = 1
    with pytest.raises(og.SerializationError) as ei:
        og.ExecutionPlan.from_bytes(rewrap(doc))
    text = str(ei.value)
    assert ei.value.rule == "plan.schema" and "4 place(s)" in text
    for path in (
        "plan: unknown key 'extra'",
        "plan.device.kind:",
        "plan.steps[0].config.knobs[0]:",
        "plan.steps[0].nodes[1]:",
    ):
        assert path in text, text


@pytest.mark.parametrize(
    "damage,path",
    [
        (lambda d: d["steps"][0].update(nodes=[99]), "plan.steps[0].nodes"),
        (lambda d: d.update(cuts=[{"before": 0, "node": 99, "reasons": []}]), "plan.cuts[0]"),
        (lambda d: d["steps"][0]["config"].update(engine="nope"), "plan.steps[0]"),
    ],
)
def test_meaning_checked_after_the_schema_names_the_json_path(damage, path):
    plan = conv_bias_relu(n=1, c=2, k=2, hw=4).build(device="cpu")
    doc, rewrap = _doc_and_file(plan)
    damage(doc)
    with pytest.raises(og.SerializationError) as ei:
        og.ExecutionPlan.from_bytes(rewrap(doc))
    assert path in str(ei.value)


def test_a_kernel_generated_differently_now_is_refused_or_recompiled(rng):
    """A plan file whose stored kernel source hash is not what this opgraph generates for the config
    (written by another version of the generator) is refused by default, naming the way out; with
    on_mismatch='recompile' it runs the config as generated now."""
    pytest.importorskip("triton")
    g = og.Graph("src", io_data_type=og.DataType.FLOAT)
    g.relu(g.tensor(dim=[4, 8], name="x")).set_output(True).set_name("y")
    plan = g.build(device="cpu", engines=["triton"])
    doc, rewrap = _doc_and_file(plan)
    assert doc["steps"][0].get("source_sha256")
    doc["steps"][0]["source_sha256"] = "0" * len(doc["steps"][0]["source_sha256"])
    with pytest.raises(og.SerializationError) as ei:
        og.ExecutionPlan.from_bytes(rewrap(doc))
    assert ei.value.rule == "plan.source" and "on_mismatch='recompile'" in str(ei.value)
    loaded = og.ExecutionPlan.from_bytes(rewrap(doc), on_mismatch="recompile")
    _same_results(plan, loaded, rng)


def test_identical_pieces_sharing_a_kernel_text_round_trip(rng):
    """A build gives a piece identical to an earlier one that piece's generated text, its parameters named after
    the other's tensors (here two copies of one reshape, each read by its own op: fuzz seed 20261205000179); the
    file stores the source's hash up to those names, which loading regenerates under the piece's own."""
    pytest.importorskip("triton")
    g = og.Graph.from_json((FIXTURES / "view_copied_twice.json").read_text())
    plan = g.build(device="cpu", engines=["triton", "torch"])
    copies = [s for s in plan.steps if s.config.knob("template") == "pointwise" and len(s.piece.nodes) == 1]
    assert len({s.kernel.source() for s in copies}) < len(copies)  # (a text shared under the first's names)
    loaded = og.ExecutionPlan.from_bytes(plan.to_bytes())
    _same_results(plan, loaded, rng)
