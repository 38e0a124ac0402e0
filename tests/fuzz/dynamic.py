"""The fuzzer's graphs with a dynamic batch, run as dynamic plans under the fuzzer's own checks.

`symbolize` makes a case's leading dim (axis 0 of the tensors of rank >= 2 that have the first input's
size there) `Dim("n", 1, size)`. `run_dynamic` builds one dynamic plan per engine set and executes it at
n = 1, the middle and the largest size (a bucket each where the build cuts them), each time checked
as `Runner` checks a static plan: the reference at that shape, the oracle's sensitivity for what the
plan's steps compute at that shape, guards, untouched inputs, a repeated execute."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np

import opgraph as og
from opgraph.core.errors import GraphError

from .gen import Case
from .runner import Expect, Failure, Lazy, Runner, Stats, _what, changed, nondeterministic


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
    """The dynamic document with `n` written in: a static graph file."""
    out = copy.deepcopy(doc)
    out["version"] = 1
    del out["dims"]
    for t in out["tensors"]:
        for key in ("dim", "stride"):
            if key in t:
                t[key] = [n if v == "n" else v for v in t[key]]
    return out


def run_dynamic(case: Case, runner: Runner) -> Stats:
    """One dynamic plan of the case's graph per engine set of `runner`, executed at three sizes of its
    batch; the failures and counts (no graph counted where the case has no batch to make dynamic, or
    its dynamic graph is refused with a typed error)."""
    stats = Stats()
    found = symbolize(case.graph)
    if found is None:
        return stats
    doc, size = found
    try:
        g = og.Graph.from_json(json.dumps(doc))
        g.validate()
    except GraphError as err:
        stats.declined[err.rule or type(err).__name__] += 1
        return stats
    stats.graphs = 1
    stats.families.update(case.families)
    rng = np.random.default_rng(case.seed)
    for es in runner.sets:

        def fail(kind: str, detail: str, es_name: str = es.name) -> None:
            stats.failures.append(Failure(case.seed, f"dynamic {es_name}", kind, detail))

        plan = runner.built(g, es, case, stats, fail)
        if plan is None:
            continue
        for n in sorted({1, (size + 1) // 2, size}):
            if not _run_at(runner, plan, g, n, case, rng, stats, fail):
                break
    return stats


def _run_at(runner: Runner, plan: Any, g: og.Graph, n: int, case: Case, rng: Any, stats: Stats, fail: Any) -> bool:
    """The dynamic plan at batch `n`: executed, checked, and executed again on the same buffers."""
    note = f"n={n}: "
    try:
        static = g.final.at({"n": n})
        shaped = plan.at({"n": n})  # (what its steps compute at this shape: the oracle's precision)
    except GraphError as err:
        fail("typed-execute", f"{note}{_what(err)}")
        return False
    expect = Expect.of(static, case, rng)
    spread = Lazy(lambda: expect.spread(shaped, rng))
    first = runner._execute(plan, expect, spread, stats, fail, note=note)
    if first is None:
        return False
    stats.runs += 1
    stats.steps.update(s.config.engine for s in shaped.steps)
    second = runner._execute(plan, expect, spread, stats, fail, again=first, note=f"{note}again: ")
    if second is None:
        return False
    bad = None if nondeterministic(shaped.steps) else changed(first, second, static.outputs)
    if bad is not None:
        fail("repeat", f"{note}a second execute changed {static.tensors[bad].label()}")
        return False
    return True


__all__ = ["run_dynamic", "symbolize", "written_at"]
