"""Every damaged plan file is a SerializationError (or, where the damage is harmless, a plan that runs
correctly): knobs set to 0, -1, None, a string or a huge number, knobs removed, a template or engine
name flipped, fields of the wrong type, indices out of range, bytes cut off or flipped. Before, such
files raised TypeError, KeyError, ValueError, StopIteration or a bare AssertionError, from loading or
(worse) from the first execute."""

from __future__ import annotations

import json

import numpy as np
import pytest

import opgraph as og

# damaged files are written with the version-1 header (no checksum), so that the damage reaches the
# parser's checks; a version-2 file's checksum would refuse them all up front
from opgraph.runtime.plan_io import MAGIC_1 as MAGIC
from opgraph.runtime.plan_io import plan_body

from .fuzz.damage import damaged_plans
from .helpers import requires_interpreter


def _plan(engines):
    g = og.Graph("dmg", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[2, 3, 4], name="x")
    s = g.tensor(dim=[1], name="s", is_pass_by_value=True)
    y = g.sigmoid(g.mul(x, s)).set_output(True).set_name("y")
    g.reduction(y, "ADD").set_dim([2, 1, 1]).set_output(True).set_name("r")
    return g.build(device="cpu", engines=engines)


def _doc(plan):
    return json.loads(plan_body(plan.to_bytes()))


def _load(doc):
    return og.ExecutionPlan.from_bytes(MAGIC + json.dumps(doc).encode())


def _knob_paths(doc):
    return [(i, j) for i, step in enumerate(doc["steps"]) for j, _ in enumerate(step["config"]["knobs"])]


@requires_interpreter
@pytest.mark.parametrize("value", [0, -1, None, "x", 1.5, True, 2**40, [], "ieee"])
def test_any_odd_knob_value(value):
    plan = _plan(["triton"])
    doc = _doc(plan)
    for i, j in _knob_paths(doc):
        name, orig = doc["steps"][i]["config"]["knobs"][j]
        if name == "template" or (type(orig) is type(value) and orig == value):
            continue
        bad = json.loads(json.dumps(doc))
        bad["steps"][i]["config"]["knobs"][j][1] = value
        with pytest.raises(og.SerializationError) as info:
            _load(bad)
        assert f"steps[{i}]" in str(info.value), name


@requires_interpreter
def test_removed_or_unknown_knobs():
    doc = _doc(_plan(["triton"]))
    for i, j in _knob_paths(doc):
        bad = json.loads(json.dumps(doc))
        del bad["steps"][i]["config"]["knobs"][j]
        with pytest.raises(og.SerializationError):
            _load(bad)
    bad = json.loads(json.dumps(doc))
    bad["steps"][0]["config"]["knobs"].append(["SPLIT_K", 4])
    with pytest.raises(og.SerializationError):
        _load(bad)


@requires_interpreter
@pytest.mark.parametrize(
    "template",
    ["pointwise", "reduction", "matmul", "conv_fprop", "rownorm", "norm_stats", "pooling", "depthwise", "nope", 3],
)
def test_flipped_template_name(template):
    doc = _doc(_plan(["triton"]))
    for i, step in enumerate(doc["steps"]):
        knobs = step["config"]["knobs"]
        at = next(j for j, (k, _) in enumerate(knobs) if k == "template")
        if knobs[at][1] == template:
            continue
        bad = json.loads(json.dumps(doc))
        bad["steps"][i]["config"]["knobs"][at][1] = template
        with pytest.raises(og.SerializationError):
            _load(bad)


def _runs_right(plan, rng):
    pack = og.testing.random_pack(plan.graph, rng)
    want = og.testing.reference_outputs(plan.graph, pack)
    plan.execute(pack)
    for u in plan.graph.outputs:
        assert og.testing.compare(plan.graph.tensors[u], pack[u], want[u]) is None


@requires_interpreter
@pytest.mark.parametrize("engine", ["triton", "torch", "reference", "library", "cudnn", "nope", 7, None])
def test_flipped_engine_name(engine, rng):
    """Another engine's name: refused, unless that engine offers the very config (torch and reference
    configs have no knobs: a plan running the step on the other engine is valid)."""
    pytest.importorskip("torch")
    for engines in (["triton"], ["torch"], ["reference"]):
        doc = _doc(_plan(engines))
        if doc["steps"][0]["config"]["engine"] == engine:
            continue
        doc["steps"][0]["config"]["engine"] = engine
        if engine in ("torch", "reference") and engines != ["triton"]:
            plan = _load(doc)
            assert plan.steps[0].config.engine == engine
            _runs_right(plan, rng)
            continue
        with pytest.raises(og.SerializationError):
            _load(doc)


@pytest.mark.parametrize(
    "path,value",
    [
        (("steps", 0, "alternatives"), 5),
        (("steps", 0, "alternatives"), [7]),
        (("cuts",), 3),
        (("cuts",), [[1]]),
        (("cuts",), [{"before": 1, "node": 0, "reasons": [["torch"]]}]),
        (("steps", 0, "nodes"), [0, 0]),
        (("steps", 0, "nodes"), [99]),
        (("steps", 0, "nodes"), "0"),
        (("steps", 0, "config", "numerical_notes"), ["TF64"]),
        (("steps", 0, "config", "knobs"), {"a": 1}),
        (("steps", 0, "config", "measured_us"), "fast"),
        (("steps",), []),
        (("device", "index"), "0"),
        (("graph", "tensors", 0, "dim"), [2, "3", 4]),
        (("graph", "tensors", 0, "data_type"), "FLOAT16X"),
        (("graph", "ops", 0, "attrs", "mode"), "NOPE"),
        (("graph",), None),
        (("version",), 99),
        (("environment",), 3),
    ],
)
def test_fields_of_the_wrong_kind(path, value):
    doc = _doc(_plan(["reference"]))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(og.SerializationError):
        _load(doc)


@pytest.mark.parametrize("cut", [0, 1, 10, 100, -1])
def test_truncated_files(cut):
    data = _plan(["reference"]).to_bytes()
    with pytest.raises(og.SerializationError):
        og.ExecutionPlan.from_bytes(data[: len(data) + cut if cut < 0 else cut])


@requires_interpreter
@pytest.mark.parametrize("engines", [["triton"], ["torch"], ["reference"]])
def test_random_damage_loads_typed_or_runs_right(engines, rng):
    """The fuzzer's damage (tests/fuzz/damage.py) over many draws: SerializationError, or a plan that
    computes what an intact plan of its graph computes."""
    pytest.importorskip("torch")
    plan = _plan(engines)
    data = plan.to_bytes()
    loaded_ok = 0
    for what, blob in damaged_plans(data, np.random.default_rng(7), count=60):
        try:
            loaded = og.ExecutionPlan.from_bytes(blob)
        except og.SerializationError:
            continue
        loaded_ok += 1
        graph = loaded.graph
        if any(t.nbytes > 1 << 20 for t in graph.tensors.values()):
            continue
        pack = og.testing.random_pack(graph, rng)
        want = og.testing.reference_outputs(graph, pack)
        try:
            loaded.execute(pack)
        except og.VariantPackError:
            continue
        for u in graph.outputs:
            assert og.testing.compare(graph.tensors[u], pack[u], want[u]) is None, what
    assert loaded_ok < 60
