"""Host overhead (issue 5): host time per execute of a tiny one-piece plan, beside PyTorch eager and
the cuDNN frontend's execute, and a CUDA-graph replay."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import opgraph as og

from . import peers
from .common import like, out_like, randn
from .harness import Result, Session, host_us_per_call

DT = og.DataType


def latency(s: Session, autotune: bool) -> None:
    w = s.workload("host time per execute: tiny conv1x1+bias+relu (µs of CPU per call)", "host")
    x = randn(1, 64, 8, 8, channels_last=True)
    wt = randn(64, 64, 1, 1, scale=0.125, channels_last=True)
    b = randn(1, 64, 1, 1, channels_last=True)
    g = og.Graph("tiny", io_data_type=DT.HALF)
    X, W, B = like(g, x, "x"), like(g, wt, "w"), like(g, b, "b")
    Y = g.relu(g.bias(g.conv_fprop(X, W), B)).set_output(True)
    g.validate()
    plan = g.build(device="cuda")
    pack = {X: x, W: wt, B: b, Y: out_like(Y)}
    note = f"[{len(plan.steps)} steps: {', '.join(st.config.engine for st in plan.steps)}]"
    s.run(w, "opgraph", lambda: plan.execute(pack), timer=lambda fn: host_us_per_call(fn), note=note)
    uid_pack = {t.uid: v for t, v in pack.items()}
    s.run(w, "opgraph (UID keys)", lambda: plan.execute(uid_pack), timer=lambda fn: host_us_per_call(fn))
    f = lambda: torch.relu(F.conv2d(x, wt, b.view(-1)))  # noqa: E731
    s.run(w, "torch eager", f, timer=lambda fn: host_us_per_call(fn), note="(3 launches)")
    if peers.available():
        holder = {}

        def cfe():
            if "run" not in holder:
                holder["out"], holder["run"] = peers.conv_bias_relu(x, wt, b, 0, 1)
            holder["run"]()

        s.run(w, "cuDNN frontend", cfe, timer=lambda fn: host_us_per_call(fn))


WORKLOADS = {"latency": latency}


def _plans():
    """conv+bias+relu and batchnorm+relu plans with every tensor by reference, and two packs each."""
    from .common import cl

    out = []
    x = [randn(32, 64, 56, 56, channels_last=True) for _ in range(2)]
    w = randn(64, 64, 3, 3, scale=1 / 24, channels_last=True)
    b = randn(1, 64, 1, 1, channels_last=True)
    g = og.Graph("conv_bias_relu", io_data_type=DT.HALF)
    X, W, B = like(g, x[0], "x"), like(g, w, "w"), like(g, b, "b")
    Y = g.relu(g.bias(g.conv_fprop(X, W, padding=1), B)).set_output(True)
    g.validate()
    ys = [out_like(Y) for _ in range(2)]
    out.append(("conv3x3+bias+relu N32 C64 56²", g, [{X: x[i], W: w, B: b, Y: ys[i]} for i in range(2)], X, x))
    xb = [randn(32, 256, 56, 56, channels_last=True) for _ in range(2)]
    g = og.Graph("bn_relu", io_data_type=DT.HALF)
    X = like(g, xb[0], "x")
    st = [1, 256, 1, 1]
    S, Bi, RM, RV = (g.tensor(dim=st, data_type=DT.FLOAT, name=n) for n in ("s", "b", "rm", "rv"))
    y, m, iv, nm, nv = g.batchnorm(X, S, Bi, in_running_mean=RM, in_running_var=RV, epsilon=1e-5, momentum=0.1)
    for t in (m, iv, nm, nv):
        t.set_output(True)
    Y = g.relu(y).set_output(True)
    g.validate()
    base = {S: torch.ones(st, device="cuda"), Bi: torch.zeros(st, device="cuda"), RM: torch.zeros(st, device="cuda"),
            RV: torch.ones(st, device="cuda"), m: out_like(m), iv: out_like(iv), nm: out_like(nm), nv: out_like(nv)}
    ys = [out_like(Y) for _ in range(2)]
    out.append(("batchnorm+relu N32 C256 56²", g, [{**base, X: xb[i], Y: ys[i]} for i in range(2)], X, xb))
    _ = cl
    return out


def cuda_graphs(s: Session, autotune: bool) -> None:
    """Host µs per step: execute, graph replay, replay after update_cuda_graph, replay after a table
    flip; and the cost of update_cuda_graph itself."""
    for title, g, packs, X, xs in _plans():
        w = s.workload(f"host µs per step, {title}", "host")
        plan = g.build(device="cuda", by_reference=True)
        s.run(w, "opgraph execute", lambda: plan.execute(packs[0]), timer=host_us_per_call)
        graph = plan.populate_cuda_graph(packs[0])
        s.run(w, "opgraph graph replay", graph.replay, timer=host_us_per_call)
        state = {"i": 0}

        def update_and_replay():
            state["i"] ^= 1
            plan.update_cuda_graph(graph, packs[state["i"]])
            graph.replay()

        s.run(w, "opgraph update + replay", update_and_replay, timer=host_us_per_call)

        def flip_and_replay():
            state["i"] ^= 1
            plan.set_address(X, xs[state["i"]])
            graph.replay()

        s.run(w, "opgraph table flip + replay", flip_and_replay, timer=host_us_per_call)

        def update_only():
            state["i"] ^= 1
            plan.update_cuda_graph(graph, packs[state["i"]])

        s.run(w, "opgraph update_cuda_graph alone", update_only, timer=host_us_per_call,
              note=f"({len(plan.steps)} steps, {sum(len(st.kernel.generated.launches) for st in plan.steps if hasattr(st.kernel, 'generated'))} launches)")


def load_vs_build(s: Session, autotune: bool) -> None:
    """Seconds to build (with autotuning, empty tuning cache) vs to load the saved plan and run it once,
    each in a fresh process."""
    import os
    import subprocess
    import sys
    import tempfile

    w = s.workload("fresh process: build with autotune vs load saved plan + run once (µs)", "host")
    tmp = tempfile.mkdtemp()
    common = (
        "import time, torch, opgraph as og\n"
        "from opgraph.samples import conv_bias_relu\n"
        "from opgraph.torch_interop import pack_to_device\n"
        "g = conv_bias_relu(n=32, c=64, k=64, hw=56)\n"
        "pack = pack_to_device(og.testing.random_pack(g.final, __import__('numpy').random.default_rng(0)), 'cuda')\n"
        "torch.cuda.synchronize()\n"
    )
    build = common + (f"t = time.perf_counter(); p = g.build(device='cuda', autotune=True); p.execute(pack); "
                      f"torch.cuda.synchronize(); print(round((time.perf_counter() - t) * 1e3, 1)); "
                      f"p.save('{tmp}/plan.ogplan')\n")
    load = common + ("t = time.perf_counter(); p = og.load_plan('" + tmp + "/plan.ogplan'); p.execute(pack); "
                     "torch.cuda.synchronize(); print(round((time.perf_counter() - t) * 1e3, 1))\n")
    env = {**os.environ, "OPGRAPH_CACHE_DIR": tmp}
    for label, code in (("opgraph build+tune+run", build), ("opgraph load+run", load),
                        ("opgraph build (cached tuning)+run", build)):
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
            ms = float(out.stdout.strip().splitlines()[-1])
            w.results.append(Result(w.name, label, ms * 1e3, note=f"({ms:.1f} ms)"))
            print(f"   {label:44s} {ms:9.1f} ms", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"   {label}: failed {e} {getattr(out, 'stderr', '')[-500:]}", flush=True)


WORKLOADS["cuda_graphs"] = cuda_graphs
WORKLOADS["load_vs_build"] = load_vs_build
