"""Generated modules' lifetime (engines/triton/loader.py): held by the kernels that run them and a
few recently loaded, never by sys.modules. Before, 150 plans built and dropped kept 150 modules
(8 MB) in sys.modules, without bound."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

import opgraph as og
from opgraph.engines.triton import loader
from opgraph.testing import compare, poison, random_values

from ..helpers import requires_interpreter

pytestmark = requires_interpreter


def _graph(k: int) -> og.Graph:
    """A graph whose generated source differs with k (the constant is in the kernel)."""
    g = og.Graph(f"drop{k}", io_data_type=og.DataType.FLOAT)
    g.relu(g.mul(g.tensor(dim=[4, 8], name="x"), 1.0 + k / 64)).set_output(True).set_name("y")
    return g


def _generated_in_sys_modules() -> int:
    return sum(name.startswith("opgraph_generated_") for name in list(sys.modules))


def _run(plan: og.ExecutionPlan, k: int, rng: np.random.Generator) -> None:
    x = random_values(plan.graph.tensor("x"), rng)
    y = poison(np.empty((4, 8), np.float32))
    plan.execute({"x": x, "y": y})
    assert compare(plan.graph.tensor("y"), y, np.maximum(x.astype(np.float64) * (1.0 + k / 64), 0)) is None


def test_dropped_plans_leave_no_generated_module(monkeypatch, rng):
    monkeypatch.setattr(loader, "RECENT", 3)
    kept = _graph(0).build(device="cpu", engines=["triton"])
    before = loader.loaded_modules()
    for k in range(1, 25):  # each plan built, run and dropped
        _run(_graph(k).build(device="cpu", engines=["triton"]), k, rng)
    gc.collect()
    assert _generated_in_sys_modules() == 0
    assert loader.loaded_modules() <= before + 3  # the kept plan's and the RECENT last ones
    _run(kept, 0, rng)  # a live plan's module stays, whatever the cache evicted


def test_a_module_loaded_again_is_the_live_one():
    source = _graph(99).build(device="cpu", engines=["triton"]).source(0)
    a = loader.load_module(source, interpret=True)
    assert loader.load_module(source, interpret=True) is a
    assert f"{loader.module_name(source, True)}" not in sys.modules


@pytest.mark.parametrize("count", [150])
def test_memory_of_many_dropped_plans_is_bounded(count, tmp_path, monkeypatch):
    """The issue's case: `count` distinct generated modules loaded and dropped (the modules only,
    without building plans): the ones alive stay under the bound."""
    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path))
    sources = [_graph(k).build(device="cpu", engines=["triton"]).source(0) for k in range(3)]
    for k in range(count):
        loader.load_module(sources[k % 3] + f"\n# variant {k}\n", interpret=True)
    gc.collect()
    assert loader.loaded_modules() <= loader.RECENT + 3 and _generated_in_sys_modules() == 0
