"""bench.runner's measurement bookkeeping, on the CPU."""

from __future__ import annotations

from bench import measure, runner
from bench.core.records import ImplResult


def test_a_profiler_sum_of_zero_is_no_device_time(monkeypatch):
    """A call in which the profiler saw no kernel computed nothing on the device (outputs folded into
    constants at compile time, on 2026-11-26): no device time is reported, and the row says why."""
    res = ImplResult("torch.compile (CUDA graphs)", "peer", None, "Inductor", "ok")
    monkeypatch.setattr(measure, "kernel_sum_us", lambda call: 0.0)
    runner._kernel_sum(res, lambda: None, "profiler kernel sum")
    assert "device_us" not in res.metrics and "saw no kernel" in res.notes
    monkeypatch.setattr(measure, "kernel_sum_us", lambda call: 12.5)
    runner._kernel_sum(res, lambda: None, "profiler kernel sum")
    assert res.metrics["device_us"] == 12.5 and res.methods["device_us"] == "profiler kernel sum"
