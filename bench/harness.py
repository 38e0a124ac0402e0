"""The benchmark protocol: every implementation of a workload is timed in the same process, on the
same inputs, with `triton.testing.do_bench` (CUDA events, median); correctness is checked against a
float64 PyTorch result before timing; the floor is the larger of bytes / measured copy bandwidth
and flops / measured GEMM rate."""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

BENCH_MS = 200  # do_bench repetition budget per implementation


def bench_ms(fn: Callable[[], Any], rep: int = BENCH_MS) -> float:
    import triton.testing as tt

    return float(tt.do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def relerr(got: torch.Tensor, want: torch.Tensor) -> float:
    g, w = got.double(), want.double()
    return float((g - w).norm() / w.norm().clamp_min(1e-30))


@dataclass
class Result:
    workload: str
    impl: str
    us: float | None
    relerr: float | None = None
    note: str = ""
    error: str = ""


@dataclass
class Workload:
    name: str
    group: str
    floor_bytes: float = 0.0
    floor_flops: float = 0.0
    results: list[Result] = field(default_factory=list)

    def floor_us(self, ceilings: dict[str, float]) -> float:
        t_bytes = self.floor_bytes / (ceilings["copy_gbps"] * 1e3) if self.floor_bytes else 0.0
        t_math = self.floor_flops / (ceilings["gemm_tflops"] * 1e6) if self.floor_flops else 0.0
        return max(t_bytes, t_math)

    def floor_kind(self, ceilings: dict[str, float]) -> str:
        t_bytes = self.floor_bytes / (ceilings["copy_gbps"] * 1e3) if self.floor_bytes else 0.0
        t_math = self.floor_flops / (ceilings["gemm_tflops"] * 1e6) if self.floor_flops else 0.0
        return "bytes" if t_bytes >= t_math else "math"

    def floor_text(self, ceilings: dict[str, float]) -> str:
        floor = self.floor_us(ceilings)
        return f"{floor:.1f} ({self.floor_kind(ceilings)})" if floor else "—"


class Session:
    """Collects results; `run(workload, impl, fn)` times one implementation, never raising."""

    def __init__(self, tolerance: float = 2e-2) -> None:
        self.workloads: list[Workload] = []
        self.ceilings: dict[str, float] = {}
        self.tolerance = tolerance
        self.meta: dict[str, Any] = {}

    def workload(self, name: str, group: str, *, bytes: float = 0.0, flops: float = 0.0) -> Workload:
        w = Workload(name, group, bytes, flops)
        self.workloads.append(w)
        print(f"== {name}", flush=True)
        return w

    def run(self, w: Workload, impl: str, fn: Callable[[], Any], *, check: Callable[[], float] | None = None,
            note: str = "", timer: Callable[[Callable[[], Any]], float] | None = None,
            tolerance: float | None = None) -> Result:
        tolerance = self.tolerance if tolerance is None else tolerance
        try:
            fn()
            torch.cuda.synchronize()
            err = check() if check is not None else None
            us = (timer or bench_ms)(fn) * (1e3 if timer is None else 1.0)
            r = Result(w.name, impl, us, err, note)
            if err is not None and not err <= tolerance:
                r.error = f"relerr {err:.3g} above {tolerance:.3g}"
        except Exception as e:  # a peer that cannot run this workload is reported, not fatal
            traceback.print_exc(limit=3)
            r = Result(w.name, impl, None, None, note, f"{type(e).__name__}: {str(e)[:200]}")
        w.results.append(r)
        print(f"   {impl:44s} {'%9.1f us' % r.us if r.us else '      n/a':>12s} "
              f"{'' if r.relerr is None else 'relerr %.1e' % r.relerr} {r.note} {r.error}", flush=True)
        return r

    def measure_ceilings(self) -> None:
        n = 1 << 29
        a = torch.randn(n, device="cuda", dtype=torch.float16)
        b = torch.empty_like(a)
        ms = bench_ms(lambda: b.copy_(a))
        self.ceilings["copy_gbps"] = 2 * a.numel() * 2 / ms / 1e6
        del a, b
        m = 8192
        x = torch.randn(m, m, device="cuda", dtype=torch.float16)
        y = torch.randn(m, m, device="cuda", dtype=torch.float16)
        ms = bench_ms(lambda: x @ y, rep=300)
        self.ceilings["gemm_tflops"] = 2 * m**3 / ms / 1e9
        print(f"ceilings: copy {self.ceilings['copy_gbps']:.0f} GB/s, fp16 GEMM {self.ceilings['gemm_tflops']:.0f} "
              f"TFLOP/s", flush=True)

    # -- reporting ---------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({"meta": self.meta, "ceilings": self.ceilings,
                           "workloads": [{**asdict(w), "floor_us": w.floor_us(self.ceilings)}
                                         for w in self.workloads]}, indent=1)

    def markdown(self) -> str:
        peers = ["torch eager", "torch.compile", "cuDNN frontend"]
        graphed = any(r.impl.endswith("(CUDA graph)") for w in self.workloads for r in w.results)
        ours = ["opgraph", "opgraph tuned"] + (["opgraph (CUDA graph)"] if graphed else [])
        head = ("| workload | floor (µs) | " + " | ".join(ours) + " | " + " | ".join(peers)
                + " | best peer | opgraph / best peer |")
        lines = [head, "|" + "---|" * (head.count("|") - 1)]
        ratios = []
        for w in self.workloads:
            if w.group == "host":
                continue
            by = {}
            for r in w.results:
                key = r.impl if r.impl.startswith("opgraph") else r.impl.split("(")[0].strip()
                if r.us is not None and not r.error and (key not in by or r.us < by[key].us):
                    by[key] = r
            mine = [by[k].us for k in ("opgraph", "opgraph tuned") if k in by]
            best_ours = min(mine) if mine else None
            peer_times = [(by[p].us, p) for p in peers if p in by]
            best_peer = min(peer_times) if peer_times else None
            ratio = best_ours / best_peer[0] if best_ours and best_peer else None
            if ratio:
                ratios.append(ratio)

            def cell(k: str) -> str:
                return f"{by[k].us:.1f}" if k in by else "—"

            lines.append(
                f"| {w.name} | {w.floor_text(self.ceilings)} | "
                + " | ".join(cell(k) for k in ours) + " | " + " | ".join(cell(p) for p in peers)
                + f" | {f'{best_peer[0]:.1f} ({best_peer[1]})' if best_peer else '—'} | "
                f"{f'{ratio:.2f}' if ratio else '—'} |"
            )
        if ratios:
            import math

            geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            lines.append(f"\nGeometric mean of opgraph / best peer over {len(ratios)} workloads: {geo:.2f}")
        host = [w for w in self.workloads if w.group == "host"]
        if host:
            lines += ["", "| host-side measurement | implementation | µs | note |", "|---|---|---|---|"]
            for w in host:
                for r in w.results:
                    us = f"{r.us:.1f}" if r.us is not None else "—"
                    lines.append(f"| {w.name} | {r.impl} | {us} | {(r.note + ' ' + r.error).strip()} |")
        return "\n".join(lines)


def host_us_per_call(fn: Callable[[], Any], iters: int = 2000) -> float:
    """Host time per call (µs), the device synchronised before and after the loop."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    host = (time.perf_counter() - t) / iters * 1e6
    torch.cuda.synchronize()
    return host
