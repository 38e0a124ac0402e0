"""How time is measured (one helper per quantity, the same for every implementation).

capture(fn, calls)   the suite's CUDA-graph helper: warm-up calls on a side stream, then `calls` calls
                     captured in one torch.cuda.CUDAGraph (peers and opgraph alike)
device_us            CUDA graph of K calls, replays timed with CUDA events, / K (K so that a replay
                     lasts ~2 ms), each replay queued behind a spin kernel (HIDE_US): no host time counts
                     (the graph launch's, ~10 µs and more on a busy host, had counted / K); with cold_l2
                     an L2-sized memset precedes each call in the graph and a graph of K memsets alone
                     is subtracted
execute_us           plain calls back to back between two events, at most MAX_CALLS per synchronisation
latency_us           one plain call on an idle device: wall clock from the call to its completion
host_us              host time per call, at most MAX_CALLS calls between synchronisations
kernel_sum_us        the profiler's sum of device activity per call (implementations that cannot be captured)

On the CPU (the dry run) every quantity is wall clock, so that the rest of the pipeline runs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

MAX_CALLS = 200  # calls between synchronisations in execute/host timings ("a few hundred at most")
GRAPH_TARGET_US = 2000.0  # one replay of the K-call graph lasts about this long
ROUND_TARGET_US = 3000.0  # one round of back-to-back calls
MAX_K = 64
HIDE_US = 1000.0  # spin before a timed graph replay or burst: longer than any host time to enqueue it


@dataclass
class Budget:
    rounds: int = 7  # rounds per measurement (median)
    latency_calls: int = 25


def _torch() -> Any:
    import torch

    return torch


def sync(cuda: bool) -> None:
    if cuda:
        _torch().cuda.synchronize()


@dataclass
class Captured:
    graph: Any
    ret: Any  # what the last captured call returned (the graph's static outputs)
    pool: Any = None


def capture(fn: Callable[[], Any], calls: int = 1, warmup: int = 2) -> Captured:
    """`calls` calls of fn captured in one CUDA graph (after `warmup` calls on a side stream, as
    PyTorch's capture rules ask)."""
    torch = _torch()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    ret = None
    with torch.cuda.graph(graph):
        for _ in range(calls):
            ret = fn()
    torch.cuda.synchronize()
    return Captured(graph, ret)


def estimate_us(fn: Callable[[], Any], cuda: bool) -> float:
    """A rough time per call (median of 3, host included): to size the counts of the measurements."""
    times = []
    for _ in range(3):
        sync(cuda)
        t = time.perf_counter()
        fn()
        sync(cuda)
        times.append((time.perf_counter() - t) * 1e6)
    return max(statistics.median(times), 1.0)


def events_us(fn: Callable[[], Any], rounds: int, hide_us: float = 0.0) -> list[float]:
    """µs of `fn` between two CUDA events, once per round, each round from an idle device. With `hide_us`,
    a spin kernel of about that many µs (at 2 GHz) is queued before the first event, so everything `fn`
    launches is enqueued before the device reaches it: no host time counts (a graph launch's included)."""
    torch = _torch()
    out = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        if hide_us > 0:
            torch.cuda._sleep(int(hide_us * 2000))
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return out


def _wall_us(fn: Callable[[], Any], rounds: int, cuda: bool) -> list[float]:
    out = []
    for _ in range(rounds):
        sync(cuda)
        t = time.perf_counter()
        fn()
        sync(cuda)
        out.append((time.perf_counter() - t) * 1e6)
    return out


def device_us(
    fn: Callable[[], Any], est: float, budget: Budget, *, cold_l2: bool = False, flush_bytes: int = 0
) -> tuple[float, str]:
    """Device µs per call from a CUDA graph of K calls; (value, how it was measured)."""
    torch = _torch()
    k = max(1, min(MAX_K, int(GRAPH_TARGET_US / est)))
    flush = None
    if cold_l2:
        flush = torch.empty(max(flush_bytes, 1 << 20), dtype=torch.uint8, device="cuda")

    def body() -> Any:
        if flush is not None:
            flush.zero_()
        return fn()

    cap = capture(body, k, warmup=1)
    cap.graph.replay()
    per = statistics.median(events_us(cap.graph.replay, budget.rounds, HIDE_US)) / k
    how = f"CUDA graph of {k} calls"
    del cap
    if flush is not None:
        fcap = capture(flush.zero_, k, warmup=1)
        per -= statistics.median(events_us(fcap.graph.replay, budget.rounds, HIDE_US)) / k
        how += ", L2 flushed before each call (flush time subtracted)"
    return per, how


def back_to_back_us(fn: Callable[[], Any], est: float, budget: Budget, cuda: bool) -> float:
    """µs per call of plain calls back to back (at most MAX_CALLS between synchronisations)."""
    n = max(1, min(MAX_CALLS, int(ROUND_TARGET_US / est)))

    def calls() -> None:
        for _ in range(n):
            fn()

    rounds = events_us(calls, budget.rounds) if cuda else _wall_us(calls, budget.rounds, False)
    return statistics.median(rounds) / n


def latency_us(fn: Callable[[], Any], budget: Budget, cuda: bool) -> float:
    return statistics.median(_wall_us(fn, budget.latency_calls, cuda))


def host_us(fn: Callable[[], Any], budget: Budget, cuda: bool, calls: int = MAX_CALLS) -> float:
    """Host µs per call: `calls` calls (<= MAX_CALLS) timed on the host, then a synchronisation."""
    calls = min(calls, MAX_CALLS)
    out = []
    for _ in range(budget.rounds):
        sync(cuda)
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) * 1e6 / calls)
        sync(cuda)
    return statistics.median(out)


def _cuda_events(fn: Callable[[], Any], calls: int, warmup: int) -> list[Any]:
    """The profiler's CUDA events over `calls` calls of fn, after `warmup` unprofiled ones."""
    torch = _torch()
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return [e for e in prof.events() if getattr(e, "device_type", None) == DeviceType.CUDA]


def kernel_sum_us(fn: Callable[[], Any], calls: int = 5) -> float:
    """Device µs per call: the profiler's sum of kernel, memcpy and memset durations over `calls` calls."""
    return sum(e.time_range.elapsed_us() for e in _cuda_events(fn, calls, warmup=1)) / calls


def call_kernels(fn: Callable[[], Any], calls: int = 10) -> list[tuple[str, float]]:
    """The GPU kernels of one call of fn in launch order, (name, device µs) each: PyTorch's profiler over
    `calls` calls (after three unprofiled ones), the last call's share of them (scripts/plan_profile.py,
    scripts/inductor_profile.py)."""
    events = [e for e in _cuda_events(fn, calls, warmup=3) if e.device_time > 0]
    kernels = sorted(events, key=lambda e: e.time_range.start)
    return [(e.name, e.device_time) for e in kernels[-(len(kernels) // calls) :]]


def print_kernels(kernels: list[tuple[str, float]]) -> None:
    """`call_kernels`' list as run, then its sums by kernel name, longest first."""
    print(f"{len(kernels)} kernels a call, {sum(us for _, us in kernels):.1f} us of device time")
    for name, us in kernels:
        print(f"  {us:8.1f}  {name[:110]}")
    print_sums(kernels)


def print_sums(timed: list[tuple[str, float]], top: int | None = None) -> None:
    """(name, µs) pairs summed by name (its first 80 characters): the sum, the count and the mean, longest
    first (the first `top` of them)."""
    sums: dict[str, list[float]] = {}
    for name, us in timed:
        total = sums.setdefault(name[:80], [0.0, 0])
        total[0] += us
        total[1] += 1
    for name, (us, n) in sorted(sums.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{us:9.1f} x{int(n):3d} {us / n:8.1f}  {name}")


def replay_us(fn: Callable[[], Any], calls: int = 10, rounds: int = 9) -> float:
    """Device µs per call: `calls` calls of fn captured in one CUDA graph, the graph replayed `rounds`
    times behind a spin kernel (host hidden), the median replay over `calls` (the checks in scripts/)."""
    torch = _torch()
    fn()
    torch.cuda.synchronize()
    cap = capture(fn, calls, warmup=1)
    cap.graph.replay()
    return statistics.median(events_us(cap.graph.replay, rounds, 1000.0)) / calls


def burst_us(fn: Callable[[], Any], calls: int = 5, rounds: int = 3) -> float:
    """Quick device µs per call, host hidden: `calls` calls queued behind a spin kernel, between two
    events (for ranking many candidates, e.g. tuning cuDNN's plans)."""

    def burst() -> None:
        for _ in range(calls):
            fn()

    return statistics.median(events_us(burst, rounds, HIDE_US)) / calls


def wall_device_us(fn: Callable[[], Any], est: float, budget: Budget) -> tuple[float, str]:
    """The dry run's stand-in for device time: wall clock of back-to-back calls on the CPU."""
    return back_to_back_us(fn, est, budget, False), "CPU wall clock (dry run)"
