"""Forward convolutions with their epilogue, fp16 and bf16, NHWC: ResNet-50's convolutions (3x3 and
1x1, the 7x7/2 stem with C=3, a strided 3x3, a 1x1/2 downsample, a bottleneck's last 1x1 with the
residual add), a ResNeXt grouped conv and a depthwise conv. Peers: eager, cuDNN's fused conv through
PyTorch (torch.cudnn_convolution_relu / _add_relu), torch.compile, the cuDNN frontend's fused graph."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import opgraph as og

from ..case import Case, Ctx, Impl, Output, Runner
from ..core.floors import Floor
from ..core.registry import workload
from ..ours import graph_impls
from ..peers import cudnn_fe
from ..peers.torch_peers import compiled, eager
from .common import TORCH_TO_OG, f64, short, torch_dtype


class Shape(NamedTuple):
    key: str
    title: str
    n: int
    c: int
    h: int
    k: int
    r: int
    pad: int
    stride: int
    groups: int = 1
    residual: bool = False


SHAPES = (
    Shape("r50_3x3_c64", "conv 3x3 C64→K64 56²", 32, 64, 56, 64, 3, 1, 1),
    Shape("r50_1x1_c256_k64", "conv 1x1 C256→K64 56²", 32, 256, 56, 64, 1, 0, 1),
    Shape("r50_3x3_c256_14", "conv 3x3 C256→K256 14²", 32, 256, 14, 256, 3, 1, 1),
    Shape("r50_3x3_c512_7", "conv 3x3 C512→K512 7²", 32, 512, 7, 512, 3, 1, 1),
    Shape("stem_7x7s2_c3", "stem conv 7x7/2 C3→K64 224²", 32, 3, 224, 64, 7, 3, 2),
    Shape("r50_3x3s2_c128", "strided conv 3x3/2 C128→K128 56²→28²", 32, 128, 56, 128, 3, 1, 2),
    Shape("r50_1x1s2_c256_k512", "downsample conv 1x1/2 C256→K512 56²→28²", 32, 256, 56, 512, 1, 0, 2),
    Shape("r50_1x1_c64_k256_add", "bottleneck conv 1x1 C64→K256 56²", 32, 64, 56, 256, 1, 0, 1, 1, True),
    Shape("resnext_3x3_g32", "grouped conv 3x3 g32 C256→K256 28²", 32, 256, 28, 256, 3, 1, 1, 32),
    Shape("depthwise_3x3_c256", "depthwise conv 3x3 C256 28²", 32, 256, 28, 256, 3, 1, 1, 256),
)


def scaled(ctx: Ctx, s: Shape) -> Shape:
    if ctx.scale == "full":
        return s
    if ctx.scale == "quick":
        return s._replace(n=8)
    depthwise = s.groups == s.c and s.groups > 1
    c = s.c if s.c <= 4 else 8
    k = c if depthwise else (s.k if s.k <= 4 else 8)
    groups = c if depthwise else (1 if s.groups == 1 else 4)
    return s._replace(n=2, c=c, k=k, h=min(s.h, 16 if s.r == 7 else 8), groups=groups)


def out_size(s: Shape) -> int:
    return (s.h + 2 * s.pad - s.r) // s.stride + 1


def conv_case(ctx: Ctx, shape: Shape, dtype: str) -> Case:
    import torch
    import torch.nn.functional as F

    s = scaled(ctx, shape)
    tdt = torch_dtype(dtype)
    cg, p = s.c // s.groups, out_size(s)
    x = ctx.randn(s.n, s.c, s.h, s.h, dtype=tdt, channels_last=True)
    w = ctx.randn(s.k, cg, s.r, s.r, dtype=tdt, scale=(cg * s.r * s.r) ** -0.5, channels_last=True)
    b = ctx.randn(s.k, dtype=tdt, scale=0.5)
    b4 = b.view(1, s.k, 1, 1)
    z = ctx.randn(s.n, s.k, p, p, dtype=tdt, channels_last=True) if s.residual else None
    geo = dict(stride=s.stride, padding=s.pad, groups=s.groups)

    def ref() -> list[Any]:
        xd, wd, bd = f64(x, w, b)
        y = F.conv2d(xd, wd, bd, **geo)
        if z is not None:
            y = y + z.double()
        return [torch.relu(y)]

    def make() -> Any:
        g = og.Graph(f"conv_{s.key}", io_data_type=TORCH_TO_OG[dtype])
        X, W, B = g.tensor_like(x, name="x"), g.tensor_like(w, name="w"), g.tensor_like(b4, name="b")
        y = g.bias(g.conv_fprop(X, W, padding=s.pad, stride=s.stride), B)
        inputs = {X: x, W: w, B: b4}
        if z is not None:
            Z = g.tensor_like(z, name="z")
            y = g.add(y, Z)
            inputs[Z] = z
        Y = g.relu(y).set_output(True).set_name("y")
        g.validate()
        return g, inputs, [Y]

    def f(x: Any, w: Any, b: Any, *z: Any) -> Any:
        y = F.conv2d(x, w, b, **geo)
        if z:
            y = y.add_(z[0])
        return F.relu(y, inplace=True)

    args = (x, w, b) + ((z,) if z is not None else ())
    impls = graph_impls(ctx, make) + [eager(f, args)] + [fused_peer(x, w, b, z, s)]
    impls += compiled(f, args, cudagraphs=ctx.compile_cudagraphs)

    def fe_build(g: Any, t: Any) -> list:
        y = g.conv_fprop(
            image=t["x"], weight=t["w"], padding=[s.pad] * 2, stride=[s.stride] * 2, dilation=[1, 1], name="conv"
        )
        y = g.bias(input=y, bias=t["b"], name="bias")
        if z is not None:
            y = g.add(y, t["z"], name="residual")
        return [(g.relu(input=y, name="relu"), tdt)]

    fe_inputs = {"x": x, "w": w, "b": b4, **({"z": z} if z is not None else {})}
    impls += cudnn_fe.impls(ctx, fe_inputs, fe_build, tdt)
    flops = 2 * s.n * s.k * p * p * cg * s.r * s.r
    moved = (x.numel() + w.numel() + b.numel() + s.n * s.k * p * p * (2 if z is not None else 1)) * x.element_size()
    return Case([Output("y", dtype)], ref, impls, Floor(bytes=moved, flops=flops, dtype=dtype))


def fused_peer(x: Any, w: Any, b: Any, z: Any, s: Shape) -> Impl:
    """cuDNN's fused conv + bias (+ residual) + relu through PyTorch."""
    import torch

    name = "torch.cudnn_convolution_add_relu" if z is not None else "torch.cudnn_convolution_relu"

    def setup() -> Runner:
        geo = ([s.stride] * 2, [s.pad] * 2, [1, 1], s.groups)
        if z is not None:
            call = lambda: torch.cudnn_convolution_add_relu(x, w, z, 1.0, b, *geo)  # noqa: E731
        else:
            call = lambda: torch.cudnn_convolution_relu(x, w, b, *geo)  # noqa: E731
        return Runner(call=call, engine="cuDNN (fused conv+bias+act through PyTorch)")

    return Impl(name, setup, role="peer", needs=frozenset({"cuda"}))


# two groups per type, five workloads each: one command (3 repeats) stays within ~8 minutes
for _dt in ("float16", "bfloat16"):
    for _i, _s in enumerate(SHAPES):
        _epi = "+bias+residual+relu" if _s.residual else "+bias+relu"
        workload(
            f"conv.{_s.key}.{short(_dt)}",
            group=f"conv-{short(_dt)}" if _i < 5 else f"conv-more-{short(_dt)}",
            title=f"{_s.title} {_epi} N{_s.n} {short(_dt)}",
            minutes=0.4,
        )(functools.partial(conv_case, shape=_s, dtype=_dt))
