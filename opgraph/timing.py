"""Timing a plan: host clock on the CPU, CUDA events (median of many runs) on the GPU."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


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


def host_time_per_call(fn: Callable[[], Any], *, calls: int = 200) -> float:
    """Host-side microseconds per call (what the CPU spends enqueueing), averaged."""
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6
