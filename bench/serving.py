"""Serving benchmark of issue 42: one model, requests of varying batch and length, from cold caches.

    python -m bench.serving --out $OUT                 # H200: the Llama of issue 40, bf16, 200 requests
    python -m bench.serving --dry-run --out DIR        # CPU: a tiny Llama, fp32, 6 requests (wiring only)

The model: transformers' `LlamaForCausalLM` (8 layers, d 1024, GQA 16/4, SwiGLU 2816, vocab 32000,
random weights), eval, bf16, returning the logits. The requests: batch 1-16 and sequence length
17-2048 drawn from a fixed seed. Implementations, each in a fresh process with empty compile caches
(opgraph's, Triton's and Inductor's):

  opgraph                 from_torch(..., dynamic_shapes=) once, then `ImportedGraph.run` per request
  torch eager             the module under no_grad
  torch.compile dynamic   torch.compile(module, dynamic=True), its compiles inside the loop

Reported per implementation: the loop's wall time (the import, every build and compilation
included), each request's time and, for opgraph, which requests built something (a bucket planned, a
kernel generated or compiled, a step's kernel built again at the shape: the plan's `stats` before and
after, BUILDS) and the time of the requests at a new shape that built nothing (the bucket's kernels
re-pointed), what ran it (opgraph: the steps by engine of the plan at the range's maximum) and the
garbage collector's passes during the loop (gc.callbacks: the full ones apart, with their seconds).
Checked after the loop (checking first would warm the caches the loop is timed from): the first
requests' and the sampled requests' outputs, and the static plans', against the float64 module. The
sampled requests (`sampled`: spread over the loop, and the shortest and the median ones) are also timed
alone (CUDA events, median of 10 after a warm-up; `_alone_ms`), each against a static opgraph plan built
for that very shape: their device time (the launches queued behind a spin of the GPU, so that none waits
for the host) and their time as launched (the GPU waiting for the host where a short request's launches
outpace it). Targets (issue 42): the loop <= 0.5x torch.compile dynamic's wall time; each request's
device time within 10% of the static plan's; no build after the first request of each bucket.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .peers.torch_peers import EAGER_ENGINE, INDUCTOR_ENGINE

IMPLS = ("opgraph", "torch eager", "torch.compile dynamic")
ENGINES = {"torch eager": EAGER_ENGINE, "torch.compile dynamic": INDUCTOR_ENGINE + ", dynamic=True"}
CHECKED = 3  # requests whose outputs are checked against float64
# the dynamic plan's counters that move when a request builds (a new shape alone moves shape_plans)
BUILDS = ("bucket_plans", "rechosen", "replans", "runtime_compiles", "shape_kernels", "shape_builds", "compiled")
SAMPLED = 6  # requests timed alone (and, for opgraph, against a static plan of their shape) ...


def sampled(reqs: list[tuple[int, int]]) -> list[int]:
    """The requests timed alone: SAMPLED spread over the loop (a fixed stride through it), and the
    requests of the fewest and of the median tokens (batch x sequence), so that short requests, where a
    plan's fixed costs weigh most, are measured too."""
    order = sorted(range(len(reqs)), key=lambda i: (i * 7919) % len(reqs))[:SAMPLED]
    by_tokens = sorted(range(len(reqs)), key=lambda i: (reqs[i][0] * reqs[i][1], i))
    extra = [by_tokens[0], by_tokens[len(by_tokens) // 2]] if reqs else []
    return list(dict.fromkeys([*order, *extra]))


def _config(dry: bool) -> dict[str, Any]:
    if dry:
        return {"d": 32, "layers": 2, "heads": 4, "kv": 2, "ffn": 64, "vocab": 128, "batch": 3, "seq": (17, 40)}
    return {"d": 1024, "layers": 8, "heads": 16, "kv": 4, "ffn": 2816, "vocab": 32000, "batch": 16, "seq": (17, 2048)}


def requests(n: int, cfg: dict[str, Any], seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(1, cfg["batch"]), rng.randint(*cfg["seq"])) for _ in range(n)]


def _model(cfg: dict[str, Any], device: str, dtype: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.frontends.zoo_models import TokenLogits

    from .workloads.zoo import unpadded_sdpa

    llama = LlamaConfig(
        vocab_size=cfg["vocab"],
        hidden_size=cfg["d"],
        num_hidden_layers=cfg["layers"],
        num_attention_heads=cfg["heads"],
        num_key_value_heads=cfg["kv"],
        intermediate_size=cfg["ffn"],
        max_position_embeddings=cfg["seq"][1],
        use_cache=False,
        attn_implementation=unpadded_sdpa(),
    )
    torch.manual_seed(0)
    return TokenLogits(LlamaForCausalLM(llama)).to(device).to(dtype).eval()


def _ids(i: int, shape: tuple[int, int], vocab: int, device: str) -> Any:
    import torch

    g = torch.Generator().manual_seed(1000 + i)
    return torch.randint(0, vocab, shape, generator=g).to(device)


def _caller(name: str, module: Any, cfg: dict[str, Any], device: str) -> tuple[Any, Any]:
    """(call(ids) -> logits, the opgraph plan getter or None)."""
    import torch

    if name == "torch eager":
        return module, None
    if name == "torch.compile dynamic":
        return torch.compile(module, dynamic=True), None
    from torch.export import Dim

    import opgraph as og

    example = _ids(-1, (2, cfg["seq"][0] + 1), cfg["vocab"], device)
    dims = {0: Dim("batch", min=1, max=cfg["batch"]), 1: Dim("seq", min=cfg["seq"][0], max=cfg["seq"][1])}
    imported = og.from_torch(module, (example,), dynamic_shapes=(dims,))
    return (lambda ids: imported.run(ids, reuse_outputs=True)), (lambda: imported.plan(device))


def _environment(device: str) -> str:
    """The machine and software, as the results' header names them (from bench.env.meta, as the suite's)."""
    from .env import meta

    m = meta(device)
    cudnn = m["cudnn"]
    cudnn_text = f"{cudnn // 10000}.{cudnn // 100 % 100}" if cudnn else "none"
    return (
        f"{m['device']}; Python {m['python']}, PyTorch {m['torch']}, Triton {m['triton']}, cuDNN {cudnn_text}, "
        f"cuDNN frontend {m['cudnn_frontend']}; opgraph {m['opgraph_commit']}"
    )


def _stats(plan: Any) -> dict[str, Any]:
    return dict(getattr(plan, "stats", {}) or {})


def _alone_ms(call: Any, ids: Any, device: str, reps: int = 10) -> dict[str, float | None]:
    """A request alone, the median of `reps` after a warm-up. `ms`: CUDA events around the call as the
    host launches it (the GPU may wait for the host between launches; on the CPU, the wall time).
    `device_ms` (GPU): the same call queued behind a spin of the GPU that outlasts the host's launching,
    so that no launch waits for the host: the request's device time (None where the host outlasted even
    a spin of 8x its launch time)."""
    import torch

    call(ids)
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call(ids)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            call(ids)
            times.append(1e3 * (time.perf_counter() - t))
    return {"ms": statistics.median(times), "device_ms": _device_ms(call, ids, reps) if device == "cuda" else None}


def _device_ms(call: Any, ids: Any, reps: int) -> float | None:
    """`_alone_ms`'s device time: each call queued behind a spin of the GPU (torch.cuda._sleep), kept only
    where the host finished launching it (the end event included) before the spin ended, as measured."""
    import torch

    pre, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    torch.cuda.synchronize()
    pre.record()
    torch.cuda._sleep(1_000_000)
    start.record()
    start.synchronize()
    cycles_per_ms = 1_000_000 / max(pre.elapsed_time(start), 1e-3)
    t = time.perf_counter()
    call(ids)
    launch_ms = 1e3 * (time.perf_counter() - t)
    torch.cuda.synchronize()
    for spin_ms in (2 * launch_ms + 1, 4 * launch_ms + 2, 8 * launch_ms + 4):
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            pre.record()
            torch.cuda._sleep(int(spin_ms * cycles_per_ms))
            start.record()
            call(ids)
            end.record()
            host_ms = 1e3 * (time.perf_counter() - t)
            end.synchronize()
            if host_ms >= pre.elapsed_time(start):
                break  # the GPU caught up with the host: not device time alone
            times.append(start.elapsed_time(end))
        if len(times) == reps:
            return statistics.median(times)
    return None


class _GcPauses:
    """The garbage collector's passes while the loop runs (gc.callbacks): how many of each generation and
    the seconds they took, the full (generation 2) ones apart: a plan's per-shape objects promote to the
    old generation, whose full passes walk every tracked object of the process."""

    def __init__(self) -> None:
        self.passes: list[tuple[int, float]] = []
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.passes.append((info["generation"], time.perf_counter() - self._started))

    def __enter__(self) -> _GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: Any) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict[str, Any]:
        full = [s for g, s in self.passes if g == 2]
        return {
            "passes": len(self.passes),
            "seconds": sum(s for _, s in self.passes),
            "full_passes": len(full),
            "full_seconds": sum(full),
            "longest_full_ms": 1e3 * max(full, default=0.0),
        }


def child(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One implementation's serving loop, checks and timings (run in a fresh process)."""
    import copy

    import torch

    dry = args.dry_run
    device = "cpu" if dry or not torch.cuda.is_available() else "cuda"
    cfg = _config(dry)
    reqs = requests(args.requests, cfg, args.seed)
    module = _model(cfg, device, torch.float32 if device == "cpu" else torch.bfloat16)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out: dict[str, Any] = {
        "impl": name,
        "device": device,
        "requests": reqs,
        "request_ms": [],
        "built": [],
        "new_shapes": [],
    }
    pauses = _GcPauses()
    with torch.no_grad(), pauses:
        start = time.perf_counter()
        call, plan_of = _caller(name, module, cfg, device)
        for i, shape in enumerate(reqs):
            if time.perf_counter() - start > args.loop_limit:
                break  # the rows say how many requests were served in the time
            before = _stats(plan_of()) if plan_of and i else {}
            t = time.perf_counter()
            call(_ids(i, shape, cfg["vocab"], device))
            sync()
            out["request_ms"].append(1e3 * (time.perf_counter() - t))
            after = _stats(plan_of()) if plan_of else {}
            if any(after.get(k) != before.get(k) for k in BUILDS):
                out["built"].append({"request": i, "shape": shape, "stats": after})
            elif after.get("shape_plans") != before.get("shape_plans"):
                out["new_shapes"].append(i)  # a new shape, the bucket's kernels re-pointed
        out["wall_s"] = time.perf_counter() - start
        out["gc"] = pauses.summary()
        out["env"] = _environment(device)  # (after the loop: its imports are not the loop's)
        out["served"] = len(out["request_ms"])
        reqs = reqs[: out["served"]]
        reference = copy.deepcopy(module).double()

        def error(got: Any, ids: Any) -> float:
            want = reference(ids)
            return float((got.double() - want).norm() / want.norm())

        sample = sampled(reqs)
        out["errors"], out["alone"] = [], []
        for i in sorted(set(range(min(CHECKED, len(reqs)))) | set(sample)):
            ids = _ids(i, reqs[i], cfg["vocab"], device)
            out["errors"].append(error(call(ids), ids))
            if i not in sample:
                continue
            alone = _alone_ms(call, ids, device)
            row = {"request": i, "shape": reqs[i], **alone}
            if plan_of is not None:  # the static plan of this very shape, checked as well
                import opgraph as og

                static = og.from_torch(module, (ids,))
                run = functools.partial(static.run, reuse_outputs=True)
                out["errors"].append(error(run(ids), ids))
                static_alone = _alone_ms(run, ids, device)
                row["static_ms"], row["static_device_ms"] = static_alone["ms"], static_alone["device_ms"]
            out["alone"].append(row)
    out["engine"] = ENGINES.get(name, "")
    if plan_of is not None:
        from .ours import engines_of

        plan = plan_of()
        out["describe"] = plan.describe()
        out["engine"] = engines_of(getattr(plan, "max_plan", plan))
    return out


def _run_child(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    caches = {v: str(work / name.replace(" ", "_") / v) for v in ("OPGRAPH_CACHE_DIR", "TRITON_CACHE_DIR")}
    caches["TORCHINDUCTOR_CACHE_DIR"] = str(work / name.replace(" ", "_") / "inductor")
    result = work / f"{name.replace(' ', '_')}.json"
    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        **caches,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }
    cmd = [sys.executable, "-m", "bench.serving", "--child", name, "--json", str(result)]
    cmd += ["--requests", str(args.requests), "--seed", str(args.seed), "--loop-limit", str(0.6 * args.timeout)]
    cmd += ["--dry-run"] if args.dry_run else []
    try:
        done = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        return {"impl": name, "error": f"timed out after {args.timeout:.0f} s: {str(e.stdout or '')[-1500:]}"}
    if done.returncode != 0:
        return {"impl": name, "error": (done.stdout + done.stderr)[-2000:]}
    return json.loads(result.read_text())


def render(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    ok = [r for r in results if "error" not in r]
    compiled = next((r for r in ok if r["impl"] == "torch.compile dynamic"), None)
    env = next((r["env"] for r in ok if "env" in r), "")
    lines = [
        f"# Serving loop: {args.requests} requests (seed {args.seed}), cold caches",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {env}. `python -m bench.serving`: see its docstring.",
        "",
        "| implementation | engine | requests served | loop wall s | vs torch.compile dynamic "
        "| median request ms | requests that built | new shapes re-pointed (median ms) "
        "| worst error vs float64 | request alone / static plan: device time | as launched "
        "| GC: full passes (s), all passes (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ok:
        full = compiled is not None and r["served"] == compiled["served"] == args.requests
        ratio = f"{r['wall_s'] / compiled['wall_s']:.2f}x" if full else "—"
        launched = [a["ms"] / a["static_ms"] for a in r["alone"] if "static_ms" in a]
        as_launched = f"{min(launched):.2f}-{max(launched):.2f}x" if launched else "—"
        device_only = [
            a["device_ms"] / a["static_device_ms"]
            for a in r["alone"]
            if a.get("device_ms") and a.get("static_device_ms")
        ]
        vs_static = f"{min(device_only):.2f}-{max(device_only):.2f}x" if device_only else "—"
        if device_only and len(device_only) < len(launched):  # (a request whose device time was not measured)
            vs_static += f" ({len(device_only)} of {len(launched)})"
        built = len(r["built"]) if r["impl"] == "opgraph" else "—"
        fresh = [r["request_ms"][i] for i in r.get("new_shapes", ())]
        repointed = f"{len(fresh)} ({statistics.median(fresh):.2f})" if fresh else ("0" if built != "—" else "—")
        median = statistics.median(r["request_ms"]) if r["request_ms"] else float("nan")
        pauses = r.get("gc")  # (absent from results of older versions)
        collected = (
            f"{pauses['full_passes']} ({pauses['full_seconds']:.2f}), {pauses['passes']} ({pauses['seconds']:.2f})"
            if pauses
            else "—"
        )
        lines.append(
            f"| {r['impl']} | {r['engine']} | {r['served']} of {args.requests} | {r['wall_s']:.1f} | {ratio} | "
            f"{median:.2f} | {built} | {repointed} | {max(r['errors'], default=float('nan')):.2e} | {vs_static} "
            f"| {as_launched} | {collected} |"
        )
    for r in results:
        if "error" in r:
            lines.append(f"\n{r['impl']} failed:\n```\n{r['error']}\n```")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=None, help="requests in the loop (200; 6 with --dry-run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--impls", help="comma-separated, of: " + ", ".join(IMPLS) + " (all; no torch.compile with --dry-run)"
    )
    p.add_argument("--dry-run", action="store_true", help="CPU, a tiny model: the wiring only")
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    p.add_argument("--timeout", type=float, default=1800, help="seconds per implementation")
    p.add_argument("--loop-limit", type=float, default=float("inf"), help=argparse.SUPPRESS)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.requests is None:
        args.requests = 6 if args.dry_run else 200
    if args.impls is None:
        args.impls = ",".join(IMPLS[:2] if args.dry_run else IMPLS)
    if args.child:
        Path(args.json).write_text(json.dumps(child(args.child, args)))
        return 0
    with tempfile.TemporaryDirectory(prefix="opgraph-serving-") as work:
        results = [_run_child(name, args, Path(work)) for name in args.impls.split(",")]
    table = render(results, args)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = next((r["device"] for r in results if "device" in r), "cpu")
    stem = f"{time.strftime('%Y-%m-%d')}-{device}-serving{'-dry-run' if args.dry_run else ''}"
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (out / f"{stem}.md").write_text(table)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
