"""GEMM-class workloads (issue 4): conv+bias+relu on ResNet-50 shapes, depthwise conv, SBR->conv->
genstats, dgrad+drelu, wgrad (+SBR), matmul+bias+gelu."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import opgraph as og

from . import peers
from .common import DEV, like, out_like, randn, run_compiled, run_opgraph
from .harness import Session, relerr

DT = og.DataType
CONV_SHAPES = [  # name, N, C, H, K, R, pad, stride
    ("3x3 C64->K64 56²", 32, 64, 56, 64, 3, 1, 1),
    ("1x1 C256->K64 56²", 32, 256, 56, 64, 1, 0, 1),
    ("3x3 C256->K256 14²", 32, 256, 14, 256, 3, 1, 1),
    ("3x3 C512->K512 7²", 32, 512, 7, 512, 3, 1, 1),
]


def conv_bias_relu(s: Session, autotune: bool) -> None:
    for name, N, C, H, K, R, pad, stride in CONV_SHAPES:
        P = (H + 2 * pad - R) // stride + 1
        w_ = s.workload(f"conv {name} +bias+relu N32 fp16", "gemm", flops=2 * N * K * P * P * C * R * R,
                        bytes=2 * (N * C * H * H + K * C * R * R + N * K * P * P))
        x = randn(N, C, H, H, channels_last=True)
        w = randn(K, C, R, R, scale=(C * R * R) ** -0.5, channels_last=True)
        b = randn(1, K, 1, 1, channels_last=True)
        ref = lambda: torch.relu(F.conv2d(x.double(), w.double(), b.view(-1).double(), padding=pad, stride=stride))  # noqa: E731,E501
        g = og.Graph(f"conv_bias_relu_{C}_{K}_{R}_{H}", io_data_type=DT.HALF)
        X, W, B = like(g, x, "x"), like(g, w, "w"), like(g, b, "b")
        Y = g.relu(g.bias(g.conv_fprop(X, W, padding=pad, stride=stride), B)).set_output(True).set_name("y")
        g.validate()
        run_opgraph(s, w_, g, {X: x, W: w, B: b, Y: out_like(Y)}, {Y: ref}, autotune=autotune)
        f = lambda x, w, b: torch.relu(F.conv2d(x, w, b, padding=pad, stride=stride))  # noqa: E731
        s.run(w_, "torch eager", lambda: f(x, w, b.view(-1)), check=lambda: relerr(f(x, w, b.view(-1)), ref()))
        run_compiled(s, w_, f, (x, w, b.view(-1)))
        if peers.available():
            holder = {}

            def cfe():
                if "run" not in holder:
                    holder["out"], holder["run"] = peers.conv_bias_relu(x, w, b, pad, stride)
                holder["run"]()

            s.run(w_, "cuDNN frontend", cfe, check=lambda: relerr(holder["out"], ref()))


def depthwise(s: Session, autotune: bool) -> None:
    N, C, H = 32, 256, 28
    w_ = s.workload("depthwise 3x3 +bias+relu N32 C256 28² fp16", "gemm", bytes=2 * 2 * N * C * H * H)
    x = randn(N, C, H, H, channels_last=True)
    w = randn(C, 1, 3, 3, scale=1 / 3, channels_last=True)
    b = randn(1, C, 1, 1, channels_last=True)
    ref = lambda: torch.relu(F.conv2d(x.double(), w.double(), b.view(-1).double(), padding=1, groups=C))  # noqa: E731
    g = og.Graph("depthwise", io_data_type=DT.HALF)
    X, W, B = like(g, x, "x"), like(g, w, "w"), like(g, b, "b")
    Y = g.relu(g.bias(g.conv_fprop(X, W, padding=1), B)).set_output(True).set_name("y")
    g.validate()
    run_opgraph(s, w_, g, {X: x, W: w, B: b, Y: out_like(Y)}, {Y: ref}, autotune=autotune)
    f = lambda x, w, b: torch.relu(F.conv2d(x, w, b, padding=1, groups=C))  # noqa: E731
    s.run(w_, "torch eager", lambda: f(x, w, b.view(-1)), check=lambda: relerr(f(x, w, b.view(-1)), ref()))
    run_compiled(s, w_, f, (x, w, b.view(-1)))


def sbr_conv_genstats(s: Session, autotune: bool) -> None:
    N, C, H, K = 32, 64, 56, 64
    w_ = s.workload("scale+bias+relu -> conv3x3 -> genstats N32 C64 56² fp16", "gemm",
                    flops=2 * N * K * H * H * C * 9, bytes=2 * 2 * N * C * H * H)
    x = randn(N, C, H, H, channels_last=True)
    w = randn(K, C, 3, 3, scale=1 / 24, channels_last=True)
    sc = (torch.rand(1, C, 1, 1, device=DEV) + 0.5).half().to(memory_format=torch.channels_last)
    bb = randn(1, C, 1, 1, scale=0.1, channels_last=True)

    def ref_y():
        return F.conv2d(torch.relu(x.double() * sc.double() + bb.double()), w.double(), padding=1)

    g = og.Graph("sbr_conv_genstats", io_data_type=DT.HALF)
    X, W, S, B = like(g, x, "x"), like(g, w, "w"), like(g, sc, "s"), like(g, bb, "b")
    # the conv's input (the SBR output) declared fp16: what cuDNN's fused graph computes with too
    act = g.relu(g.bias(g.scale(X, S), B)).set_data_type(DT.HALF)
    Y = g.conv_fprop(act, W, padding=1).set_output(True).set_name("y")
    SUM, SQ = g.genstats(Y)
    SUM.set_output(True).set_name("sum")
    SQ.set_output(True).set_name("sq_sum")
    g.validate()
    pack = {X: x, W: w, S: sc, B: bb, Y: out_like(Y), SUM: out_like(SUM), SQ: out_like(SQ)}
    run_opgraph(s, w_, g, pack, {Y: ref_y, SUM: lambda: ref_y().sum((0, 2, 3)).view(1, K, 1, 1)},
                autotune=autotune)

    def f(x, w, s_, b):
        y = F.conv2d(torch.relu(x * s_ + b), w, padding=1)
        yf = y.float()
        return y, yf.sum((0, 2, 3)), (yf * yf).sum((0, 2, 3))

    s.run(w_, "torch eager", lambda: f(x, w, sc, bb), check=lambda: relerr(f(x, w, sc, bb)[0], ref_y()))
    run_compiled(s, w_, f, (x, w, sc, bb))
    if peers.available():
        holder = {}

        def cfe():
            if "run" not in holder:
                holder["outs"], holder["run"] = peers.sbr_conv_genstats(x, w, sc, bb)
            holder["run"]()

        s.run(w_, "cuDNN frontend", cfe, check=lambda: relerr(holder["outs"][0], ref_y()))


def conv_backward(s: Session, autotune: bool) -> None:
    N, C, H, K = 32, 64, 56, 64
    flops = 2 * N * K * H * H * C * 9
    x = randn(N, C, H, H, channels_last=True)
    w = randn(K, C, 3, 3, scale=1 / 24, channels_last=True)
    dy = randn(N, K, H, H, channels_last=True)
    yfwd = randn(N, C, H, H, channels_last=True)

    w_ = s.workload("conv dgrad + drelu N32 C64 K64 56² 3x3 fp16", "gemm", flops=flops)
    dx_ref = lambda: torch.where(yfwd.double() > 0, torch.nn.grad.conv2d_input(x.shape, w.double(), dy.double(), padding=1), 0)  # noqa: E731,E501
    g = og.Graph("dgrad_drelu", io_data_type=DT.HALF)
    DY, W, YF = like(g, dy, "dy"), like(g, w, "w"), like(g, yfwd, "y")
    dx = g.conv_dgrad(DY, W, padding=1)
    DX = g.relu_backward(dx, YF).set_output(True).set_name("dx")
    g.validate()
    run_opgraph(s, w_, g, {DY: dy, W: w, YF: yfwd, DX: out_like(DX)}, {DX: dx_ref}, autotune=autotune)

    def eager_dgrad():
        d = torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                [True, False, False])[0]
        return torch.where(yfwd > 0, d, 0)

    s.run(w_, "torch eager", eager_dgrad, check=lambda: relerr(eager_dgrad(), dx_ref()))

    w_ = s.workload("conv wgrad N32 C64 K64 56² 3x3 fp16", "gemm", flops=flops)
    dw_ref = lambda: torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), padding=1)  # noqa: E731
    g = og.Graph("wgrad", io_data_type=DT.HALF)
    X, DY = like(g, x, "x"), like(g, dy, "dy")
    DW = g.conv_wgrad(X, DY, padding=1).set_output(True).set_name("dw").set_dim([K, C, 3, 3])
    DW.set_stride(list(w.stride()))
    g.validate()
    run_opgraph(s, w_, g, {X: x, DY: dy, DW: out_like(DW)}, {DW: dw_ref}, autotune=autotune)

    def eager_wgrad():
        return torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                   [False, True, False])[1]

    s.run(w_, "torch eager", eager_wgrad, check=lambda: relerr(eager_wgrad(), dw_ref()))

    w_ = s.workload("scale+bias+relu -> conv wgrad N32 C64 56² 3x3 fp16", "gemm", flops=flops)
    sc = (torch.rand(1, C, 1, 1, device=DEV) + 0.5).half().to(memory_format=torch.channels_last)
    bb = randn(1, C, 1, 1, scale=0.1, channels_last=True)
    sdw_ref = lambda: torch.nn.grad.conv2d_weight(torch.relu(x.double() * sc.double() + bb.double()), w.shape, dy.double(), padding=1)  # noqa: E731,E501
    g = og.Graph("sbr_wgrad", io_data_type=DT.HALF)
    X, DY, S, B = like(g, x, "x"), like(g, dy, "dy"), like(g, sc, "s"), like(g, bb, "b")
    act = g.relu(g.bias(g.scale(X, S), B)).set_data_type(DT.HALF)  # fp16, as the unfused eager path has it
    DW = g.conv_wgrad(act, DY, padding=1).set_output(True).set_name("dw")
    DW.set_dim([K, C, 3, 3]).set_stride(list(w.stride()))
    g.validate()
    run_opgraph(s, w_, g, {X: x, DY: dy, S: sc, B: bb, DW: out_like(DW)}, {DW: sdw_ref}, autotune=autotune)

    def eager_sbr_wgrad():
        a = torch.relu(x * sc + bb)
        return torch.ops.aten.convolution_backward(dy, a, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                   [False, True, False])[1]

    s.run(w_, "torch eager", eager_sbr_wgrad, check=lambda: relerr(eager_sbr_wgrad(), sdw_ref()))


def matmul_bias_gelu(s: Session, autotune: bool) -> None:
    M, K, Nn = 8192, 4096, 4096
    w_ = s.workload("matmul+bias+gelu 8192x4096x4096 fp16", "gemm", flops=2 * M * K * Nn,
                    bytes=2 * (M * K + K * Nn + M * Nn))
    a = randn(1, M, K)
    bm = randn(1, K, Nn, scale=K ** -0.5)
    bias = randn(1, 1, Nn)
    ref = lambda: F.gelu(a.double() @ bm.double() + bias.double())  # noqa: E731
    g = og.Graph("matmul_bias_gelu", io_data_type=DT.HALF)
    A, B, BI = like(g, a, "a"), like(g, bm, "b"), like(g, bias, "bias")
    Y = g.gelu(g.add(g.matmul(A, B), BI)).set_output(True).set_name("y")
    g.validate()
    run_opgraph(s, w_, g, {A: a, B: bm, BI: bias, Y: out_like(Y)}, {Y: ref}, autotune=autotune)
    f = lambda a, b, c: F.gelu(torch.matmul(a, b) + c)  # noqa: E731
    s.run(w_, "torch eager", lambda: f(a, bm, bias), check=lambda: relerr(f(a, bm, bias), ref()))
    run_compiled(s, w_, f, (a, bm, bias))
    if peers.available():
        holder = {}

        def cfe():
            if "run" not in holder:
                holder["out"], holder["run"] = peers.matmul_bias_gelu(a, bm, bias)
            holder["run"]()

        s.run(w_, "cuDNN frontend", cfe, check=lambda: relerr(holder["out"], ref()))


WORKLOADS = {
    "conv": conv_bias_relu, "depthwise": depthwise, "sbr_conv_genstats": sbr_conv_genstats,
    "conv_bwd": conv_backward, "matmul": matmul_bias_gelu,
}
