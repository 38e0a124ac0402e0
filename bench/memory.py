"""Memory-bound workloads (issue 3): pointwise chains and DAGs, batchnorm forward and backward,
layernorm forward and backward."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import opgraph as og

from .common import DEV, cl, like, out_like, randn, run_compiled, run_opgraph
from .harness import Session, relerr

DT = og.DataType


def pointwise_chain(s: Session, autotune: bool) -> None:
    n = 64 * 1024 * 1024
    w = s.workload("relu(x*s + b + r) 64M fp16", "memory", bytes=3 * n * 2)
    x, r = randn(n), randn(n)
    sc = torch.tensor([0.5], device=DEV, dtype=torch.float16)
    bb = torch.tensor([0.1], device=DEV, dtype=torch.float16)
    ref = lambda: torch.relu(x.double() * sc.double() + bb.double() + r.double())  # noqa: E731
    g = og.Graph("pointwise_chain", io_data_type=DT.HALF)
    X, R, S, B = like(g, x, "x"), like(g, r, "r"), like(g, sc, "s"), like(g, bb, "b")
    Y = g.relu(g.add(g.add(g.mul(X, S), B), R)).set_output(True).set_name("y")
    g.validate()
    y = out_like(Y)
    run_opgraph(s, w, g, {X: x, R: r, S: sc, B: bb, Y: y}, {Y: ref}, autotune=autotune)
    f = lambda x, s_, b, r: torch.relu(x * s_ + b + r)  # noqa: E731
    s.run(w, "torch eager", lambda: f(x, sc, bb, r), check=lambda: relerr(f(x, sc, bb, r), ref()))
    run_compiled(s, w, f, (x, sc, bb, r))


def pointwise_dag(s: Session, autotune: bool) -> None:
    n = 32 * 1024 * 1024
    w = s.workload("6-op pointwise DAG, 2 outputs, 32M fp16", "memory", bytes=4 * n * 2)
    a, b = randn(n), randn(n)

    def f(a, b):
        t = a * 0.5 + b
        u = torch.sigmoid(t) * a
        return torch.relu(u - b), torch.tanh(t)

    g = og.Graph("pointwise_dag", io_data_type=DT.HALF)
    A, B = like(g, a, "a"), like(g, b, "b")
    t = g.add(g.mul(A, 0.5), B)
    u = g.mul(g.sigmoid(t), A)
    Y1 = g.relu(g.sub(u, B)).set_output(True).set_name("y1")
    Y2 = g.tanh(t).set_output(True).set_name("y2")
    g.validate()
    y1, y2 = out_like(Y1), out_like(Y2)
    run_opgraph(s, w, g, {A: a, B: b, Y1: y1, Y2: y2},
                {Y1: lambda: f(a.double(), b.double())[0], Y2: lambda: f(a.double(), b.double())[1]},
                autotune=autotune)
    s.run(w, "torch eager", lambda: f(a, b), check=lambda: relerr(f(a, b)[0], f(a.double(), b.double())[0]))
    run_compiled(s, w, f, (a, b))


def batchnorm_relu(s: Session, autotune: bool) -> None:
    N, C, H = 32, 256, 56
    w = s.workload("batchnorm training + relu N32 C256 56² fp16", "memory", bytes=2 * N * C * H * H * 2)
    x = randn(N, C, H, H, channels_last=True)
    gam, bet = randn(C, dtype=torch.float32), randn(C, dtype=torch.float32)
    rm, rv = torch.zeros(C, device=DEV), torch.ones(C, device=DEV)

    def ref():
        return torch.relu(F.batch_norm(x.double(), None, None, gam.double(), bet.double(), training=True, eps=1e-5))

    g = og.Graph("bn_relu", io_data_type=DT.HALF)
    X = like(g, x, "x")
    stat = [1, C, 1, 1]
    SC = g.tensor(dim=stat, data_type=DT.FLOAT, name="scale")
    BI = g.tensor(dim=stat, data_type=DT.FLOAT, name="bias")
    RM = g.tensor(dim=stat, data_type=DT.FLOAT, name="rm")
    RV = g.tensor(dim=stat, data_type=DT.FLOAT, name="rv")
    y, mean, inv, nrm, nrv = g.batchnorm(X, SC, BI, in_running_mean=RM, in_running_var=RV, epsilon=1e-5,
                                         momentum=0.1, name="bn")
    for t, n in ((mean, "mean"), (inv, "inv_var"), (nrm, "next_rm"), (nrv, "next_rv")):
        t.set_output(True).set_name(n)
    Y = g.relu(y).set_output(True).set_name("y")
    g.validate()
    pack = {X: x, SC: gam.view(stat), BI: bet.view(stat), RM: rm.view(stat), RV: rv.view(stat), Y: out_like(Y),
            mean: out_like(mean), inv: out_like(inv), nrm: out_like(nrm), nrv: out_like(nrv)}
    run_opgraph(s, w, g, pack, {Y: ref}, autotune=autotune)
    f = lambda x, rm, rv, g_, b: torch.relu(F.batch_norm(x, rm, rv, g_, b, training=True))  # noqa: E731
    s.run(w, "torch eager", lambda: f(x, rm, rv, gam, bet), check=lambda: relerr(f(x, rm, rv, gam, bet), ref()))
    run_compiled(s, w, f, (x, rm, rv, gam, bet))


def batchnorm_backward(s: Session, autotune: bool) -> None:
    N, C, H = 32, 256, 56
    w = s.workload("batchnorm backward (dX, dscale, dbias) N32 C256 56² fp16", "memory", bytes=3 * N * C * H * H * 2)
    x = randn(N, C, H, H, channels_last=True)
    dy = randn(N, C, H, H, channels_last=True)
    gam = randn(C, dtype=torch.float32)
    mean = x.float().mean((0, 2, 3))
    inv = torch.rsqrt(x.float().var((0, 2, 3), unbiased=False) + 1e-5)

    def ref():
        xd = x.double().requires_grad_()
        gd = gam.double().requires_grad_()
        yd = F.batch_norm(xd, None, None, gd, torch.zeros_like(gd), training=True, eps=1e-5)
        return torch.autograd.grad(yd, xd, dy.double())[0]

    g = og.Graph("bn_bwd", io_data_type=DT.HALF)
    stat = [1, C, 1, 1]
    X, DY = like(g, x, "x"), like(g, dy, "dy")
    SC = g.tensor(dim=stat, data_type=DT.FLOAT, name="scale")
    M = g.tensor(dim=stat, data_type=DT.FLOAT, name="mean")
    IV = g.tensor(dim=stat, data_type=DT.FLOAT, name="inv_var")
    DX, DS, DB = g.batchnorm_backward(DY, X, SC, mean=M, inv_variance=IV, name="bnb")
    DX.set_output(True).set_name("dx")
    DS.set_output(True).set_name("dscale")
    DB.set_output(True).set_name("dbias")
    g.validate()
    pack = {X: x, DY: dy, SC: gam.view(stat), M: mean.view(stat), IV: inv.view(stat), DX: out_like(DX),
            DS: out_like(DS), DB: out_like(DB)}
    run_opgraph(s, w, g, pack, {DX: ref}, autotune=autotune)
    xr = x.detach().requires_grad_()
    gr = gam.detach().requires_grad_()
    br = torch.zeros_like(gr, requires_grad=True)
    yr = F.batch_norm(xr, None, None, gr, br, training=True)
    s.run(w, "torch eager", lambda: torch.autograd.grad(yr, (xr, gr, br), dy, retain_graph=True),
          check=lambda: relerr(torch.autograd.grad(yr, (xr,), dy, retain_graph=True)[0], ref()),
          note="(autograd bn backward)")


def layernorm(s: Session, autotune: bool) -> None:
    M, Nn = 8192, 4096
    w = s.workload("layernorm forward [8192, 4096] bf16", "memory", bytes=2 * M * Nn * 2)
    x = randn(M, Nn, dtype=torch.bfloat16)
    wt, bt = randn(Nn, dtype=torch.bfloat16), randn(Nn, dtype=torch.bfloat16)
    ref = lambda: F.layer_norm(x.double(), (Nn,), wt.double(), bt.double())  # noqa: E731
    g = og.Graph("ln", io_data_type=DT.BFLOAT16)
    X = like(g, x, "x")
    W = g.tensor(dim=[1, Nn], data_type=DT.BFLOAT16, name="scale")
    B = g.tensor(dim=[1, Nn], data_type=DT.BFLOAT16, name="bias")
    Y, MEAN, INV = g.layernorm(og.NormForwardPhase.TRAINING, X, scale=W, bias=B, epsilon=1e-5, name="ln")
    Y.set_output(True).set_name("y")
    MEAN.set_output(True).set_name("mean")
    INV.set_output(True).set_name("inv_var")
    g.validate()
    pack = {X: x, W: wt.view(1, Nn), B: bt.view(1, Nn), Y: out_like(Y), MEAN: out_like(MEAN), INV: out_like(INV)}
    run_opgraph(s, w, g, pack, {Y: ref}, autotune=autotune)
    f = lambda x, w_, b: F.layer_norm(x, (Nn,), w_, b)  # noqa: E731
    s.run(w, "torch eager", lambda: f(x, wt, bt), check=lambda: relerr(f(x, wt, bt), ref()))
    run_compiled(s, w, f, (x, wt, bt))

    w = s.workload("layernorm backward [8192, 4096] bf16", "memory", bytes=3 * M * Nn * 2)
    dy = randn(M, Nn, dtype=torch.bfloat16)
    mean = x.float().mean(1, keepdim=True)
    inv = torch.rsqrt(x.float().var(1, unbiased=False, keepdim=True) + 1e-5)

    def bref():
        xd = x.double().requires_grad_()
        return torch.autograd.grad(F.layer_norm(xd, (Nn,), wt.double(), bt.double()), xd, dy.double())[0]

    g = og.Graph("ln_bwd", io_data_type=DT.BFLOAT16)
    X, DY = like(g, x, "x"), like(g, dy, "dy")
    W = g.tensor(dim=[1, Nn], data_type=DT.BFLOAT16, name="scale")
    MN = g.tensor(dim=[M, 1], data_type=DT.FLOAT, name="mean")
    IV = g.tensor(dim=[M, 1], data_type=DT.FLOAT, name="inv_var")
    DX, DS, DB = g.layernorm_backward(DY, X, W, MN, IV, name="lnb")
    DX.set_output(True).set_name("dx")
    DS.set_output(True).set_name("dscale")
    DB.set_output(True).set_name("dbias")
    g.validate()
    pack = {X: x, DY: dy, W: wt.view(1, Nn), MN: mean, IV: inv, DX: out_like(DX), DS: out_like(DS), DB: out_like(DB)}
    run_opgraph(s, w, g, pack, {DX: bref}, autotune=autotune)
    xr = x.detach().requires_grad_()
    wr, br = wt.detach().requires_grad_(), bt.detach().requires_grad_()
    yr = F.layer_norm(xr, (Nn,), wr, br)
    s.run(w, "torch eager", lambda: torch.autograd.grad(yr, (xr, wr, br), dy, retain_graph=True),
          check=lambda: relerr(torch.autograd.grad(yr, (xr,), dy, retain_graph=True)[0], bref()),
          note="(autograd)")

    def fb(x, w_, b, dy):
        x = x.detach().requires_grad_()
        y = F.layer_norm(x, (Nn,), w_, b)
        return torch.autograd.grad(y, (x,), dy)

    run_compiled(s, w, fb, (x, wt, bt, dy), note="(fwd+bwd)")


WORKLOADS = {
    "pointwise": pointwise_chain, "dag": pointwise_dag, "bn": batchnorm_relu, "bn_bwd": batchnorm_backward,
    "layernorm": layernorm,
}
_ = cl
