"""opgraph.grad through sdpa (rule sdpa -> sdpa_backward saving Stats) against torch autograd in
float64: masks, GQA, bias, score modifiers, dropout (mask and Philox), a forward without Stats
(recomputed), attention inside a pointwise chain; split and combined modes."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.autodiff import grad
from opgraph.ops import attention_ref as R

from ..ops.attention_torch import attention, keep_mask
from .test_grad import check, fgraph

torch = pytest.importorskip("torch")

B, HQ, SQ, SKV, DH = 2, 4, 5, 6, 8


def _qkv(g, hk=2):
    return (
        g.tensor(dim=[B, HQ, SQ, DH], name="q"),
        g.tensor(dim=[B, hk, SKV, DH], name="k"),
        g.tensor(dim=[B, hk, SKV, DH], name="v"),
    )


def _sdpa(g, q, k, v, stats=True, **kw):
    o, st = g.sdpa(q, k, v, attn_scale=0.3, generate_stats=stats, **kw)
    o.set_output(True).set_name("o")
    if st is not None:
        st.set_output(True).set_name("stats")
    return o


@pytest.mark.parametrize("combined", [False, True])
@pytest.mark.parametrize(
    "opts", [{}, {"use_causal_mask": True}, {"use_causal_mask_bottom_right": True, "sliding_window_length": 3}]
)
@pytest.mark.parametrize("hk", [4, 2, 1])
def test_masks_gqa(opts, hk, combined, rng):
    g = fgraph()
    q, k, v = _qkv(g, hk)
    o = _sdpa(g, q, k, v, **opts)
    keep = keep_mask(
        B,
        SQ,
        SKV,
        causal=opts.get("use_causal_mask", False),
        br=opts.get("use_causal_mask_bottom_right", False),
        window=opts.get("sliding_window_length"),
    )
    res = check(g, o, [q, k, v], lambda q, k, v: attention(q, k, v, scale=0.3, keep=keep)[0], rng, combined=combined)
    kinds = [r.op.kind for r in res.graph._records]
    assert "sdpa_backward" in kinds
    if not combined:
        assert g.final.tensor("stats").uid in res.saved  # Stats saved, not recomputed


def test_bias_and_score_mod(rng):
    g = fgraph()
    q, k, v = _qkv(g)
    bias = g.tensor(dim=[1, HQ, SQ, SKV], name="bias")
    o = _sdpa(g, q, k, v, bias=bias, use_causal_mask=True, score_mod=lambda sg, s: sg.mul(sg.tanh(sg.div(s, 1.5)), 1.5))
    keep = keep_mask(B, SQ, SKV, causal=True)
    check(
        g,
        o,
        [q, k, v, bias],
        lambda q, k, v, bias: attention(
            q, k, v, scale=0.3, bias=bias, keep=keep, mod=lambda s: torch.tanh(s / 1.5) * 1.5
        )[0],
        rng,
    )


def test_without_stats_recomputes(rng):
    g = fgraph()
    q, k, v = _qkv(g)
    o = _sdpa(g, q, k, v, stats=False, use_alibi_mask=True)
    res = check(g, o, [q, k], lambda q, k, v: attention(q, k, v, scale=0.3, alibi=True)[0], rng)
    assert [r.op.kind for r in res.graph._records].count("sdpa") == 1  # the recomputation


def test_padding_and_dropout_mask(rng):
    g = fgraph()
    q, k, v = _qkv(g)
    lq = g.tensor(dim=[B, 1, 1, 1], data_type=og.DataType.INT32, name="lq")
    lkv = g.tensor(dim=[B, 1, 1, 1], data_type=og.DataType.INT32, name="lkv")
    m = g.tensor(dim=[B, HQ, SQ, SKV], name="m")
    o = _sdpa(g, q, k, v, use_padding_mask=True, seq_len_q=lq, seq_len_kv=lkv, dropout=(m, 2.0))

    def prepare(p):
        p["lq"][...] = np.array([3, 5]).reshape(B, 1, 1, 1)
        p["lkv"][...] = np.array([6, 2]).reshape(B, 1, 1, 1)
        p["m"][...] = np.arange(p["m"].size).reshape(p["m"].shape) % 3 != 0

    keep = keep_mask(B, SQ, SKV, lens=([3, 5], [6, 2]))
    check(
        g,
        o,
        [q, k, v],
        lambda q, k, v, lq, lkv, m: attention(q, k, v, scale=0.3, keep=keep, drop=m * 2.0)[0],
        rng,
        prepare=prepare,
    )


def test_philox_dropout(rng):
    g = fgraph()
    q, k, v = _qkv(g)
    seed = g.tensor(dim=[1], data_type=og.DataType.INT64, name="seed")
    off = g.tensor(dim=[1], data_type=og.DataType.INT64, name="off")
    o = _sdpa(g, q, k, v, dropout=(0.2, seed, off))

    def prepare(p):
        p["seed"][...] = 42
        p["off"][...] = 1000

    drop = R.dropout_keep(0.2, 42, 1000, (B, HQ, SQ, SKV)) / 0.8
    check(g, o, [q, k, v], lambda q, k, v, seed, off: attention(q, k, v, scale=0.3, drop=drop)[0], rng, prepare=prepare)


def test_attention_in_a_chain(rng):
    """x -> q = x * w (pointwise prologue) -> sdpa -> tanh(o) (epilogue): gradients of x and w."""
    g = fgraph()
    x = g.tensor(dim=[B, HQ, SQ, DH], name="x")
    w = g.tensor(dim=[1, HQ, 1, DH], name="w")
    k = g.tensor(dim=[B, 2, SKV, DH], name="k")
    v = g.tensor(dim=[B, 2, SKV, DH], name="v")
    o, _ = g.sdpa(g.mul(x, w), k, v, attn_scale=0.3, generate_stats=False, use_causal_mask=True)
    y = g.tanh(o).set_output(True).set_name("y")
    keep = keep_mask(B, SQ, SKV, causal=True)
    for combined in (False, True):
        check(
            g,
            y,
            [x, w, v],
            lambda x, w, k, v: torch.tanh(attention(x * w, k, v, scale=0.3, keep=keep)[0]),
            rng,
            combined=combined,
        )


def test_gradient_into_stats_is_an_error():
    g = fgraph()
    q, k, v = _qkv(g)
    o, st = g.sdpa(q, k, v)
    o.set_output(True)
    st.set_output(True)
    with pytest.raises(og.UnsupportedGraphError) as info:
        grad(g, [st], [q])
    assert info.value.rule == "autodiff.output"


def test_paged_caches_have_no_gradient():
    g = fgraph()
    q = g.tensor(dim=[2, 4, 5, 8], name="q")
    k, v = (g.tensor(dim=[8, 4, 2, 8], name=n) for n in "kv")
    tab = g.tensor(dim=[2, 1, 4, 1], data_type=og.DataType.INT32, name="tab")
    o, _ = g.sdpa(q, k, v, paged_attention_k_table=tab, paged_attention_v_table=tab, generate_stats=False)
    o.set_output(True)
    with pytest.raises(og.UnsupportedGraphError) as info:
        grad(g, [o], [q])
    assert info.value.rule == "autodiff.sdpa_paged"


@pytest.mark.parametrize("with_stats", [False, True])
def test_gradient_of_packed_attention_with_a_sink(with_stats, rng):
    """og.grad of a packed sdpa with a sink token and a band: dq, dk, dv packed like q, k, v, and the
    sink's gradient, against autograd of a formulation by explicit loops over the sequences."""
    lq, lkv, offq, offkv = [2, 3], [4, 3], [0, 3], [1, 6]
    g = fgraph()
    q = g.tensor(dim=[1, 2, 6, 4], name="q")
    k, v = (g.tensor(dim=[1, 1, 9, 4], name=n) for n in "kv")
    sink = g.tensor(dim=[1, 2, 1, 1], name="sink")
    lens = [g.tensor(dim=[2, 1, 1, 1], data_type=og.DataType.INT32, name=n) for n in ("lq", "lkv")]
    offs = [g.tensor(dim=[3, 1, 1, 1], data_type=og.DataType.INT64, name=n) for n in ("oq", "okv")]
    o, st = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.5,
        generate_stats=with_stats,
        use_padding_mask=True,
        seq_len_q=lens[0],
        seq_len_kv=lens[1],
        q_ragged_offset=offs[0],
        k_ragged_offset=offs[1],
        v_ragged_offset=offs[1],
        o_ragged_offset=offs[0],
        max_seq_len_q=3,
        max_seq_len_kv=4,
        sink_token=sink,
        diagonal_band_left_bound=2,
        diagonal_band_right_bound=1,
    )
    o.set_output(True)
    if st is not None:
        st.set_output(True)

    def prepare(p):
        p["lq"][...] = np.array(lq).reshape(2, 1, 1, 1)
        p["lkv"][...] = np.array(lkv).reshape(2, 1, 1, 1)
        p["oq"][...] = np.array(offq + [5]).reshape(3, 1, 1, 1)
        p["okv"][...] = np.array(offkv + [9]).reshape(3, 1, 1, 1)

    def fn(q, k, v, sink, **_):
        out = torch.zeros(1, 2, 6, 4, dtype=torch.float64)
        for b in range(2):
            qb = q[0, :, offq[b] : offq[b] + lq[b]]
            kb = k[0, :, offkv[b] : offkv[b] + lkv[b]].expand(2, -1, -1)
            vb = v[0, :, offkv[b] : offkv[b] + lkv[b]].expand(2, -1, -1)
            s = qb @ kb.transpose(-1, -2) * 0.5
            i, j = torch.arange(lq[b])[:, None], torch.arange(lkv[b])[None, :]
            s = s.masked_fill(~((j <= i + 1) & (j > i - 2)), float("-inf"))
            s = torch.cat([s, sink[0].expand(2, lq[b], 1)], dim=-1)
            out[0, :, offq[b] : offq[b] + lq[b]] = torch.softmax(s, -1)[..., :-1] @ vb
        return out

    check(g, o, [q, k, v, sink], fn, rng, prepare=prepare)
