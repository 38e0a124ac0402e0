"""Training-side convolution workloads on ResNet-50's first 3x3 (N32 C64 K64 56²), fp16 and bf16:
scale+bias+relu -> conv -> genstats (y, sum, sum of squares), dgrad + drelu, wgrad, and
scale+bias+relu -> wgrad. Peers: eager (the ops autograd runs), torch.compile, the cuDNN frontend's
fused graphs (heuristic and tuned)."""

from __future__ import annotations

import functools
from typing import Any, Callable

import opgraph as og

from ..case import Case, Ctx, Output
from ..core.floors import Floor
from ..core.registry import workload
from ..ours import graph_impls
from ..peers import cudnn_fe
from ..peers.torch_peers import compiled, eager
from .common import TORCH_TO_OG, nbytes, short, torch_dtype

PAD = 1


def _shapes(ctx: Ctx) -> tuple[int, int, int, int]:
    return ctx.pick((32, 64, 56, 64), (8, 64, 56, 64), (2, 8, 8, 8))


def _common(ctx: Ctx, dtype: str) -> dict[str, Any]:
    N, C, H, K = _shapes(ctx)
    tdt = torch_dtype(dtype)
    return dict(
        N=N,
        C=C,
        H=H,
        K=K,
        tdt=tdt,
        ogdt=TORCH_TO_OG[dtype],
        x=ctx.randn(N, C, H, H, dtype=tdt, channels_last=True),
        w=ctx.randn(K, C, 3, 3, dtype=tdt, scale=(C * 9) ** -0.5, channels_last=True),
        dy=ctx.randn(N, K, H, H, dtype=tdt, channels_last=True),
        sc=ctx.rand(1, C, 1, 1, dtype=tdt, lo=0.5, hi=1.5),
        bb=ctx.randn(1, C, 1, 1, dtype=tdt, scale=0.1),
        flops=2 * N * K * H * H * C * 9,
    )


def _peers(ctx: Ctx, f: Callable, args: tuple, fe_inputs: dict, fe_build: Callable, tdt: Any) -> list:
    return (
        [eager(f, args)]
        + compiled(f, args, cudagraphs=ctx.compile_cudagraphs)
        + cudnn_fe.impls(ctx, fe_inputs, fe_build, tdt)
    )


def _cbw(dy: Any, x: Any, w: Any, mask: list[bool]) -> Any:
    import torch

    return torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [PAD, PAD], [1, 1], False, [0, 0], 1, mask)


def sbr_conv_genstats(ctx: Ctx, dtype: str) -> Case:
    import torch
    import torch.nn.functional as F

    v = _common(ctx, dtype)
    x, w, sc, bb, K, tdt = v["x"], v["w"], v["sc"], v["bb"], v["K"], v["tdt"]

    def ref() -> list[Any]:
        y = F.conv2d(torch.relu(x.double() * sc.double() + bb.double()), w.double(), padding=PAD)
        return [y, y.sum((0, 2, 3)), (y * y).sum((0, 2, 3))]

    def make() -> Any:
        g = og.Graph("sbr_conv_genstats", io_data_type=v["ogdt"])
        X, W, S, B = (g.tensor_like(t, name=k) for t, k in ((x, "x"), (w, "w"), (sc, "s"), (bb, "b")))
        act = g.relu(g.bias(g.scale(X, S), B)).set_data_type(v["ogdt"])  # as cuDNN's fused graph and eager round it
        Y = g.conv_fprop(act, W, padding=PAD).set_output(True).set_name("y")
        SUM, SQ = g.genstats(Y)
        SUM.set_output(True).set_name("sum")
        SQ.set_output(True).set_name("sq_sum")
        g.validate()
        return g, {X: x, W: w, S: sc, B: bb}, [Y, SUM, SQ]

    def f(x: Any, w: Any, s: Any, b: Any) -> Any:
        y = F.conv2d(F.relu(torch.addcmul(b, x, s), inplace=True), w, padding=PAD)
        yf = y.float()
        return y, yf.sum((0, 2, 3)), (yf * yf).sum((0, 2, 3))

    def fe_build(g: Any, t: Any) -> list:
        a = g.relu(input=g.bias(input=g.scale(input=t["x"], scale=t["s"]), bias=t["b"]))
        y = g.conv_fprop(image=a, weight=t["w"], padding=[PAD] * 2, stride=[1, 1], dilation=[1, 1])
        s1, s2 = g.genstats(input=y)
        return [(y, tdt), (s1, torch.float32), (s2, torch.float32)]

    impls = graph_impls(ctx, make) + _peers(ctx, f, (x, w, sc, bb), {"x": x, "w": w, "s": sc, "b": bb}, fe_build, tdt)
    outs = [Output("y", dtype), Output("sum", "float32"), Output("sq_sum", "float32")]
    y_bytes = v["N"] * K * v["H"] ** 2 * x.element_size()
    return Case(outs, ref, impls, Floor(bytes=nbytes(x, w) + y_bytes, flops=v["flops"], dtype=dtype))


def dgrad_drelu(ctx: Ctx, dtype: str) -> Case:
    import torch

    v = _common(ctx, dtype)
    w, dy, tdt = v["w"], v["dy"], v["tdt"]
    yf = ctx.randn(*v["x"].shape, dtype=tdt, channels_last=True)  # the forward relu's input (mask)

    def ref() -> list[Any]:
        d = torch.nn.grad.conv2d_input(tuple(yf.shape), w.double(), dy.double(), padding=PAD)
        return [torch.where(yf.double() > 0, d, 0.0)]

    def make() -> Any:
        g = og.Graph("dgrad_drelu", io_data_type=v["ogdt"])
        DY, W, YF = g.tensor_like(dy, name="dy"), g.tensor_like(w, name="w"), g.tensor_like(yf, name="y")
        DX = g.relu_backward(g.conv_dgrad(DY, W, padding=PAD), YF).set_output(True).set_name("dx")
        g.validate()
        return g, {DY: dy, W: w, YF: yf}, [DX]

    def f(dy: Any, w: Any, yf: Any) -> Any:
        d = _cbw(dy, yf, w, [True, False, False])[0]
        return torch.ops.aten.threshold_backward(d, yf, 0)

    def fe_build(g: Any, t: Any) -> list:
        d = g.conv_dgrad(loss=t["dy"], filter=t["w"], padding=[PAD] * 2, stride=[1, 1], dilation=[1, 1])
        d.set_dim(list(yf.shape)).set_stride(list(yf.stride()))
        return [(g.relu_backward(loss=d, input=t["y"]), tdt)]

    impls = graph_impls(ctx, make) + _peers(ctx, f, (dy, w, yf), {"dy": dy, "w": w, "y": yf}, fe_build, tdt)
    return Case([Output("dx", dtype)], ref, impls, Floor(bytes=nbytes(dy, w, yf, yf), flops=v["flops"], dtype=dtype))


def _wgrad_case(ctx: Ctx, dtype: str, sbr: bool) -> Case:
    import torch
    import torch.nn.functional as F

    v = _common(ctx, dtype)
    x, w, dy, sc, bb, tdt = v["x"], v["w"], v["dy"], v["sc"], v["bb"], v["tdt"]

    def ref() -> list[Any]:
        a = torch.relu(x.double() * sc.double() + bb.double()) if sbr else x.double()
        return [torch.nn.grad.conv2d_weight(a, tuple(w.shape), dy.double(), padding=PAD)]

    def make() -> Any:
        g = og.Graph("sbr_wgrad" if sbr else "wgrad", io_data_type=v["ogdt"])
        X, DY = g.tensor_like(x, name="x"), g.tensor_like(dy, name="dy")
        inputs = {X: x, DY: dy}
        a = X
        if sbr:
            S, B = g.tensor_like(sc, name="s"), g.tensor_like(bb, name="b")
            a = g.relu(g.bias(g.scale(X, S), B)).set_data_type(v["ogdt"])  # fp16/bf16, as eager has it
            inputs.update({S: sc, B: bb})
        DW = g.conv_wgrad(a, DY, padding=PAD).set_output(True).set_name("dw")
        DW.set_dim(list(w.shape)).set_stride(list(w.stride()))
        g.validate()
        return g, inputs, [DW]

    def f(x: Any, dy: Any, w: Any, *sb: Any) -> Any:
        a = F.relu(torch.addcmul(sb[1], x, sb[0]), inplace=True) if sb else x
        return _cbw(dy, a, w, [False, True, False])[1]

    def fe_build(g: Any, t: Any) -> list:
        a = t["x"]
        if sbr:
            a = g.relu(input=g.bias(input=g.scale(input=a, scale=t["s"]), bias=t["b"]))
        dw = g.conv_wgrad(image=a, loss=t["dy"], padding=[PAD] * 2, stride=[1, 1], dilation=[1, 1])
        dw.set_dim(list(w.shape)).set_stride(list(w.stride()))
        return [(dw, tdt)]

    args = (x, dy, w) + ((sc, bb) if sbr else ())
    fe_inputs = {"x": x, "dy": dy, **({"s": sc, "b": bb} if sbr else {})}
    impls = graph_impls(ctx, make) + _peers(ctx, f, args, fe_inputs, fe_build, tdt)
    return Case([Output("dw", dtype)], ref, impls, Floor(bytes=nbytes(x, dy, w), flops=v["flops"], dtype=dtype))


CASES = (
    ("sbr_conv_genstats", "scale+bias+relu → conv3x3 → genstats N32 C64 56²", sbr_conv_genstats),
    ("dgrad_drelu", "conv dgrad + drelu N32 C64 K64 56² 3x3", dgrad_drelu),
    ("wgrad", "conv wgrad N32 C64 K64 56² 3x3", functools.partial(_wgrad_case, sbr=False)),
    ("sbr_wgrad", "scale+bias+relu → conv wgrad N32 C64 56² 3x3", functools.partial(_wgrad_case, sbr=True)),
)

for _dt in ("float16", "bfloat16"):
    for _key, _title, _fn in CASES:
        workload(
            f"conv_bwd.{_key}.{short(_dt)}", group=f"conv-bwd-{short(_dt)}", title=f"{_title} {short(_dt)}", minutes=0.4
        )(functools.partial(_fn, dtype=_dt))
