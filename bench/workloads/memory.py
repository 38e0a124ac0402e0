"""Memory-bound workloads: pointwise chain and DAG, batchnorm training forward (+relu) and backward,
layernorm forward and backward. Every output is checked: batchnorm's mean, inv_variance and running
statistics, layernorm's statistics and both norms' dscale and dbias included."""

from __future__ import annotations

from typing import Any

import opgraph as og

from ..case import Case, Ctx, Impl, Output, Runner
from ..core.floors import Floor
from ..core.registry import workload
from ..ours import graph_impls
from ..peers import cudnn_fe
from ..peers.torch_peers import EAGER_ENGINE, compiled, eager
from .common import DT

EPS, MOMENTUM = 1e-5, 0.1


def torch_peers(ctx: Ctx, fn: Any, args: tuple, **kw: Any) -> list[Impl]:
    return [eager(fn, args)] + compiled(fn, args, cudagraphs=ctx.compile_cudagraphs, **kw)


@workload("memory.pointwise_chain.fp16", group="memory", title="relu(x*s + b + r), 64M fp16")
def pointwise_chain(ctx: Ctx) -> Case:
    import torch

    n = ctx.pick(64 << 20, 8 << 20, 4096)
    x, r = ctx.randn(n), ctx.randn(n)
    sc = torch.tensor([0.5], device=ctx.device, dtype=torch.float16)
    bb = torch.tensor([0.1], device=ctx.device, dtype=torch.float16)

    def make() -> Any:
        g = og.Graph("pointwise_chain", io_data_type=DT.HALF)
        X, R, S, B = (g.tensor_like(t, name=k) for t, k in ((x, "x"), (r, "r"), (sc, "s"), (bb, "b")))
        Y = g.relu(g.add(g.add(g.mul(X, S), B), R)).set_output(True).set_name("y")
        g.validate()
        return g, {X: x, R: r, S: sc, B: bb}, [Y]

    def f(x: Any, s: Any, b: Any, r: Any) -> Any:
        return torch.relu(x * s + b + r)

    ref = lambda: [torch.relu(x.double() * sc.double() + bb.double() + r.double())]  # noqa: E731
    impls = graph_impls(ctx, make) + torch_peers(ctx, f, (x, sc, bb, r))
    return Case([Output("y", "float16")], ref, impls, Floor(bytes=3 * n * 2))


@workload("memory.pointwise_dag.fp16", group="memory", title="6-op pointwise DAG, 2 outputs, 32M fp16")
def pointwise_dag(ctx: Ctx) -> Case:
    import torch

    n = ctx.pick(32 << 20, 4 << 20, 4096)
    a, b = ctx.randn(n), ctx.randn(n)

    def f(a: Any, b: Any) -> Any:
        t = a * 0.5 + b
        u = torch.sigmoid(t) * a
        return torch.relu(u - b), torch.tanh(t)

    def make() -> Any:
        g = og.Graph("pointwise_dag", io_data_type=DT.HALF)
        A, B = g.tensor_like(a, name="a"), g.tensor_like(b, name="b")
        t = g.add(g.mul(A, 0.5), B)
        u = g.mul(g.sigmoid(t), A)
        Y1 = g.relu(g.sub(u, B)).set_output(True).set_name("y1")
        Y2 = g.tanh(t).set_output(True).set_name("y2")
        g.validate()
        return g, {A: a, B: b}, [Y1, Y2]

    ref = lambda: list(f(a.double(), b.double()))  # noqa: E731
    return Case(
        [Output("y1", "float16"), Output("y2", "float16")],
        ref,
        graph_impls(ctx, make) + torch_peers(ctx, f, (a, b)),
        Floor(bytes=4 * n * 2),
    )


def _bn_inputs(ctx: Ctx) -> tuple:
    import torch

    N, C, H = ctx.pick((32, 256, 56), (8, 256, 56), (2, 8, 6))
    x = ctx.randn(N, C, H, H, channels_last=True)
    gam = ctx.rand(C, dtype=torch.float32, lo=0.5, hi=1.5)
    bet = ctx.randn(C, dtype=torch.float32, scale=0.1)
    return N, C, H, x, gam, bet


@workload(
    "memory.batchnorm_fwd_relu.fp16",
    group="memory",
    title="batchnorm training + relu, N32 C256 56² fp16 (y, mean, inv_var, running stats)",
)
def batchnorm_forward(ctx: Ctx) -> Case:
    import torch

    N, C, H, x, gam, bet = _bn_inputs(ctx)
    rm0 = ctx.randn(C, dtype=torch.float32, scale=0.1)
    rv0 = ctx.rand(C, dtype=torch.float32, lo=0.5, hi=1.5)
    st = [1, C, 1, 1]

    def ref() -> list[Any]:
        xd = x.double()
        mean = xd.mean((0, 2, 3))
        var = xd.var((0, 2, 3), unbiased=False)
        inv = (var + EPS).rsqrt()
        y = torch.relu((xd - mean.view(st)) * inv.view(st) * gam.double().view(st) + bet.double().view(st))
        m = N * H * H
        return [
            y,
            mean,
            inv,
            (1 - MOMENTUM) * rm0.double() + MOMENTUM * mean,
            (1 - MOMENTUM) * rv0.double() + MOMENTUM * var * m / (m - 1),
        ]

    def make() -> Any:
        g = og.Graph("bn_relu", io_data_type=DT.HALF)
        X = g.tensor_like(x, name="x")
        SC, BI, RM, RV = (g.tensor(dim=st, data_type=DT.FLOAT, name=k) for k in ("scale", "bias", "rm", "rv"))
        y, mean, inv, nrm, nrv = g.batchnorm(
            X, SC, BI, in_running_mean=RM, in_running_var=RV, epsilon=EPS, momentum=MOMENTUM, name="bn"
        )
        for t, k in ((mean, "mean"), (inv, "inv_var"), (nrm, "next_rm"), (nrv, "next_rv")):
            t.set_output(True).set_name(k)
        Y = g.relu(y).set_output(True).set_name("y")
        g.validate()
        inputs = {X: x, SC: gam.view(st), BI: bet.view(st), RM: rm0.view(st), RV: rv0.view(st)}
        return g, inputs, [Y, mean, inv, nrm, nrv]

    def bn(x: Any, g_: Any, b: Any, rm: Any, rv: Any) -> Any:
        y, mean, invstd, _ = torch.ops.aten._batch_norm_with_update(x, g_, b, rm, rv, MOMENTUM, EPS)
        return torch.relu(y), mean, invstd

    def stateful(call_of: Any) -> list[Impl]:
        """Peers update running stats in place (PyTorch's semantics): each gets its own buffers, reset to
        the initial values before a check and read back as the next_rm / next_rv outputs."""
        rm, rv = rm0.clone(), rv0.clone()
        reset = lambda: (rm.copy_(rm0), rv.copy_(rv0))  # noqa: E731
        read = lambda ret: [ret[0], ret[1], ret[2], rm, rv]  # noqa: E731
        return call_of(rm, rv, reset, read)

    def eager_impl(rm: Any, rv: Any, reset: Any, read: Any) -> list[Impl]:
        def setup() -> Runner:
            return Runner(
                call=lambda: bn(x, gam, bet, rm, rv),
                read=read,
                reset=reset,
                engine=EAGER_ENGINE + ": _batch_norm_with_update (cuDNN where it applies) + relu",
            )

        return [Impl("torch eager", setup)]

    def compiled_impls(rm: Any, rv: Any, reset: Any, read: Any) -> list[Impl]:
        return compiled(bn, (x, gam, bet, rm, rv), cudagraphs=ctx.compile_cudagraphs, read=read, reset=reset)

    def fe_build(g: Any, t: Any) -> list:
        y, mean, inv, nrm, nrv = g.batchnorm(
            input=t["x"],
            scale=t["scale"],
            bias=t["bias"],
            in_running_mean=t["rm"],
            in_running_var=t["rv"],
            epsilon=t["eps"],
            momentum=t["momentum"],
            name="bn",
        )
        return [(g.relu(input=y, name="relu"), torch.float16)] + [(o, torch.float32) for o in (mean, inv, nrm, nrv)]

    fe_inputs = {
        "x": x,
        "scale": gam.view(st),
        "bias": bet.view(st),
        "rm": rm0.view(st),
        "rv": rv0.view(st),
        "eps": torch.full((1, 1, 1, 1), EPS),
        "momentum": torch.full((1, 1, 1, 1), MOMENTUM),
    }
    impls = (
        graph_impls(ctx, make)
        + stateful(eager_impl)
        + stateful(compiled_impls)
        + cudnn_fe.impls(ctx, fe_inputs, fe_build, torch.float16)
    )
    outs = [Output("y", "float16")] + [Output(k, "float32") for k in ("mean", "inv_var", "next_rm", "next_rv")]
    act = N * C * H * H * 2
    floor = Floor(
        bytes=2 * act,
        alt_bytes=(("two passes: statistics, then normalize", 3 * act),),
        note="the input (51 MB) does not fit in L2 (50 MB on an H100): two passes read it twice",
    )
    return Case(outs, ref, impls, floor)


@workload(
    "memory.batchnorm_bwd.fp16", group="memory", title="batchnorm backward (dx, dscale, dbias), N32 C256 56² fp16"
)
def batchnorm_backward(ctx: Ctx) -> Case:
    import torch

    N, C, H, x, gam, bet = _bn_inputs(ctx)
    dy = ctx.randn(N, C, H, H, channels_last=True)
    rm, rv = torch.zeros(C, device=ctx.device), torch.ones(C, device=ctx.device)
    _, save_mean, save_invstd, reserve = torch.ops.aten._batch_norm_with_update(x, gam, bet, rm, rv, MOMENTUM, EPS)
    st = [1, C, 1, 1]

    def ref() -> list[Any]:
        xd, dyd = x.double(), dy.double()
        mean, inv, w = save_mean.double().view(st), save_invstd.double().view(st), gam.double().view(st)
        xhat = (xd - mean) * inv
        m = N * H * H
        dbias = dyd.sum((0, 2, 3))
        dscale = (dyd * xhat).sum((0, 2, 3))
        dx = w * inv / m * (m * dyd - dbias.view(st) - xhat * dscale.view(st))
        return [dx, dscale, dbias]

    def make() -> Any:
        g = og.Graph("bn_bwd", io_data_type=DT.HALF)
        X, DY = g.tensor_like(x, name="x"), g.tensor_like(dy, name="dy")
        SC, M, IV = (g.tensor(dim=st, data_type=DT.FLOAT, name=k) for k in ("scale", "mean", "inv_var"))
        DX, DS, DB = g.batchnorm_backward(DY, X, SC, mean=M, inv_variance=IV, name="bnb")
        DX.set_output(True).set_name("dx")
        DS.set_output(True).set_name("dscale").set_data_type(DT.FLOAT)
        DB.set_output(True).set_name("dbias").set_data_type(DT.FLOAT)
        g.validate()
        return g, {X: x, DY: dy, SC: gam.view(st), M: save_mean.view(st), IV: save_invstd.view(st)}, [DX, DS, DB]

    def f(dy: Any, x: Any, w: Any, mean: Any, invstd: Any, reserve: Any) -> Any:
        return torch.ops.aten.batch_norm_backward(
            dy, x, w, None, None, mean, invstd, True, EPS, [True, True, True], reserve
        )

    args = (dy, x, gam, save_mean, save_invstd, reserve)

    def fe_build(g: Any, t: Any) -> list:
        dx, ds, db = g.batchnorm_backward(
            grad=t["dy"], input=t["x"], scale=t["scale"], mean=t["mean"], inv_variance=t["inv_var"], name="bnb"
        )
        return [(dx, torch.float16), (ds, torch.float32), (db, torch.float32)]

    fe_inputs = {"dy": dy, "x": x, "scale": gam.view(st), "mean": save_mean.view(st), "inv_var": save_invstd.view(st)}
    impls = (
        graph_impls(ctx, make)
        + [eager(f, args, engine=EAGER_ENGINE + ": batch_norm_backward (autograd's op)")]
        + compiled(f, args, cudagraphs=ctx.compile_cudagraphs)
        + cudnn_fe.impls(ctx, fe_inputs, fe_build, torch.float16)
    )
    act = N * C * H * H * 2
    floor = Floor(bytes=3 * act, alt_bytes=(("two passes: reductions, then dx", 5 * act),))
    return Case([Output("dx", "float16"), Output("dscale", "float32"), Output("dbias", "float32")], ref, impls, floor)


def _ln_inputs(ctx: Ctx) -> tuple:
    import torch

    M, N = ctx.pick((8192, 4096), (2048, 4096), (16, 32))
    x = ctx.randn(M, N, dtype=torch.bfloat16)
    w = ctx.rand(N, dtype=torch.bfloat16, lo=0.5, hi=1.5)
    b = ctx.randn(N, dtype=torch.bfloat16, scale=0.1)
    return M, N, x, w, b


@workload("memory.layernorm_fwd.bf16", group="memory", title="layernorm forward [8192, 4096] bf16 (y, mean, inv_var)")
def layernorm_forward(ctx: Ctx) -> Case:
    import torch

    M, N, x, w, b = _ln_inputs(ctx)

    def ref() -> list[Any]:
        xd = x.double()
        mean = xd.mean(1, keepdim=True)
        inv = (xd.var(1, unbiased=False, keepdim=True) + EPS).rsqrt()
        return [(xd - mean) * inv * w.double() + b.double(), mean, inv]

    def make() -> Any:
        g = og.Graph("ln", io_data_type=DT.BFLOAT16)
        X = g.tensor_like(x, name="x")
        W = g.tensor(dim=[1, N], data_type=DT.BFLOAT16, name="scale")
        B = g.tensor(dim=[1, N], data_type=DT.BFLOAT16, name="bias")
        Y, MEAN, INV = g.layernorm(og.NormForwardPhase.TRAINING, X, scale=W, bias=B, epsilon=EPS, name="ln")
        Y.set_output(True).set_name("y")
        MEAN.set_output(True).set_name("mean").set_data_type(DT.FLOAT)
        INV.set_output(True).set_name("inv_var").set_data_type(DT.FLOAT)
        g.validate()
        return g, {X: x, W: w.view(1, N), B: b.view(1, N)}, [Y, MEAN, INV]

    def f(x: Any, w: Any, b: Any) -> Any:
        return torch.ops.aten.native_layer_norm(x, [N], w, b, EPS)

    def fe_build(g: Any, t: Any) -> list:
        y, mean, inv = g.layernorm(
            norm_forward_phase=module().norm_forward_phase.TRAINING,
            input=t["x"],
            scale=t["scale"],
            bias=t["bias"],
            epsilon=t["eps"],
            name="ln",
        )
        return [(y, torch.bfloat16), (mean, torch.float32), (inv, torch.float32)]

    fe_inputs = {
        "x": x.view(1, M, N),
        "scale": w.view(1, 1, N),
        "bias": b.view(1, 1, N),
        "eps": torch.full((1, 1, 1), EPS),
    }
    impls = (
        graph_impls(ctx, make)
        + torch_peers(ctx, f, (x, w, b))
        + cudnn_fe.impls(ctx, fe_inputs, fe_build, torch.bfloat16)
    )
    outs = [Output("y", "bfloat16"), Output("mean", "float32"), Output("inv_var", "float32")]
    return Case(outs, ref, impls, Floor(bytes=2 * M * N * 2 + 2 * M * 4 + 2 * N * 2))


def module() -> Any:
    return cudnn_fe.module()


@workload("memory.layernorm_bwd.bf16", group="memory", title="layernorm backward [8192, 4096] bf16 (dx, dscale, dbias)")
def layernorm_backward(ctx: Ctx) -> Case:
    import torch

    M, N, x, w, b = _ln_inputs(ctx)
    dy = ctx.randn(M, N, dtype=torch.bfloat16)
    _, mean_n, rstd_n = torch.ops.aten.native_layer_norm(x, [N], w, b, EPS)  # what PyTorch's backward reads
    mean, rstd = mean_n.float(), rstd_n.float()  # FLOAT on CUDA already (bf16 on the CPU)

    def ref() -> list[Any]:
        xd, dyd, wd = x.double(), dy.double(), w.double()
        xhat = (xd - mean.double()) * rstd.double()
        g = dyd * wd
        dx = rstd.double() * (g - g.mean(1, keepdim=True) - xhat * (g * xhat).mean(1, keepdim=True))
        return [dx, (dyd * xhat).sum(0), dyd.sum(0)]

    def make() -> Any:
        g = og.Graph("ln_bwd", io_data_type=DT.BFLOAT16)
        X, DY = g.tensor_like(x, name="x"), g.tensor_like(dy, name="dy")
        W = g.tensor(dim=[1, N], data_type=DT.BFLOAT16, name="scale")
        MN = g.tensor(dim=[M, 1], data_type=DT.FLOAT, name="mean")
        IV = g.tensor(dim=[M, 1], data_type=DT.FLOAT, name="inv_var")
        DX, DS, DB = g.layernorm_backward(DY, X, W, MN, IV, name="lnb")
        DX.set_output(True).set_name("dx")
        DS.set_output(True).set_name("dscale").set_data_type(DT.BFLOAT16)
        DB.set_output(True).set_name("dbias").set_data_type(DT.BFLOAT16)
        g.validate()
        return g, {X: x, DY: dy, W: w.view(1, N), MN: mean.view(M, 1), IV: rstd.view(M, 1)}, [DX, DS, DB]

    def f(dy: Any, x: Any, mean: Any, rstd: Any, w: Any, b: Any) -> Any:
        return torch.ops.aten.native_layer_norm_backward(dy, x, [N], mean, rstd, w, b, [True, True, True])

    def fe_build(g: Any, t: Any) -> list:
        dx, ds, db = g.layernorm_backward(
            grad=t["dy"], input=t["x"], scale=t["scale"], mean=t["mean"], inv_variance=t["inv_var"], name="lnb"
        )
        return [(dx, torch.bfloat16), (ds, torch.bfloat16), (db, torch.bfloat16)]

    fe_inputs = {
        "dy": dy.view(1, M, N),
        "x": x.view(1, M, N),
        "scale": w.view(1, 1, N),
        "mean": mean.view(1, M, 1),
        "inv_var": rstd.view(1, M, 1),
    }
    impls = (
        graph_impls(ctx, make)
        + torch_peers(ctx, f, (dy, x, mean_n, rstd_n, w, b))
        + cudnn_fe.impls(ctx, fe_inputs, fe_build, torch.bfloat16)
    )
    outs = [Output("dx", "bfloat16"), Output("dscale", "bfloat16"), Output("dbias", "bfloat16")]
    return Case(outs, ref, impls, Floor(bytes=3 * M * N * 2 + 2 * M * 4 + 3 * N * 2))
