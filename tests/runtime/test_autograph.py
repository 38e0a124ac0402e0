"""The internal CUDA graph's switch and its limits, without a GPU (its replays: tests/test_runtime_gpu.py)."""

from __future__ import annotations

import pytest

from opgraph.runtime import autograph


@pytest.mark.parametrize(
    "value,on",
    [
        (None, True),
        ("", True),
        ("1", True),
        ("yes", True),
        ("0", False),
        (" off ", False),
        ("False", False),
        ("no", False),
    ],
)
def test_opgraph_autograph_switch(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("OPGRAPH_AUTOGRAPH", raising=False)
    else:
        monkeypatch.setenv("OPGRAPH_AUTOGRAPH", value)
    assert autograph.default() is on


def test_plans_take_the_default_when_built(monkeypatch):
    import opgraph as og

    g = og.Graph("x", io_data_type=og.DataType.FLOAT)
    g.relu(g.tensor(dim=[4], name="x")).set_output(True)
    monkeypatch.setenv("OPGRAPH_AUTOGRAPH", "0")
    assert g.build(device="cpu").auto_graph is False
    monkeypatch.delenv("OPGRAPH_AUTOGRAPH")
    assert g.build(device="cpu").auto_graph is True


class _Bound:
    """What AutoGraph reads of a bound plan: a capturable plan that never really captures here."""

    def __init__(self) -> None:
        from types import SimpleNamespace

        from opgraph.runtime.state import ThreadCount

        self.state = SimpleNamespace(
            device=SimpleNamespace(is_cuda=True), steps=[], graph=SimpleNamespace(name="p"), threads=ThreadCount()
        )


def test_a_binding_that_keeps_changing_stops_being_captured(monkeypatch):
    """After MAX_CAPTURES graphs invalidated one after the other, the binding launches flat for good."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    bound = _Bound()  # (kept: the graph holds its bound plan by a weak proxy, as the plan owns it)
    ag = autograph.AutoGraph(bound)
    replayed = []

    class _Graph:
        def replay(self):
            replayed.append(1)

    def capture(_torch):
        ag.graph, ag.captures = _Graph(), ag.captures + 1
        return True

    monkeypatch.setattr(ag, "_capture", capture)
    for _ in range(autograph.MAX_CAPTURES):
        assert [ag.run() for _ in range(autograph.AFTER + 2)] == [False] * autograph.AFTER + [True, True]
        ag.invalidate()  # a moved buffer
    assert ag.captures == autograph.MAX_CAPTURES and len(replayed) == 2 * autograph.MAX_CAPTURES
    assert [ag.run() for _ in range(autograph.AFTER + 3)] == [False] * (autograph.AFTER + 3)
    assert ag.enabled is False and ag.captures == autograph.MAX_CAPTURES


def test_a_plan_run_by_two_threads_is_not_captured(monkeypatch):
    """PyTorch's CUDA generator is one per process and joins every capture: another thread drawing
    random numbers during a capture broke it, and every later torch.randn of the process (the GPU
    tier's cascade). A plan that a second thread binds launches flat from then on."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    bound = _Bound()
    ag = autograph.AutoGraph(bound)
    captured = []
    monkeypatch.setattr(ag, "_capture", lambda _torch: captured.append(1) or False)
    bound.state.threads.join()
    assert [ag.run() for _ in range(autograph.AFTER + 1)] == [False] * (autograph.AFTER + 1) and captured == [1]
    bound.state.threads.join()  # a second thread
    assert not ag.run() and not ag.enabled and captured == [1]


def test_one_capture_at_a_time(monkeypatch):
    """While another thread captures (the process-wide lock held), a stable binding launches flat and
    tries again later."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    bound = _Bound()  # (kept: the graph holds its bound plan by a weak proxy, as the plan owns it)
    ag = autograph.AutoGraph(bound)
    captured = []
    monkeypatch.setattr(ag, "_capture", lambda _torch: captured.append(1) or False)
    with autograph._CAPTURING:
        assert [ag.run() for _ in range(autograph.AFTER + 2)] == [False] * (autograph.AFTER + 2)
    assert captured == [] and ag.enabled
    ag.run()
    assert captured == [1]
