"""The runtime at model scale (issue 14), on one GPU: `python -m bench.runtime [--phases ...] --out DIR`.

Self-contained (no bench.harness): writes runtime.json and runtime.md into --out.

Phases (all by default):
  host      host µs per step of a repeated execute: a 17-step plan of generated kernels and an
            8-step plan of cuDNN steps, each beside the launch paths they replace (Triton's JIT launch,
            the frontend's dict and public execute), each checked against PyTorch first.
  models    per network (ResNet-18, MobileNetV2; batch 64, fp16, channels-last, SGD momentum through
            opgraph.training.train_step), each in fresh processes:
            cold   from nothing (empty opgraph and Triton caches) to the first training step, timed from
                   the process's start (imports included) and broken down;
            warm   the same in a second process (the caches warm), then plain execute against eager
                   PyTorch (wall time per step), host time per step against device time per step, host
                   µs per step by engine inside the plan; the loss checked against the fp32 module;
                   the plan saved with its kernels;
            load   a fresh process loads the saved plan and runs one step: seconds beyond `import torch`,
                   kernels compiled (counted: opgraph.engines.triton.compiler.STATS) and cuDNN plans built.
Targets (issue 14): <= 3 µs/step generated, <= 8 µs/step cuDNN; execute <= 0.8x eager and host < device;
cold <= 15 s (ResNet-18) / 30 s (MobileNetV2), warm <= 5 s, load <= 3 s with 0 kernels compiled.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .measure import events_us

T_START = time.perf_counter()  # a child's clock starts with this module (after the interpreter's own start)


# -- shared helpers ----------------------------------------------------------------------------------
def relerr(got: Any, want: Any) -> float:
    g, w = got.double(), want.double()
    return float((g - w).norm() / w.norm().clamp_min(1e-30))


def host_us(fn: Any, rounds: int = 15, burst: int = 20) -> float:
    """Host µs per call: bursts of calls timed on the host (the device synchronised between bursts,
    short enough that the launch queue never fills), median over rounds."""
    import torch

    for _ in range(burst):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(burst):
            fn()
        samples.append((time.perf_counter() - t0) / burst * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def device_us(fn: Any, host_estimate_us: float, burst: int = 2, rounds: int = 3) -> float:
    """Device µs per call: `burst` calls enqueued behind a spin kernel long enough to cover their host
    time (twice the estimate, at 2 GHz), timed with CUDA events: no host time counts."""

    def calls() -> None:
        for _ in range(burst):
            fn()

    return statistics.median(events_us(calls, rounds, max(host_estimate_us * burst, 500.0) * 2)) / burst


def wall_ms(fn: Any, steps: int = 10, rounds: int = 5) -> float:
    """Wall ms per call of `fn` run back to back (device synchronised at the ends), median of rounds."""
    import torch

    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / steps * 1e3)
    return statistics.median(samples)


# -- host µs per step ----------------------------------------------------------------------------------
def _chain_plan(stages: int) -> tuple[Any, dict[Any, Any], Any]:
    """Stages of (x * s_i, relu, max over H and W, subtract): a plan of generated reduction kernels."""
    import torch

    import opgraph as og

    g = og.Graph("chain", io_data_type=og.DataType.HALF)
    x = g.tensor(dim=[8, 64, 16, 16], stride=[16384, 1, 1024, 64], name="x")
    scales = [g.tensor(dim=[1, 64, 1, 1], name=f"s{i}") for i in range(stages)]
    h = x
    for s in scales:
        h = g.relu(g.mul(h, s))
        h = g.sub(h, g.reduction(h, mode="max").set_dim([8, 64, 1, 1]))
    h.set_output(True).set_name("y")
    g.validate()
    plan = g.build(device="cuda", engines=["triton"])
    dev = "cuda"
    xs = torch.randn(8, 64, 16, 16, device=dev).to(torch.float16).to(memory_format=torch.channels_last)
    pack: dict[Any, Any] = {x: xs}
    ref = xs.float()
    for t in scales:
        v = torch.rand(1, 64, 1, 1, device=dev).add_(0.5).to(torch.float16)
        pack[t] = v
        ref = torch.relu(ref * v.float())
        ref = ref - ref.amax(dim=(2, 3), keepdim=True)
    out = torch.empty_strided(h.dim, h.stride, dtype=torch.float16, device=dev)
    pack[h] = out
    return plan, pack, (out, ref)


def _conv_plan(count: int) -> tuple[Any, dict[Any, Any], Any]:
    """`count` independent fp16 conv3x3+bias+relu (N32 C64 56²): a plan of cuDNN steps."""
    import torch

    import opgraph as og

    g = og.Graph("convs", io_data_type=og.DataType.HALF)
    pack: dict[Any, Any] = {}
    checks = []
    for i in range(count):
        x = torch.randn(32, 64, 56, 56, device="cuda").to(torch.float16).to(memory_format=torch.channels_last)
        w = (torch.randn(64, 64, 3, 3, device="cuda") / 24).to(torch.float16).to(memory_format=torch.channels_last)
        b = torch.randn(1, 64, 1, 1, device="cuda").to(torch.float16)
        X, W, B = g.tensor_like(x, name=f"x{i}"), g.tensor_like(w, name=f"w{i}"), g.tensor_like(b, name=f"b{i}")
        Y = g.relu(g.bias(g.conv_fprop(X, W, padding=[1, 1]), B)).set_output(True).set_name(f"y{i}")
        pack.update({X: x, W: w, B: b})
        checks.append((Y, x, w, b))
    g.validate()
    plan = g.build(device="cuda")
    outs = []
    for Y, x, w, b in checks:
        y = torch.empty_strided(Y.dim, Y.stride, dtype=torch.float16, device="cuda")
        pack[Y] = y
        outs.append((y, torch.relu(torch.nn.functional.conv2d(x.float(), w.float(), b.float().view(-1), padding=1))))
    return plan, pack, outs


class _Env:
    """Environment variables set for a block, restored after it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env, self.saved = env, {k: os.environ.get(k) for k in env}

    def __enter__(self) -> None:
        os.environ.update(self.env)

    def __exit__(self, *exc: Any) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def phase_host(results: dict[str, Any]) -> None:
    import torch

    rows = []
    flat = {"OPGRAPH_AUTOGRAPH": "0"}
    modes = [
        ("auto graph (default)", {"OPGRAPH_AUTOGRAPH": "1"}),
        ("flat: native launches (OPGRAPH_AUTOGRAPH=0)", flat),
        ("flat: Triton JIT launches (reference)", {**flat, "OPGRAPH_LAUNCH": "jit"}),
    ]
    for label, env in modes:
        with _Env(env):
            plan, pack, (out, ref) = _chain_plan(16)
            out.fill_(float("nan"))
            plan.execute(pack)
            torch.cuda.synchronize()
            err = relerr(out.float(), ref)
            launches = sum(len(s.kernel.generated.launches) for s in plan.steps)
            us = host_us(lambda plan=plan, pack=pack: plan.execute(pack))
            rows.append(
                {
                    "what": "generated kernels",
                    "path": label,
                    "steps": len(plan.steps),
                    "launches": launches,
                    "us_per_execute": us,
                    "us_per_step": us / len(plan.steps),
                    "relerr": err,
                    "launch_kinds": _count(
                        type(x).__name__
                        for launcher in plan.bind(pack, None).launchers
                        for x in getattr(launcher, "launches", ())
                    ),
                }
            )
    modes = [
        ("auto graph (default)", {"OPGRAPH_AUTOGRAPH": "1"}),
        ("flat: raw pointer array (OPGRAPH_AUTOGRAPH=0)", flat),
        ("flat: frontend execute (reference)", {**flat, "OPGRAPH_CUDNN_LAUNCH": "execute"}),
    ]
    for label, env in modes:
        with _Env(env):
            plan, pack, outs = _conv_plan(8)
            engines = sorted({s.config.engine for s in plan.steps})
            for y, _ in outs:
                y.fill_(float("nan"))
            plan.execute(pack)
            torch.cuda.synchronize()
            err = max(relerr(y.float(), want) for y, want in outs)
            us = host_us(lambda plan=plan, pack=pack: plan.execute(pack), burst=10)
            rows.append(
                {
                    "what": f"cuDNN steps ({'/'.join(engines)})",
                    "path": label,
                    "steps": len(plan.steps),
                    "us_per_execute": us,
                    "us_per_step": us / len(plan.steps),
                    "relerr": err,
                    "mode": getattr(plan.bind(pack, None).launchers[0], "mode", None),
                }
            )
    for r in rows:
        print(
            f"   host: {r['what']:28s} {r['path']:32s} {r['us_per_step']:7.2f} us/step "
            f"({r['steps']} steps, relerr {r['relerr']:.1e})",
            flush=True,
        )
    results["host"] = rows


# -- networks -----------------------------------------------------------------------------------------
class _Stamps(dict):
    """Stage times, also printed to stderr as they happen (a child that times out still says where)."""

    def __setitem__(self, key: str, value: float) -> None:
        super().__setitem__(key, value)
        print(f"STAMP {key} {value:.2f} (at {time.perf_counter() - T_START:.1f} s)", file=sys.stderr, flush=True)


def _network(name: str, batch: int) -> dict[str, Any]:
    """In a child process: build the training step of `name` and run it once; with --timing also
    time it against eager PyTorch and save the plan."""
    import torch

    stamps = _Stamps()
    stamps["import_torch_s"] = time.perf_counter() - T_START
    import torchvision.models as tvm

    import opgraph as og
    from opgraph.engines.triton import compiler

    stamps["import_rest_s"] = time.perf_counter() - T_START - stamps["import_torch_s"]
    t = time.perf_counter()
    torch.manual_seed(0)
    model = getattr(tvm, name)(weights=None).cuda().to(memory_format=torch.channels_last).train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(torch.float16).to(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device="cuda")
    model.half()
    stamps["model_s"] = time.perf_counter() - t
    t = time.perf_counter()
    imported = og.from_torch(model, (x,))
    stamps["import_graph_s"] = time.perf_counter() - t
    t = time.perf_counter()
    step = og.training.train_step(
        imported, og.training.OneHotCrossEntropy(), og.training.SGD(0.0, momentum=0.9), grad_data_type=og.DataType.HALF
    )
    stamps["step_graph_s"] = time.perf_counter() - t
    t = time.perf_counter()
    plan = step.graph.build(device="cuda")
    stamps["build_s"] = time.perf_counter() - t
    print(
        "BUILD",
        json.dumps(_jsonable(plan.build_stats)),
        _count(s.config.engine for s in plan.steps),
        file=sys.stderr,
        flush=True,
    )
    pack = step.pack(x, target=torch.eye(1000, device="cuda", dtype=torch.float16)[labels])
    t = time.perf_counter()
    plan.execute(pack)
    imported.write_back(pack)
    torch.cuda.synchronize()
    stamps["first_step_s"] = time.perf_counter() - t
    stamps["total_s"] = time.perf_counter() - T_START
    out = {
        "stamps": stamps,
        "build_stats": _jsonable(plan.build_stats),
        "steps": len(plan.steps),
        "engines": _count(s.config.engine for s in plan.steps),
        "compiled": dict(compiler.STATS),
    }
    if os.environ.get("RT_TIMING"):
        out.update(_timing(model, x, labels, plan, pack, step))
        path = os.environ.get("RT_SAVE")
        if path:
            t = time.perf_counter()
            plan.save(path)
            out["save_s"] = time.perf_counter() - t
            out["plan_bytes"] = os.path.getsize(path)
    return out


def _timing(model: Any, x: Any, labels: Any, plan: Any, pack: Any, step: Any) -> dict[str, Any]:
    import copy

    import torch
    from torch.nn import functional as F

    torch.backends.cudnn.benchmark = True
    want = F.cross_entropy(copy.deepcopy(model).float()(x.float()), labels).detach()
    eager_model = copy.deepcopy(model)
    opt = torch.optim.SGD(eager_model.parameters(), lr=0.0, momentum=0.9)

    def eager() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(eager_model(x), labels)
        loss.backward()
        opt.step()
        return loss

    eager_err = relerr(eager().detach().float(), want)
    loss_uid = step.loss_uid

    def og_step() -> None:
        plan.execute(pack)
        step.imported.write_back(pack)

    out: dict[str, Any] = {"eager_relerr": eager_err, "eager_ms": wall_ms(eager)}
    for label, auto in (("", True), ("_flat", False)):
        plan.auto_graph = auto
        for _ in range(4):  # settle (a graph is captured on the third execute of a stable binding)
            og_step()
        pack[loss_uid].fill_(float("nan"))
        og_step()
        torch.cuda.synchronize()
        out["relerr" + label] = relerr(pack[loss_uid].reshape(()).float(), want)
        out["execute_ms" + label] = wall_ms(og_step)
        out["ratio" + label] = out["execute_ms" + label] / out["eager_ms"]
        out["host_us_per_step" + label] = host_us(og_step, rounds=7, burst=1)
        out["host_execute_us" + label] = host_us(lambda: plan.execute(pack), rounds=7, burst=1)
    plan.auto_graph = True
    out["device_us_per_step"] = device_us(og_step, out["host_us_per_step_flat"])
    ag = plan.local_state().owned.autograph
    out["autograph"] = {"enabled": ag.enabled, "captures": ag.captures, "replays": ag.replays}
    out["by_engine"] = _host_by_engine(plan, pack)
    return out


def _host_by_engine(plan: Any, pack: Any, runs: int = 5) -> dict[str, Any]:
    """Host µs of each step's launches inside a real execute, summed by engine (median of runs)."""
    import torch

    bound = plan.bind(pack, None)
    handle, _ = plan.state.streams(None)
    bound.binding.stream.set(handle)
    per_step: list[list[float]] = [[] for _ in plan.steps]
    for _ in range(runs):
        torch.cuda.synchronize()
        for fn, args in bound.preludes:
            fn(*args)
        for i in range(len(plan.steps)):
            t0 = time.perf_counter()
            for fn, args in bound.step_calls(i):
                fn(*args)
            per_step[i].append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    out: dict[str, Any] = {}
    for step, samples in zip(plan.steps, per_step):
        e = out.setdefault(step.config.engine, {"steps": 0, "us": 0.0})
        e["steps"] += 1
        e["us"] += statistics.median(samples)
    for e in out.values():
        e["us_per_step"] = e["us"] / e["steps"]
    return out


def _load(path: str) -> dict[str, Any]:
    """In a child process: load a saved plan and run one step on random data."""
    import torch

    t_torch = time.perf_counter() - T_START
    t0 = time.perf_counter()
    import opgraph as og
    from opgraph.engines import cudnn_frontend  # noqa: F401 - counted below
    from opgraph.engines.triton import compiler

    plan = og.load_plan(path)
    t_loaded = time.perf_counter() - t0
    pack = {}
    for uid in (*plan.graph.inputs, *plan.graph.outputs):
        d = plan.graph.tensors[uid]
        if d.is_pass_by_value:
            pack[uid] = 0.5
            continue
        if uid in pack:
            continue
        t = torch.empty_strided(d.dim, d.stride, dtype=d.data_type.to_torch(), device="cuda")
        t.copy_(torch.randn(d.dim, device="cuda").mul_(0.1)) if d.data_type.is_floating else t.zero_()
        pack[uid] = t
    t1 = time.perf_counter()
    plan.execute(pack)
    torch.cuda.synchronize()
    total = time.perf_counter() - t0
    first = time.perf_counter() - t1
    built = sum(1 for s in plan.steps if s.config.engine == "cudnn" and not getattr(s.kernel, "deserialized", True))
    return {
        "import_torch_s": t_torch,
        "load_s": t_loaded,
        "first_execute_s": first,
        "beyond_torch_s": total,
        "compiled": dict(compiler.STATS),
        "cudnn_built": built,
        "steps": len(plan.steps),
        "build_stats": _jsonable(plan.build_stats),
    }


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _child(args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.runtime", *args],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as err:
        tail = err.stderr or ""
        if isinstance(tail, bytes):
            tail = tail.decode(errors="replace")
        return {"error": f"timed out after {timeout:.0f} s", "wall_s": time.perf_counter() - t0, "stderr": tail[-3000:]}
    wall = time.perf_counter() - t0
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        return {"error": f"exit {proc.returncode}", "wall_s": wall, "stderr": proc.stderr[-3000:]}
    out = json.loads(line[len("RESULT ") :])
    out["wall_s"] = wall
    return out


def phase_models(results: dict[str, Any], models: list[str], deadline: float) -> None:
    rows = results.setdefault("models", {})
    for name in models:
        row = rows.setdefault(name, {})
        caches = tempfile.mkdtemp(prefix=f"rt_{name}_")
        env = {"OPGRAPH_CACHE_DIR": f"{caches}/og", "TRITON_CACHE_DIR": f"{caches}/triton", "PYTHONUNBUFFERED": "1"}
        plan_path = f"{caches}/{name}.ogplan"
        for stage, extra, limit in (("cold", {}, 130), ("warm", {"RT_TIMING": "1", "RT_SAVE": plan_path}, 130)):
            left = deadline - time.perf_counter()
            if left < 30:
                row[stage] = {"error": "skipped: the run's time budget is spent"}
                continue
            row[stage] = _child(["--child-network", name], {**env, **extra}, min(limit, left - 10))
            print(f"   {name} {stage}: {_short(row[stage])}", flush=True)
        left = deadline - time.perf_counter()
        if os.path.exists(plan_path) and left > 20:
            row["load"] = _child(["--child-load", plan_path], env, min(60, left - 5))
            print(f"   {name} load: {_short(row['load'])}", flush=True)


def _short(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"ERROR {r['error']}: {r.get('stderr', '')[-600:]}"
    keys = (
        "wall_s",
        "stamps",
        "beyond_torch_s",
        "compiled",
        "ratio",
        "host_us_per_step",
        "device_us_per_step",
        "relerr",
        "cudnn_built",
    )
    return json.dumps({k: r[k] for k in keys if k in r}, default=str)[:900]


# -- report -----------------------------------------------------------------------------------------
def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        f"Measured {meta['date']} on {meta['device']}: torch {meta['torch']}, Triton {meta['triton']}, "
        f"cuDNN {meta['cudnn']}, cuDNN frontend {meta.get('cudnn_frontend')}, {meta['cpus']} CPU cores. "
        "`python -m bench.runtime`, one run.",
        "",
        "| host µs per step of a repeated execute | path | steps | µs/step | µs/execute | target |",
        "|---|---|---|---|---|---|",
    ]
    for r in results.get("host", []):
        target = "<= 3" if "generated" in r["what"] else "<= 8"
        lines.append(
            f"| {r['what']} | {r['path']} | {r['steps']} | {r['us_per_step']:.2f} | "
            f"{r['us_per_execute']:.1f} | {target if 'reference' not in r['path'] else '-'} |"
        )
    lines += [
        "",
        "| training step (batch 64, fp16, channels-last) | execute | ms | eager ms | ratio (target <= 0.8) | "
        "host µs/step (execute + BN write-back) | device µs/step | loss relerr |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results.get("models", {}).items():
        w = row.get("warm", {})
        if "execute_ms" in w:
            for label, key in (("auto graph (default)", ""), ("flat launches (OPGRAPH_AUTOGRAPH=0)", "_flat")):
                lines.append(
                    f"| {name} | {label} | {w['execute_ms' + key]:.2f} | {w['eager_ms']:.2f} | "
                    f"{w['ratio' + key]:.2f} | {w['host_us_per_step' + key]:.0f} | "
                    f"{w['device_us_per_step']:.0f} | {w['relerr' + key]:.1e} |"
                )
        else:
            lines.append(f"| {name} | {w.get('error', 'not run')} | | | | | | |")
    lines += [
        "",
        "| from nothing to the first training step (s) | caches | total (target) | imports (torch + rest) | "
        "model import + step graph | build (of which compile) | first step | kernels compiled |",
        "|---|---|---|---|---|---|---|---|",
    ]
    targets = {
        ("resnet18", "cold"): 15,
        ("mobilenet_v2", "cold"): 30,
        ("resnet18", "warm"): 5,
        ("mobilenet_v2", "warm"): 5,
    }
    for name, row in results.get("models", {}).items():
        for stage in ("cold", "warm"):
            r = row.get(stage, {})
            if "stamps" not in r:
                lines.append(f"| {name} | {stage} | {r.get('error', 'not run')} | | | | | |")
                continue
            st, bs = r["stamps"], r.get("build_stats", {})
            lines.append(
                f"| {name} | {stage} | {st['total_s']:.1f} (<= {targets.get((name, stage), '-')}) | "
                f"{st['import_torch_s'] + st['import_rest_s']:.1f} ({st['import_torch_s']:.1f} + {st['import_rest_s']:.1f}) | "
                f"{st['import_graph_s'] + st['step_graph_s']:.1f} | {st['build_s']:.1f} ({bs.get('compile_s', 0):.1f}) | "
                f"{st['first_step_s']:.2f} | {r.get('build_stats', {}).get('compile', {}).get('compiled', '-')} of "
                f"{r.get('build_stats', {}).get('compile', {}).get('kernels', '-')} |"
            )
    lines += [
        "",
        "| saved training plan, fresh process | load (s) | first execute (s) | beyond `import torch` (s, target <= 3) "
        "| kernels compiled | cuDNN plans built | plan file |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in results.get("models", {}).items():
        r, w = row.get("load", {}), row.get("warm", {})
        if "beyond_torch_s" not in r:
            lines.append(f"| {name} | {r.get('error', 'not run')[:200]} | | | | | |")
            continue
        lines.append(
            f"| {name} | {r['load_s']:.2f} | {r['first_execute_s']:.2f} | {r['beyond_torch_s']:.2f} | "
            f"{r['compiled'].get('compiled')} | {r['cudnn_built']} | {w.get('plan_bytes', 0) / 1e6:.1f} MB |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", default="host,models")
    ap.add_argument("--models", default="resnet18,mobilenet_v2")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--budget", type=float, default=420.0, help="seconds the whole run may take")
    ap.add_argument("--child-network")
    ap.add_argument("--child-load")
    args = ap.parse_args(argv)
    if args.child_network or args.child_load:
        out = _network(args.child_network, 64) if args.child_network else _load(args.child_load)
        print("RESULT " + json.dumps(out, default=str), flush=True)
        return 0
    deadline = time.perf_counter() + args.budget
    import torch
    import triton

    meta = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "triton": triton.__version__,
        "cpus": os.cpu_count(),
    }
    try:
        from importlib import metadata

        meta["cudnn_frontend"] = metadata.version("nvidia-cudnn-frontend")
    except Exception:  # noqa: BLE001
        meta["cudnn_frontend"] = None
    print(meta, flush=True)
    results: dict[str, Any] = {"meta": meta}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        (out / "runtime.json").write_text(json.dumps(results, indent=1, default=str))
        (out / "runtime.md").write_text(markdown(results))

    phases = args.phases.split(",")
    if "host" in phases:
        try:
            phase_host(results)
        except Exception as err:  # noqa: BLE001 - reported, the run goes on
            import traceback

            traceback.print_exc()
            results["host_error"] = f"{type(err).__name__}: {err}"
        write()
    if "models" in phases:
        phase_models(results, args.models.split(","), deadline)
        write()
    print(markdown(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
