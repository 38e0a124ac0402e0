"""sdpa / sdpa_backward on the cudnn engine: what is offered to cuDNN and why the rest is declined
(CPU), and on a GPU with nvidia-cudnn-frontend, cuDNN's SDPA against the reference engine (fp16/bf16,
head dims 64/128/256, masks, GQA, BSHD, bias, padding, explicit-mask dropout, forward and backward)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph import DataType as DT
from opgraph.core.config import NumericalNote
from opgraph.engines.cudnn_frontend import static_problem

from ..helpers import assert_engine_matches
from ..ops.attention_torch import strides
from .test_cudnn_frontend import requires_cudnn, whole


def attention_graph(
    io=DT.HALF,
    *,
    b=2,
    hq=4,
    hk=2,
    sq=64,
    skv=96,
    d=64,
    layout="bshd",
    backward=False,
    stats=None,
    bias=False,
    padding=False,
    drop=None,
    scale=0.125,
    **opts,
):
    g = og.Graph("att", io_data_type=io, intermediate_data_type=DT.FLOAT)
    dims = {"q": (b, hq, sq, d), "k": (b, hk, skv, d), "v": (b, hk, skv, d)}
    t = {n: g.tensor(dim=x, stride=strides(x, layout), name=n) for n, x in dims.items()}
    backward_only = {k: opts.pop(k) for k in ("use_deterministic_algorithm",) if k in opts}
    kw = dict(opts, attn_scale=scale)
    if bias:
        kw["bias"] = g.tensor(dim=[1, hq, sq, skv], name="bias")
    if padding:
        kw["use_padding_mask"] = True
        kw["seq_len_q"] = g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_q")
        kw["seq_len_kv"] = g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_kv")
    if drop == "mask":
        kw["dropout"] = (g.tensor(dim=[b, hq, sq, skv], name="dmask"), 1 / 0.75)
    elif drop == "mask_scale_tensor":  # what cuDNN takes: the scale as a (pass-by-value) tensor
        kw["dropout"] = (
            g.tensor(dim=[b, hq, sq, skv], name="dmask"),
            g.tensor(dim=[1, 1, 1, 1], data_type=DT.FLOAT, is_pass_by_value=True, name="dscale"),
        )
    elif drop in ("philox", "philox_by_value"):
        kw["dropout"] = (
            0.25,
            *(
                g.tensor(dim=[1, 1, 1, 1], data_type=DT.INT64, is_pass_by_value=drop == "philox_by_value", name=n)
                for n in ("seed", "offset")
            ),
        )
    want_stats = backward if stats is None else stats
    o, st = g.sdpa(t["q"], t["k"], t["v"], generate_stats=want_stats, **kw, name="fwd")
    o.set_output(True).set_stride(strides((b, hq, sq, d), layout))
    if st is not None:
        st.set_output(True)
    if backward:
        g2 = og.Graph("att_bwd", io_data_type=io, intermediate_data_type=DT.FLOAT)
        h = {n: g2.tensor(dim=x, stride=strides(x, layout), name=n) for n, x in dims.items()}
        od = (b, hq, sq, d)
        ob, dob = (g2.tensor(dim=od, stride=strides(od, layout), name=n) for n in ("o", "dO"))
        stb = g2.tensor(dim=[b, hq, sq, 1], data_type=DT.FLOAT, name="stats")
        kb = {k: v for k, v in kw.items() if k not in ("bias", "seq_len_q", "seq_len_kv", "dropout")}
        kb.update(backward_only)
        if bias:
            kb["bias"] = g2.tensor(dim=[1, hq, sq, skv], name="bias")
            kb["dBias"] = g2.tensor(dim=[1, hq, sq, skv], name="dBias")
        if padding:
            kb["seq_len_q"] = g2.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_q")
            kb["seq_len_kv"] = g2.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_kv")
        if drop == "mask":
            kb["dropout"] = (g2.tensor(dim=[b, hq, sq, skv], name="dmask"), 1 / 0.75)
        for x in g2.sdpa_backward(h["q"], h["k"], h["v"], ob, dob, stb, **kb, name="bwd"):
            x.set_output(True)
        return g, g2
    return g


# -- what is offered (no GPU needed) -------------------------------------------------------------------


def test_plain_attention_is_offered():
    assert static_problem(whole(attention_graph(use_causal_mask=True))) is None
    _, g2 = attention_graph(backward=True, bias=True)
    assert static_problem(whole(g2)) is None


@pytest.mark.parametrize(
    "kw,words",
    [
        ({"io": DT.FLOAT}, "fp16/bf16"),
        ({"d": 20}, "multiples of 8"),
        ({"drop": "philox"}, "Philox"),
        ({"drop": "philox_by_value"}, "Philox"),  # (a host seed too: cuDNN's stream is not the op's)
        ({"padding": True, "stats": True}, "+inf"),
        ({"sq": 96, "skv": 64, "use_causal_mask_bottom_right": True, "stats": True}, "+inf"),
        ({"score_mod": lambda g, s: g.tanh(s)}, "score modifiers"),
    ],
)
def test_declines_with_a_reason(kw, words):
    why = static_problem(whole(attention_graph(**kw)))
    assert why is not None and words in why[0], why


def test_backward_without_every_gradient_is_declined():
    g = og.Graph("bwd", io_data_type=DT.HALF)
    q, k, v, o, do = (g.tensor(dim=[1, 2, 16, 64], name=n) for n in ("q", "k", "v", "o", "dO"))
    st = g.tensor(dim=[1, 2, 16, 1], data_type=DT.FLOAT, name="stats")
    from opgraph.ops.attention import SdpaBackward

    rest = [None] * (len(SdpaBackward().input_roles()) - 6)
    (dq,) = g._add_op(SdpaBackward(), [q, k, v, o, do, st] + rest, outputs=["dQ"])[:1]
    dq.set_output(True)
    why = static_problem(whole(g))
    assert why is not None and "dQ, dK and dV" in why[0]


def test_padding_without_stats_is_offered():
    assert static_problem(whole(attention_graph(padding=True, stats=False))) is None


# -- GPU -------------------------------------------------------------------------------------------------


def _prepare(g):
    final = g.final

    def prepare(pack):
        rng = np.random.default_rng(3)
        for uid in final.inputs:
            t = final.tensors[uid]
            if t.name == "seq_len_q":
                pack[uid][...] = np.array([37, 64][: t.dim[0]]).reshape(t.dim)
            elif t.name == "seq_len_kv":
                pack[uid][...] = np.array([90, 17][: t.dim[0]]).reshape(t.dim)
            elif t.name == "dmask":
                pack[uid][...] = (rng.uniform(size=t.dim) > 0.25).astype(pack[uid].dtype)
            elif t.name == "stats":
                pack[uid][...] = np.abs(pack[uid]) + 2.0  # a plausible LSE

    return prepare


def _cudnn(g, rng, tol=3e-2):
    plan = assert_engine_matches(
        g,
        rng,
        engines=("cudnn",),
        device="cuda",
        expect_steps=1,
        rtol=tol,
        atol=tol,
        prepare=_prepare(g),
        low=-1.0,
        high=1.0,
    )
    assert plan.steps[0].config.engine == "cudnn", plan.describe()
    assert NumericalNote.TENSOR_CORE in plan.steps[0].config.numerical_notes
    return plan


@pytest.mark.gpu
@requires_cudnn
@pytest.mark.parametrize("io", [DT.HALF, DT.BFLOAT16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mask", [{}, {"use_causal_mask": True}, {"use_causal_mask_bottom_right": True}])
def test_gpu_forward(io, d, mask, rng):
    _cudnn(attention_graph(io, d=d, sq=128, skv=192, stats=True, **mask), rng)


@pytest.mark.gpu
@requires_cudnn
@pytest.mark.parametrize("io", [DT.HALF, DT.BFLOAT16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", [{}, {"use_causal_mask": True}])
def test_gpu_forward_then_backward(io, d, mask, rng):
    """The backward graph fed with cuDNN's own forward O and Stats."""
    g, g2 = attention_graph(io, d=d, sq=128, skv=128, backward=True, **mask)
    fwd = g.build(device="cuda", engines=["cudnn"])
    bwd = g2.build(device="cuda", engines=["cudnn"])
    assert fwd.steps[0].config.engine == bwd.steps[0].config.engine == "cudnn"
    _cudnn(g2, rng)  # random O/Stats: the formula holds whatever they are


@pytest.mark.gpu
@requires_cudnn
@pytest.mark.parametrize(
    "features",
    [
        {"bias": True},
        {"padding": True, "stats": False},
        {"drop": "mask_scale_tensor", "stats": True},
        {"layout": "bhsd", "hk": 1},
        {"sliding_window_length": 32, "use_causal_mask": True, "stats": True},
    ],
)
def test_gpu_forward_features(features, rng):
    _cudnn(attention_graph(DT.BFLOAT16, d=64, sq=128, skv=128, **features), rng)


@pytest.mark.gpu
@requires_cudnn
@pytest.mark.parametrize("features", [{"bias": True}, {"use_deterministic_algorithm": True}])
def test_gpu_backward_features(features, rng):
    _, g2 = attention_graph(DT.HALF, d=64, sq=128, skv=128, backward=True, **features)
    _cudnn(g2, rng)


def test_backward_with_an_explicit_dropout_mask_is_declined():
    """cuDNN's backward with a mask disagreed with the reference on an H100 (2026-11-25): declined, with
    the reason, and the graph still runs (the generated kernel or the torch engine take it)."""
    from opgraph.engines.cudnn_sdpa import attention_problem

    _, g2 = attention_graph(DT.HALF, d=64, sq=128, skv=128, backward=True, drop="mask")
    from opgraph.core.piece import make_piece

    node = g2.final.nodes[0]
    why = attention_problem(node, make_piece(g2.final, 0, [node]))
    assert why is not None and "dropout" in why


# -- operands read through views, gradients written through them (GPT-2's fused qkv) -------------------


def fused_qkv_graphs(io=DT.BFLOAT16, b=2, s=256, h=4, d=64):
    """An imported GPT block's attention: q/k/v sliced from one [B, S, 3 * H * D] tensor, the backward's
    dO a transposed view of dy, and the gradients through transposes and reshapes into one concatenation
    (the qkv projection's input gradient), in the graph's io type. The forward and the backward graph."""

    def heads(g, qkv):
        return [
            g.transpose(
                g.reshape(g.slice(qkv, [slice(None), slice(None), slice(i * h * d, (i + 1) * h * d)]), [b, s, h, d]),
                [0, 2, 1, 3],
            )
            for i in range(3)
        ]

    g = og.Graph("qkv_fwd", io_data_type=io, intermediate_data_type=DT.FLOAT)
    o, st = g.sdpa(
        *heads(g, g.tensor(dim=[b, s, 3 * h * d], name="qkv")), attn_scale=d**-0.5, use_causal_mask=True, name="fwd"
    )
    o.set_output(True).set_name("o")
    st.set_output(True).set_name("stats")
    g2 = og.Graph("qkv_bwd", io_data_type=io, intermediate_data_type=io)
    q, k, v = heads(g2, g2.tensor(dim=[b, s, 3 * h * d], name="qkv"))
    ob = g2.tensor(dim=[b, h, s, d], stride=list(g.final.tensor("o").stride), name="o")  # (as the forward stores O)
    stb = g2.tensor(dim=[b, h, s, 1], data_type=DT.FLOAT, name="stats")
    do = g2.transpose(g2.reshape(g2.tensor(dim=[b, s, h * d], name="dy"), [b, s, h, d]), [0, 2, 1, 3])
    grads = g2.sdpa_backward(q, k, v, ob, do, stb, attn_scale=d**-0.5, use_causal_mask=True, name="bwd")
    g2.concatenate([g2.reshape(g2.transpose(x, [0, 2, 1, 3]), [b, s, h * d]) for x in grads], axis=2).set_output(
        True
    ).set_name("dqkv")
    return g, g2


def test_fused_qkv_views_are_offered_with_their_offsets():
    from opgraph.engines.cudnn_frontend import canonical_uids
    from opgraph.engines.cudnn_sdpa import operand_slots

    b, s, h, d = 2, 256, 4, 64
    g, g2 = fused_qkv_graphs(b=b, s=s, h=h, d=d)
    for graph, n_keys in ((g, 2 + 3), (g2, 2 + 4 + 3)):  # (o, stats direct; q, k, v, dO and dQ, dK, dV views)
        piece = whole(graph)
        assert static_problem(piece) is None
        keys, views = operand_slots(piece)
        assert len(keys) == n_keys and len(set(canonical_uids(piece).values())) == n_keys
        node = next(n for n in piece.nodes if n.kind.startswith("sdpa"))
        q, k, v = (node.input(r) for r in ("q", "k", "v"))
        assert [views[u].offset for u in (q, k, v)] == [0, h * d, 2 * h * d]
        assert views[q].desc.stride == (s * 3 * h * d, d, 3 * h * d, 1)
    piece = whole(g2)
    _, views = operand_slots(piece)
    node = next(n for n in piece.nodes if n.kind == "sdpa_backward")
    dq, dk, dv = (node.output(r) for r in ("dQ", "dK", "dV"))
    dqkv = piece.graph.tensor("dqkv").uid
    assert {views[u].base for u in (dq, dk, dv)} == {dqkv}
    assert [views[u].offset for u in (dq, dk, dv)] == [0, h * d, 2 * h * d]


def test_views_feeding_other_ops_are_declined_with_a_reason():
    g = og.Graph("qkv_other", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    qkv = g.tensor(dim=[1, 128, 3 * 2 * 64], name="qkv")
    heads = [
        g.transpose(
            g.reshape(g.slice(qkv, [slice(None), slice(None), slice(i * 128, (i + 1) * 128)]), [1, 128, 2, 64]),
            [0, 2, 1, 3],
        )
        for i in range(3)
    ]
    o, _ = g.sdpa(g.mul(heads[0], 2.0).set_data_type(DT.BFLOAT16), heads[1], heads[2], generate_stats=False, name="fwd")
    o.set_output(True)
    why = static_problem(whole(g))
    assert why is not None and "attention op alone" in why[0], why


@pytest.mark.gpu
@requires_cudnn
def test_gpu_fused_qkv_views_forward_and_backward():
    """bf16 B=2 S=256 H=4 D=64 through cuDNN with q/k/v read at their offsets in the fused tensor and
    dQ/dK/dV written into their slots of the concatenation; against PyTorch autograd in float32."""
    import torch

    from ..ops.attention_torch import fused_qkv_errors

    b, s, h, d = 2, 256, 4, 64
    g, g2 = fused_qkv_graphs(b=b, s=s, h=h, d=d)
    fwd = g.build(device="cuda", engines=["cudnn"])
    bwd = g2.build(device="cuda", engines=["cudnn"])
    assert [st.config.engine for st in (*fwd.steps, *bwd.steps)] == ["cudnn", "cudnn"], (fwd.describe(), bwd.describe())
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(b, s, 3 * h * d, device="cuda", generator=gen).to(torch.bfloat16)
    dy = torch.randn(b, s, h * d, device="cuda", generator=gen).to(torch.bfloat16)
    f1, f2 = g.final, g2.final
    o = torch.empty_strided(f1.tensor("o").dim, f1.tensor("o").stride, device="cuda", dtype=torch.bfloat16)
    o.fill_(float("nan"))
    stats = torch.full((b, h, s, 1), float("nan"), device="cuda")
    fwd.execute({f1.tensor("qkv").uid: x, f1.tensor("o").uid: o, f1.tensor("stats").uid: stats})
    dqkv = torch.full((b, s, 3 * h * d), float("nan"), device="cuda", dtype=torch.bfloat16)
    bwd.execute(
        {
            f2.tensor("qkv").uid: x,
            f2.tensor("o").uid: o,
            f2.tensor("stats").uid: stats,
            f2.tensor("dy").uid: dy,
            f2.tensor("dqkv").uid: dqkv,
        }
    )
    torch.cuda.synchronize()
    errs = fused_qkv_errors(x, dy, o, dqkv, h)
    assert all(e < 2e-2 for e in errs.values()), errs
