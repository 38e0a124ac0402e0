"""The fuzzer's graphs with a dynamic batch: each case's leading dim (axis 0 of the tensors of rank
>= 2 that have the first input's size there) becomes `Dim("n", 1, size)`. Where the dynamic graph
validates, its static graph at the original size must be the original graph exactly, and at other
sizes the graph file with the size written in (validated as a static graph) exactly: symbolic
inference may refuse (a typed error), never differ. Then one dynamic plan (reference engine) runs at
those sizes against the reference on each static graph, and dynamic plans of the generated kernels
(triton and torch, the interpreter) run under the fuzzer's own checks (tests/fuzz/dynamic.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import opgraph as og
from opgraph.testing import compare, random_pack, reference_outputs
from tests.fuzz.dynamic import run_dynamic, symbolize, written_at
from tests.fuzz.families import make_case
from tests.fuzz.runner import CI_SETTINGS, EngineSet, Runner, Stats

SEEDS = range(40)


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


def test_dynamic_plans_of_generated_kernels_pass_the_fuzzers_checks():
    """Dynamic plans of the triton and torch engines (bucket kernels taking their sizes at run time) at
    n = 1, the middle and the largest batch, checked as the fuzzer checks a static plan: the oracle's
    tolerance, guards, untouched inputs, a repeated execute (tests/fuzz/dynamic.py)."""
    runner = Runner("cpu", (EngineSet("triton+torch", ("triton", "torch")),), **CI_SETTINGS)
    total = Stats()
    for seed in range(60):
        total.merge(run_dynamic(make_case(seed), runner))
    assert not total.failures, "\n".join(map(str, total.failures))
    assert total.graphs >= 30 and total.runs >= 2 * total.graphs, total  # (the test exercises something)
    assert total.steps["triton"] > total.steps["torch"], total.steps
