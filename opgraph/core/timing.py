"""Timing a plan: host clock on the CPU, CUDA events (median of many runs) on the GPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any


def time_call(fn: Callable[[], Any], *, cuda: bool, warmup: int = 3, repeat: int = 20) -> float:
    """Median time of `fn()` in microseconds. On CUDA the work is timed with events, so it is the
    device time of what `fn` enqueues (plus launch gaps), not the host time."""
    for _ in range(warmup):
        fn()
    if cuda:
        import torch

        torch.cuda.synchronize()
        times = []
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return statistics.median(times)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


SPIN_CYCLES = 2_000_000  # about 1 ms on an H100: more than the host time of what is timed behind it


def settle_clocks(cycles: int = 20 * SPIN_CYCLES) -> None:
    """A spin kernel of `cycles` (~20 ms), waited for: a GPU idle meanwhile (compiles on the host) runs at
    its working clocks before what is timed next."""
    import torch

    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()


def time_device(fn: Callable[[], Any], *, warmup: int = 3, rounds: int = 5, burst: int = 10) -> float:
    """Device microseconds per call of `fn`: `burst` calls back to back between two CUDA events,
    enqueued while a spin kernel holds the device, so that none of their host time counts (median
    over `rounds`). What a call costs in a captured CUDA graph, or in any plan whose host work runs
    ahead of the device; the benchmark suite's do_bench hides host time the same way. A burst whose
    enqueueing outlasted half the spin is timed again behind a spin twice its host time (`spin_for`): the
    device may have waited for the host (a library call's Python, ~100 µs, ten times over)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()

    def calls() -> None:
        for _ in range(burst):
            fn()

    cycles = SPIN_CYCLES
    samples = []
    for _ in range(rounds):
        device, host = _behind_spin(calls, cycles)
        if host > spin_us(cycles) / 2:
            cycles = spin_for(host)
            device, host = _behind_spin(calls, cycles)
        samples.append(device / burst)
    return statistics.median(samples)


_CYCLES_PER_US: dict[int, float] = {}  # the spin kernel's cycles a microsecond, by device, measured once a process
SPIN_LIMIT_US = 200_000.0  # the longest spin `spin_for` asks for


def spin_us(cycles: int) -> float:
    """About how long a spin of `cycles` holds the current device (µs)."""
    return cycles / _cycles_per_us()


def spin_for(host_us: float) -> int:
    """Spin cycles that hold the device for twice `host_us` (SPIN_CYCLES at least, SPIN_LIMIT_US at most)."""
    return max(SPIN_CYCLES, int(min(2 * host_us, SPIN_LIMIT_US) * _cycles_per_us()))


def _cycles_per_us() -> float:
    """The current device's spin rate, from a spin of SPIN_CYCLES timed after another (the clocks up), once a
    process."""
    import torch

    device = torch.cuda.current_device()
    if device not in _CYCLES_PER_US:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        torch.cuda._sleep(SPIN_CYCLES)
        end.record()
        end.synchronize()
        _CYCLES_PER_US[device] = SPIN_CYCLES / max(start.elapsed_time(end) * 1e3, 1.0)
    return _CYCLES_PER_US[device]


def _behind_spin(fn: Callable[[], Any], cycles: int = SPIN_CYCLES) -> tuple[float, float]:
    """(device µs, host µs) of the work `fn` enqueues, timed with CUDA events while a spin kernel holds
    the device: the work starts once it is all enqueued, so no host time counts in the device time
    (while the enqueueing takes less than the spin, `cycles`)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)
    start.record()
    t0 = time.perf_counter()
    fn()
    host = (time.perf_counter() - t0) * 1e6
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3, host


def host_time_per_call(fn: Callable[[], Any], *, calls: int = 200) -> float:
    """Host-side microseconds per call (what the CPU spends enqueueing), averaged."""
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def step_times(runs: Sequence[Callable[[], Any]], *, cuda: bool, repeat: int = 10) -> list[tuple[float, float]]:
    """(device µs, host µs) of each callable of `runs`, run in order `repeat` times (after one warm-up
    pass): medians. On CUDA each call is enqueued behind a spin kernel on an otherwise idle device,
    so its device time is its own, without the host's launch time (unless that exceeds the spin)."""
    for fn in runs:
        fn()
    samples: list[list[tuple[float, float]]] = [[] for _ in runs]
    for _ in range(repeat):
        for i, fn in enumerate(runs):
            if cuda:
                samples[i].append(_behind_spin(fn))
            else:
                t0 = time.perf_counter()
                fn()
                host = (time.perf_counter() - t0) * 1e6
                samples[i].append((host, host))
    return [(statistics.median(d for d, _ in rows), statistics.median(h for _, h in rows)) for rows in samples]
