"""Host-side costs on tiny shapes (the device idles; what is measured is the CPU): plan.execute beside
PyTorch's eager calls and the cuDNN frontend's execute; CUDA-graph replay, update and address-table
flips of by-reference plans; building vs loading a plan in a fresh process. At most a few hundred
calls between synchronisations (bench.measure.MAX_CALLS)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Any

import opgraph as og

from ..case import Case, Ctx, Impl, Output, Runner
from ..core.registry import workload
from ..ours import engines_of, out_like
from ..peers import cudnn_fe
from ..peers.torch_peers import EAGER_ENGINE
from .common import DT


def _tiny_conv(ctx: Ctx) -> tuple:
    import torch
    import torch.nn.functional as F

    x = ctx.randn(1, 64, 8, 8, channels_last=True)
    w = ctx.randn(64, 64, 1, 1, scale=0.125, channels_last=True)
    b = ctx.randn(64, scale=0.5)
    ref = lambda: [torch.relu(F.conv2d(x.double(), w.double(), b.double()))]  # noqa: E731
    return x, w, b, ref


@workload(
    "host.execute_tiny_conv", group="host", kind="host", title="host time per call: conv1x1+bias+relu N1 C64 8² fp16"
)
def execute_tiny_conv(ctx: Ctx) -> Case:
    import torch
    import torch.nn.functional as F

    x, w, b, ref = _tiny_conv(ctx)
    b4 = b.view(1, 64, 1, 1)
    g = og.Graph("tiny", io_data_type=DT.HALF)
    X, W, B = g.tensor_like(x, name="x"), g.tensor_like(w, name="w"), g.tensor_like(b4, name="b")
    Y = g.relu(g.bias(g.conv_fprop(X, W), B)).set_output(True).set_name("y")
    g.validate()

    def ours(uid_keys: bool) -> Runner:
        plan = g.build(device=ctx.device)
        pack = {X: x, W: w, B: b4, Y: out_like(g.final.tensors[Y.uid], ctx.device)}
        bufs = [pack[Y]]
        if uid_keys:
            pack = {t.uid: v for t, v in pack.items()}
        return Runner(call=lambda: plan.execute(pack), outputs=bufs, engine=engines_of(plan), keep=plan)

    def eager() -> Runner:
        return Runner(call=lambda: torch.relu(F.conv2d(x, w, b)), engine=EAGER_ENGINE, notes="conv + relu launches")

    def fe_build(fg: Any, t: Any) -> list:
        y = fg.conv_fprop(image=t["x"], weight=t["w"], padding=[0, 0], stride=[1, 1], dilation=[1, 1])
        return [(fg.relu(input=fg.bias(input=y, bias=t["b"])), torch.float16)]

    impls = [
        Impl("opgraph", lambda: ours(False), role="ours", tuned=False),
        Impl("opgraph (UID keys)", lambda: ours(True), role="ours", tuned=False),
        Impl("torch eager", eager),
    ] + cudnn_fe.impls(ctx, {"x": x, "w": w, "b": b4}, fe_build, torch.float16, tune=False, public=True)
    return Case([Output("y", "float16")], ref, impls, host_only=True)


def _by_reference_plans(ctx: Ctx, which: str) -> tuple:
    """A graph for a by-reference plan with two packs (double buffering): (graph, X, outputs, the two
    inputs, the other inputs, the float64 results of both packs, output names)."""
    import torch
    import torch.nn.functional as F

    if which == "conv":
        N, C, H = ctx.pick((32, 64, 56), (8, 64, 56), (2, 8, 8))
        xs = [ctx.randn(N, C, H, H, channels_last=True) for _ in range(2)]
        w = ctx.randn(C, C, 3, 3, scale=(C * 9) ** -0.5, channels_last=True)
        b = ctx.randn(1, C, 1, 1, scale=0.5)
        g = og.Graph("conv_bias_relu", io_data_type=DT.HALF)
        X, W, B = g.tensor_like(xs[0], name="x"), g.tensor_like(w, name="w"), g.tensor_like(b, name="b")
        Y = g.relu(g.bias(g.conv_fprop(X, W, padding=1), B)).set_output(True).set_name("y")
        g.validate()
        refs = [[torch.relu(F.conv2d(x.double(), w.double(), b.view(-1).double(), padding=1))] for x in xs]
        return g, X, [Y], xs, {W: w, B: b}, refs, ["y"]
    N, C, H = ctx.pick((32, 256, 56), (8, 256, 56), (2, 8, 8))
    xs = [ctx.randn(N, C, H, H, channels_last=True) for _ in range(2)]
    st = [1, C, 1, 1]
    g = og.Graph("bn_relu", io_data_type=DT.HALF)
    X = g.tensor_like(xs[0], name="x")
    S, Bi = (g.tensor(dim=st, data_type=DT.FLOAT, name=k) for k in ("s", "b"))
    y, mean, inv = g.batchnorm(X, S, Bi, epsilon=1e-5)[:3]
    mean.set_output(True).set_name("mean")
    inv.set_output(True).set_name("inv_var")
    Y = g.relu(y).set_output(True).set_name("y")
    g.validate()
    base = {S: torch.ones(st, device=ctx.device), Bi: torch.zeros(st, device=ctx.device)}

    def ref(x: Any) -> list[Any]:
        xd = x.double()
        m, v = xd.mean((0, 2, 3)), xd.var((0, 2, 3), unbiased=False)
        return [torch.relu(F.batch_norm(xd, None, None, training=True, eps=1e-5)), m, (v + 1e-5).rsqrt()]

    return g, X, [Y, mean, inv], xs, base, [ref(x) for x in xs], ["y", "mean", "inv_var"]


def cuda_graph_ops(ctx: Ctx, which: str) -> Case:
    """Host µs per step of a by-reference plan: execute, graph replay, update + replay, address-table
    flip + replay, update alone. Each is checked on both packs (outputs 0 from x0, 1 from x1)."""
    g, X, outs, xs, base, refs, names = _by_reference_plans(ctx, which)
    state: dict[str, Any] = {}

    def common() -> tuple:
        if "plan" not in state:
            plan = g.build(device=ctx.device, by_reference=True)
            bufs = [[out_like(g.final.tensors[o.uid], ctx.device) for o in outs] for _ in range(2)]
            packs = [{**base, X: xs[i], **dict(zip(outs, bufs[i]))} for i in range(2)]
            state["plan"] = (plan, packs, bufs)
        return state["plan"]

    def runner(kind: str) -> Runner:
        plan, packs, bufs = common()
        graph = plan.populate_cuda_graph(packs[0]) if kind != "execute" else None
        flip = {"i": 0}

        def point(i: int) -> None:  # the address table at pack i: no update call, no re-capture
            plan.set_address(X, xs[i])
            for o, buf in zip(outs, bufs[i]):
                plan.set_address(o, buf)

        def both_updates() -> None:
            for i in (0, 1):
                plan.update_cuda_graph(graph, packs[i])
                graph.replay()

        def both_flips() -> None:
            for i in (0, 1):
                point(i)
                graph.replay()

        def toggle() -> int:
            flip["i"] ^= 1
            return flip["i"]

        if kind == "execute":
            call, check = (lambda: plan.execute(packs[0])), (lambda: [plan.execute(p) for p in packs])
        elif kind == "replay":
            call, check = graph.replay, both_updates
        elif kind == "update+replay":
            call, check = (lambda: (plan.update_cuda_graph(graph, packs[toggle()]), graph.replay())), both_updates
        elif kind == "flip+replay":
            call, check = (lambda: (point(toggle()), graph.replay())), both_flips
        else:  # update alone
            call, check = (lambda: plan.update_cuda_graph(graph, packs[toggle()])), both_updates
        launches = sum(len(st.kernel.generated.launches) for st in plan.steps if hasattr(st.kernel, "generated"))
        return Runner(
            call=call,
            check_call=check,
            outputs=bufs[0] + bufs[1],
            engine=engines_of(plan),
            keep=(plan, graph),
            notes=f"{len(plan.steps)} steps, {launches} launches",
        )

    kinds = ("execute", "replay", "update+replay", "flip+replay", "update alone")
    impls = [
        Impl(
            f"opgraph {k}",
            (lambda k=k: runner(k)),
            role="ours",
            needs=frozenset({"cuda"}) if k != "execute" else frozenset(),
        )
        for k in kinds
    ]
    dtypes = {"y": "float16", "mean": "float32", "inv_var": "float32"}
    outputs = [Output(f"{n}{i}", dtypes[n]) for i in (0, 1) for n in names]
    return Case(
        outputs,
        lambda: refs[0] + refs[1],
        impls,
        host_only=True,
        notes="no peer: the tolerance is the type's fallback (bench.core.tolerance.FALLBACK)",
    )


for _which, _title in (("conv", "conv3x3+bias+relu N32 C64 56²"), ("bn", "batchnorm+relu N32 C256 56²")):
    workload(
        f"host.cuda_graph_ops.{_which}",
        group="host",
        kind="host",
        title=f"host µs per step of a by-reference plan, {_title}",
    )((lambda w: lambda ctx: cuda_graph_ops(ctx, w))(_which))


FRESH = """
import time, json, numpy as np, torch, opgraph as og
t0 = time.perf_counter()
from opgraph.tools.samples import conv_bias_relu
from opgraph.core.torch_interop import pack_to_device, torch_to_numpy
g = conv_bias_relu(n={n}, c={c}, k={c}, hw={hw})
host = og.testing.random_pack(g.final, np.random.default_rng(0))
pack = pack_to_device(host, '{device}')
t1 = time.perf_counter()
p = og.load_plan('{path}') if {load} else g.build(device='{device}', autotune={tune})
p.execute(pack)
if torch.cuda.is_available(): torch.cuda.synchronize()
t2 = time.perf_counter()
if {save}: p.save('{path}')
(uid,) = g.final.outputs
want = og.testing.reference_outputs(g.final, host)[uid].astype(np.float64)
got = torch_to_numpy(pack[uid]).astype(np.float64)
err = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300)) if np.isfinite(got).all() else float('nan')
print(json.dumps(dict(ms=(t2 - t1) * 1e3, total_ms=(t2 - t0) * 1e3, err=err)))
"""


@workload(
    "host.build_vs_load",
    group="host",
    kind="host",
    minutes=1.0,
    title="fresh process: build (tuned, cold cache), build (tuning cached), load a saved plan; first result ms",
)
def build_vs_load(ctx: Ctx) -> Case:
    import json

    import torch

    n, c, hw = ctx.pick((32, 64, 56), (8, 64, 56), (1, 8, 8))
    tmp = tempfile.mkdtemp(prefix="opgraph-bench-")
    path = os.path.join(tmp, "plan.ogplan")
    env = {**os.environ, "OPGRAPH_CACHE_DIR": tmp}
    device = "cuda" if ctx.cuda else "cpu"

    def fresh(load: bool, tune: bool, save: bool) -> Runner:
        code = FRESH.format(n=n, c=c, hw=hw, device=device, path=path, load=load, tune=tune and ctx.cuda, save=save)
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False
        )
        if out.returncode != 0:
            raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed")
        d = json.loads(out.stdout.strip().splitlines()[-1])
        return Runner(
            call=lambda: None,
            measured={"fresh_ms": d["ms"]},
            errors={"y": d["err"]},
            notes=f"{d['total_ms']:.0f} ms with imports and data",
            engine="opgraph",
        )

    impls = [
        Impl("build + tune (cold cache) + run", lambda: fresh(False, True, True), role="ours"),
        Impl("build (tuning cached) + run", lambda: fresh(False, True, False), role="ours"),
        Impl("load saved plan + run", lambda: fresh(True, False, False), role="ours"),
    ]
    return Case(
        [Output("y", "float16")],
        lambda: [torch.zeros(1)],
        impls,
        host_only=True,
        notes="each in a fresh process, in this order; y checked there against the reference engine "
        "(no peer: the fp16 fallback tolerance)",
    )
