"""bench.measure's event timing, on the CPU against a simulated device timeline: a device time must not
count the host's time to launch the work (a busy host's graph launch had counted in suite-d's rows)."""

from __future__ import annotations

import types

import pytest

from bench import measure

LAUNCH_US = 90.0  # host µs to launch the work (a busy host)
WORK_US = 38.0  # device µs of the work


class FakeDevice:
    """One stream: the device runs what was enqueued in order, never before the host enqueued it."""

    def __init__(self) -> None:
        self.host = 0.0
        self.dev = 0.0

    def enqueue(self, us: float) -> float:
        self.dev = max(self.dev, self.host) + us
        return self.dev

    def launch_work(self) -> None:
        self.host += LAUNCH_US
        self.enqueue(WORK_US)

    def torch(self) -> types.SimpleNamespace:
        device = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.t = None

            def record(self) -> None:
                self.t = device.enqueue(0.0)

            def synchronize(self) -> None:
                device.host = max(device.host, self.t)

            def elapsed_time(self, other: Event) -> float:
                return (other.t - self.t) / 1e3  # ms, as torch's

        def synchronize() -> None:
            device.host = max(device.host, device.dev)

        return types.SimpleNamespace(
            cuda=types.SimpleNamespace(
                Event=Event, synchronize=synchronize, _sleep=lambda cycles: device.enqueue(cycles / 2000)
            )
        )


@pytest.fixture
def device(monkeypatch) -> FakeDevice:
    d = FakeDevice()
    monkeypatch.setattr(measure, "_torch", d.torch)
    return d


def test_events_us_hides_the_launch_behind_a_spin_kernel(device):
    assert measure.events_us(device.launch_work, 3, measure.HIDE_US) == [WORK_US] * 3
    # without the spin the launch counts (what execute-mode timings measure on purpose)
    assert measure.events_us(device.launch_work, 3) == [WORK_US + LAUNCH_US] * 3


def test_device_us_of_a_graph_counts_no_host_time(device, monkeypatch):
    k_seen = []

    def capture(fn, calls, warmup=1):
        k_seen.append(calls)
        return measure.Captured(
            types.SimpleNamespace(
                replay=lambda: (
                    setattr(device, "host", device.host + LAUNCH_US),
                    [device.enqueue(WORK_US) for _ in range(calls)],
                )
            ),
            None,
        )

    monkeypatch.setattr(measure, "capture", capture)
    # an estimate inflated by host time gives a small K: the launch had added LAUNCH_US / K a call
    per, how = measure.device_us(lambda: None, 150.0, measure.Budget(rounds=3))
    assert k_seen == [13] and how == "CUDA graph of 13 calls"
    assert per == pytest.approx(WORK_US)


def test_burst_us_counts_no_host_time(device):
    assert measure.burst_us(device.launch_work, calls=5, rounds=3) == pytest.approx(WORK_US)
