"""Attention as LLM stacks run it, on the reference engine, against an independent PyTorch float64
formulation written in this file from docs/attention.md: keep masks built by explicit loops, packed
and paged tensors built and read back by explicit loops, the sink as an extra softmax column,
gradients by autograd. A combination matrix of layout (dense, packed, paged) x band (causal either
alignment, left, right, both) x sink x score modifier x GQA x dropout at tiny shapes, forward and
backward; decode shapes; the outputs score_max / score_sum_exp / rng_dump; the rules."""

from __future__ import annotations

import itertools
import math
import zlib

import numpy as np
import pytest

import opgraph as og
from opgraph.ops import attention_ref as R
from opgraph.ops.attention_builders import band_fields
from opgraph.testing import empty_like_desc

from ..helpers import check_rule
from .attention_torch import D, fill, strides

torch = pytest.importorskip("torch")

B, HQ, DQK, DV = 2, 4, 8, 6
LQ, LKV = np.array([3, 5]), np.array([6, 4])  # lengths of the two sequences
BLOCK = 2  # rows of a page of the paged caches


# -- the independent formulation ------------------------------------------------------------------------


def keep_loops(sq, skv, lq, lkv, *, padding, br, left, right):
    """keep(b, i, j) of the documented band table, by loops over every position."""
    keep = np.ones((B, 1, sq, skv), dtype=bool)
    for b in range(B):
        aq, akv = (int(lq[b]), int(lkv[b])) if padding else (sq, skv)
        delta = akv - aq if br else 0
        for i in range(sq):
            for j in range(skv):
                ok = not padding or (i < aq and j < akv)
                if right is not None:
                    ok = ok and j <= i + delta + right
                if left is not None:
                    ok = ok and j > i + delta - left
                keep[b, 0, i, j] = ok
    return keep


def attend(q, k, v, *, scale, keep, sink=None, mod=None, drop=None, empty=math.inf, rows=None):
    """(O, Stats, score_max, score_sum_exp) in float64; the sink is one more softmax column whose value
    row is zero, -inf on padded rows (`rows` False); a row with every logit -inf gives O = 0,
    Stats = `empty`, max -inf, sum 0."""
    hq = q.shape[1]
    s = (q @ k.repeat_interleave(hq // k.shape[1], 1).transpose(-1, -2)) * scale
    if mod is not None:
        s = mod(s)
    s = s.masked_fill(~torch.as_tensor(keep), float("-inf"))
    if sink is not None:
        column = sink.reshape(1, hq, 1, 1).expand(*s.shape[:3], 1)
        if rows is not None:
            column = column.masked_fill(~torch.as_tensor(rows), float("-inf"))
        s = torch.cat([s, column], dim=-1)
    empty_row = (s == float("-inf")).all(-1, keepdim=True)
    safe = s.masked_fill(empty_row, 0.0)
    p = torch.softmax(safe, -1).masked_fill(empty_row, 0.0)
    lse = torch.logsumexp(safe, -1, keepdim=True)
    m = s.amax(-1, keepdim=True)
    total = torch.exp(safe - safe.amax(-1, keepdim=True)).sum(-1, keepdim=True).masked_fill(empty_row, 0.0)
    if sink is not None:
        p = p[..., :-1]
    if drop is not None:
        p = p * torch.as_tensor(drop)
    o = p @ v.repeat_interleave(hq // v.shape[1], 1)
    return o, lse.masked_fill(empty_row, empty), m, total


def pack_loops(dense, offsets, lens, tokens):
    """Dense [B, H, S, w] written row by row into a zero packed [1, H, T, w]."""
    out = np.zeros((1, dense.shape[1], tokens, dense.shape[3]))
    for b in range(dense.shape[0]):
        for i in range(int(lens[b])):
            out[0, :, offsets[b] + i] = dense[b, :, i]
    return out


def page_loops(dense, rng):
    """A container [pages, H, BLOCK, w] holding dense [B, H, S, w] in shuffled pages, and the table."""
    b, h, s, w = dense.shape
    per = -(-s // BLOCK)
    order = rng.permutation(b * per) + 1  # page 0 stays unused (zeros)
    container = np.zeros((b * per + 1, h, BLOCK, w))
    table = np.zeros((b, 1, per, 1), dtype=np.int32)
    for bi in range(b):
        for p in range(per):
            page = order[bi * per + p]
            table[bi, 0, p, 0] = page
            rows = dense[bi, :, p * BLOCK : (p + 1) * BLOCK]
            container[page, :, : rows.shape[1]] = rows
    return container, table


# -- one case -----------------------------------------------------------------------------------------

BANDS = {
    "none": {},
    "causal": {"use_causal_mask": True},
    "causal_br": {"use_causal_mask_bottom_right": True},
    "left": {"diagonal_band_left_bound": 2},
    "left_br": {"diagonal_band_left_bound": 3, "diagonal_alignment": "BOTTOM_RIGHT"},
    "right": {"diagonal_band_right_bound": 1},
    "band_br": {"diagonal_band_left_bound": 2, "diagonal_band_right_bound": 1, "diagonal_alignment": "BOTTOM_RIGHT"},
}


def _band(opts):
    f = band_fields("t", **opts)
    br = f["use_causal_mask_bottom_right"] or f["diagonal_alignment"].name == "BOTTOM_RIGHT"
    right = 0 if f["use_causal_mask"] or f["use_causal_mask_bottom_right"] else f["diagonal_band_right_bound"]
    return br, f["sliding_window_length"], right


def case(
    layout,
    band,
    *,
    sink=False,
    mod=False,
    hk=2,
    drop=None,
    sq=5,
    skv=7,
    backward=False,
    padding=None,
    empty="+inf",
    extra_outputs=False,
    engine="reference",
    device="cpu",
):
    """Build and run one sdpa (and sdpa_backward) graph on `engine` (CPU); compare with `attend`."""
    rng = np.random.default_rng(zlib.crc32(repr((layout, band, sink, mod, hk, drop, sq, skv, backward)).encode()))
    padding = layout == "packed" if padding is None else padding
    lq, lkv = np.minimum(LQ, sq), np.minimum(LKV, skv)
    g = og.Graph("att", io_data_type=D.DOUBLE, intermediate_data_type=D.DOUBLE)
    dense = {
        "q": rng.uniform(-1.5, 1.5, (B, HQ, sq, DQK)),
        "k": rng.uniform(-1.5, 1.5, (B, hk, skv, DQK)),
        "v": rng.uniform(-1.5, 1.5, (B, hk, skv, DV)),
    }
    if padding:  # padded rows hold garbage: no engine may read it into a kept score
        for name, lens in (("q", lq), ("k", lkv), ("v", lkv)):
            for b in range(B):
                dense[name][b, :, lens[b] :] = 1e3
    feeds, kw = {}, dict(BANDS[band])
    kw["attn_scale"] = 0.4
    offq = np.array([1, 1 + int(lq[0]) + 2, 0])  # gaps between and before the sequences
    offkv = np.array([0, int(lkv[0]) + 1, 0])
    tq, tkv = int(offq[1] + lq[1] + 1), int(offkv[1] + lkv[1] + 3)
    t = {}
    for name, d in dense.items():
        if layout == "packed":
            off, lens, tokens = (offq, lq, tq) if name == "q" else (offkv, lkv, tkv)
            arr = pack_loops(d, off, lens, tokens)
        elif layout == "paged" and name != "q":
            arr, table = page_loops(d, rng)
            tab = g.tensor(dim=table.shape, data_type=D.INT32, name=f"table_{name}")
            feeds[tab] = table
            kw[f"paged_attention_{name}_table"] = tab
            kw["paged_attention_max_seq_len_kv"] = skv
        else:
            arr = d
        t[name] = g.tensor(dim=arr.shape, stride=strides(arr.shape, "bshd"), name=name)
        feeds[t[name]] = arr
    if padding:
        kw["use_padding_mask"] = True
        kw["seq_len_q"] = g.tensor(dim=[B, 1, 1, 1], data_type=D.INT32, name="lq")
        kw["seq_len_kv"] = g.tensor(dim=[B, 1, 1, 1], data_type=D.INT64, name="lkv")
        feeds[kw["seq_len_q"]], feeds[kw["seq_len_kv"]] = lq.reshape(B, 1, 1, 1), lkv.reshape(B, 1, 1, 1)
    if layout == "packed":
        oq = g.tensor(dim=[B + 1, 1, 1, 1], data_type=D.INT64, name="offq")
        okv = g.tensor(dim=[B + 1, 1, 1, 1], data_type=D.INT32, name="offkv")
        feeds[oq], feeds[okv] = offq.reshape(-1, 1, 1, 1), offkv.reshape(-1, 1, 1, 1)
        kw.update(
            q_ragged_offset=oq,
            k_ragged_offset=okv,
            v_ragged_offset=okv,
            o_ragged_offset=oq,
            stats_ragged_offset=oq,
            max_seq_len_q=sq,
            max_seq_len_kv=skv,
        )
    sink_t = None
    if sink:
        sink_v = rng.uniform(-1, 1, (1, HQ, 1, 1))
        kw["sink_token"] = sink_t = g.tensor(dim=[1, HQ, 1, 1], name="sink")
        feeds[sink_t] = sink_v
    if mod:
        kw["score_mod"] = lambda sg, s: sg.mul(sg.tanh(sg.div(s, 2.0)), 2.0)
    drop_v = None
    if drop == "mask":
        m = (rng.uniform(size=(B, HQ, sq, skv)) > 0.3).astype(np.float64)
        dm = g.tensor(dim=m.shape, name="dmask")
        feeds[dm] = m
        kw["dropout"] = (dm, 1 / 0.7)
        drop_v = m / 0.7
    elif drop == "philox":
        seed, off = g.tensor(dim=[1], data_type=D.INT64, name="seed"), g.tensor(dim=[1], data_type=D.INT64, name="off")
        feeds[seed], feeds[off] = np.array([77]), np.array([5])
        kw["dropout"] = (0.3, seed, off)
        drop_v = R.dropout_keep(0.3, 77, 5, (B, HQ, sq, skv)) / 0.7
    stats_rows = (1, HQ, tq, 1) if layout == "packed" else (B, HQ, sq, 1)
    extras = {}
    if extra_outputs:
        extras = {
            "score_max": g.tensor(dim=stats_rows, name="smax"),
            "score_sum_exp": g.tensor(dim=stats_rows, name="ssum"),
        }
        if drop == "philox":
            extras["rng_dump"] = g.tensor(dim=[B, HQ, sq, skv], name="rng")
    o, st = g.sdpa(t["q"], t["k"], t["v"], **kw, **extras, empty_row_stats=empty, name="att")
    o.set_output(True)
    st.set_output(True).set_data_type(D.DOUBLE)
    outs = [o, st, *extras.values()]
    for x in extras.values():
        x.set_output(True).set_data_type(D.DOUBLE)
    grads = []
    if backward:
        do_dense = rng.uniform(-1, 1, (B, HQ, sq, DV))
        do_arr = pack_loops(do_dense, offq, lq, tq) if layout == "packed" else do_dense
        do = g.tensor(dim=do_arr.shape, stride=strides(do_arr.shape, "bshd"), name="dO")
        feeds[do] = do_arr
        bkw = {key: val for key, val in kw.items() if key not in ("o_ragged_offset", "stats_ragged_offset")}
        if layout == "packed":
            bkw.update(o_ragged_offset=kw["o_ragged_offset"], stats_ragged_offset=kw["stats_ragged_offset"])
        dsink = g.tensor(dim=[1, HQ, 1, 1], name="dsink") if sink else None
        grads = g.sdpa_backward(t["q"], t["k"], t["v"], o, do, st, **bkw, dSink_token=dsink, name="att_bwd")
        grads = [*grads, *([dsink] if sink else [])]
        for x in grads:
            x.set_output(True).set_data_type(D.DOUBLE)
    got = _run(g, feeds, outs + grads, engine, device)

    # the independent computation, on the dense tensors
    br, left, right = _band(BANDS[band])
    keep = keep_loops(sq, skv, lq, lkv, padding=padding, br=br, left=left, right=right)
    ts = {n: torch.tensor(d, requires_grad=backward) for n, d in dense.items()}
    sink_tt = torch.tensor(sink_v, requires_grad=backward) if sink else None
    mod_fn = (lambda s: torch.tanh(s / 2.0) * 2.0) if mod else None
    rows = None
    if padding:
        rows = np.arange(sq).reshape(1, 1, sq, 1) < lq.reshape(B, 1, 1, 1)
    wo, wst, wm, wz = attend(
        ts["q"],
        ts["k"],
        ts["v"],
        scale=0.4,
        keep=keep,
        sink=sink_tt,
        mod=mod_fn,
        drop=drop_v,
        empty=math.inf if empty == "+inf" else -math.inf,
        rows=rows,
    )
    want = [wo.detach().numpy(), wst.detach().numpy(), wm.detach().numpy(), wz.detach().numpy()]
    if layout == "packed":
        want = [pack_loops(w, offq, lq, tq) for w in want]
    checks = [("o", got[0], want[0]), ("stats", got[1], want[1])]
    if extra_outputs:
        checks += [("score_max", got[2], want[2]), ("score_sum_exp", got[3], want[3])]
        if "rng_dump" in extras:
            checks.append(("rng_dump", got[4], (drop_v != 0).astype(np.float64)))
    if backward:
        wrt = [ts["q"], ts["k"], ts["v"]] + ([sink_tt] if sink else [])
        wg = torch.autograd.grad(wo, wrt, torch.tensor(do_dense), allow_unused=True)
        wg = [np.zeros(x.shape) if w is None else w.numpy() for w, x in zip(wg, wrt)]
        if padding:  # rows past a sequence: the dense formulation's gradient of ignored garbage
            for w, lens in zip(wg[:3], (lq, lkv, lkv)):
                for b in range(B):
                    w[b, :, lens[b] :] = 0
        if layout == "packed":
            wg[:3] = [
                pack_loops(w, o_, l_, n_)
                for w, (o_, l_, n_) in zip(wg[:3], ((offq, lq, tq), (offkv, lkv, tkv), (offkv, lkv, tkv)))
            ]
        checks += list(zip(("dQ", "dK", "dV", "dSink"), got[len(outs) :], wg))
    for name, a, w in checks:
        assert a.shape == w.shape, name
        np.testing.assert_array_equal(np.isposinf(a), np.isposinf(w), err_msg=name)
        np.testing.assert_array_equal(np.isneginf(a), np.isneginf(w), err_msg=name)
        np.testing.assert_allclose(
            np.nan_to_num(a, posinf=0, neginf=0),
            np.nan_to_num(w, posinf=0, neginf=0),
            rtol=1e-9,
            atol=1e-11,
            err_msg=name,
        )
    return g


def _run(g, feeds, outs, engine="reference", device="cpu"):
    final = g.final
    pack = {
        h: (fill(final.tensors[h.uid], np.asarray(v)) if isinstance(v, np.ndarray) else v) for h, v in feeds.items()
    }
    bufs = [empty_like_desc(final.tensors[h.uid]) for h in outs]
    for buf in bufs:
        buf[...] = np.nan
    pack.update(zip(outs, bufs))
    plan = g.build(device=device, engines=[engine])
    assert {s.config.engine for s in plan.steps} == {engine}
    if device == "cpu":
        plan.execute(pack)
        return [b.astype(np.float64) for b in bufs]
    on_gpu = {h: torch.from_numpy(v).to(device) if isinstance(v, np.ndarray) else v for h, v in pack.items()}
    plan.execute(on_gpu)
    return [on_gpu[h].cpu().numpy().astype(np.float64) for h in outs]


# -- the matrix ------------------------------------------------------------------------------------------

EXTRAS = [
    dict(sink=True, mod=False, hk=2, drop=None),
    dict(sink=False, mod=True, hk=1, drop="philox"),
    dict(sink=True, mod=True, hk=4, drop="mask"),
]
MATRIX = [
    (layout, band, i)
    for layout, band in itertools.product(["dense", "packed", "paged"], BANDS)
    for i in range(len(EXTRAS))
]


@pytest.mark.parametrize("layout,band,extra", MATRIX)
def test_forward_matrix(layout, band, extra):
    case(layout, band, **EXTRAS[extra], padding=True if layout == "paged" and extra == 1 else None)


@pytest.mark.parametrize("layout,band,extra", [m for m in MATRIX if m[0] != "paged"])
def test_backward_matrix(layout, band, extra):
    case(layout, band, **EXTRAS[extra], backward=True)


@pytest.mark.parametrize("layout", ["dense", "packed"])
@pytest.mark.parametrize("sq,skv", [(5, 7), (7, 5), (1, 9), (3, 9)])
def test_everything_at_once(layout, sq, skv):
    """Packed + window + sink + score modifier + GQA + Philox dropout, forward and backward, with the
    extra outputs, Sq < Skv (decode included) and Sq > Skv."""
    case(
        layout,
        "band_br",
        sink=True,
        mod=True,
        hk=2,
        drop="philox",
        sq=sq,
        skv=skv,
        backward=True,
        extra_outputs=True,
        padding=True,
    )


@pytest.mark.parametrize("layout", ["dense", "paged", "packed"])
@pytest.mark.parametrize("hk", [4, 1])
def test_decode(layout, hk):
    """One query (and three) against a longer cache, GQA/MQA, with lengths and bottom-right causality."""
    for sq in (1, 3):
        case(layout, "causal_br", hk=hk, sq=sq, skv=9, padding=True, extra_outputs=True)


@pytest.mark.parametrize("empty", ["+inf", "-inf"])
@pytest.mark.parametrize("sink", [False, True])
def test_empty_rows_and_extra_outputs(empty, sink):
    """Padded and fully masked rows: O = 0, Stats = +inf or -inf (a fully masked row within its sequence:
    the sink's logit with a sink), score_max -inf, score_sum_exp 0 (the sink's 1)."""
    case("dense", "left", sq=7, skv=5, sink=sink, padding=True, empty=empty, extra_outputs=True, backward=True)


# -- the band's two spellings, and the rules ----------------------------------------------------------


@pytest.mark.parametrize(
    "opts,fields",
    [
        ({"diagonal_band_right_bound": 0}, {"use_causal_mask": True, "diagonal_band_right_bound": None}),
        (
            {"diagonal_band_right_bound": 0, "diagonal_alignment": "BOTTOM_RIGHT"},
            {"use_causal_mask_bottom_right": True, "diagonal_alignment": og.DiagonalAlignment.TOP_LEFT},
        ),
        ({"diagonal_band_left_bound": 4}, {"sliding_window_length": 4}),
        ({"diagonal_alignment": "BOTTOM_RIGHT"}, {"diagonal_alignment": og.DiagonalAlignment.TOP_LEFT}),
        (
            {"diagonal_band_left_bound": 4, "diagonal_alignment": 1},
            {"sliding_window_length": 4, "diagonal_alignment": og.DiagonalAlignment.BOTTOM_RIGHT},
        ),
        ({"diagonal_band_right_bound": 3}, {"diagonal_band_right_bound": 3, "use_causal_mask": False}),
    ],
)
def test_band_normalizes_to_the_fields_older_files_know(opts, fields):
    got = band_fields("t", **opts)
    for key, value in fields.items():
        assert got[key] == value, key


def _raises(fn, rule):
    with pytest.raises(og.GraphError) as err:
        fn()
    check_rule(err.value, rule)


def _dense_graph():
    g = og.Graph("att", io_data_type=D.HALF)
    q, k, v = (g.tensor(dim=[2, 4, 5, 8], name=n) for n in "qkv")
    return g, q, k, v


@pytest.mark.parametrize(
    "kw,rule",
    [
        ({"use_causal_mask": True, "diagonal_band_right_bound": 2}, "sdpa.band"),
        ({"sliding_window_length": 2, "diagonal_band_left_bound": 2}, "sdpa.band"),
        ({"diagonal_band_right_bound": -1}, "sdpa.band"),
        ({"diagonal_band_left_bound": 0}, "sdpa.sliding_window"),
        ({"diagonal_alignment": "middle"}, "sdpa.band"),
        ({"generate_stats": True, "is_inference": True}, "sdpa.generate_stats"),
    ],
)
def test_builder_rules(kw, rule):
    g, q, k, v = _dense_graph()
    _raises(lambda: g.sdpa(q, k, v, **kw), rule)


def test_is_inference_is_the_negation_of_generate_stats():
    g, q, k, v = _dense_graph()
    assert g.sdpa(q, k, v, is_inference=True)[1] is None
    assert g.sdpa(q, k, v, is_inference=False)[1] is not None
    assert g.sdpa(q, k, v)[1] is not None


def _packed_graph(**kw):
    g = og.Graph("att", io_data_type=D.HALF)
    q = g.tensor(dim=[1, 4, 12, 8], name="q")
    k, v = (g.tensor(dim=[2, 4, 7, 8], name=n) for n in "kv")
    lq, lkv = (g.tensor(dim=[2, 1, 1, 1], data_type=D.INT32, name=n) for n in ("lq", "lkv"))
    off = g.tensor(dim=[3, 1, 1, 1], data_type=D.INT64, name="off")
    args = dict(
        generate_stats=False, use_padding_mask=True, seq_len_q=lq, seq_len_kv=lkv, q_ragged_offset=off, max_seq_len_q=5
    )
    args.update(kw)
    o, _ = g.sdpa(q, k, v, **args)
    o.set_output(True)
    return g


@pytest.mark.parametrize(
    "kw,rule",
    [
        ({"max_seq_len_q": None}, "sdpa.max_seq_len"),
        ({"use_padding_mask": False}, "sdpa.padding_mask"),
    ],
)
def test_packed_rules(kw, rule):
    _raises(lambda: _packed_graph(**kw).validate(), rule)


def test_packed_offsets_and_sink_are_checked():
    g = og.Graph("att", io_data_type=D.HALF)
    q, k, v = (g.tensor(dim=[2, 4, 5, 8], name=n) for n in "qkv")
    sink = g.tensor(dim=[1, 2, 1, 1], data_type=D.FLOAT, name="sink")
    g.sdpa(q, k, v, sink_token=sink, generate_stats=False)[0].set_output(True)
    _raises(g.validate, "sdpa.sink")


def test_rng_dump_needs_philox_dropout():
    g, q, k, v = _dense_graph()
    dump = g.tensor(dim=[2, 4, 5, 5], data_type=D.FLOAT, name="dump")
    g.sdpa(q, k, v, rng_dump=dump, generate_stats=False)[0].set_output(True)
    dump.set_output(True)
    _raises(g.validate, "sdpa.rng_dump")


def test_block_mask_keeps_tiles():
    """block_mask_bits against explicit bit tests: 300 queries x 1100 keys (3 x 9 tiles, 2 bytes)."""
    rng = np.random.default_rng(3)
    mask = rng.integers(0, 256, (1, 1, 3, 2), dtype=np.uint8)
    bits = R.block_mask_bits(mask, 300, 1100)
    for i in (0, 127, 128, 299):
        for j in (0, 127, 128, 1023, 1024, 1099):
            ti, tj = i // 128, j // 128
            assert bits[0, 0, i, j] == bool((int(mask[0, 0, ti, tj // 8]) >> (tj % 8)) & 1)
