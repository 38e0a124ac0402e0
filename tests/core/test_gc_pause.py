"""The garbage collector held off while a plan is built (opgraph.core.gc_pause)."""

import gc

import numpy as np
import pytest

import opgraph as og
from opgraph.core.gc_pause import gc_paused


@pytest.fixture(autouse=True)
def _collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_off_inside_and_back_on_after_even_on_an_error():
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), gc_paused():
        raise ValueError("boom")
    assert gc.isenabled()


def test_left_off_when_the_caller_had_it_off():
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_builds_run_with_the_collector_off(monkeypatch):
    """A static build and a dynamic plan's plan of a new shape both plan with the collector off, and
    leave it on."""
    from opgraph.build import planner

    seen = []
    real = planner.plan_steps

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(planner, "plan_steps", spy)
    monkeypatch.setattr("opgraph.runtime.plan.plan_steps", spy)
    monkeypatch.setattr("opgraph.build.bucket_plan.plan_steps", spy)
    g = og.Graph("relu", io_data_type=og.DataType.FLOAT, compute_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 8], name="x")
    g.relu(x).set_output(True).set_name("y")
    g.build(device="cpu")
    dims = og.Dim("batch", 1, 64)
    d = og.Graph("relu_dyn", io_data_type=og.DataType.FLOAT, compute_data_type=og.DataType.FLOAT)
    xd = d.tensor(dim=[dims, 8], name="x")
    d.relu(xd).set_output(True).set_name("y")
    plan = d.build(device="cpu")
    plan.at({"batch": 3})  # (a bucket planned at its first shape)
    assert seen and not any(seen)
    assert gc.isenabled()
    out = np.zeros((3, 8), np.float32)
    plan.execute({"x": np.ones((3, 8), np.float32), "y": out})
    assert (out == 1).all()


def test_overlapping_blocks_restore_it_when_the_last_ends():
    """Two builds at once (threads): the first to end leaves it off while the other runs; the last
    turns it back on."""
    import threading

    started, release = threading.Event(), threading.Event()
    seen = []

    def other():
        with gc_paused():
            started.set()
            release.wait(5)
            seen.append(gc.isenabled())

    t = threading.Thread(target=other)
    t.start()
    started.wait(5)
    with gc_paused():
        pass
    seen.append(gc.isenabled())  # (the other block still runs)
    release.set()
    t.join(5)
    assert seen == [False, False] and gc.isenabled()
