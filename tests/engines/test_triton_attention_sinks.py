"""Attention sinks and the softmax's statistics in the generated attention kernels
(opgraph/engines/triton/attention/forward.py, backward.py): `sink_token` in the forward's online
softmax, the `score_max` / `score_sum_exp` outputs, Stats of -inf on empty rows (cuDNN's), and the
backward's `dSink_token`; under Triton's interpreter on small shapes (tiles of 16) against the
reference engine on random inputs with poisoned outputs: with causal masks of either alignment, the
band, padding masks (padded rows take no sink), packed (THD) tensors, GQA, dropout, a score modifier,
rows that see no key (the sink alone), fp32 / fp16 / bf16; a GPU test (marked gpu)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.core.device import Device
from opgraph.core.piece import make_piece
from opgraph.core.tensor import packed_strides
from opgraph.engines.triton.templates import attention as fwd_template
from opgraph.testing import check_plan

from ..helpers import assert_engine_matches, requires_cuda

DT = og.DataType
B, HQ = 2, 4
BSHD = (0, 2, 1, 3)
H100 = Device("cuda", 0, "H100", (9, 0), 132)
TOL = {
    DT.FLOAT: {"rtol": 2e-3, "atol": 2e-4},
    DT.HALF: {"rtol": 3e-2, "atol": 3e-2},
    DT.BFLOAT16: {"rtol": 5e-2, "atol": 5e-2},
}

pytestmark = pytest.mark.interpreter


def graph(
    io=DT.FLOAT,
    *,
    sq=20,
    skv=27,
    hk=2,
    d=16,
    backward=True,
    stats=True,
    sink=True,
    smax=True,
    ssum=True,
    empty="+inf",
    padding=False,
    drop=False,
    mod=False,
    **opts,
):
    """sdpa with a sink and its row statistics (and with `backward` an sdpa_backward writing dSink)."""
    g = og.Graph("att", io_data_type=io, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[B, HQ, sq, d], stride=packed_strides((B, HQ, sq, d), BSHD), name="q")
    k = g.tensor(dim=[B, hk, skv, d], name="k")
    v = g.tensor(dim=[B, hk, skv, d], name="v")
    kw = dict(opts, attn_scale=0.3)
    if sink:
        kw["sink_token"] = g.tensor(dim=[1, HQ, 1, 1], data_type=DT.FLOAT, name="sink")
    if padding:
        kw["use_padding_mask"] = True
        kw["seq_len_q"] = g.tensor(dim=[B, 1, 1, 1], data_type=DT.INT32, name="seq_len_q")
        kw["seq_len_kv"] = g.tensor(dim=[B, 1, 1, 1], data_type=DT.INT32, name="seq_len_kv")
    if drop:
        kw["dropout"] = (0.25, g.tensor(dim=[1], data_type=DT.INT64, name="seed"), 5)
    if mod:
        kw["score_mod"] = lambda sg, s: sg.mul(sg.tanh(sg.div(s, 2.0)), 2.0)
    extra = {}
    if smax:
        extra["score_max"] = g.tensor(dim=[B, HQ, sq, 1], data_type=DT.FLOAT, name="score_max")
    if ssum:
        extra["score_sum_exp"] = g.tensor(dim=[B, HQ, sq, 1], data_type=DT.FLOAT, name="score_sum_exp")
    o, st = g.sdpa(q, k, v, generate_stats=stats, empty_row_stats=empty, name="fwd", **kw, **extra)
    for x in (o, st, *extra.values()):
        if x is not None:
            x.set_output(True)
    if backward:
        do = g.tensor(dim=[B, HQ, sq, d], name="dO")
        dsink = g.tensor(dim=[1, HQ, 1, 1], data_type=DT.FLOAT, name="dSink") if sink else None
        for x in (*g.sdpa_backward(q, k, v, o, do, st, dSink_token=dsink, name="bwd", **kw), dsink):
            if x is not None:
                x.set_output(True)
    return g


def prepare(g, lens=((17, 0), (27, 9))):
    def prep(pack):
        final = g.final
        for uid in final.inputs:
            name = final.tensors[uid].name
            if name == "seq_len_q":
                pack[uid][...] = np.array(lens[0]).reshape(B, 1, 1, 1)
            elif name == "seq_len_kv":
                pack[uid][...] = np.array(lens[1]).reshape(B, 1, 1, 1)
            elif name == "sink":  # logits about the scores' size, one of -inf (the sink adds nothing)
                pack[uid][...] = np.array([1.5, -0.5, -np.inf, 3.0]).reshape(1, HQ, 1, 1)
            elif name == "seed":
                pack[uid][...] = 99

    return prep


def check(g, rng, io=DT.FLOAT, steps=2, lens=((17, 0), (27, 9)), prep_override=None):
    prep = prep_override or prepare(g, lens)
    return assert_engine_matches(g, rng, engines=("triton",), expect_steps=steps, prepare=prep, **TOL[io])


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"use_causal_mask": True},
        {"use_causal_mask_bottom_right": True},  # Sq < Skv
        {"use_causal_mask_bottom_right": True, "sq": 27, "skv": 20},  # rows that see no key: the sink alone
        {"diagonal_band_right_bound": 2, "diagonal_band_left_bound": 5, "diagonal_alignment": "BOTTOM_RIGHT"},
        {"padding": True, "use_causal_mask": True},  # padded rows take no sink; a sequence with no queries
        {"hk": 1, "drop": True, "mod": True, "use_causal_mask": True},
    ],
    ids=["none", "causal", "causal_br", "empty_rows", "band_br", "padding", "mqa_dropout_softcap"],
)
def test_sink_forward_and_backward(opts, rng):
    check(graph(**opts), rng)


@pytest.mark.parametrize("empty", ["+inf", "-inf"])
@pytest.mark.parametrize("sink", [False, True])
def test_row_statistics_on_empty_rows(empty, sink, rng):
    """Rows with no key kept (padding, a bottom-right diagonal past the rows): Stats of `empty`,
    score_max -inf and score_sum_exp 0 without a sink; the backward reads either Stats."""
    g = graph(sink=sink, empty=empty, padding=True, use_causal_mask_bottom_right=True, sq=27, skv=20)
    check(g, rng, lens=((27, 5), (20, 0)))


@pytest.mark.parametrize(
    "outs",
    [{"smax": False}, {"ssum": False}, {"stats": False, "backward": False}, {"sink": False, "backward": False}],
    ids=["sum_only", "max_only", "no_stats", "no_sink"],
)
def test_outputs_one_at_a_time(outs, rng):
    g = graph(use_causal_mask=True, **outs)
    check(g, rng, steps=2 if outs.get("backward", True) else 1)


@pytest.mark.parametrize("io", [DT.HALF, DT.BFLOAT16])
def test_half_types(io, rng):
    check(graph(io, use_causal_mask=True), rng, io)


def test_packed_sink_and_statistics(rng):
    """Packed q, k, v, O, Stats, score_max and score_sum_exp (at Stats' offsets), dSink summed over the
    sequences' rows only."""
    lq, lkv = (1, 17, 0, 23), (9, 17, 4, 31)
    b, sq, skv = 4, max(lq), max(lkv)
    off_q = np.concatenate([[1], 1 + np.cumsum(np.array(lq) + 2)])
    off_kv = np.concatenate([[1], 1 + np.cumsum(np.array(lkv) + 2)])
    tq, tkv = int(off_q[-1]) + 1, int(off_kv[-1]) + 1
    g = og.Graph("att", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[1, HQ, tq, 16], stride=packed_strides((1, HQ, tq, 16), BSHD), name="q")
    k = g.tensor(dim=[1, 2, tkv, 16], stride=packed_strides((1, 2, tkv, 16), BSHD), name="k")
    v = g.tensor(dim=[1, 2, tkv, 16], stride=packed_strides((1, 2, tkv, 16), BSHD), name="v")
    oq = g.tensor(dim=[b + 1, 1, 1, 1], data_type=DT.INT32, name="off_q")
    okv = g.tensor(dim=[b + 1, 1, 1, 1], data_type=DT.INT64, name="off_kv")
    offs = {f"{r}_ragged_offset": okv if r in "kv" else oq for r in ("q", "k", "v", "o", "stats")}
    kw = {
        "attn_scale": 0.3,
        "use_padding_mask": True,
        "seq_len_q": g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_q"),
        "seq_len_kv": g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_kv"),
        "max_seq_len_q": sq,
        "max_seq_len_kv": skv,
        "sink_token": g.tensor(dim=[1, HQ, 1, 1], data_type=DT.FLOAT, name="sink"),
        "use_causal_mask_bottom_right": True,
    }
    smax, ssum = (g.tensor(dim=[1, HQ, tq, 1], data_type=DT.FLOAT, name=n) for n in ("smax", "ssum"))
    o, st = g.sdpa(q, k, v, score_max=smax, score_sum_exp=ssum, empty_row_stats="-inf", **kw, **offs)
    o.set_stride(packed_strides((1, HQ, tq, 16), BSHD))
    do = g.tensor(dim=[1, HQ, tq, 16], stride=packed_strides((1, HQ, tq, 16), BSHD), name="dO")
    dsink = g.tensor(dim=[1, HQ, 1, 1], data_type=DT.FLOAT, name="dSink")
    for x in (o, st, smax, ssum, *g.sdpa_backward(q, k, v, o, do, st, dSink_token=dsink, **kw, **offs), dsink):
        x.set_output(True)

    def prep(pack):
        final = g.final
        by = {final.tensors[u].name: u for u in final.inputs}
        pack[by["seq_len_q"]][...] = np.array(lq).reshape(-1, 1, 1, 1)
        pack[by["seq_len_kv"]][...] = np.array(lkv).reshape(-1, 1, 1, 1)
        pack[by["off_q"]][...] = off_q.reshape(-1, 1, 1, 1)
        pack[by["off_kv"]][...] = off_kv.reshape(-1, 1, 1, 1)
        pack[by["sink"]][...] = np.array([1.5, -0.5, -np.inf, 3.0]).reshape(1, HQ, 1, 1)
        for name, off, lens in (("q", off_q, lq), ("dO", off_q, lq), ("k", off_kv, lkv), ("v", off_kv, lkv)):
            covered = np.zeros(pack[by[name]].shape[2], dtype=bool)
            for o_, n in zip(off, lens):
                covered[o_ : o_ + n] = True
            pack[by[name]][:, :, ~covered] = np.nan

    assert_engine_matches(g, rng, engines=("triton",), expect_steps=2, prepare=prep, **TOL[DT.FLOAT])


@pytest.mark.parametrize(
    "opts",
    [{"use_causal_mask": True}, {"padding": True, "use_causal_mask_bottom_right": True, "sink": True}],
    ids=["causal", "padding_sink"],
)
@pytest.mark.parametrize("seed", [2**41 + 12345, 3])
def test_rng_dump(opts, seed, rng):
    """rng_dump: the Philox keep mask of every element of the padded scores (masked ones too), bit for
    bit the reference's, beside the forward and backward that draw the same mask."""
    g = og.Graph("att", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[B, HQ, 20, 16], name="q")
    k, v = (g.tensor(dim=[B, 2, 27, 16], name=n) for n in "kv")
    kw = dict(opts, attn_scale=0.3)
    kw.pop("sink", None)
    if opts.get("sink"):
        kw["sink_token"] = g.tensor(dim=[1, HQ, 1, 1], data_type=DT.FLOAT, name="sink")
    if kw.pop("padding", False):
        kw["use_padding_mask"] = True
        kw["seq_len_q"] = g.tensor(dim=[B, 1, 1, 1], data_type=DT.INT32, name="seq_len_q")
        kw["seq_len_kv"] = g.tensor(dim=[B, 1, 1, 1], data_type=DT.INT32, name="seq_len_kv")
    kw["dropout"] = (0.3, g.tensor(dim=[1], data_type=DT.INT64, name="seed"), 2**32 - 9)
    dump = g.tensor(dim=[B, HQ, 20, 27], data_type=DT.FLOAT, name="dump")
    o, st = g.sdpa(q, k, v, rng_dump=dump, name="fwd", **kw)
    do = g.tensor(dim=[B, HQ, 20, 16], name="dO")
    for x in (o, st, dump, *g.sdpa_backward(q, k, v, o, do, st, name="bwd", **kw)):
        x.set_output(True)
    base = prepare(g)

    def prep(pack):
        base(pack)
        pack[next(u for u in g.final.inputs if g.final.tensors[u].name == "seed")][...] = seed

    check(g, rng, prep_override=prep)


def test_no_sink_leaves_the_forward_source_as_it_was():
    """Without a sink or the extra outputs the forward's text has none of their lines (the kernels of the
    features they already ran are unchanged)."""
    from opgraph.engines.triton.attention import FwdKnobs, forward

    g = graph(sink=False, smax=False, ssum=False, backward=False, use_causal_mask=True)
    final = g.final
    spec = fwd_template.TEMPLATE.matched(make_piece(final, 0, list(final.nodes)), H100).spec()
    src = forward(spec, FwdKnobs(64, 32, 4, 2)).source
    assert "sink" not in src and "smax" not in src and "ssum" not in src
    assert "lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * " in src


# -- Hopper (sm_90) compilation without a GPU -------------------------------------------------------------


def _hopper_graph(backward: bool):
    """One node (the forward, or the backward with dSink alone): bf16, B 2, H 4/2, S 2048, D 128, causal."""
    g = og.Graph("att", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    q, k, v = (g.tensor(dim=[2, 4 if n == "q" else 2, 2048, 128], name=n) for n in "qkv")
    sink = g.tensor(dim=[1, 4, 1, 1], data_type=DT.FLOAT, name="sink")
    kw = {"attn_scale": 128**-0.5, "use_causal_mask": True, "sink_token": sink}
    if backward:
        o, do = (g.tensor(dim=[2, 4, 2048, 128], name=n) for n in ("o", "dO"))
        st = g.tensor(dim=[2, 4, 2048, 1], data_type=DT.FLOAT, name="stats")
        dsink = g.tensor(dim=[1, 4, 1, 1], data_type=DT.FLOAT, name="dSink")
        outs = [*g.sdpa_backward(q, k, v, o, do, st, dSink_token=dsink, **kw), dsink]
    else:
        smax, ssum = (g.tensor(dim=[2, 4, 2048, 1], data_type=DT.FLOAT, name=n) for n in ("smax", "ssum"))
        outs = [*g.sdpa(q, k, v, score_max=smax, score_sum_exp=ssum, empty_row_stats="-inf", **kw), smax, ssum]
    for x in outs:
        x.set_output(True)
    return g


HOPPER_CASES = {
    "sink_fwd": (lambda: _hopper_graph(False), "attention", None),
    "sink_bwd": (lambda: _hopper_graph(True), "attention_bwd", None),
}


def test_sink_kernels_compile_for_hopper():
    """The sink's forward (with score_max, score_sum_exp) and backward (with the dSink launch) compile for
    sm_90 with the heuristic's knobs; only the backward's dK/dV launch spills (12 bytes here, GQA: its loop
    over the group's heads; the sink adds nothing to it)."""
    from .hopper_compile import attention_smem, compile_for_hopper

    out = compile_for_hopper(__name__)
    lines = [line.split() for line in out.splitlines() if line.startswith("compiled")]
    names = {(w[1], w[2]) for w in lines}
    assert {("sink_fwd", "kernel_attn_fwd"), ("sink_bwd", "kernel_attn_bwd_dsink")} <= names, lines
    for w in lines:
        assert int(w[w.index("spills") + 1]) <= (32 if w[2] == "kernel_attn_bwd_dkdv" else 0), w
    for case, kernel, smem, estimate in attention_smem(__name__, out):  # (the fit trusts the estimate)
        assert smem <= estimate, (case, kernel, smem, estimate)


# -- GPU --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("io", [DT.HALF, DT.BFLOAT16])
def test_gpu_sink_statistics_and_dsink(io):
    """B 2, H 4/2, S 700/900, D 128, bottom-right causal with padding, -inf Stats: the GPU's own knobs
    against the reference engine."""
    rng = np.random.default_rng(3)
    g = graph(io, sq=700, skv=900, hk=2, d=128, padding=True, use_causal_mask_bottom_right=True, empty="-inf")
    plan = g.build(device="cuda", engines=["triton"])
    assert len(plan.steps) == 2, plan.describe()
    bad = check_plan(plan, rng, prepare=prepare(g, ((700, 333), (900, 200))), rtol=5e-2, atol=5e-2)
    assert not bad, "\n".join(map(str, bad))
