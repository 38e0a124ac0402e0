"""The Triton engine's choices, pinned: for a corpus of representative pieces (ResNet-18/50 convs forward,
dgrad and wgrad with their fusions, the 7x7 stem of 3 channels, depthwise and grouped convs, transformer
GEMMs and their epilogues, norms, reductions, pooling and its backward, pointwise DAGs, attention forward
and backward), each on a simulated H100, a CPU (the interpreter's heuristics) and, for a few, a GPU older
than bfloat16: the engine's verdict, every config of every heuristic mode (knobs with their types,
numerical notes, estimates) and a hash of each config's generated kernels (source, launches, scratch).

The golden file was recorded from the code before the template protocol was rebuilt (issue 37): a change
of what the engine offers or generates shows here as a diff of one piece. A kernel's source is more than
behaviour: a plan file stores each step's source hash and refuses to load where opgraph (of the same
version) generates another, so a source may change only with the version, or where a config could not be
generated before. Where a change is meant, record the file again and say why in the commit:

    OPGRAPH_REGEN_GOLDEN=1 python -m pytest tests/engines/test_triton_selection_golden.py

(nothing is compiled or run: configs and sources only, so no GPU and no interpreter are needed)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import opgraph as og
from opgraph.autodiff import grad
from opgraph.core.config import HeurMode, Support
from opgraph.core.device import Device
from opgraph.core.piece import Piece, make_piece
from opgraph.engines import get_engine
from opgraph.engines.triton.rewrite import OVERLAP, without_overlap
from opgraph.tools.samples import nhwc

DT = og.DataType
FLOAT = DT.FLOAT
GOLDEN = Path(__file__).parent / "golden" / "triton_selection.json"
H100 = Device("cuda", 0, "NVIDIA H100 80GB HBM3", (9, 0), 132)
CPU = Device("cpu")
T4 = Device("cuda", 0, "Tesla T4", (7, 5), 40)
DEVICES = {"h100": H100, "cpu": CPU}
TRAIN, INFER = "training", "inference"


# -- the corpus ------------------------------------------------------------------------------------------


def _graph(name: str, dt: DT = DT.HALF, intermediate: DT = FLOAT) -> og.Graph:
    return og.Graph(name, io_data_type=dt, intermediate_data_type=intermediate, compute_data_type=FLOAT)


def _stride(dims, layout: str):
    return nhwc(list(dims)) if layout == "nhwc" and len(dims) >= 3 else None


def _out_dims(xd, wd, padding, stride, dilation=None):
    nsp = len(xd) - 2
    dilation = dilation or [1] * nsp
    return [
        xd[0],
        wd[0],
        *((x + 2 * p - d * (r - 1) - 1) // s + 1 for x, r, p, s, d in zip(xd[2:], wd[2:], padding, stride, dilation)),
    ]


def conv(
    xd,
    wd,
    *,
    dt=DT.HALF,
    layout="nhwc",
    padding=None,
    stride=None,
    dilation=None,
    epilogue=None,
    prologue=False,
    genstats=False,
    residual=False,
    out_dt=None,
):
    nsp = len(xd) - 2
    padding, stride = padding or [0] * nsp, stride or [1] * nsp
    g = _graph("conv", dt, DT.HALF if prologue else FLOAT)
    x = g.tensor(dim=list(xd), stride=_stride(xd, layout), name="x")
    w = g.tensor(dim=list(wd), stride=_stride(wd, layout), name="w")
    if prologue:  # SBR: the scale + bias + relu of a batchnorm before the conv
        cd = [1, xd[1]] + [1] * nsp
        x = g.relu(
            g.bias(
                g.scale(x, g.tensor(dim=cd, stride=_stride(cd, layout), name="s")),
                g.tensor(dim=cd, stride=_stride(cd, layout), name="b"),
            )
        )
    y = g.conv_fprop(x, w, padding=padding, stride=stride, dilation=dilation, name="conv")
    kd = [1, wd[0]] + [1] * nsp
    if epilogue == "bias_relu":
        y = g.relu(g.bias(y, g.tensor(dim=kd, stride=_stride(kd, layout), name="bias")))
    if residual:
        yd = _out_dims(xd, wd, padding, stride, dilation)
        y = g.relu(g.add(y, g.tensor(dim=yd, stride=_stride(yd, layout), name="res")))
    y.set_output(True)
    if out_dt is not None:
        y.set_data_type(out_dt)
    if genstats:
        for t in g.genstats(y):
            t.set_output(True).set_data_type(FLOAT)
    return g


def dgrad(
    xd, wd, *, dt=DT.HALF, layout="nhwc", padding=None, stride=None, drelu=False, bn_inputs=False, loss_prologue=False
):
    nsp = len(xd) - 2
    padding, stride = padding or [0] * nsp, stride or [1] * nsp
    g = _graph("dgrad", dt)
    yd = _out_dims(xd, wd, padding, stride)
    dy = g.tensor(dim=yd, stride=_stride(yd, layout), name="dy")
    if loss_prologue:
        dy = g.relu_backward(dy, g.tensor(dim=yd, name="act"))
    w = g.tensor(dim=list(wd), stride=_stride(wd, layout), name="w")
    dx = g.conv_dgrad(dy, w, padding=padding, stride=stride, name="dgrad").set_dim(list(xd))
    if layout == "nhwc":
        dx.set_stride(nhwc(list(xd)))
    if drelu or bn_inputs:
        dx = g.relu_backward(dx, g.tensor(dim=list(xd), stride=_stride(xd, layout), name="y_fwd"))
    dx.set_output(True)
    if bn_inputs:
        cd = [1, xd[1]] + [1] * nsp
        mean, inv, scale = (g.tensor(dim=cd, data_type=FLOAT, name=n) for n in ("mean", "inv", "scale"))
        x = g.tensor(dim=list(xd), stride=_stride(xd, layout), name="x")
        g.mul(dx, scale).set_output(True)
        g.reduction(dx, mode="ADD").set_dim(cd).set_output(True)
        g.reduction(g.mul(dx, g.mul(g.sub(x, mean), inv)), mode="ADD").set_dim(cd).set_output(True)
    return g


def wgrad(xd, wd, *, dt=DT.HALF, layout="nhwc", padding=None, stride=None, prologue=False, sgd=False):
    nsp = len(xd) - 2
    padding, stride = padding or [0] * nsp, stride or [1] * nsp
    g = _graph("wgrad", dt)
    yd = _out_dims(xd, wd, padding, stride)
    x = g.tensor(dim=list(xd), stride=_stride(xd, layout), name="x")
    dy = g.tensor(dim=yd, stride=_stride(yd, layout), name="dy")
    if prologue:
        cd = [1, xd[1]] + [1] * nsp
        x = g.relu(
            g.bias(
                g.scale(x, g.tensor(dim=cd, stride=_stride(cd, layout), name="s")),
                g.tensor(dim=cd, stride=_stride(cd, layout), name="b"),
            )
        )
    dw = g.conv_wgrad(x, dy, padding=padding, stride=stride, name="wgrad").set_dim(list(wd))
    if layout == "nhwc":
        dw.set_stride(nhwc(list(wd)))
    if sgd:
        w = g.tensor(dim=list(wd), stride=_stride(wd, layout), name="w")
        lr = g.tensor(dim=[1], data_type=FLOAT, is_pass_by_value=True, name="lr")
        g.sub(w, g.mul(dw, lr)).set_output(True)
    else:
        dw.set_output(True)
    return g


def matmul(a, b, *, dt=DT.HALF, epilogue=None, transpose_b=False, row_sum=False, cast_a=False, out_dt=None):
    g = _graph("matmul", dt)
    ta = g.tensor(dim=list(a), data_type=FLOAT if cast_a else dt, name="a")
    if cast_a:
        ta = g.identity(ta)
        ta.set_data_type(dt)
    if transpose_b:
        bd = [*b[:-2], b[-1], b[-2]]
        tb = g.transpose(g.tensor(dim=bd, name="b"), [*range(len(b) - 2), len(b) - 1, len(b) - 2])
    else:
        tb = g.tensor(dim=list(b), name="b")
    y = g.matmul(ta, tb, name="mm")
    n = b[-1]
    if epilogue in ("bias_gelu", "bias"):
        y = g.bias(y, g.tensor(dim=[1] * (len(a) - 1) + [n], name="bias"))
        if epilogue == "bias_gelu":
            y = g.gelu(y)
    y.set_output(True)
    if out_dt is not None:
        y.set_data_type(out_dt)
    if row_sum:
        g.reduction(y, mode="ADD").set_dim([*a[:-1], 1]).set_output(True).set_data_type(FLOAT)
    return g


def layernorm(dims, *, dt=DT.BFLOAT16, residual=False, gelu=False, rms=False):
    g = og.Graph("ln", io_data_type=dt)
    x = g.tensor(dim=list(dims), name="x")
    if residual:
        x = g.add(x, g.tensor(dim=list(dims), name="r"))
        x.set_output(True)
    sd = [1] * (len(dims) - 1) + [dims[-1]]
    scale = g.tensor(dim=sd, data_type=FLOAT, name="s")
    if rms:
        y, inv = g.rmsnorm(TRAIN, x, scale, epsilon=1e-5)
        outs = [inv]
    else:
        y, mean, inv = g.layernorm(TRAIN, x, scale, g.tensor(dim=sd, data_type=FLOAT, name="b"), epsilon=1e-5)
        outs = [mean, inv]
    (g.gelu(y) if gelu else y).set_output(True)
    for t in outs:
        t.set_output(True)
    return g


def layernorm_backward(dims, *, dt=DT.BFLOAT16, rms=False):
    g = og.Graph("lnb", io_data_type=dt)
    x, dy = g.tensor(dim=list(dims), name="x"), g.tensor(dim=list(dims), name="dy")
    sd = [1] * (len(dims) - 1) + [dims[-1]]
    st = [*dims[:-1], 1]
    scale = g.tensor(dim=sd, data_type=FLOAT, name="s")
    inv = g.tensor(dim=st, data_type=FLOAT, name="inv")
    if rms:
        outs = g.rmsnorm_backward(dy, x, scale, inv, has_dbias=False)
    else:
        outs = g.layernorm_backward(dy, x, scale, g.tensor(dim=st, data_type=FLOAT, name="mean"), inv)
    for t in outs:
        if t is not None:
            t.set_output(True)
    return g


def batchnorm(dims, *, dt=DT.HALF, layout="nhwc", relu=True, instance=False, residual=False):
    g = og.Graph("bn", io_data_type=dt)
    cd = [1, dims[1]] + [1] * (len(dims) - 2)
    x = g.tensor(dim=list(dims), stride=_stride(dims, layout), name="x")
    if residual:
        x = g.add(x, g.tensor(dim=list(dims), stride=_stride(dims, layout), name="r"))
    scale, bias = g.tensor(dim=cd, data_type=FLOAT, name="s"), g.tensor(dim=cd, data_type=FLOAT, name="b")
    if instance:
        y, mean, inv = g.instancenorm(TRAIN, x, scale, bias, 1e-5)
        outs = [mean, inv]
    else:
        rm, rv = g.tensor(dim=cd, data_type=FLOAT, name="rm"), g.tensor(dim=cd, data_type=FLOAT, name="rv")
        y, mean, inv, nrm, nrv = g.batchnorm(x, scale, bias, rm, rv, epsilon=1e-5, momentum=0.1)
        outs = [mean, inv, nrm, nrv]
    (g.relu(y) if relu else y).set_output(True)
    for t in outs:
        t.set_output(True)
    return g


def batchnorm_backward(dims, *, dt=DT.HALF, layout="nhwc", saved=True, drelu=False, instance=False):
    g = og.Graph("bnb", io_data_type=dt)
    cd = [1, dims[1]] + [1] * (len(dims) - 2)
    sd = list(dims[:2]) + [1] * (len(dims) - 2) if instance else cd
    x = g.tensor(dim=list(dims), stride=_stride(dims, layout), name="x")
    dy = g.tensor(dim=list(dims), stride=_stride(dims, layout), name="dy")
    if drelu:
        dy = g.relu_backward(dy, g.tensor(dim=list(dims), stride=_stride(dims, layout), name="y_fwd"))
    scale = g.tensor(dim=cd, data_type=FLOAT, name="s")
    build = g.instancenorm_backward if instance else g.batchnorm_backward
    if saved:
        outs = build(
            dy, x, scale, g.tensor(dim=sd, data_type=FLOAT, name="mean"), g.tensor(dim=sd, data_type=FLOAT, name="inv")
        )
    else:
        outs = build(dy, x, scale, epsilon=1e-5)
    for t in outs:
        if t is not None:
            t.set_output(True)
    return g


def batchnorm_inference(dims, *, dt=DT.HALF, layout="nhwc"):
    g = og.Graph("bni", io_data_type=dt)
    cd = [1, dims[1]] + [1] * (len(dims) - 2)
    x = g.tensor(dim=list(dims), stride=_stride(dims, layout), name="x")
    stats = [g.tensor(dim=cd, data_type=FLOAT, name=n) for n in ("mean", "inv", "s", "b")]
    g.relu(g.batchnorm_inference(x, *stats)).set_output(True)
    return g


def reduction(dims, out, *, dt=DT.HALF, mode="ADD", layout="nchw", prologue=False):
    g = og.Graph("red", io_data_type=dt)
    x = g.tensor(dim=list(dims), stride=_stride(dims, layout), name="x")
    if prologue:
        x = g.relu(g.mul(x, 2.0))
    g.reduction(x, mode=mode).set_dim(list(out)).set_output(True).set_data_type(FLOAT)
    return g


def genstats(dims, *, dt=DT.HALF, layout="nhwc"):
    g = og.Graph("gs", io_data_type=dt)
    x = g.tensor(dim=list(dims), stride=_stride(dims, layout), name="x")
    for t in g.genstats(g.relu(x)):
        t.set_output(True).set_data_type(FLOAT)
    return g


def embedding_grad(tokens, vocab, width, *, dt=DT.BFLOAT16):
    """A language model's token table gradient: bf16 rows scatter-added into an fp32 [vocab, width] table."""
    g = og.Graph("embedding_grad", io_data_type=dt, intermediate_data_type=FLOAT)
    idx = g.tensor(dim=list(tokens), name="ids", data_type=DT.INT64)
    dy = g.tensor(dim=[*tokens, width], name="dy")
    g.embedding_backward(dy, idx, num_weights=vocab, name="dembedding").set_output(True).set_data_type(FLOAT)
    return g


def pool(dims, *, mode="max", window=(3, 3), stride=(2, 2), padding=(1, 1), dt=DT.HALF, layout="nhwc", backward=False):
    g = og.Graph("pool", io_data_type=dt, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    x = g.tensor(dim=list(dims), stride=_stride(dims, layout), name="x")
    y = g.resample(
        x,
        mode=mode,
        window=list(window),
        stride=list(stride),
        pre_padding=list(padding),
        post_padding=list(padding),
        name="pool",
    )[0]
    y.set_output(True)
    return grad(g, y, x).graph if backward else g


def pointwise(kind: str, dims=(32, 64, 56, 56), *, dt=DT.HALF):
    g = og.Graph("pw", io_data_type=dt, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    if kind == "add_relu":
        x, r = (
            g.tensor(dim=list(dims), stride=_stride(dims, "nhwc"), name="x"),
            g.tensor(dim=list(dims), stride=_stride(dims, "nhwc"), name="r"),
        )
        g.relu(g.add(x, r)).set_output(True)
    elif kind == "gelu_cast":
        x = g.tensor(dim=list(dims), data_type=FLOAT, name="x")
        g.gelu(x).set_output(True).set_data_type(dt)
    elif kind == "transposed_cast":  # a cast of a weight's transpose: the tiled walk
        x = g.tensor(dim=list(dims), data_type=FLOAT, name="x")
        g.identity(g.transpose(x, [1, 0])).set_output(True).set_data_type(dt)
    elif kind == "row_walk":  # cross-entropy backward over [tokens, vocab]: per-row values, a division
        logits = g.tensor(dim=list(dims), name="logits")
        m, s = (
            g.tensor(dim=[dims[0], 1], data_type=FLOAT, name="m"),
            g.tensor(dim=[dims[0], 1], data_type=FLOAT, name="s"),
        )
        g.div(g.exp(g.sub(logits, m)), s).set_output(True)
    elif kind == "small":
        x = g.tensor(dim=list(dims), name="x")
        g.sigmoid(g.mul(x, 3.0)).set_output(True)
    elif kind == "broadcast_mixed":
        x = g.tensor(dim=list(dims), name="x")
        b = g.tensor(dim=[1, dims[1], 1, 1], data_type=FLOAT, name="b")
        y = g.add(g.mul(x, b), 1.0)
        y.set_output(True)
        g.cmp_gt(y, 0.0).set_output(True)
    else:
        raise ValueError(kind)
    return g


def attention(b, h, s, d, *, dt=DT.HALF, causal=False, backward=False, hk=None, mod=None, skv=None):
    g = og.Graph("att", io_data_type=dt, intermediate_data_type=FLOAT)
    hk = hk or h
    skv = skv or s
    q = g.tensor(dim=[b, h, s, d], name="q")
    k = g.tensor(dim=[b, hk, skv, d], name="k")
    v = g.tensor(dim=[b, hk, skv, d], name="v")
    kw: dict[str, Any] = dict(attn_scale=d**-0.5, use_causal_mask=causal)
    if mod == "softcap":
        kw["score_mod"] = lambda sg, sc: sg.mul(sg.tanh(sg.div(sc, 30.0)), 30.0)
    o, st = g.sdpa(q, k, v, generate_stats=backward, name="fwd", **kw)
    o.set_output(True)
    if st is not None:
        st.set_output(True)
    if backward:
        do = g.tensor(dim=[b, h, s, d], name="dO")
        for t in g.sdpa_backward(q, k, v, o, do, st, name="bwd", **kw):
            t.set_output(True)
    return g


N = 32  # ResNet batch
CASES: dict[str, tuple[Callable[[], og.Graph], str | None]] = {
    # conv_fprop / depthwise (name: (graph, the kind of the piece's op: the piece is the nodes from it on))
    "stem_fp16": (lambda: conv((N, 3, 224, 224), (64, 3, 7, 7), padding=[3, 3], stride=[2, 2]), None),
    "stem_bf16": (lambda: conv((N, 3, 224, 224), (64, 3, 7, 7), dt=DT.BFLOAT16, padding=[3, 3], stride=[2, 2]), None),
    "stem_fp32": (lambda: conv((N, 3, 224, 224), (64, 3, 7, 7), dt=FLOAT, padding=[3, 3], stride=[2, 2]), None),
    "stem_int8": (
        lambda: conv((N, 3, 224, 224), (64, 3, 7, 7), dt=DT.INT8, padding=[3, 3], stride=[2, 2], out_dt=DT.INT32),
        None,
    ),
    "c64_56_3x3": (lambda: conv((N, 64, 56, 56), (64, 64, 3, 3), padding=[1, 1]), None),
    "c64_56_3x3_bf16": (lambda: conv((N, 64, 56, 56), (64, 64, 3, 3), dt=DT.BFLOAT16, padding=[1, 1]), None),
    "c128_56_3x3_s2": (lambda: conv((N, 128, 56, 56), (128, 128, 3, 3), padding=[1, 1], stride=[2, 2]), None),
    "c256_14_3x3": (lambda: conv((N, 256, 14, 14), (256, 256, 3, 3), padding=[1, 1]), None),
    "c512_7_3x3": (lambda: conv((N, 512, 7, 7), (512, 512, 3, 3), padding=[1, 1]), None),
    "c256_56_1x1_k64": (lambda: conv((N, 256, 56, 56), (64, 256, 1, 1)), None),
    "c256_56_1x1_s2_k512": (lambda: conv((N, 256, 56, 56), (512, 256, 1, 1), stride=[2, 2]), None),
    "c64_56_1x1_k256_residual": (lambda: conv((N, 64, 56, 56), (256, 64, 1, 1), residual=True), None),
    "c64_56_3x3_bias_relu": (lambda: conv((N, 64, 56, 56), (64, 64, 3, 3), padding=[1, 1], epilogue="bias_relu"), None),
    "sbr_conv_genstats": (
        lambda: conv((N, 64, 56, 56), (64, 64, 3, 3), padding=[1, 1], prologue=True, genstats=True),
        None,
    ),
    "sbr_conv_genstats_bf16": (
        lambda: conv((N, 64, 56, 56), (64, 64, 3, 3), dt=DT.BFLOAT16, padding=[1, 1], prologue=True, genstats=True),
        None,
    ),
    "sbr_conv_1x1": (lambda: conv((N, 64, 56, 56), (256, 64, 1, 1), prologue=True), None),
    "conv_genstats": (lambda: conv((N, 64, 56, 56), (64, 64, 3, 3), padding=[1, 1], genstats=True), None),
    "grouped_8ch_fp16": (lambda: conv((N, 256, 28, 28), (256, 8, 3, 3), padding=[1, 1]), None),
    "grouped_8ch_bf16": (lambda: conv((N, 256, 28, 28), (256, 8, 3, 3), dt=DT.BFLOAT16, padding=[1, 1]), None),
    "grouped_32ch": (lambda: conv((N, 256, 14, 14), (256, 32, 3, 3), padding=[1, 1]), None),
    "conv_fp32": (lambda: conv((N, 64, 28, 28), (64, 64, 3, 3), dt=FLOAT, padding=[1, 1]), None),
    "conv_int8": (lambda: conv((N, 64, 28, 28), (64, 64, 3, 3), dt=DT.INT8, padding=[1, 1], out_dt=DT.INT32), None),
    "conv_nchw": (lambda: conv((N, 64, 28, 28), (64, 64, 3, 3), layout="nchw", padding=[1, 1]), None),
    "conv_1d": (lambda: conv((8, 64, 100), (128, 64, 5), padding=[2]), None),
    "conv_3d": (lambda: conv((2, 16, 8, 16, 16), (32, 16, 3, 3, 3), padding=[1, 1, 1]), None),
    "conv_dilated": (lambda: conv((N, 64, 28, 28), (64, 64, 3, 3), padding=[2, 2], dilation=[2, 2]), None),
    "conv_double": (lambda: conv((2, 8, 6, 6), (16, 8, 3, 3), dt=DT.DOUBLE, padding=[1, 1]), None),
    "tiny_conv": (lambda: conv((2, 8, 6, 6), (16, 8, 3, 3), padding=[1, 1], epilogue="bias_relu"), None),
    "tiny_stem": (lambda: conv((2, 3, 11, 12), (16, 3, 7, 7), padding=[3, 3], stride=[2, 2]), None),
    "depthwise_3x3": (lambda: conv((N, 256, 28, 28), (256, 1, 3, 3), padding=[1, 1]), None),
    "depthwise_3x3_bias_relu": (
        lambda: conv((N, 144, 56, 56), (144, 1, 3, 3), padding=[1, 1], epilogue="bias_relu"),
        None,
    ),
    "depthwise_3x3_s2": (lambda: conv((N, 96, 112, 112), (96, 1, 3, 3), padding=[1, 1], stride=[2, 2]), None),
    "depthwise_5x5": (lambda: conv((N, 240, 14, 14), (240, 1, 5, 5), padding=[2, 2]), None),
    "depthwise_int8": (lambda: conv((N, 64, 28, 28), (64, 1, 3, 3), dt=DT.INT8, padding=[1, 1], out_dt=DT.INT32), None),
    "depthwise_genstats": (lambda: conv((N, 64, 28, 28), (64, 1, 3, 3), padding=[1, 1], genstats=True), None),
    "depthwise_mult2": (lambda: conv((8, 32, 20, 20), (64, 1, 3, 3), padding=[1, 1]), None),
    "depthwise_tiny": (lambda: conv((2, 8, 6, 6), (8, 1, 3, 3), padding=[1, 1]), None),
    # conv_dgrad
    "dgrad_c64_56_3x3": (lambda: dgrad((N, 64, 56, 56), (64, 64, 3, 3), padding=[1, 1]), None),
    "dgrad_c128_s2": (lambda: dgrad((N, 64, 56, 56), (128, 64, 3, 3), padding=[1, 1], stride=[2, 2]), None),
    "dgrad_1x1_s2": (lambda: dgrad((N, 256, 56, 56), (512, 256, 1, 1), stride=[2, 2]), None),
    "dgrad_drelu": (lambda: dgrad((N, 64, 56, 56), (64, 64, 3, 3), padding=[1, 1], drelu=True), None),
    "dgrad_bn_inputs": (lambda: dgrad((N, 64, 56, 56), (64, 64, 3, 3), padding=[1, 1], bn_inputs=True), None),
    "dgrad_loss_prologue": (lambda: dgrad((N, 64, 28, 28), (64, 64, 3, 3), padding=[1, 1], loss_prologue=True), None),
    "dgrad_fp32": (lambda: dgrad((N, 64, 28, 28), (64, 64, 3, 3), dt=FLOAT, padding=[1, 1]), None),
    "dgrad_depthwise": (lambda: dgrad((N, 144, 56, 56), (144, 1, 3, 3), padding=[1, 1]), None),
    "dgrad_grouped": (lambda: dgrad((N, 256, 28, 28), (256, 8, 3, 3), padding=[1, 1]), None),
    "dgrad_tiny_s2": (lambda: dgrad((2, 8, 9, 8), (16, 8, 3, 3), padding=[1, 1], stride=[2, 2]), None),
    # conv_wgrad
    "wgrad_c64_56_3x3": (lambda: wgrad((N, 64, 56, 56), (64, 64, 3, 3), padding=[1, 1]), None),
    "wgrad_c64_56_3x3_fp32": (lambda: wgrad((N, 64, 56, 56), (64, 64, 3, 3), dt=FLOAT, padding=[1, 1]), None),
    "wgrad_c512_7_3x3": (lambda: wgrad((N, 512, 7, 7), (512, 512, 3, 3), padding=[1, 1]), None),
    "wgrad_1x1": (lambda: wgrad((N, 256, 56, 56), (64, 256, 1, 1)), None),
    "wgrad_stem": (lambda: wgrad((N, 3, 224, 224), (64, 3, 7, 7), padding=[3, 3], stride=[2, 2]), None),
    "wgrad_stem_bf16": (
        lambda: wgrad((N, 3, 224, 224), (64, 3, 7, 7), dt=DT.BFLOAT16, padding=[3, 3], stride=[2, 2]),
        None,
    ),
    "wgrad_stem_sgd": (lambda: wgrad((N, 3, 224, 224), (64, 3, 7, 7), padding=[3, 3], stride=[2, 2], sgd=True), None),
    "sbr_wgrad": (lambda: wgrad((N, 64, 56, 56), (64, 64, 3, 3), padding=[1, 1], prologue=True), None),
    "sbr_wgrad_sgd": (lambda: wgrad((N, 64, 56, 56), (64, 64, 3, 3), padding=[1, 1], prologue=True, sgd=True), None),
    "wgrad_sgd": (lambda: wgrad((N, 128, 28, 28), (128, 128, 3, 3), padding=[1, 1], sgd=True), None),
    "wgrad_depthwise": (lambda: wgrad((N, 144, 56, 56), (144, 1, 3, 3), padding=[1, 1]), None),
    "wgrad_depthwise_5x5x5": (lambda: wgrad((2, 8, 8, 8, 8), (8, 1, 5, 5, 5), padding=[2, 2, 2]), None),
    "wgrad_grouped": (lambda: wgrad((N, 256, 28, 28), (256, 8, 3, 3), padding=[1, 1]), None),
    "wgrad_tiny_stem": (lambda: wgrad((2, 3, 11, 12), (16, 3, 7, 7), padding=[3, 3], stride=[2, 2]), None),
    "wgrad_tiny_int8": (lambda: wgrad((2, 8, 6, 6), (16, 8, 3, 3), dt=DT.INT8, padding=[1, 1]), None),
    # matmul
    "mlp_up_bias_gelu": (lambda: matmul((8192, 768), (768, 3072), epilogue="bias_gelu"), None),
    "mlp_up_bias_gelu_bf16": (lambda: matmul((8192, 768), (768, 3072), dt=DT.BFLOAT16, epilogue="bias_gelu"), None),
    "mlp_down_bias": (lambda: matmul((8192, 3072), (3072, 768), epilogue="bias"), None),
    "gemm_4k": (lambda: matmul((4096, 4096), (4096, 4096), dt=DT.BFLOAT16), None),
    "gemm_small_m": (lambda: matmul((16, 4096), (4096, 4096)), None),
    "gemm_batched": (lambda: matmul((48, 512, 64), (48, 64, 512)), None),
    "gemm_broadcast_b": (lambda: matmul((4, 1024, 768), (1, 768, 2304)), None),
    "gemm_transposed_b": (lambda: matmul((2048, 1024), (1024, 4096), transpose_b=True), None),
    "gemm_fp32": (lambda: matmul((2048, 1024), (1024, 1024), dt=FLOAT), None),
    "gemm_int8": (lambda: matmul((1024, 1024), (1024, 1024), dt=DT.INT8, out_dt=DT.INT32), None),
    "gemm_row_sum": (lambda: matmul((1024, 512), (512, 128), row_sum=True), None),
    "gemm_cast_prologue": (lambda: matmul((1024, 512), (512, 1024), cast_a=True), None),
    "gemm_fp8": (lambda: matmul((1024, 512), (512, 1024), dt=DT.FP8_E4M3, out_dt=DT.HALF), None),
    "gemm_tiny": (lambda: matmul((20, 24), (24, 40), epilogue="bias_gelu"), None),
    # normalizations
    "layernorm_4k": (lambda: layernorm((8192, 4096)), None),
    "layernorm_residual_gelu": (lambda: layernorm((4096, 768), dt=DT.HALF, residual=True, gelu=True), None),
    "rmsnorm_4k": (lambda: layernorm((8192, 4096), rms=True), None),
    "layernorm_backward": (lambda: layernorm_backward((8192, 4096)), None),
    "rmsnorm_backward": (lambda: layernorm_backward((8192, 1024), rms=True), None),
    "layernorm_tiny": (lambda: layernorm((7, 12), dt=FLOAT), None),
    "batchnorm_nhwc_relu": (lambda: batchnorm((N, 64, 56, 56)), None),
    "batchnorm_nchw": (lambda: batchnorm((N, 64, 56, 56), layout="nchw", relu=False), None),
    "batchnorm_residual": (lambda: batchnorm((N, 256, 14, 14), residual=True), None),
    "batchnorm_backward": (lambda: batchnorm_backward((N, 64, 56, 56)), None),
    "batchnorm_backward_drelu_unsaved": (lambda: batchnorm_backward((N, 64, 56, 56), saved=False, drelu=True), None),
    "batchnorm_inference": (lambda: batchnorm_inference((N, 64, 56, 56)), None),
    "instancenorm": (lambda: batchnorm((8, 64, 32, 32), layout="nchw", instance=True), None),
    "instancenorm_backward": (lambda: batchnorm_backward((8, 64, 32, 32), layout="nchw", instance=True), None),
    "batchnorm_tiny": (lambda: batchnorm((2, 8, 5, 5)), None),
    # reductions
    "row_sum_vocab": (lambda: reduction((8192, 50304), (8192, 1), dt=FLOAT), None),
    "row_max": (lambda: reduction((4096, 1024), (4096, 1), mode="MAX"), None),
    "global_avg_pool": (lambda: reduction((N, 2048, 7, 7), (N, 2048, 1, 1), mode="AVG", layout="nhwc"), None),
    "channel_sum_nhwc": (lambda: reduction((N, 64, 56, 56), (1, 64, 1, 1), layout="nhwc", prologue=True), None),
    "channel_sum_nchw": (lambda: reduction((N, 64, 56, 56), (1, 64, 1, 1)), None),
    "total_norm2": (lambda: reduction((4096, 4096), (1, 1), mode="NORM2", dt=FLOAT), None),
    "genstats_nhwc": (lambda: genstats((N, 64, 56, 56)), None),
    "reduction_tiny": (lambda: reduction((5, 7), (5, 1)), None),
    # pooling
    "maxpool_stem": (lambda: pool((N, 64, 112, 112)), None),
    "avgpool": (
        lambda: pool((N, 256, 14, 14), mode="avg_include_padding", window=(2, 2), stride=(2, 2), padding=(0, 0)),
        None,
    ),
    "maxpool_nchw": (lambda: pool((N, 64, 112, 112), layout="nchw"), None),
    "maxpool_stem_backward": (lambda: pool((N, 64, 112, 112), backward=True), None),
    "avgpool_backward": (lambda: pool((N, 64, 56, 56), mode="avg_exclude_padding", backward=True), None),
    "maxpool_tiny_backward": (lambda: pool((2, 3, 7, 6), backward=True, dt=FLOAT, layout="nchw"), None),
    # gathers
    "embedding_grad_llama": (lambda: embedding_grad((4, 1024), 32000, 1024), None),
    "embedding_grad_tiny": (lambda: embedding_grad((2, 3), 7, 5, dt=FLOAT), None),
    # pointwise
    "add_relu": (lambda: pointwise("add_relu"), None),
    "gelu_cast": (lambda: pointwise("gelu_cast", (8192, 3072)), None),
    "transposed_cast": (lambda: pointwise("transposed_cast", (4096, 1024)), None),
    "row_walk": (lambda: pointwise("row_walk", (8192, 50304)), None),
    "row_walk_ragged": (lambda: pointwise("row_walk", (512, 1000)), None),
    "pointwise_small": (lambda: pointwise("small", (3, 5)), None),
    "broadcast_mixed": (lambda: pointwise("broadcast_mixed", (N, 64, 56, 56)), None),
    # attention
    "sdpa_d64": (lambda: attention(4, 16, 1024, 64), None),
    "sdpa_d128_causal_bf16": (lambda: attention(4, 16, 2048, 128, dt=DT.BFLOAT16, causal=True), None),
    "sdpa_d256": (lambda: attention(2, 8, 512, 256), None),
    "sdpa_fp32": (lambda: attention(2, 4, 256, 64, dt=FLOAT), None),
    "sdpa_gqa_softcap": (lambda: attention(2, 8, 1024, 128, hk=2, mod="softcap"), None),
    "sdpa_bwd_d64": (lambda: attention(4, 16, 1024, 64, backward=True), "sdpa_backward"),
    "sdpa_bwd_d128_causal": (lambda: attention(4, 16, 1024, 128, causal=True, backward=True), "sdpa_backward"),
    "sdpa_bwd_d128_softcap": (lambda: attention(2, 8, 1024, 128, backward=True, mod="softcap"), "sdpa_backward"),
    "sdpa_bwd_d256": (lambda: attention(2, 8, 512, 256, backward=True), "sdpa_backward"),
    "sdpa_tiny_bwd": (lambda: attention(1, 2, 20, 16, dt=FLOAT, backward=True), "sdpa_backward"),
}
T4_CASES = ("c64_56_3x3_bf16", "stem_bf16", "mlp_up_bias_gelu_bf16", "layernorm_4k", "c64_56_3x3")


def piece_of(case: str) -> Piece:
    build, kind = CASES[case]
    final = build().final
    nodes = list(final.nodes)
    if kind is not None:  # the piece of one op (a forward's output feeds the backward)
        nodes = [n for n in nodes if n.kind == kind]
    return make_piece(final, 0, nodes)


# -- recording -------------------------------------------------------------------------------------------


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _knobs(knobs: tuple) -> list:
    return [[k, type(v).__name__, v] for k, v in knobs]


def _generated(engine: Any, piece: Piece, config: Any, device: Device) -> dict[str, Any]:
    try:
        gen = engine.generated(piece, config, device)
    except Exception as err:  # a config the engine offers but cannot generate: pinned too
        return {"error": f"{type(err).__name__}: {str(err)[:200]}"}
    launches = [
        [
            l.kernel,
            list(l.grid),
            [[str(getattr(a.kind, "value", a.kind)), a.uid, a.offset, a.dtype] for a in l.args],
            [[k, v] for k, v in l.meta],
        ]
        for l in gen.launches
    ]
    # (the launch overlap's two statements, added to every Hopper kernel, left out as TritonKernel.source_digest
    # leaves them out: test_hopper_kernels_are_generated_overlapped checks that they are there)
    return {
        "source": _digest(without_overlap(gen.source)),
        "launches": _digest(json.dumps(launches)),
        "scratch": gen.scratch_bytes,
        "notes": sorted(set(gen.notes) - {OVERLAP}),
    }


def record(piece: Piece, device: Device, *, sources: bool = True) -> dict[str, Any]:
    engine = get_engine("triton")
    verdict = engine.supports(piece, device)
    out: dict[str, Any] = {"supported": verdict.ok, "reason": verdict.reason}
    if not verdict.ok:
        return out
    for mode in (HeurMode.B, HeurMode.A, HeurMode.FALLBACK):
        configs = engine.configs(piece, device, mode)
        if mode is not HeurMode.B:  # the other modes pick from B's list: their knobs only
            out[mode.name] = [_knobs(c.knobs) for c in configs]
            continue
        out["B"] = [
            {
                "knobs": _knobs(c.knobs),
                "notes": sorted(n.name for n in c.numerical_notes),
                "behavior": sorted(n.name for n in c.behavior_notes),
                "estimate": c.estimate_us,
                "why": c.why,
                **(_generated(engine, piece, c, device) if sources else {}),
            }
            for c in configs
        ]
    return out


def record_all() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for case in CASES:
        piece = piece_of(case)
        for dname, device in DEVICES.items():
            out[f"{case}@{dname}"] = record(piece, device)
        if case in T4_CASES:
            out[f"{case}@t4"] = record(piece, T4, sources=False)
    return out


@pytest.fixture
def gpu_available_here(monkeypatch):
    """The engine's verdicts for the simulated GPUs as on a machine with one (Triton imported here may be
    the interpreter's, which the engine refuses for CUDA devices)."""
    from opgraph.engines.triton import TritonEngine

    monkeypatch.setattr(TritonEngine, "available", lambda self, device: Support.yes())


def _diff(want: Any, got: Any, where: str = "") -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got)):
            if k not in got or k not in want:
                out.append(f"{where}/{k}: {'missing' if k not in got else 'new'}")
            else:
                out += _diff(want[k], got[k], f"{where}/{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{where}: {len(want)} entries -> {len(got)}: {json.dumps(want)[:300]} -> {json.dumps(got)[:300]}"]
        return [d for i, (a, b) in enumerate(zip(want, got)) for d in _diff(a, b, f"{where}[{i}]")]
    if isinstance(want, float) and isinstance(got, float):
        return [] if got == pytest.approx(want, rel=1e-9) else [f"{where}: {want!r} -> {got!r}"]
    return [] if want == got else [f"{where}: {want!r} -> {got!r}"]


def test_the_engine_offers_and_generates_what_it_did(gpu_available_here):
    got = json.loads(json.dumps(record_all()))  # (tuples as lists, as stored)
    if os.environ.get("OPGRAPH_REGEN_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        lines = [f"{json.dumps(k)}: {json.dumps(got[k], sort_keys=True)}" for k in sorted(got)]
        GOLDEN.write_text("{\n" + ",\n".join(lines) + "\n}\n")  # a line a piece and device
        pytest.skip(f"recorded {GOLDEN}")
    want = json.loads(GOLDEN.read_text())
    diffs = _diff(want, got)
    assert not diffs, f"{len(diffs)} differences:\n" + "\n".join(diffs[:60])


def test_hopper_kernels_are_generated_overlapped(gpu_available_here, monkeypatch):
    """Every config's kernels on the simulated H100 carry the launch overlap (rewrite.overlapped, left out of the
    recorded hashes above); the interpreter's do not."""
    monkeypatch.delenv("OPGRAPH_LAUNCH_OVERLAP", raising=False)
    engine = get_engine("triton")
    piece = piece_of("add_relu")
    for device, overlapped in ((H100, True), (CPU, False)):
        for config in engine.configs(piece, device, HeurMode.A):
            gen = engine.generated(piece, config, device)
            assert (OVERLAP in gen.notes) == overlapped and ("gdc_wait()" in gen.source) == overlapped
