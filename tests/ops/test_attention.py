"""sdpa / sdpa_backward on the reference engine against an independent PyTorch float64 formulation
(tests/ops/attention_torch.py) and F.scaled_dot_product_attention: masks x GQA x layouts x Sq != Skv,
bias, ALiBi, score modifiers, explicit-mask and Philox dropout, empty rows; the validation rules;
JSON round trips of graphs with score modifiers."""

from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest

import opgraph as og
from opgraph.ops import attention_ref as R
from opgraph.ops.score_mod import ScoreMod, Src

from ..helpers import check_rule
from .attention_torch import D, alibi_slopes, attention, keep_mask, run, strides

torch = pytest.importorskip("torch")
F = torch.nn.functional

B, HQ, DQK, DV = 2, 4, 8, 6
MASKS = {
    "none": {},
    "causal": {"use_causal_mask": True},
    "bottom_right": {"use_causal_mask_bottom_right": True},
    "window": {"sliding_window_length": 3},
    "causal_window": {"use_causal_mask": True, "sliding_window_length": 2},
    "br_window": {"use_causal_mask_bottom_right": True, "sliding_window_length": 3},
    "padding": {"use_padding_mask": True},
    "padding_br": {"use_padding_mask": True, "use_causal_mask_bottom_right": True},
    "padding_causal_window": {"use_padding_mask": True, "use_causal_mask": True, "sliding_window_length": 2},
}
LENS = (np.array([3, 5]), np.array([6, 2]))  # seq_len_q, seq_len_kv per batch (clipped to the dims)


def _keep(opts, sq, skv):
    lens = None
    if opts.get("use_padding_mask"):
        lens = (np.minimum(LENS[0], sq), np.minimum(LENS[1], skv))
    return keep_mask(
        B,
        sq,
        skv,
        lens=lens,
        causal=opts.get("use_causal_mask", False),
        br=opts.get("use_causal_mask_bottom_right", False),
        window=opts.get("sliding_window_length"),
    ), lens


# score modifiers: (builder, torch) pairs
def _softcap(g, s):
    return g.mul(g.tanh(g.div(s, 2.0)), 2.0)


def _leaky(g, s):
    return g.binary_select(s, g.mul(s, 0.25), g.cmp_gt(s, 0.0))


def _rel(g, s):  # ALiBi-like from positions, with a graph tensor of slopes [1, H, 1, 1]
    slopes = g.outer_slopes
    return g.add(s, g.mul(g.sub(g.gen_index(s, axis=3), g.gen_index(s, axis=2)), slopes))


def _t_rel(s, slopes):
    sq, skv = s.shape[2], s.shape[3]
    dist = torch.arange(skv, dtype=torch.float64)[None, :] - torch.arange(sq, dtype=torch.float64)[:, None]
    return s + dist * slopes


MODS = {
    "softcap": (_softcap, lambda s, _: torch.tanh(s / 2.0) * 2.0),
    "leaky": (_leaky, lambda s, _: torch.where(s > 0, s, 0.25 * s)),
    "rel": (_rel, _t_rel),
}


def _graph(
    sq,
    skv,
    hk,
    hv,
    layout,
    *,
    mask="none",
    bias=False,
    alibi=False,
    mod=None,
    drop_mask=False,
    backward=False,
    scale=0.35,
):
    """An sdpa (or sdpa_backward) graph in float64 and its input arrays (logical dims)."""
    rng = np.random.default_rng(
        zlib.crc32(repr((sq, skv, hk, hv, layout, mask, bias, alibi, mod, drop_mask, backward)).encode())
    )
    g = og.Graph("att", io_data_type=D.DOUBLE, intermediate_data_type=D.DOUBLE)
    dims = {"q": (B, HQ, sq, DQK), "k": (B, hk, skv, DQK), "v": (B, hv, skv, DV)}
    t = {n: g.tensor(dim=d, stride=strides(d, layout), name=n) for n, d in dims.items()}
    vals = {n: rng.uniform(-1.5, 1.5, d) for n, d in dims.items()}
    opts = dict(MASKS[mask])
    keep, lens = _keep(opts, sq, skv)
    kw = dict(attn_scale=scale, use_alibi_mask=alibi, **opts)
    feeds = {t[n]: vals[n] for n in dims}
    if lens is not None:
        kw["seq_len_q"] = g.tensor(dim=[B, 1, 1, 1], data_type=D.INT32, name="lq")
        kw["seq_len_kv"] = g.tensor(dim=[B, 1, 1, 1], data_type=D.INT32, name="lkv")
        feeds[kw["seq_len_q"]] = lens[0].reshape(B, 1, 1, 1)
        feeds[kw["seq_len_kv"]] = lens[1].reshape(B, 1, 1, 1)
    if bias:
        bdims = (1, HQ, sq, skv)
        kw["bias"] = g.tensor(dim=bdims, name="bias")
        vals["bias"] = rng.uniform(-1, 1, bdims)
        feeds[kw["bias"]] = vals["bias"]
    slopes = rng.uniform(0.1, 0.5, (1, HQ, 1, 1))
    if mod is not None:
        outer = g.tensor(dim=[1, HQ, 1, 1], name="slopes") if mod == "rel" else None  # read by _rel
        if outer is not None:
            feeds[outer] = slopes
        fn = MODS[mod][0]
        kw["score_mod"] = lambda sg, s: fn(_Sub(sg, outer), s)
    drop = None
    if drop_mask:
        drop = (rng.uniform(size=(B, HQ, sq, skv)) > 0.3).astype(np.float64)
        m = g.tensor(dim=[B, HQ, sq, skv], name="dmask")
        feeds[m] = drop
        kw["dropout"] = (m, 1 / 0.7)
        drop = drop / 0.7
    ref = {
        "keep": keep,
        "bias": vals.get("bias"),
        "alibi": alibi,
        "drop": drop,
        "scale": scale,
        "mod": None if mod is None else (lambda s: MODS[mod][1](s, torch.tensor(slopes))),
    }
    return g, t, kw, feeds, vals, ref


class _Sub:
    """Gives a score_mod function the slopes tensor as `g.outer_slopes`."""

    def __init__(self, sub, slopes):
        self._sub, self.outer_slopes = sub, slopes

    def __getattr__(self, name):
        return getattr(self._sub, name)


def _torch_forward(vals, ref, requires_grad=False):
    ts = {n: torch.tensor(vals[n], requires_grad=requires_grad) for n in ("q", "k", "v")}
    bias = None if ref["bias"] is None else torch.tensor(ref["bias"], requires_grad=requires_grad)
    o, lse = attention(
        ts["q"],
        ts["k"],
        ts["v"],
        scale=ref["scale"],
        bias=bias,
        alibi=ref["alibi"],
        keep=ref["keep"],
        mod=ref["mod"],
        drop=ref["drop"],
    )
    return ts, bias, o, lse


def _forward(sq, skv, hk, hv, layout, **features):
    g, t, kw, feeds, vals, ref = _graph(sq, skv, hk, hv, layout, **features)
    o, st = g.sdpa(t["q"], t["k"], t["v"], **kw, name="att")
    o.set_output(True).set_stride(strides((B, HQ, sq, DV), layout))
    st.set_output(True).set_data_type(D.DOUBLE)  # FLOAT by default
    got_o, got_st = run(g, feeds, [o, st])
    _, _, want_o, want_st = _torch_forward(vals, ref)
    np.testing.assert_allclose(got_o, want_o.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.isinf(got_st), np.isinf(want_st.detach().numpy()))
    np.testing.assert_allclose(got_st, want_st.detach().numpy(), rtol=1e-10, atol=1e-12)
    return g, got_o, ref


GQA = [(4, 4), (2, 2), (1, 2)]
SEQ = [(5, 7), (7, 5)]


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("hk,hv", GQA)
@pytest.mark.parametrize("sq,skv", SEQ)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_forward_masks_gqa_layouts(mask, hk, hv, sq, skv, layout):
    _forward(sq, skv, hk, hv, layout, mask=mask)


@pytest.mark.parametrize(
    "features",
    [
        {"bias": True},
        {"alibi": True},
        {"mod": "softcap"},
        {"mod": "leaky"},
        {"mod": "rel"},
        {"drop_mask": True},
        {"bias": True, "mod": "softcap", "drop_mask": True},
        {"alibi": True, "mod": "rel"},
    ],
)
@pytest.mark.parametrize("mask", ["none", "causal", "br_window", "padding_br"])
@pytest.mark.parametrize("sq,skv,hk,hv,layout", [(5, 7, 2, 2, "bshd"), (7, 5, 1, 2, "bhsd")])
def test_forward_features(features, mask, sq, skv, hk, hv, layout):
    _forward(sq, skv, hk, hv, layout, mask=mask, **features)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hk", [4, 2, 1])
def test_forward_against_torch_sdpa(causal, hk):
    """F.scaled_dot_product_attention itself (top-left causal, GQA, a float bias)."""
    g, t, kw, feeds, vals, _ref = _graph(5, 7, hk, hk, "bshd", mask="causal" if causal else "none", bias=True)
    o, _ = g.sdpa(t["q"], t["k"], t["v"], **kw, generate_stats=False)
    o.set_output(True)
    (got,) = run(g, feeds, [o])
    q, k, v = (torch.tensor(vals[n]) for n in "qkv")
    mask = torch.tensor(vals["bias"])
    if causal:
        mask = mask.masked_fill(~torch.ones(5, 7, dtype=torch.bool).tril(), float("-inf"))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.35, enable_gqa=hk != HQ)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12)


def test_empty_rows_give_zero_and_inf_stats():
    g = og.Graph("att", io_data_type=D.DOUBLE)
    q, k, v = (g.tensor(dim=d, name=n) for n, d in (("q", (2, 1, 4, 8)), ("k", (2, 1, 3, 8)), ("v", (2, 1, 3, 8))))
    lq = g.tensor(dim=[2, 1, 1, 1], data_type=D.INT32, name="lq")
    lkv = g.tensor(dim=[2, 1, 1, 1], data_type=D.INT32, name="lkv")
    o, st = g.sdpa(q, k, v, use_padding_mask=True, seq_len_q=lq, seq_len_kv=lkv)
    o.set_output(True)
    st.set_output(True)
    rng = np.random.default_rng(0)
    feeds = {x: rng.uniform(-1, 1, x.dim) for x in (q, k, v)}
    feeds[lq] = np.array([2, 4]).reshape(2, 1, 1, 1)
    feeds[lkv] = np.array([3, 0]).reshape(2, 1, 1, 1)  # batch 1: no key at all
    got_o, got_st = run(g, feeds, [o, st])
    assert np.all(got_o[0, :, 2:] == 0) and np.all(got_o[1] == 0)
    assert np.all(got_st[0, :, 2:] == np.inf) and np.all(got_st[1] == np.inf)
    assert np.all(np.isfinite(got_st[0, :, :2])) and np.abs(got_o[0, :, :2]).max() > 0


# -- backward ------------------------------------------------------------------------------------------


def _backward(sq, skv, hk, hv, layout, **features):
    g, t, kw, feeds, vals, ref = _graph(sq, skv, hk, hv, layout, backward=True, **features)
    ts, bias, o, lse = _torch_forward(vals, ref, requires_grad=True)
    do = np.random.default_rng(7).uniform(-1, 1, o.shape)
    o.backward(torch.tensor(do))
    to = g.tensor(dim=o.shape, name="o")
    tdo = g.tensor(dim=o.shape, name="dO")
    tst = g.tensor(dim=lse.shape, name="stats")
    feeds.update({to: o.detach().numpy(), tdo: do, tst: lse.detach().numpy()})
    dbias = None
    if bias is not None:
        dbias = g.tensor(dim=bias.shape, name="dBias")
        kw["dBias"] = dbias
    dq, dk, dv = g.sdpa_backward(t["q"], t["k"], t["v"], to, tdo, tst, **kw, name="att_bwd")
    outs = [dq, dk, dv] + ([dbias] if dbias is not None else [])
    for x in (dq, dk, dv):
        x.set_output(True)
    got = run(g, feeds, outs)
    want = [ts["q"].grad, ts["k"].grad, ts["v"].grad] + ([bias.grad] if bias is not None else [])
    for name, a, w in zip(("dQ", "dK", "dV", "dBias"), got, want):
        np.testing.assert_allclose(a, w.numpy(), rtol=1e-9, atol=1e-11, err_msg=name)


@pytest.mark.parametrize("mask", ["none", "causal", "bottom_right", "causal_window", "padding_br", "window"])
@pytest.mark.parametrize("hk,hv", GQA)
@pytest.mark.parametrize("sq,skv,layout", [(5, 7, "bshd"), (7, 5, "bhsd")])
def test_backward_masks_gqa(mask, hk, hv, sq, skv, layout):
    _backward(sq, skv, hk, hv, layout, mask=mask)


@pytest.mark.parametrize(
    "features",
    [
        {"bias": True},
        {"alibi": True},
        {"mod": "softcap"},
        {"mod": "leaky"},
        {"mod": "rel"},
        {"drop_mask": True},
        {"bias": True, "mod": "softcap", "drop_mask": True},
    ],
)
@pytest.mark.parametrize("mask", ["none", "causal", "padding_br"])
def test_backward_features(features, mask):
    _backward(5, 7, 2, 2, "bshd", mask=mask, **features)


# -- dropout (Philox) -------------------------------------------------------------------------------------


def test_philox_matches_known_structure():
    """The mask is a pure function of (seed, offset + linear index): shifting the offset shifts it."""
    shape = (2, 2, 3, 5)
    a = R.dropout_keep(0.4, 11, 100, shape).reshape(-1)
    b = R.dropout_keep(0.4, 11, 107, shape).reshape(-1)
    np.testing.assert_array_equal(a[7:], b[:-7])
    c = R.dropout_keep(0.4, 12, 100, shape).reshape(-1)
    assert (a != c).any()
    u = R.philox_uniform(3, np.arange(20000, dtype=np.int64))
    assert u.dtype == np.float32 and 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.01


def test_philox_bitexact_with_triton_rand():
    triton = pytest.importorskip("triton")
    import os

    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available():
        pytest.skip("needs Triton's interpreter or a GPU")
    tl = triton.language

    @triton.jit
    def rand_kernel(out, seed, offset, N: tl.constexpr):
        i = tl.arange(0, N).to(tl.int64)
        tl.store(out + i, tl.rand(seed, offset + i))

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for seed, offset in [(0, 0), (12345, 2**33 + 17), (-5, 3), (2**40 + 3, 2**31 - 100)]:
        out = torch.empty(128, dtype=torch.float32, device=dev)
        rand_kernel[(1,)](out, seed, offset, N=128)
        want = R.philox_uniform(seed, offset + np.arange(128, dtype=np.int64))
        np.testing.assert_array_equal(out.cpu().numpy(), want)


def test_philox_dropout_forward_and_backward():
    """O with Philox dropout equals the independent formula with the mask tl.rand draws; the backward
    (same seed/offset) matches autograd through it; another seed gives another O."""
    rng = np.random.default_rng(3)
    sq, skv, p = 5, 7, 0.3
    g = og.Graph("att", io_data_type=D.DOUBLE, intermediate_data_type=D.DOUBLE)
    q, k, v = (
        g.tensor(dim=d, name=n) for n, d in (("q", (B, HQ, sq, DQK)), ("k", (B, 2, skv, DQK)), ("v", (B, 2, skv, DV)))
    )
    seed = g.tensor(dim=[1], data_type=D.INT64, name="seed")
    off = g.tensor(dim=[1], data_type=D.INT64, name="offset")
    o, st = g.sdpa(q, k, v, attn_scale=0.5, use_causal_mask=True, dropout=(p, seed, off))
    o.set_output(True)
    st.set_output(True).set_data_type(D.DOUBLE)
    vals = {x: rng.uniform(-1, 1, x.dim) for x in (q, k, v)}
    feeds = {**vals, seed: np.array([1234]), off: np.array([77])}
    got_o, got_st = run(g, feeds, [o, st])
    keep = np.zeros((B, HQ, sq, skv), dtype=bool)
    for idx in np.ndindex(*keep.shape):
        n = ((idx[0] * HQ + idx[1]) * sq + idx[2]) * skv + idx[3]
        keep[idx] = R.philox_uniform(1234, np.array([77 + n]))[0] >= np.float32(p)
    assert 0.4 < keep.mean() < 0.95
    tq, tk, tv = (torch.tensor(vals[x], requires_grad=True) for x in (q, k, v))
    causal = keep_mask(B, sq, skv, causal=True)
    want_o, want_st = attention(tq, tk, tv, scale=0.5, keep=causal, drop=keep / (1 - p))
    np.testing.assert_allclose(got_o, want_o.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_st, want_st.detach().numpy(), rtol=1e-10)
    other, _ = run(g, {**feeds, seed: np.array([1235])}, [o, st])
    assert np.abs(other - got_o).max() > 1e-3
    # backward with the same dropout
    do = rng.uniform(-1, 1, want_o.shape)
    want_o.backward(torch.tensor(do))
    gb = og.Graph("bwd", io_data_type=D.DOUBLE, intermediate_data_type=D.DOUBLE)
    h = {n: gb.tensor(dim=x.dim, name=n) for n, x in (("q", q), ("k", k), ("v", v))}
    to, tdo = gb.tensor(dim=o.dim, name="o"), gb.tensor(dim=o.dim, name="dO")
    tst = gb.tensor(dim=st.dim, name="stats")
    s2, o2 = gb.tensor(dim=[1], data_type=D.INT64, name="seed"), gb.tensor(dim=[1], data_type=D.INT64, name="off")
    grads = gb.sdpa_backward(
        h["q"], h["k"], h["v"], to, tdo, tst, attn_scale=0.5, use_causal_mask=True, dropout=(p, s2, o2)
    )
    for x in grads:
        x.set_output(True)
    got = run(
        gb,
        {
            h["q"]: vals[q],
            h["k"]: vals[k],
            h["v"]: vals[v],
            to: got_o,
            tdo: do,
            tst: got_st,
            s2: np.array([1234]),
            o2: np.array([77]),
        },
        grads,
    )
    for a, w in zip(got, (tq.grad, tk.grad, tv.grad)):
        np.testing.assert_allclose(a, w.numpy(), rtol=1e-9, atol=1e-11)


# -- the Philox seed and offset as device tensors, pass-by-value tensors and numbers ----------------------

BIG_SEED = 2**60 + 1  # above 2**53: float64 (let alone fp32) rounds it to 2**60, which draws another mask
BIG_OFFSET = 2**33 + 5  # above 2**32: an int32 would wrap it


def philox_graph(how, seed_type=D.INT64, io=D.DOUBLE):
    """sdpa with Philox dropout and rng_dump, then sdpa_backward with the same dropout, over `io` tensors.
    Seed and offset: "device" 1-element tensors read at run time, "by_value" pass-by-value tensors
    (cuDNN's is_pass_by_value, [1, 1, 1, 1]), or "number" (BIG_SEED and BIG_OFFSET baked in)."""
    sq, skv = 5, 7
    g = og.Graph("drop", io_data_type=io, intermediate_data_type=D.DOUBLE if io is D.DOUBLE else D.FLOAT)
    q = g.tensor(dim=[B, HQ, sq, DQK], name="q")
    k = g.tensor(dim=[B, 2, skv, DQK], name="k")
    v = g.tensor(dim=[B, 2, skv, DV], name="v")
    do = g.tensor(dim=[B, HQ, sq, DV], name="dO")
    if how == "number":
        seed, off = BIG_SEED, BIG_OFFSET
    else:
        seed, off = (
            g.tensor(dim=[1, 1, 1, 1], data_type=seed_type, is_pass_by_value=how == "by_value", name=n)
            for n in ("seed", "offset")
        )
    dump = g.tensor(dim=[B, HQ, sq, skv], data_type=D.FLOAT, name="rng_dump")
    kw = {"attn_scale": 0.5, "use_causal_mask": True, "dropout": (0.3, seed, off)}
    o, st = g.sdpa(q, k, v, rng_dump=dump, name="fwd", **kw)
    o.set_output(True).set_name("o")
    st.set_output(True).set_data_type(D.DOUBLE if io is D.DOUBLE else D.FLOAT).set_name("stats")
    dump.set_output(True)
    for x, n in zip(g.sdpa_backward(q, k, v, o, do, st, name="bwd", **kw), ("dQ", "dK", "dV")):
        x.set_output(True).set_name(n)
    return g


def philox_inputs(g, seed=0):
    """Random q, k, v, dO of philox_graph `g`, by name, in their types."""
    rng = np.random.default_rng(seed)
    final = g.final
    descs = [final.tensors[u] for u in final.inputs if final.tensors[u].name in ("q", "k", "v", "dO")]
    return {t.name: rng.uniform(-1, 1, t.dim).astype(t.data_type.numpy) for t in descs}


def run_philox(plan, inputs, seed, offset):
    """Outputs by name of `plan` (graph of philox_graph) on `inputs`, seed and offset given as its tensors
    take them (a host value where pass-by-value, else a 1-element buffer of the tensor's type)."""
    from opgraph.testing import empty_like_desc, poison

    final = plan.graph
    pack = {}
    for uid in final.inputs:
        t = final.tensors[uid]
        if t.name in ("seed", "offset"):
            value = seed if t.name == "seed" else offset
            pack[uid] = value if t.is_pass_by_value else np.full(t.dim, value, t.data_type.numpy)
        else:
            pack[uid] = inputs[t.name]
    outs = {u: poison(empty_like_desc(final.tensors[u])) for u in final.outputs}
    plan.execute({**pack, **outs})
    return {final.tensors[u].name: outs[u] for u in final.outputs}


def test_philox_seed_device_by_value_or_number_draws_one_mask():
    """The same seed and offset as 1-element device tensors, pass-by-value tensors or numbers give the same
    outputs, forward and backward, bit for bit; the mask is the spec's for the exact int64 values."""
    inputs = philox_inputs(philox_graph("device"))
    got = {
        how: run_philox(philox_graph(how).build(device="cpu", engines=["reference"]), inputs, BIG_SEED, BIG_OFFSET)
        for how in ("device", "by_value", "number")
    }
    for how in ("by_value", "number"):
        for name, want in got["device"].items():
            np.testing.assert_array_equal(got[how][name], want, err_msg=f"{how}: {name}")
    want_keep = R.dropout_keep(0.3, BIG_SEED, BIG_OFFSET, got["device"]["rng_dump"].shape)
    np.testing.assert_array_equal(got["device"]["rng_dump"], want_keep.astype(np.float32))
    assert 0.4 < want_keep.mean() < 0.95
    for name in ("o", "dQ", "dK", "dV"):
        assert np.isfinite(got["device"][name]).all() and np.abs(got["device"][name]).max() > 0


@pytest.mark.parametrize("how", ["device", "by_value"])
def test_philox_every_bit_of_the_seed_and_offset_counts(how):
    """A seed one apart above 2**53 (equal in float64), one differing only in its high bits, an offset
    differing only above bit 32: each draws another mask (and another O and dQ)."""
    g = philox_graph(how)
    plan = g.build(device="cpu", engines=["reference"])
    inputs = philox_inputs(g)
    base = run_philox(plan, inputs, BIG_SEED, BIG_OFFSET)
    for seed, offset in (
        (BIG_SEED - 1, BIG_OFFSET),
        (BIG_SEED ^ (1 << 62), BIG_OFFSET),
        (BIG_SEED, BIG_OFFSET + 2**40),
    ):
        other = run_philox(plan, inputs, seed, offset)
        assert (other["rng_dump"] != base["rng_dump"]).any(), (seed, offset)
        assert np.abs(other["o"] - base["o"]).max() > 1e-3 and np.abs(other["dQ"] - base["dQ"]).max() > 1e-3
        np.testing.assert_array_equal(other["rng_dump"], R.dropout_keep(0.3, seed, offset, base["rng_dump"].shape))
    np.testing.assert_array_equal(run_philox(plan, inputs, BIG_SEED, BIG_OFFSET)["o"], base["o"])


def test_philox_int32_pass_by_value_seed_equals_int64_device_seed():
    inputs = philox_inputs(philox_graph("device"))
    a = run_philox(philox_graph("by_value", D.INT32).build(device="cpu"), inputs, 2**31 - 1, 7)
    b = run_philox(philox_graph("device").build(device="cpu"), inputs, 2**31 - 1, 7)
    for name, want in b.items():
        np.testing.assert_array_equal(a[name], want)


def test_philox_pass_by_value_host_forms():
    """A pass-by-value seed takes a Python int, NumPy integer scalars and 0-d or 1-element integer arrays
    and CPU tensors (cuDNN's variant packs), all the same value."""
    g = philox_graph("by_value")
    plan = g.build(device="cpu")
    inputs = philox_inputs(g)
    want = run_philox(plan, inputs, BIG_SEED, BIG_OFFSET)["o"]
    forms = [np.int64(BIG_SEED), np.uint64(BIG_SEED), np.array(BIG_SEED), np.full((1, 1, 1, 1), BIG_SEED, np.int64)]
    forms.append(torch.full((1, 1, 1, 1), BIG_SEED, dtype=torch.int64))
    for form in forms:
        np.testing.assert_array_equal(run_philox(plan, inputs, form, BIG_OFFSET)["o"], want, err_msg=repr(form))


@pytest.mark.parametrize(
    "seed, offset, seed_type, rule, name",
    [
        (-1, 5, D.INT64, "sdpa.dropout", "seed"),
        (5, -3, D.INT64, "sdpa.dropout", "offset"),
        (2**63, 5, D.INT64, "pack.pass_by_value", "seed"),
        (np.uint64(2**63 + 1), 5, D.INT64, "pack.pass_by_value", "seed"),
        (5.0, 5, D.INT64, "pack.pass_by_value", "seed"),
        (float(BIG_SEED), 5, D.INT64, "pack.pass_by_value", "seed"),
        (np.float64(5), 5, D.INT64, "pack.pass_by_value", "seed"),
        (np.array([5.0]), 5, D.INT64, "pack.pass_by_value", "seed"),
        ("torch float", 5, D.INT64, "pack.pass_by_value", "seed"),
        (True, 5, D.INT64, "pack.pass_by_value", "seed"),
        (5, 2.5, D.INT64, "pack.pass_by_value", "offset"),
        (2**31, 5, D.INT32, "pack.pass_by_value", "seed"),
        (np.array([1, 2]), 5, D.INT64, "pack.pass_by_value", "seed"),
    ],
)
def test_philox_pass_by_value_values_that_do_not_fit(seed, offset, seed_type, rule, name):
    """A negative seed or offset, a value beyond the tensor's type, a float (it holds integers exactly
    only below 2**53) or a bool: a VariantPackError naming the tensor and the rule, before anything runs."""
    if isinstance(seed, str):
        seed = torch.tensor([5.0])
    g = philox_graph("by_value", seed_type)
    plan = g.build(device="cpu")
    with pytest.raises(og.VariantPackError) as info:
        run_philox(plan, philox_inputs(g), seed, offset)
    check_rule(info.value, rule, name)


# -- score modifiers: equivalences, derivative, JSON ------------------------------------------------------


def test_score_mod_causal_equals_builtin_causal():
    """A causal mask written as a score modifier (gen_index, select -inf) equals use_causal_mask."""

    def causal(g, s):
        return g.binary_select(s, -math.inf, g.cmp_le(g.gen_index(s, axis=3), g.gen_index(s, axis=2)))

    outs = []
    for kw in ({"score_mod": causal}, {"use_causal_mask": True}):
        g = og.Graph("att", io_data_type=D.DOUBLE)
        q, k, v = (g.tensor(dim=[1, 2, 5, 4], name=n) for n in "qkv")
        o, _ = g.sdpa(q, k, v, generate_stats=False, **kw)
        o.set_output(True)
        rng = np.random.default_rng(0)
        outs.append(run(g, {x: rng.uniform(-1, 1, x.dim) for x in (q, k, v)}, [o])[0])
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-12)


@pytest.mark.parametrize(
    "build,torch_fn",
    [
        (lambda g, s: g.mul(g.tanh(g.div(s, 3.0)), 3.0), lambda s: torch.tanh(s / 3.0) * 3.0),
        (lambda g, s: g.mul(s, s), lambda s: s * s),
        (lambda g, s: g.add(g.exp(g.mul(s, 0.5)), g.sin(s)), lambda s: torch.exp(0.5 * s) + torch.sin(s)),
        (lambda g, s: g.pointwise(s, 2.0, mode="pow"), lambda s: s**2.0),
        (lambda g, s: g.max(s, g.mul(s, s)), lambda s: torch.maximum(s, s * s)),
        (lambda g, s: g.relu(s, negative_slope=0.1), lambda s: F.leaky_relu(s, 0.1)),
        (lambda g, s: g.sigmoid(g.gelu(s)), lambda s: torch.sigmoid(F.gelu(s))),
        (lambda g, s: g.add(s, 1.0), lambda s: s + 1.0),
    ],
)
def test_score_mod_derivative(build, torch_fn):
    from opgraph.autodiff.score_mod import derivative
    from opgraph.ops.score_mod import ScoreModBuilder, evaluate

    sub = ScoreModBuilder(object(), "t")
    mod, _extra = sub.finish(build(sub, sub.score))
    d = derivative(mod)
    s = np.random.default_rng(1).uniform(-2, 2, (1, 2, 3, 4))
    grad = np.random.default_rng(2).uniform(-1, 1, s.shape)
    ts = torch.tensor(s, requires_grad=True)
    torch_fn(ts).backward(torch.tensor(grad))
    np.testing.assert_allclose(evaluate(mod, s, []), torch_fn(torch.tensor(s)).numpy(), rtol=1e-12)
    np.testing.assert_allclose(evaluate(d, s, [], grad), ts.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert not d.reads(Src.INPUT)


def test_json_round_trip_with_score_mod():
    g = og.Graph("att", io_data_type=D.HALF)
    q = g.tensor(dim=[1, 4, 6, 8], stride=strides((1, 4, 6, 8), "bshd"), name="q")
    k, v = (g.tensor(dim=[1, 2, 6, 8], name=n) for n in "kv")
    slopes = g.tensor(dim=[1, 4, 1, 1], data_type=D.FLOAT, name="slopes")
    cap = g.tensor(dim=[1], data_type=D.FLOAT, name="cap")

    def mod(sg, s):
        dist = sg.sub(sg.gen_index(s, axis=3), sg.gen_index(s, axis=2))
        capped = sg.mul(sg.tanh(sg.div(s, cap)), cap)
        return sg.add(capped, sg.mul(dist, slopes))

    o, st = g.sdpa(q, k, v, attn_scale=0.125, use_causal_mask=True, score_mod=mod, name="att")
    o.set_output(True)
    st.set_output(True)
    text = g.to_json()
    doc = json.loads(text)
    attrs = doc["ops"][0]["attrs"]["score_mod"]
    assert attrs["num_inputs"] == 2 and attrs["nodes"][0]["mode"] == "GEN_INDEX"
    g2 = og.Graph.from_json(text)
    assert g2.final == g.final and g2.key() == g.key() and hash(g2.final) == hash(g.final)
    assert "score_mod={%0 = gen_index(score, axis=3)" in str(g2.final)
    node = g2.final.nodes[0]
    assert node.input("score_mod_input0") == cap.uid and node.input("score_mod_input1") == slopes.uid  # first use
    # the same graph runs after the round trip, with the same result
    rng = np.random.default_rng(0)
    feeds = {x: rng.uniform(-1, 1, x.dim) for x in (q, k, v)}
    feeds.update({slopes: rng.uniform(0.1, 0.5, (1, 4, 1, 1)), cap: np.array([5.0])})
    a = run(g, feeds, [o, st])
    b = run(g2, {g2_handle(g2, x): val for x, val in feeds.items()}, [g2_handle(g2, o), g2_handle(g2, st)])
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
        assert np.isfinite(x).all()


def g2_handle(g2, t):
    """The handle of graph g2 (loaded from JSON) with t's UID."""
    return next(h for h in g2._tensors if h.uid == t.uid)


def test_json_round_trip_backward_with_score_mod():
    g = og.Graph("bwd", io_data_type=D.FLOAT)
    q, k, v, o, do = (g.tensor(dim=[1, 2, 4, 8], name=n) for n in ("q", "k", "v", "o", "dO"))
    st = g.tensor(dim=[1, 2, 4, 1], name="stats")
    bias = g.tensor(dim=[1, 2, 4, 4], name="bias")
    db = g.tensor(dim=[1, 2, 4, 4], name="dBias")
    grads = g.sdpa_backward(
        q, k, v, o, do, st, bias=bias, dBias=db, score_mod=_softcap, use_deterministic_algorithm=True
    )
    for x in grads:
        x.set_output(True)
    g2 = og.Graph.from_json(g.to_json())
    assert g2.final == g.final
    op = g2.final.nodes[0].op
    assert isinstance(op.score_mod_grad, ScoreMod) and op.score_mod_grad.reads(Src.GRAD)
    assert g2.final.nodes[0].output("dBias") == db.uid


# -- validation rules -------------------------------------------------------------------------------------


def _qkv(g, q=(2, 4, 5, 8), k=(2, 2, 6, 8), v=(2, 2, 6, 8), dt=None):
    return [g.tensor(dim=d, name=n, data_type=dt) for n, d in (("q", q), ("k", k), ("v", v))]


def _err(build, cls, rule, *names):
    g = og.Graph("att")
    with pytest.raises(cls) as info:
        build(g)
        g.validate()
    return check_rule(info.value, rule, *names)


def _fwd(g, **kw):
    dims = kw.pop("dims", {})
    q, k, v = _qkv(g, **dims)
    o, st = g.sdpa(q, k, v, name="att", **kw)
    o.set_output(True)
    if st is not None:
        st.set_output(True)
    return q, k, v


@pytest.mark.parametrize(
    "dims,rule,name",
    [
        ({"q": (2, 4, 5)}, "sdpa.rank", "q"),
        ({"k": (3, 2, 6, 8), "v": (3, 2, 6, 8)}, "sdpa.batch", "k"),
        ({"k": (2, 2, 6, 16)}, "sdpa.head_dim", "k"),
        ({"v": (2, 2, 7, 8)}, "sdpa.kv_length", "v"),
        ({"k": (2, 3, 6, 8)}, "sdpa.gqa", "k"),
        ({"v": (2, 3, 6, 8)}, "sdpa.gqa", "v"),
    ],
)
def test_shape_rules(dims, rule, name):
    _err(lambda g: _fwd(g, dims=dims), og.ShapeError, rule, name)


def test_dtype_rules():
    def mixed(g):
        q, k, v = _qkv(g)
        k.set_data_type(D.FLOAT)
        g.sdpa(q, k, v, generate_stats=False)[0].set_output(True)

    _err(mixed, og.DataTypeError, "sdpa.dtype", "k")
    _err(
        lambda g: g.sdpa(*_qkv(g, dt=D.INT8), generate_stats=False)[0].set_output(True),
        og.DataTypeError,
        "sdpa.dtype",
        "q",
    )


def test_mask_rules():
    _err(
        lambda g: _fwd(g, use_causal_mask=True, use_causal_mask_bottom_right=True),
        og.AttributeValueError,
        "sdpa.causal",
    )
    _err(lambda g: _fwd(g, sliding_window_length=0), og.AttributeValueError, "sdpa.sliding_window")
    _err(lambda g: _fwd(g, use_padding_mask=True), og.ShapeError, "sdpa.padding_mask")
    _err(
        lambda g: _fwd(
            g,
            seq_len_q=g.tensor(dim=[2, 1, 1, 1], data_type=D.INT32, name="lq"),
            seq_len_kv=g.tensor(dim=[2, 1, 1, 1], data_type=D.INT32, name="lkv"),
        ),
        og.AttributeValueError,
        "sdpa.padding_mask",
        "lq",
    )
    _err(
        lambda g: _fwd(
            g,
            use_padding_mask=True,
            seq_len_q=g.tensor(dim=[2, 1, 1, 1], name="lq"),
            seq_len_kv=g.tensor(dim=[2, 1, 1, 1], data_type=D.INT32, name="lkv"),
        ),
        og.DataTypeError,
        "sdpa.seq_len",
        "lq",
    )
    _err(
        lambda g: _fwd(
            g,
            use_padding_mask=True,
            seq_len_q=g.tensor(dim=[2, 1, 1, 1], data_type=D.INT32),
            seq_len_kv=g.tensor(dim=[1, 2, 1, 1], data_type=D.INT32, name="lkv"),
        ),
        og.ShapeError,
        "sdpa.seq_len",
        "lkv",
    )
    _err(lambda g: _fwd(g, bias=g.tensor(dim=[2, 4, 5, 3], name="b")), og.ShapeError, "sdpa.bias_dims", "b")
    _err(lambda g: _fwd(g, bias=g.tensor(dim=[4, 5, 6], name="b")), og.ShapeError, "sdpa.bias_dims", "b")


def test_dropout_rules():
    _err(
        lambda g: _fwd(g, dropout=(1.0, g.tensor(dim=[1], data_type=D.INT64), g.tensor(dim=[1], data_type=D.INT64))),
        og.AttributeValueError,
        "sdpa.dropout",
    )
    _err(
        lambda g: _fwd(g, dropout=(0.1, g.tensor(dim=[1], name="seed"), g.tensor(dim=[1], data_type=D.INT64))),
        og.DataTypeError,
        "sdpa.dropout",
        "seed",
    )
    _err(
        lambda g: _fwd(
            g, dropout=(0.1, g.tensor(dim=[2], data_type=D.INT64, name="seed"), g.tensor(dim=[1], data_type=D.INT64))
        ),
        og.ShapeError,
        "op.scalar_input",
        "seed",
    )
    _err(lambda g: _fwd(g, dropout=0.1), og.AttributeValueError, "sdpa.dropout")
    _err(lambda g: _fwd(g, dropout=(0.1, -1, 0)), og.AttributeValueError, "sdpa.dropout")  # a negative seed
    _err(lambda g: _fwd(g, dropout=(0.1, 3, -2)), og.AttributeValueError, "sdpa.dropout")
    _err(lambda g: _fwd(g, dropout=(0.1, 2**63, 0)), og.AttributeValueError, "sdpa.dropout")  # beyond int64
    _err(lambda g: _fwd(g, dropout=(0.1, 2.5, 0)), og.AttributeValueError, "sdpa.dropout")
    _err(
        lambda g: _fwd(
            g,
            dropout=(
                0.1,
                g.tensor(dim=[1], data_type=D.FLOAT, is_pass_by_value=True, name="seed"),
                g.tensor(dim=[1], data_type=D.INT64, is_pass_by_value=True),
            ),
        ),
        og.DataTypeError,
        "sdpa.dropout",
        "seed",
    )
    _err(lambda g: _fwd(g, dropout=(g.tensor(dim=[2, 4, 5, 7], name="m"), 2.0)), og.ShapeError, "sdpa.dropout", "m")


def test_score_mod_rules():
    def conv_in_mod(g):
        _fwd(g, score_mod=lambda sg, s: sg.matmul(s, s))

    _err(conv_in_mod, og.AttributeValueError, "sdpa.score_mod_op")
    _err(
        lambda g: _fwd(g, score_mod=lambda sg, s: sg.add(s, g.tensor(dim=[2, 4, 5, 3], name="x"))),
        og.ShapeError,
        "sdpa.score_mod_input",
        "x",
    )
    _err(
        lambda g: _fwd(g, score_mod=lambda sg, s: sg.add(s, sg.tensor(dim=[1]))), og.GraphError, "sdpa.score_mod_tensor"
    )
    _err(lambda g: _fwd(g, score_mod=lambda sg, s: "x"), og.AttributeValueError, "sdpa.score_mod_result")
    _err(
        lambda g: _fwd(g, score_mod=lambda sg, s: sg.gen_index(s, axis=5)),
        og.AttributeValueError,
        "sdpa.score_mod_axis",
    )
    _err(lambda g: _fwd(g, score_mod=3), og.AttributeValueError, "sdpa.score_mod")


def test_backward_rules():
    def bad_stats(g):
        q, k, v = _qkv(g)
        o, do = (g.tensor(dim=[2, 4, 5, 8], name=n) for n in ("o", "dO"))
        st = g.tensor(dim=[2, 4, 5, 2], name="st")
        for x in g.sdpa_backward(q, k, v, o, do, st):
            x.set_output(True)

    _err(bad_stats, og.ShapeError, "sdpa_backward.dims", "st")

    def dbias_without_bias(g):
        q, k, v = _qkv(g)
        o, do = (g.tensor(dim=[2, 4, 5, 8], name=n) for n in ("o", "dO"))
        st = g.tensor(dim=[2, 4, 5, 1], name="st")
        for x in g.sdpa_backward(q, k, v, o, do, st, dBias=g.tensor(dim=[1, 4, 5, 6], name="db")):
            x.set_output(True)

    _err(dbias_without_bias, og.AttributeValueError, "sdpa_backward.dbias", "db")


def test_alibi_slopes():
    np.testing.assert_allclose(R.alibi_slopes(4), [2**-2, 2**-4, 2**-6, 2**-8])
    np.testing.assert_allclose(R.alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])
    np.testing.assert_allclose(R.alibi_slopes(6), alibi_slopes(6).numpy())
