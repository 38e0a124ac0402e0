"""The generated attention forward on packed (ragged, THD) tensors and diagonal bands
(opgraph/engines/triton/attention/ragged.py, forward.py): sdpa graphs built for the triton engine
alone, run under Triton's interpreter on small shapes (tiles of 16, so sequence ends fall inside and
across tiles) and compared with the reference engine on random inputs with poisoned outputs, the gaps
between packed sequences holding NaN (a row read past its sequence shows). Mixes of sequence lengths
(a length-1 sequence, an empty one, lengths not multiples of the tile, queries longer than keys), causal
either alignment, the band's right bound with and without the left bound, GQA, fp32 / fp16 / bf16,
offsets in elements (cuDNN's), dense O and Stats from packed q; what the templates still decline. A GPU
test (marked gpu) at realistic sizes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import opgraph as og
from opgraph.core.device import Device
from opgraph.core.piece import make_piece
from opgraph.core.tensor import packed_strides
from opgraph.engines.triton.templates import attention as fwd_template
from opgraph.engines.triton.templates import attention_bwd as bwd_template
from opgraph.testing import check_plan

from ..helpers import assert_engine_matches, requires_cuda

DT = og.DataType
HQ = 4
BSHD = (0, 2, 1, 3)
H100 = Device("cuda", 0, "H100", (9, 0), 132)

pytestmark = pytest.mark.interpreter

MIXES = {
    "mixed": ((1, 17, 0, 23), (9, 17, 4, 31)),  # a one-token and an empty query sequence
    "q_longer": ((16, 5), (3, 21)),  # bottom-right: rows before the diagonal see nothing
    "equal": ((20, 20), (20, 20)),
    "empty_keys": ((6, 13), (0, 11)),
}


def offsets(lens, gap=2):
    """B + 1 row offsets with `gap` unused rows before and between the sequences, and T."""
    off = [1]
    for n in lens:
        off.append(off[-1] + n + gap)
    return np.array(off), off[-1] + 1


def graph(
    lq,
    lkv,
    io=DT.FLOAT,
    *,
    hk=2,
    d=16,
    dv=16,
    layout="bshd",
    pack=("q", "k", "v", "o", "stats"),
    stats=True,
    per_row=False,
    **opts,
):
    """sdpa over packed tensors (those in `pack`; the others dense) with the lengths' maxima as the
    padded dims."""
    b = len(lq)
    sq, skv = max(max(lq), 1), max(max(lkv), 1)
    tq, tkv = offsets(lq)[1], offsets(lkv)[1]
    g = og.Graph("att", io_data_type=io, intermediate_data_type=DT.FLOAT)
    heads = {"q": HQ, "k": hk, "v": hk}
    width = {"q": d, "k": d, "v": dv}
    t, kw = {}, dict(opts)
    for r in ("q", "k", "v"):
        rows, tokens = (sq, tq) if r == "q" else (skv, tkv)
        dims = (1, heads[r], tokens, width[r]) if r in pack else (b, heads[r], rows, width[r])
        t[r] = g.tensor(dim=dims, stride=packed_strides(dims, BSHD if layout == "bshd" else None), name=r)
    kw["use_padding_mask"] = True
    kw["seq_len_q"] = g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_q")
    kw["seq_len_kv"] = g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_kv")
    offq = g.tensor(dim=[b + 1, 1, 1, 1], data_type=DT.INT32, name="off_q") if {"q", "o"} & set(pack) else None
    offkv = g.tensor(dim=[b + 1, 1, 1, 1], data_type=DT.INT64, name="off_kv") if "k" in pack else None
    for r in pack:
        kw[f"{r}_ragged_offset"] = offkv if r in ("k", "v") else offq
    if "q" in pack:
        kw["max_seq_len_q"] = sq
    if "k" in pack:
        kw["max_seq_len_kv"] = skv
    o, st = g.sdpa(t["q"], t["k"], t["v"], attn_scale=0.3, generate_stats=stats, name="fwd", **kw)
    o_dims = (1, HQ, tq, dv) if "o" in pack else (b, HQ, sq, dv)
    o.set_output(True).set_stride(packed_strides(o_dims, BSHD if layout == "bshd" else None))
    if st is not None:
        st.set_output(True)
    if per_row:  # offsets counted in elements, as cuDNN's (a row is H * D elements of a BSHD tensor)
        rec = next(r for r in g._records if r.op.kind == "sdpa")
        counts = {r: heads.get(r, HQ) * {"o": dv, "stats": 1}.get(r, width.get(r, 0)) for r in pack}
        rec.op = dataclasses.replace(rec.op, ragged_offset_strides=tuple(sorted(counts.items())))
        g._invalidate()
    return g


def prepare(pack, g, lq, lkv, per_row=None):
    """Lengths and offsets; NaN in every packed row no sequence covers."""
    final = g.final
    oq, _ = offsets(lq)
    okv, _ = offsets(lkv)
    node = next(n for n in final.nodes if n.kind == "sdpa")
    strides = dict(node.op.ragged_offset_strides)
    by_name = {final.tensors[u].name: u for u in final.inputs}
    pack[by_name["seq_len_q"]][...] = np.array(lq).reshape(-1, 1, 1, 1)
    pack[by_name["seq_len_kv"]][...] = np.array(lkv).reshape(-1, 1, 1, 1)
    scale_q = strides.get("q", 1)  # (q, o and stats share their offsets: one count per row)
    scale_kv = strides.get("k", 1)
    for name, off, scale in (("off_q", oq, scale_q), ("off_kv", okv, scale_kv)):
        if name in by_name:
            pack[by_name[name]][...] = (off * scale).reshape(-1, 1, 1, 1)
    for r, (off, lens) in (("q", (oq, lq)), ("k", (okv, lkv)), ("v", (okv, lkv))):
        x = pack[by_name[r]]
        if x.shape[0] != 1 or node.input(f"{r}_ragged_offset") is None:
            continue
        covered = np.zeros(x.shape[2], dtype=bool)
        for o_, n in zip(off, lens):
            covered[o_ : o_ + n] = True
        x[:, :, ~covered] = np.nan


def check(lq, lkv, rng, io=DT.FLOAT, steps=1, **kw):
    g = graph(lq, lkv, io, **kw)
    tol = {} if io is DT.FLOAT else {"rtol": 3e-2, "atol": 3e-2}
    return assert_engine_matches(
        g, rng, engines=("triton",), expect_steps=steps, prepare=lambda p: prepare(p, g, lq, lkv), **tol
    )


CAUSAL = [{}, {"use_causal_mask": True}, {"use_causal_mask_bottom_right": True}]


# -- (a) packed sequences -------------------------------------------------------------------------------


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("opts", CAUSAL, ids=["none", "causal", "causal_br"])
def test_packed_forward(mix, opts, rng):
    check(*MIXES[mix], rng, **opts)


@pytest.mark.parametrize("io", [DT.HALF, DT.BFLOAT16])
@pytest.mark.parametrize("opts", CAUSAL[1:], ids=["causal", "causal_br"])
def test_packed_half_types(io, opts, rng):
    check(*MIXES["mixed"], rng, io, hk=1, **opts)


@pytest.mark.parametrize(
    "case",
    [
        {"layout": "bhsd", "hk": 4, "d": 24, "dv": 40},
        {"pack": ("q", "k", "v"), "use_causal_mask": True},  # dense O and Stats (padded rows 0 / +inf)
        {"pack": ("k", "v"), "use_causal_mask_bottom_right": True},  # dense queries, packed keys
        {"pack": ("q", "o", "stats"), "use_causal_mask": True},  # packed queries, dense keys
        {"stats": False, "sliding_window_length": 5, "use_causal_mask": True},
        {"per_row": True, "pack": ("q", "k", "v", "o"), "use_causal_mask": True},
    ],
    ids=["bhsd_d24_dv40", "dense_outputs", "dense_q", "dense_kv", "window", "element_offsets"],
)
def test_packed_variants(case, rng):
    mix = MIXES["mixed"]
    if "q" not in case.get("pack", "q"):
        mix = ((23, 23, 23, 23), mix[1])
    if "k" not in case.get("pack", "k"):
        mix = (mix[0], (31, 31, 31, 31))
    check(*mix, rng, **case)


def test_packed_bias_dropout_and_score_mod(rng):
    """What the tile loop adds to a score works at sequence-local positions: a bias of the padded
    dims, Philox dropout's counter, a soft-cap."""
    lq, lkv = MIXES["q_longer"]
    g = og.Graph("att", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    b, sq, skv = 2, max(lq), max(lkv)
    tq, tkv = offsets(lq)[1], offsets(lkv)[1]
    q = g.tensor(dim=[1, HQ, tq, 16], stride=packed_strides((1, HQ, tq, 16), BSHD), name="q")
    k = g.tensor(dim=[1, 2, tkv, 16], stride=packed_strides((1, 2, tkv, 16), BSHD), name="k")
    v = g.tensor(dim=[1, 2, tkv, 16], stride=packed_strides((1, 2, tkv, 16), BSHD), name="v")
    lens = [g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name=n) for n in ("seq_len_q", "seq_len_kv")]
    offq = g.tensor(dim=[b + 1, 1, 1, 1], data_type=DT.INT32, name="off_q")
    offkv = g.tensor(dim=[b + 1, 1, 1, 1], data_type=DT.INT64, name="off_kv")
    seed = g.tensor(dim=[1], data_type=DT.INT64, name="seed")
    o, st = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.3,
        bias=g.tensor(dim=[b, 1, sq, skv], name="bias"),
        dropout=(0.25, seed, 7),
        score_mod=lambda sg, s: sg.mul(sg.tanh(sg.div(s, 2.0)), 2.0),
        use_causal_mask_bottom_right=True,
        use_padding_mask=True,
        seq_len_q=lens[0],
        seq_len_kv=lens[1],
        q_ragged_offset=offq,
        k_ragged_offset=offkv,
        v_ragged_offset=offkv,
        o_ragged_offset=offq,
        stats_ragged_offset=offq,
        max_seq_len_q=sq,
        max_seq_len_kv=skv,
    )
    o.set_output(True).set_stride(packed_strides((1, HQ, tq, 16), BSHD))
    st.set_output(True)

    def prep(p):
        prepare(p, g, lq, lkv)
        p[next(u for u in g.final.inputs if g.final.tensors[u].name == "seed")][...] = 1234

    assert_engine_matches(g, rng, engines=("triton",), expect_steps=1, prepare=prep)


def test_packed_prologue_makes_its_own_piece(rng):
    """A pointwise op on packed q is not fused (the template declines it), so it runs on its own."""
    lq, lkv = MIXES["mixed"]
    g = graph(lq, lkv, use_causal_mask=True)
    final = g.final
    node = next(n for n in final.nodes if n.kind == "sdpa")
    assert fwd_template.TEMPLATE.match(make_piece(final, 0, [node]), H100)
    g2 = og.Graph("att", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    tq, tkv = offsets(lq)[1], offsets(lkv)[1]
    q = g2.tensor(dim=[1, HQ, tq, 16], name="q")
    k = g2.tensor(dim=[1, HQ, tkv, 16], name="k")
    v = g2.tensor(dim=[1, HQ, tkv, 16], name="v")
    lens = [g2.tensor(dim=[4, 1, 1, 1], data_type=DT.INT32, name=n) for n in ("seq_len_q", "seq_len_kv")]
    offq = g2.tensor(dim=[5, 1, 1, 1], data_type=DT.INT32, name="off_q")
    offkv = g2.tensor(dim=[5, 1, 1, 1], data_type=DT.INT64, name="off_kv")
    o, _ = g2.sdpa(
        g2.mul(q, 0.5),
        k,
        v,
        generate_stats=False,
        use_padding_mask=True,
        seq_len_q=lens[0],
        seq_len_kv=lens[1],
        q_ragged_offset=offq,
        k_ragged_offset=offkv,
        v_ragged_offset=offkv,
        o_ragged_offset=offq,
        max_seq_len_q=max(lq),
        max_seq_len_kv=max(lkv),
    )
    o.set_output(True)
    final = g2.final
    why = fwd_template.TEMPLATE.match(make_piece(final, 0, list(final.nodes)), H100)
    assert not why and "packed" in why.reason and "prologue" in why.reason, why.reason
    plan = g2.build(device="cpu", engines=["triton"])
    assert [s.config.knob("template") for s in plan.steps][-1] == "attention", plan.describe()
    bad = check_plan(plan, rng, prepare=lambda p: prepare(p, g2, lq, lkv))
    assert not bad, "\n".join(map(str, bad))


# -- (b) the diagonal band --------------------------------------------------------------------------------

BANDS = [
    {"diagonal_band_right_bound": 3},
    {"diagonal_band_right_bound": 0, "diagonal_alignment": "BOTTOM_RIGHT"},
    {"diagonal_band_right_bound": 5, "diagonal_band_left_bound": 7},
    {"diagonal_band_right_bound": 2, "diagonal_band_left_bound": 4, "diagonal_alignment": "BOTTOM_RIGHT"},
    {"diagonal_band_left_bound": 6, "diagonal_alignment": "BOTTOM_RIGHT"},
]
BAND_IDS = ["right", "right0_br", "band", "band_br", "left_br"]


@pytest.mark.parametrize("opts", BANDS, ids=BAND_IDS)
@pytest.mark.parametrize("mix", ["mixed", "q_longer"])
def test_band_packed(opts, mix, rng):
    check(*MIXES[mix], rng, **opts)


def _dense(sq, skv, io=DT.FLOAT, **opts):
    g = og.Graph("att", io_data_type=io, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[2, HQ, sq, 16], name="q")
    k = g.tensor(dim=[2, 2, skv, 16], name="k")
    v = g.tensor(dim=[2, 2, skv, 16], name="v")
    o, st = g.sdpa(q, k, v, attn_scale=0.3, name="fwd", **opts)
    o.set_output(True)
    st.set_output(True)
    return g


@pytest.mark.parametrize("opts", BANDS, ids=BAND_IDS)
@pytest.mark.parametrize("sq, skv", [(37, 45), (45, 21)])
def test_band_dense(opts, sq, skv, rng):
    assert_engine_matches(_dense(sq, skv, **opts), rng, engines=("triton",), expect_steps=1)


@pytest.mark.parametrize("io", [DT.HALF, DT.BFLOAT16])
def test_band_half_types(io, rng):
    g = _dense(40, 52, io, diagonal_band_right_bound=4, diagonal_band_left_bound=9)
    assert_engine_matches(g, rng, engines=("triton",), expect_steps=1, rtol=3e-2, atol=3e-2)


def test_band_visits_only_the_blocks_it_sees():
    """A window costs proportional work: the key loop's bounds come from the band, not the sequence."""
    from opgraph.engines.triton.attention import FwdKnobs, forward

    g = _dense(256, 256, diagonal_band_right_bound=8, diagonal_band_left_bound=16)
    final = g.final
    spec = fwd_template.TEMPLATE.matched(make_piece(final, 0, list(final.nodes)), H100).spec()
    src = forward(spec, FwdKnobs(64, 32, 4, 2)).source
    assert "hi = tl.minimum(hi, tl.maximum(m0 + 64 + diag + 8, 0))" in src, src
    assert "lo = (tl.maximum(m0 + diag - 15, 0) // 32) * 32" in src, src


# -- the GPU's knobs under the interpreter ------------------------------------------------------------------


@pytest.mark.parametrize(
    "knobs",
    [
        {"BLOCK_M": 32, "BLOCK_N": 16, "ONELOOP": 1},
        {"BLOCK_M": 16, "BLOCK_N": 32, "ORDER": 1},
        {"BLOCK_M": 32, "BLOCK_N": 32, "ONELOOP": 1, "ORDER": 1},
        {"BLOCK_M": 16, "BLOCK_N": 16, "ONELOOP": 1, "TILES": 1},
    ],
    ids=["oneloop", "order", "both", "tiles"],
)
@pytest.mark.parametrize(
    "opts",
    [
        {"use_causal_mask_bottom_right": True},
        {"diagonal_band_left_bound": 5, "diagonal_band_right_bound": 3, "diagonal_alignment": "BOTTOM_RIGHT"},
    ],
    ids=["causal_br", "band_br"],
)
def test_packed_with_the_gpu_knobs(knobs, opts, rng):
    """One loop with run-time masks and the other grid order (the GPU's candidates), run directly."""
    _launch(*MIXES["mixed"], rng, knobs, **opts)


def _launch_tiles(lq, lkv, rng, knobs, io=DT.HALF, **opts):
    return _launch(lq, lkv, rng, {"ONELOOP": 1, "TILES": 1, **knobs}, io, **opts)


def _launch(lq, lkv, rng, knobs, io=DT.HALF, **opts):
    """The forward of graph(lq, lkv, io, **opts) with `knobs`, launched directly under the interpreter;
    every output compared with the reference engine's."""
    import torch

    from opgraph.engines.triton.attention import FwdKnobs, forward
    from opgraph.engines.triton.attention.run import launch
    from opgraph.testing import compare, random_pack, reference_outputs

    g = graph(lq, lkv, io, **opts)
    final = g.final
    spec = fwd_template.TEMPLATE.matched(make_piece(final, 0, list(final.nodes)), Device("cpu")).spec()
    pack = random_pack(final, rng)
    prepare(pack, g, lq, lkv)
    want = reference_outputs(final, pack)
    buffers = {u: torch.from_numpy(x) for u, x in pack.items()}
    gen = forward(spec, FwdKnobs(num_warps=4, num_stages=1, **knobs))
    launch(gen, buffers, interpret=True)
    for u in final.outputs:
        bad = compare(final.tensors[u], buffers[u].numpy(), want[u], rtol=3e-2, atol=3e-2)
        assert bad is None, bad
    return gen


@pytest.mark.parametrize(
    "lens",
    [
        ((1, 17, 0, 23), (9, 17, 4, 31)),  # a one-token and an empty sequence, blocks of 16: 0-2 a sequence
        ((40, 3, 33, 16, 1), (40, 3, 33, 16, 1)),  # levels of 1 to 5 sequences
        ((0, 0), (5, 5)),  # no query at all: no tile
    ],
    ids=["mixed", "levels", "empty"],
)
@pytest.mark.parametrize("opts", [{}, {"use_causal_mask": True}], ids=["none", "causal"])
def test_the_tile_list_walks_every_sequences_blocks_once(lens, opts, rng, monkeypatch):
    """TILES=1 (tiles.py): a program a tile of the list (the highest blocks first) instead of a grid over
    the longest sequence's blocks: every row of every sequence computed once (outputs poisoned, gaps NaN),
    with fewer programs, as many as there are tiles."""
    import importlib

    fwd_module = importlib.import_module("opgraph.engines.triton.attention.forward")
    lq, lkv = lens
    gen = _launch_tiles(lq, lkv, rng, {"BLOCK_M": 16, "BLOCK_N": 16}, **opts)
    launch = next(l for l in gen.launches if l.kernel == "kernel_attn_fwd")
    num_m = -(-max(max(lq), 1) // 16)
    assert launch.grid[1] == HQ and launch.grid[0] <= len(lq) * num_m
    assert "start_m = tl.sum(tl.where(in_level, levels, 0), 0)" in gen.source and "if m0 >= q_len:" not in gen.source
    tiles = sum(-(-n // 16) for n in lq)
    monkeypatch.setattr(fwd_module, "tile_programs", lambda *a: tiles)  # (as many programs as tiles)
    _launch_tiles(lq, lkv, rng, {"BLOCK_M": 16, "BLOCK_N": 16}, **opts)
    if tiles > 1:  # (one program fewer: the last tile's rows are not written, as the test must see)
        monkeypatch.setattr(fwd_module, "tile_programs", lambda *a: tiles - 1)
        with pytest.raises(AssertionError):
            _launch_tiles(lq, lkv, rng, {"BLOCK_M": 16, "BLOCK_N": 16}, **opts)


def test_the_engine_offers_the_tile_list_after_its_other_configs(rng):
    """The packed forward's candidates end with the tile list on the heuristic's first two knob sets (an
    autotuned build times them); a plan built with mode B's candidates holds one among its alternatives
    (never FALLBACK's pick), run through the engine as a plan's step, its outputs checked; a dense O gets
    none."""
    from ..helpers import assert_candidates_match

    lq, lkv = MIXES["mixed"]
    g = graph(lq, lkv, DT.HALF, use_causal_mask=True)
    cands = fwd_template.TEMPLATE.matched(make_piece(g.final, 0, list(g.final.nodes)), Device("cpu")).candidates()
    assert [k.TILES for k in cands][-2:] == [1, 1] and not any(k.TILES for k in cands[:-2]), cands
    modes = [og.HeurMode.A, og.HeurMode.B]  # (B: every candidate among the alternatives, for tuning)
    plan = g.build(device="cpu", engines=["triton"], heur_mode=modes)
    configs = [plan.steps[0].config, *plan.steps[0].alternatives]
    listed = [c for c in configs if c.knob("TILES")]
    assert listed and not plan.steps[0].config.knob("TILES"), configs
    prep = lambda p: prepare(p, g, lq, lkv)  # noqa: E731
    for c in listed:
        bad = og.testing.check_plan(_step_plan(plan, c), rng, prepare=prep, rtol=3e-2, atol=3e-2)
        assert not bad, f"{c}: {bad}"
    dense_o = graph(lq, lkv, pack=("q", "k", "v", "stats")).build(device="cpu", engines=["triton"], heur_mode=modes)
    assert not any(c.knob("TILES") for c in dense_o.steps[0].alternatives)


def _step_plan(plan, config):
    from ..helpers import step_plan

    return step_plan(plan, plan.steps[0], config)


def test_the_tile_list_is_refused_where_it_does_not_apply(rng):
    from opgraph.core.errors import AttributeValueError
    from opgraph.engines.triton.attention import FwdKnobs, forward

    lq, lkv = MIXES["mixed"]
    g = graph(lq, lkv, pack=("q", "k", "v", "stats"))  # O dense: its rows past a length are written
    spec = fwd_template.TEMPLATE.matched(make_piece(g.final, 0, list(g.final.nodes)), Device("cpu")).spec()
    with pytest.raises(AttributeValueError, match="TILES=1 does not apply here: an output"):
        forward(spec, FwdKnobs(16, 16, 4, 1, TILES=1))
    with pytest.raises(AttributeValueError, match="TILES=2 must be 0 or 1"):
        FwdKnobs(16, 16, 4, 1, TILES=2)


# -- declines ---------------------------------------------------------------------------------------------


def test_backward_takes_packed_tensors_and_the_band():
    """The backward runs what the forward runs of packed tensors and the band (the kernels' tests:
    test_triton_attention_ragged_backward.py)."""
    g2 = og.Graph("att", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    q, k, v, o, do = (g2.tensor(dim=[1, HQ, 30, 16], name=n) for n in ("q", "k", "v", "o", "dO"))
    st = g2.tensor(dim=[1, HQ, 30, 1], name="stats")
    lens = [g2.tensor(dim=[2, 1, 1, 1], data_type=DT.INT32, name=n) for n in ("lq", "lkv")]
    off = g2.tensor(dim=[3, 1, 1, 1], data_type=DT.INT32, name="off")
    packed = {f"{r}_ragged_offset": off for r in ("q", "k", "v", "o", "dO", "stats", "dQ", "dK", "dV")}
    grads = g2.sdpa_backward(
        q,
        k,
        v,
        o,
        do,
        st,
        use_padding_mask=True,
        seq_len_q=lens[0],
        seq_len_kv=lens[1],
        max_seq_len_q=16,
        max_seq_len_kv=16,
        diagonal_band_right_bound=3,
        diagonal_alignment="BOTTOM_RIGHT",
        **packed,
    )
    for x in grads:
        x.set_output(True)
    final = g2.final
    assert bwd_template.TEMPLATE.match(make_piece(final, 0, list(final.nodes)), H100)


def test_forward_takes_every_feature():
    """Sinks, the softmax's statistics and block masks run too (test_triton_attention_sinks.py,
    test_triton_attention_block_mask.py): the generated forward declines none of the features."""
    from opgraph.engines.triton.attention.lowering import RUNS
    from opgraph.ops.attention_layout import Feature

    assert RUNS["sdpa"] == frozenset(Feature)
    assert RUNS["sdpa_backward"] == frozenset(Feature) - {Feature.PAGED, Feature.EMPTY_ROW_STATS}
    g = og.Graph("att", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    q, k, v = (g.tensor(dim=[2, HQ, 8, 16], name=n) for n in "qkv")
    sink = g.tensor(dim=[1, HQ, 1, 1], name="sink")
    smax = g.tensor(dim=[2, HQ, 8, 1], name="smax")
    bm = g.tensor(dim=[2, HQ, 1, 1], data_type=DT.UINT8, name="bm")
    o, _ = g.sdpa(q, k, v, generate_stats=False, sink_token=sink, score_max=smax, block_mask=bm)
    o.set_output(True)
    smax.set_output(True)
    final = g.final
    assert fwd_template.TEMPLATE.match(make_piece(final, 0, list(final.nodes)), H100)


# -- GPU --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("io", [DT.HALF, DT.BFLOAT16])
@pytest.mark.parametrize(
    "opts",
    [
        {"use_causal_mask": True},
        {"use_causal_mask_bottom_right": True},
        {},
        {"diagonal_band_left_bound": 256, "use_causal_mask": True},
        {"diagonal_band_left_bound": 200, "diagonal_band_right_bound": 64, "diagonal_alignment": "BOTTOM_RIGHT"},
    ],
    ids=["causal", "causal_br", "none", "window", "band_br"],
)
def test_gpu_packed_against_the_reference(io, opts):
    """12 packed (THD) sequences of 0 to 700 tokens, D 128, GQA 4/2, with the GPU's own knobs (128-row
    tiles): every output against the reference engine (float64 NumPy on the host)."""
    rng = np.random.default_rng(41)
    lq = (1, 0, *(int(x) for x in rng.integers(2, 700, 10)))
    lkv = lq if opts.get("use_causal_mask") else (7, 300, *(int(x) for x in rng.integers(1, 700, 10)))
    g = graph(lq, lkv, io, hk=2, d=128, dv=128, **opts)
    plan = g.build(device="cuda", engines=["triton"])
    assert len(plan.steps) == 1, plan.describe()
    bad = check_plan(plan, rng, prepare=lambda p: prepare(p, g, lq, lkv), rtol=2e-2, atol=2e-2)
    assert not bad, "\n".join(map(str, bad))


def _sources(g) -> str:
    plan = g.build(device="cpu", engines=["triton"])
    return "\n".join(s.kernel.generated.source for s in plan.steps)


def test_programs_past_their_sequence_return_where_every_output_is_packed():
    """The packed launch's grid spans max_seq_len's blocks: a program past its sequence's length returns
    at once where all it writes is packed (its stores bounded by the sequence's rows); a dense O has its
    rows past the length written (zeros), so its programs run to the end."""
    lq, lkv = (5, 9, 30), (7, 12, 40)
    assert "if m0 >= q_len:" in _sources(graph(lq, lkv))
    assert "if m0 >= q_len:" not in _sources(graph(lq, lkv, pack=("q", "k", "v", "stats")))


# -- compiled for Hopper -------------------------------------------------------------------------------------


def _packed_forward(io=DT.BFLOAT16, d=128, **opts):
    """sdpa over packed q, k, v, O, Stats: 32 sequences of at most 4,096 tokens, 32k in all, 16 heads."""
    b, s, t = 32, 4096, 32768
    g = og.Graph("att", io_data_type=io, intermediate_data_type=DT.FLOAT)
    x = {n: g.tensor(dim=(1, 16, t, d), stride=packed_strides((1, 16, t, d), BSHD), name=n) for n in "qkv"}
    off = g.tensor(dim=[b + 1, 1, 1, 1], data_type=DT.INT32, name="off")
    lens = [g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name=n) for n in ("lq", "lkv")]
    offs = {f"{r}_ragged_offset": off for r in ("q", "k", "v", "o", "stats")}
    o, st = g.sdpa(
        x["q"], x["k"], x["v"], attn_scale=d**-0.5, generate_stats=True, use_padding_mask=True, seq_len_q=lens[0],
        seq_len_kv=lens[1], max_seq_len_q=s, max_seq_len_kv=s, name="fwd", **offs, **opts,
    )  # fmt: skip
    o.set_output(True).set_stride(packed_strides((1, 16, t, d), BSHD))
    st.set_output(True)
    return g


HOPPER_CASES = {  # the heuristic's choice, and the same with the tile list
    "packed_causal_fwd": (
        lambda: _packed_forward(use_causal_mask=True),
        "attention",
        lambda cands: [cands[0], {**cands[0], "TILES": 1}],
    ),
}


def test_packed_forward_with_the_tile_list_compiles_for_hopper():
    """The tile list (TILES=1) compiles for sm_90 (Triton's NVIDIA backend and ptxas, no GPU) beside the
    heuristic's knobs, in about as many registers (244 and 245 with Triton 3.9), without spills (a loop
    over several tiles a program spilled 12 bytes)."""
    from .hopper_compile import compile_for_hopper

    out = compile_for_hopper(__name__)
    lines = [
        line.split()
        for line in out.splitlines()
        if line.startswith("compiled") and line.split()[2] == "kernel_attn_fwd"
    ]
    assert len(lines) == 2, out
    (plain, listed) = lines
    assert "'TILES':" in " ".join(listed) or "TILES" in " ".join(listed), listed
    for w in lines:
        assert int(w[w.index("spills") + 1]) == 0, w
    assert int(listed[listed.index("regs") + 1]) <= int(plain[plain.index("regs") + 1]) + 8, (plain, listed)
