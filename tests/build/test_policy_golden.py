"""The default heuristic's choices, pinned: for a corpus of pieces (ResNet convolutions in fp16, bf16
and fp32 with the stem, depthwise, grouped and tiny ones, their gradients, matmuls, a weight gradient
with AdamW's update, attention) planned for a simulated H100 and H200 with the engines of a GPU machine
(triton, library, cudnn, torch), the order in which engines' configs are ranked and every config with
its knobs and estimate (heuristic modes A and B; the first of mode A, the one a default build picks,
with its notes) equal the ones recorded in policy_golden.json.

cuDNN is taken to accept every piece its own rules offer to it (its support check passes the piece,
as on a GPU with nvidia-cudnn-frontend), so that only opgraph's rules decide. Refactoring the ranking
policy must leave this file unchanged; a deliberate change of policy regenerates it:

    OPGRAPH_UPDATE_GOLDEN=1 python -m pytest tests/build/test_policy_golden.py
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import opgraph as og
from opgraph import DataType as DT
from opgraph.build.planner import default_engines, engine_configs
from opgraph.core.config import EngineConfig, HeurMode, Support
from opgraph.core.device import Device
from opgraph.core.tensor import packed_strides
from opgraph.engines import get_engine
from opgraph.tools.samples import nhwc

from .fakes import H100, H200

GOLDEN = Path(__file__).with_name("policy_golden.json")
DEVICES = {"H100": H100, "H200": H200}
BSHD = (0, 2, 1, 3)


def _graph(name: str, dt: DT) -> og.Graph:
    return og.Graph(name, io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)


def _t(g: og.Graph, dims, name: str, **kw) -> og.Tensor:
    return g.tensor(dim=list(dims), stride=nhwc(list(dims)), name=name, **kw)


def _out(dims_in, w, pad, stride):
    return [dims_in[0], w[0], *((h + 2 * pad - r) // stride + 1 for h, r in zip(dims_in[2:], w[2:]))]


def conv(n, c, k, hw, r, *, dt=DT.HALF, pad=None, stride=1, groups=1, epilogue="bias_relu"):
    """x -> conv (k filters of r x r, c / groups channels each) -> epilogue."""
    pad = r // 2 if pad is None else pad
    g = _graph("conv", dt)
    x = _t(g, (n, c, hw, hw), "x")
    w = _t(g, (k, c // groups, r, r), "w")
    y = g.conv_fprop(x, w, padding=[pad, pad], stride=[stride, stride], name="conv")
    dims = _out((n, c, hw, hw), (k, c, r, r), pad, stride)
    if epilogue == "bias_relu":
        y = g.relu(g.bias(y, _t(g, (1, k, 1, 1), "b")))
    elif epilogue == "residual":
        y = g.relu(g.add(g.bias(y, _t(g, (1, k, 1, 1), "b")), _t(g, dims, "res")))
    elif epilogue == "scale_shift":
        y = g.relu(g.add(g.mul(y, _t(g, (1, k, 1, 1), "s")), _t(g, (1, k, 1, 1), "sh")))
    y.set_output(True)
    return g


def sbr_conv_genstats(n, c, k, hw, *, dt=DT.HALF):
    g = og.Graph("sbr", io_data_type=dt, intermediate_data_type=dt, compute_data_type=DT.FLOAT)
    x, w = _t(g, (n, c, hw, hw), "x"), _t(g, (k, c, 3, 3), "w")
    a = g.relu(g.bias(g.scale(x, _t(g, (1, c, 1, 1), "s")), _t(g, (1, c, 1, 1), "b")))
    y = g.conv_fprop(a, w, padding=[1, 1], name="conv")
    y.set_output(True)
    for t in g.genstats(y):
        t.set_output(True).set_data_type(DT.FLOAT)
    return g


def dgrad(n, c, k, hw, r, *, dt=DT.HALF, stride=1, drelu=False):
    g = _graph("dgrad", dt)
    pad = r // 2
    dy = _t(g, _out((n, c, hw, hw), (k, c, r, r), pad, stride), "dy")
    w = _t(g, (k, c, r, r), "w")
    dx = g.conv_dgrad(dy, w, padding=[pad, pad], stride=[stride, stride], name="dgrad")
    dx.set_dim([n, c, hw, hw]).set_stride(nhwc([n, c, hw, hw]))
    if drelu:
        dx = g.relu_backward(dx, _t(g, (n, c, hw, hw), "x"))
    dx.set_output(True)
    return g


def wgrad(n, c, k, hw, r, *, dt=DT.HALF, stride=1):
    g = _graph("wgrad", dt)
    pad = r // 2
    x = _t(g, (n, c, hw, hw), "x")
    dy = _t(g, _out((n, c, hw, hw), (k, c, r, r), pad, stride), "dy")
    dw = g.conv_wgrad(x, dy, padding=[pad, pad], stride=[stride, stride], name="wgrad")
    dw.set_dim([k, c, r, r]).set_stride(nhwc([k, c, r, r])).set_output(True)
    return g


def matmul(b, m, n, k, *, dt=DT.HALF, epilogue=None):
    g = _graph("mm", dt)
    a = g.tensor(dim=[b, m, k], name="A")
    bb = g.tensor(dim=[b, k, n], name="B")
    c = g.matmul(a, bb, name="mm")
    if epilogue == "bias_gelu":
        c = g.gelu(g.add(c, g.tensor(dim=[1, 1, n], name="bias")))
    c.set_output(True)
    return g


def wgrad_adamw(tokens, k_in, n_out, *, update=True):
    """A linear layer's weight gradient (activations^T x output gradient, bf16, K = tokens) cast to fp32 and,
    with `update`, AdamW's update of the fp32 parameter and moments in place (mixed precision, as
    opgraph.training emits it: the moments' lerps, the decayed step); without, the fp32 gradient stored."""
    g = _graph("wgrad_adamw", DT.BFLOAT16)
    x = g.tensor(dim=[1, k_in, tokens], stride=[tokens * k_in, 1, k_in], name="x_t")
    dy = g.tensor(dim=[1, tokens, n_out], name="dy")
    g32 = g.identity(g.matmul(x, dy, name="dW"), name="g32").set_data_type(DT.FLOAT)
    if not update:
        g32.set_output(True)
        return g
    f32 = {"data_type": DT.FLOAT}
    p, m, v = (g.tensor(dim=[1, k_in, n_out], name=n, uid=i, **f32) for i, n in enumerate("pmv", start=100))
    s = {n: g.tensor(dim=[1], name=n, is_pass_by_value=True, **f32) for n in ("b1", "b2", "lr", "eps", "wd")}
    m_new = g.add(m, g.mul(g.sub(g32, m, name="dm"), s["b1"], name="m_step"), name="m_new").set_uid(101)
    g2 = g.mul(g32, g32, name="g2")
    v_new = g.add(v, g.mul(g.sub(g2, v, name="dv"), s["b2"], name="v_step"), name="v_new").set_uid(102)
    m_new.set_output(True)
    v_new.set_output(True)
    denom = g.add(g.sqrt(v_new, name="sqrt_v"), s["eps"], name="denom")
    step = g.add(g.mul(g.div(m_new, denom, name="ratio"), s["lr"], name="step"), g.mul(p, s["wd"], name="decay"))
    g.sub(p, step, name="p_new").set_uid(100).set_output(True)
    return g


def attention(b, h, s, d, *, dt=DT.HALF, causal=True, backward=False):
    dims = (b, h, s, d)
    stride = packed_strides(dims, BSHD)
    g = og.Graph("att", io_data_type=dt, intermediate_data_type=DT.FLOAT)
    q, k, v = (g.tensor(dim=list(dims), stride=stride, name=n) for n in "qkv")
    if not backward:
        o, _ = g.sdpa(q, k, v, attn_scale=d**-0.5, use_causal_mask=causal, generate_stats=False, name="fwd")
        o.set_output(True).set_stride(stride)
        return g
    o, do = (g.tensor(dim=list(dims), stride=stride, name=n) for n in ("o", "dO"))
    stats = g.tensor(dim=[b, h, s, 1], data_type=DT.FLOAT, name="stats")
    for t in g.sdpa_backward(q, k, v, o, do, stats, attn_scale=d**-0.5, use_causal_mask=causal, name="bwd"):
        t.set_output(True)
    return g


CORPUS: dict[str, Callable[[], og.Graph]] = {
    # ResNet-50's convolutions at N=32 (forward, bias + relu), in three types
    **{
        f"{name}_{dt.name}": (lambda a=args, dt=dt: conv(*a, dt=dt))
        for name, args in {
            "stem7x7s2_c3": (
                32,
                3,
                64,
                224,
                7,
            ),
            "c64_3x3_56": (32, 64, 64, 56, 3),
            "c64_k256_1x1_56": (32, 64, 256, 56, 1),
            "c256_k64_1x1_56": (32, 256, 64, 56, 1),
            "c512_3x3_7": (32, 512, 512, 7, 3),
            "c256_3x3_14": (32, 256, 256, 14, 3),
        }.items()
        for dt in (DT.HALF, DT.BFLOAT16, DT.FLOAT)
    },
    "stem7x7s2_c3_pad3": lambda: conv(32, 3, 64, 224, 7, pad=3, stride=2),
    "stem7x7s2_c3_pad3_bf16": lambda: conv(32, 3, 64, 224, 7, pad=3, stride=2, dt=DT.BFLOAT16),
    "stem1x1_c3": lambda: conv(32, 3, 64, 224, 1),
    "c128_3x3s2_28": lambda: conv(32, 128, 128, 56, 3, stride=2),
    "c256_k512_1x1s2": lambda: conv(32, 256, 512, 28, 1, stride=2),
    "c64_k256_1x1_residual": lambda: conv(32, 64, 256, 56, 1, epilogue="residual"),
    "c64_k256_1x1_residual_bf16": lambda: conv(32, 64, 256, 56, 1, epilogue="residual", dt=DT.BFLOAT16),
    "c64_k256_1x1_scale_shift": lambda: conv(32, 64, 256, 56, 1, epilogue="scale_shift"),
    "c64_3x3_56_plain": lambda: conv(32, 64, 64, 56, 3, epilogue=None),
    "depthwise3x3_c256_56": lambda: conv(32, 256, 256, 56, 3, groups=256),
    "depthwise3x3_c96_112_bf16": lambda: conv(32, 96, 96, 112, 3, groups=96, dt=DT.BFLOAT16),
    "grouped3x3_g32x8_28": lambda: conv(32, 256, 256, 28, 3, groups=32),
    "grouped3x3_g16x16_28": lambda: conv(32, 256, 256, 28, 3, groups=16),
    "grouped3x3_g8x8_tiny": lambda: conv(1, 64, 64, 7, 3, groups=8),
    "tiny_c8_6x6": lambda: conv(2, 8, 16, 6, 3),
    "tiny_c8_6x6_fp32": lambda: conv(2, 8, 16, 6, 3, dt=DT.FLOAT),
    "tiny_stem_c3_8x8": lambda: conv(1, 3, 8, 8, 3),
    "sbr_conv_genstats_c64_56": lambda: sbr_conv_genstats(32, 64, 64, 56),
    "sbr_conv_genstats_c64_56_bf16": lambda: sbr_conv_genstats(32, 64, 64, 56, dt=DT.BFLOAT16),
    "sbr_conv_genstats_tiny": lambda: sbr_conv_genstats(2, 8, 16, 5),
    "dgrad3x3_c64_56": lambda: dgrad(32, 64, 64, 56, 3),
    "dgrad3x3_c64_56_drelu": lambda: dgrad(32, 64, 64, 56, 3, drelu=True),
    "dgrad1x1_c256_k64_56_bf16": lambda: dgrad(32, 256, 64, 56, 1, dt=DT.BFLOAT16),
    "dgrad3x3_c64_56_fp32": lambda: dgrad(32, 64, 64, 56, 3, dt=DT.FLOAT),
    "wgrad3x3_c64_56": lambda: wgrad(32, 64, 64, 56, 3),
    "wgrad3x3_c64_56_bf16": lambda: wgrad(32, 64, 64, 56, 3, dt=DT.BFLOAT16),
    "wgrad3x3_c512_7": lambda: wgrad(32, 512, 512, 7, 3),
    "wgrad_stem7x7_c3": lambda: wgrad(32, 3, 64, 224, 7, stride=2),
    "wgrad_tiny": lambda: wgrad(2, 8, 16, 6, 3),
    "mm4096": lambda: matmul(1, 4096, 4096, 4096),
    "mm4096_bf16": lambda: matmul(1, 4096, 4096, 4096, dt=DT.BFLOAT16),
    "mm4096_fp32": lambda: matmul(1, 4096, 4096, 4096, dt=DT.FLOAT),
    "mm_small": lambda: matmul(1, 64, 64, 64),
    "mm_bias_gelu": lambda: matmul(8, 1024, 3072, 768, epilogue="bias_gelu"),
    "wgrad_adamw_1024x2816": lambda: wgrad_adamw(4096, 1024, 2816),
    "wgrad_1024x2816": lambda: wgrad_adamw(4096, 1024, 2816, update=False),
    "attention_s1024_d64": lambda: attention(4, 12, 1024, 64),
    "attention_s128_d64_small": lambda: attention(1, 2, 128, 64, causal=False),
    "attention_s2048_d128_bf16": lambda: attention(2, 16, 2048, 128, dt=DT.BFLOAT16),
    "attention_bwd_s1024_d64": lambda: attention(4, 12, 1024, 64, backward=True),
    "attention_bwd_s128_d64_small": lambda: attention(1, 2, 128, 64, backward=True),
}


def _runs(engines: list[str]) -> list[str]:
    """The engines in ranked order, each run of one engine's configs once."""
    out: list[str] = []
    for e in engines:
        if not out or out[-1] != e:
            out.append(e)
    return out


def _brief(config: EngineConfig) -> str:
    """A config's engine, knobs and estimate (to 0.01 µs): what ranking decides."""
    est = "" if config.estimate_us is None else f" ~{config.estimate_us:.2f}"
    return config.engine + "[" + " ".join(f"{k}={v}" for k, v in config.knobs) + "]" + est


def record(graph: og.Graph, device: Device) -> dict[str, dict[str, object]]:
    graph.validate()
    engines = default_engines(device)
    a = engine_configs(graph.final, device=device, engines=engines, heur_mode=HeurMode.A)
    b = engine_configs(graph.final, device=device, engines=engines, heur_mode=HeurMode.B)
    out = {}
    for pa, pb in zip(a, b, strict=True):
        out[pa.piece.label()] = {
            "engines_A": _runs([c.engine for c in pa.configs]),
            "engines_B": _runs([c.engine for c in pb.configs]),
            "first": str(pa.configs[0]) if pa.configs else None,
            "A": [_brief(c) for c in pa.configs],
            "B": [_brief(c) for c in pb.configs],
        }
    return out


@pytest.fixture
def gpu_engines(monkeypatch):
    """The default CUDA engines, available; cuDNN's own support check passes whatever its rules offer."""
    import opgraph.engines.cudnn_frontend as cf

    for name in ("triton", "library", "cudnn", "torch"):
        monkeypatch.setattr(type(get_engine(name)), "available", lambda self, device: Support.yes())
    monkeypatch.setattr(cf, "_verdict", lambda piece, device: (None, ["a cuDNN plan"]))


def _golden() -> dict:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


@pytest.mark.parametrize("device", sorted(DEVICES))
@pytest.mark.parametrize("case", sorted(CORPUS))
def test_the_default_heuristic_ranks_as_recorded(case, device, gpu_engines):
    got = record(CORPUS[case](), DEVICES[device])
    key = f"{case}@{device}"
    if os.environ.get("OPGRAPH_UPDATE_GOLDEN"):
        data = _golden()
        data[key] = got
        GOLDEN.write_text(json.dumps(dict(sorted(data.items())), indent=1) + "\n")
        return
    want = _golden().get(key)
    assert want is not None, f"{key} is not recorded: run with OPGRAPH_UPDATE_GOLDEN=1"
    assert got == want


def test_the_corpus_covers_what_the_policy_decides():
    """Every kind of rule has cases on each side (the recorded file says which way each went)."""
    data = _golden()
    firsts = [v["engines_A"][0] for rec in data.values() for v in rec.values() if v["engines_A"]]
    assert {"cudnn", "triton", "library"} & set(firsts) >= {"cudnn", "triton"}
    assert len(data) == len(CORPUS) * len(DEVICES)


def test_a_weight_gradient_with_adamws_update_goes_to_cublas_and_a_separate_update(gpu_engines):
    """The Llama's gate/up/down weight gradients (1024 x 2816, K = 4096) with AdamW's update in place: the
    epilogue's 69 MB of moments and parameters follow the main loop of 88 tiles with no math to overlap,
    and the fused kernel took 69-71 µs where cuBLAS and a separate update took 54
    (constants.md#exposed-epilogue): cuBLAS leads; the product with its fp32 cast alone stays generated."""
    for device in (H200,):  # (measured there; the H100's bandwidth and rates put the two closer)
        for case, first in (("wgrad_adamw_1024x2816", "library"), ("wgrad_1024x2816", "triton")):
            pieces = record(CORPUS[case](), device)
            (gemm,) = [p for label, p in pieces.items() if "dW" in label]
            assert gemm["engines_A"][0] == first, (case, gemm["A"][:3])
