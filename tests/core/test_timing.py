"""core.timing's device timing on a simulated device (a fake torch.cuda): a burst enqueued behind a spin kernel
is timed by the device alone, and one whose host enqueueing outlasts the spin is timed again behind a longer
spin rather than charged the host's time (autotune's library candidates: ~100 µs of Python a call)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import opgraph.core.timing as timing  # noqa: E402

CYCLES_PER_US = 2000.0


class Device:
    """A device timeline: a spin of `cycles` holds it cycles / CYCLES_PER_US µs from the moment it is
    enqueued; each call's kernel takes `kernel_us` once both the device and its launch (after `host_us` of
    the host's enqueueing) are ready. Host time is simulated too: the clock advances by `host_us` a call."""

    def __init__(self, host_us: float, kernel_us: float) -> None:
        self.host_us, self.kernel_us = host_us, kernel_us
        self.host = 0.0  # the host's clock (µs)
        self.free = 0.0  # when the device is next idle (µs)
        self.spins: list[int] = []

    def call(self) -> None:
        self.host += self.host_us
        self.free = max(self.free, self.host) + self.kernel_us

    def sleep(self, cycles: int) -> None:
        self.spins.append(cycles)
        self.free = max(self.free, self.host) + cycles / CYCLES_PER_US


@pytest.fixture
def device(monkeypatch):
    made: list[Device] = []

    def make(host_us: float, kernel_us: float) -> Device:
        d = Device(host_us, kernel_us)
        made.append(d)

        class Event:
            def __init__(self, enable_timing: bool = True) -> None:
                self.at = 0.0

            def record(self) -> None:
                self.at = max(d.free, d.host)

            def synchronize(self) -> None:
                d.host = max(d.host, d.free)

            def elapsed_time(self, end: Event) -> float:
                return (end.at - self.at) / 1e3  # (ms)

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "_sleep", d.sleep)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
        monkeypatch.setattr(timing.time, "perf_counter", lambda: d.host / 1e6)
        monkeypatch.setattr(timing, "_CYCLES_PER_US", {})
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        return d

    return make


def test_a_burst_behind_the_spin_is_timed_by_the_device(device):
    d = device(host_us=10.0, kernel_us=15.0)
    assert timing.time_device(d.call, warmup=1, rounds=3, burst=10) == pytest.approx(15.0)
    assert set(d.spins) == {timing.SPIN_CYCLES}  # (the two that measured the rate too)


def test_a_burst_whose_host_time_outlasts_the_spin_is_timed_again_behind_a_longer_one(device):
    """300 µs of host time a call, ten calls: 3 ms of enqueueing behind a 1-ms spin would time ~200 µs a
    call; timed again behind a spin of twice the host time, the kernel's 15."""
    d = device(host_us=300.0, kernel_us=15.0)
    assert timing.time_device(d.call, warmup=1, rounds=3, burst=10) == pytest.approx(15.0)
    assert max(d.spins) >= 2 * 3000 * CYCLES_PER_US * 0.99
    assert timing.spin_for(1e9) == int(timing.SPIN_LIMIT_US * CYCLES_PER_US)  # (bounded)
    assert timing.spin_for(1.0) == timing.SPIN_CYCLES
