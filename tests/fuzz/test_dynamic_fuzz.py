"""The fuzzer's graphs with a dynamic batch: each case's leading dim (axis 0 of the tensors of rank
>= 2 that have the first input's size there) becomes `Dim("n", 1, size)`. Where the dynamic graph
validates, its static graph at the original size must be the original graph exactly, and at other
sizes the graph file with the size written in (validated as a static graph) exactly: symbolic
inference may refuse (a typed error), never differ. Then one dynamic plan (reference engine) runs at
those sizes against the reference on each static graph."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import opgraph as og
from opgraph.testing import compare, random_pack, reference_outputs
from tests.fuzz.families import make_case

SEEDS = range(40)


def symbolize(doc: dict) -> tuple[dict, int] | None:
    """The graph document with a dynamic leading dim, and that dim's size (None: no size >= 2)."""
    produced = {u for o in doc["ops"] for u in o["outputs"].values()}
    first = next((t for t in doc["tensors"] if t["uid"] not in produced and len(t.get("dim", [])) >= 2), None)
    if first is None or first["dim"][0] < 2:
        return None
    size = first["dim"][0]
    out = copy.deepcopy(doc)
    out["version"] = 2
    out["dims"] = [{"name": "n", "min": 1, "max": size}]
    for t in out["tensors"]:
        if len(t.get("dim", [])) >= 2 and t["dim"][0] == size:
            t["dim"][0] = "n"
    return out, size


def written_at(doc: dict, n: int) -> dict:
    out = copy.deepcopy(doc)
    out["version"] = 1
    del out["dims"]
    for t in out["tensors"]:
        for key in ("dim", "stride"):
            if key in t:
                t[key] = [n if v == "n" else v for v in t[key]]
    return out


def test_symbolic_inference_never_differs_from_static_inference():
    tried = checked = 0
    for seed in SEEDS:
        case = make_case(seed)
        found = symbolize(case.graph)
        if found is None:
            continue
        doc, size = found
        tried += 1
        try:
            dynamic = og.Graph.from_json(json.dumps(doc)).final
        except og.GraphError as err:
            assert type(err) is not og.GraphError and err.rule, f"seed {seed}: untyped refusal {err}"
            continue
        checked += 1
        original = og.Graph.from_json(json.dumps(case.graph)).final
        assert str(dynamic.at({"n": size})) == str(original), f"seed {seed}"
        assert dynamic.at({"n": size}).nodes == original.nodes, f"seed {seed}"
        for n in sorted({1, (size + 1) // 2}):
            static = og.Graph.from_json(json.dumps(written_at(doc, n))).final
            assert str(dynamic.at({"n": n})) == str(static), f"seed {seed} at n={n}"
            assert dynamic.at({"n": n}).nodes == static.nodes, f"seed {seed} at n={n}"
    assert tried >= 20 and checked >= tried // 3, (tried, checked)  # the test exercises something


@pytest.mark.parametrize("seed", list(SEEDS)[:12])
def test_a_dynamic_plan_runs_fuzz_graphs_at_several_sizes(seed):
    case = make_case(seed)
    found = symbolize(case.graph)
    if found is None:
        pytest.skip("no batch of size >= 2")
    doc, size = found
    try:
        g = og.Graph.from_json(json.dumps(doc))
        g.validate()
    except og.GraphError:
        pytest.skip("refused with a typed error (the inference test checks those)")
    plan = g.build(device="cpu", engines=["reference"])
    rng = np.random.default_rng(seed)
    for n in sorted({1, (size + 1) // 2, size}):
        static = g.final.at({"n": n})
        pack = random_pack(static, rng)
        want = reference_outputs(static, pack)
        plan.execute(pack)
        bad = [m for u in static.outputs if (m := compare(static.tensors[u], pack[u], want[u])) is not None]
        assert not bad, f"n={n}: " + "\n".join(map(str, bad))
