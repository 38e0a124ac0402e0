"""GQA head packing in the generated attention forward (opgraph/engines/triton/attention/gqa_pack.py) and
the build's choice of it (opgraph/build/gqa_pack.py): decode steps (1 or 3 queries) of groups of G = 2, 4,
8 query heads per key/value head, one program per key/value head whose tile rows are the group's heads
times the queries, with and without split-KV, under Triton's interpreter against the reference engine
on random inputs with poisoned outputs: contiguous, paged (whole key blocks and a gather a key) and
packed caches, padding and the bottom-right causal mask, a window, a sink with score_max /
score_sum_exp, dropout with a score modifier, ALiBi with a bias, Stats, fp16 / bf16; tiles that hold
part of a group or several blocks of packed rows. The policy: which config goes first for which shapes."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.build import split_kv
from opgraph.core.config import HeurMode
from opgraph.core.device import Device
from opgraph.core.errors import AttributeValueError
from opgraph.core.piece import make_piece
from opgraph.core.tensor import packed_strides
from opgraph.engines import get_engine
from opgraph.engines.triton.attention import FwdKnobs
from opgraph.engines.triton.templates import attention as fwd_template
from opgraph.testing import check_plan

from ..helpers import requires_cuda
from .test_triton_attention_split import decode as split_decode
from .test_triton_attention_split import prepare as split_prepare

DT = og.DataType
B, HK = 3, 2
BSHD = (0, 2, 1, 3)
H100 = Device("cuda", 0, "H100", (9, 0), 132)
TOL = {DT.FLOAT: (2e-4, 2e-5), DT.HALF: (3e-2, 3e-2), DT.BFLOAT16: (5e-2, 5e-2)}

pytestmark = pytest.mark.interpreter


def decode(group, io=DT.FLOAT, **kw):
    """A decode step with `group` query heads per key/value head (test_triton_attention_split.decode)."""
    return split_decode(io, group=group, **kw)


def _sinks(hq):  # one head's sink -inf (adds nothing), the others different per head
    return [-np.inf if h == 1 else 0.5 * h - 1.0 for h in range(hq)]


def prepare(g, sq, skv, layout, page=16, lens_kv=None):
    return split_prepare(g, sq, skv, layout, page, lens_kv, sinks=_sinks)


def run_packed(g, prep, knobs, io=DT.FLOAT):
    """The forward with `knobs` (PACK_GQA=1), launched directly under the interpreter, against the
    reference engine."""
    import torch

    from opgraph.engines.triton.attention import forward
    from opgraph.engines.triton.attention.run import launch
    from opgraph.testing import compare, random_pack, reference_outputs

    final = g.final
    spec = fwd_template.TEMPLATE.matched(make_piece(final, 0, list(final.nodes)), Device("cpu")).spec()
    pack = random_pack(final, np.random.default_rng(knobs.BLOCK_M + (knobs.SPLIT or 0)))
    prep(pack)
    want = reference_outputs(final, pack)
    # (outputs poisoned by random_pack; bf16 arrays shared with torch through int16, checked in `pack`)
    buffers = {
        u: torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
        if x.dtype.name == "bfloat16"
        else torch.from_numpy(x)
        for u, x in pack.items()
    }
    gen = forward(spec, knobs)
    assert "off_hr" in gen.source  # (the packed kernel)
    assert ("kernel_attn_fwd_combine" in gen.source) == bool(knobs.SPLIT)
    programs = gen.launches[-1 if not knobs.SPLIT else -2].grid
    assert programs[1] == B * spec.Hk, programs  # a program per key/value head
    launch(gen, buffers, interpret=True)
    rtol, atol = TOL[io]
    for u in final.outputs:
        bad = compare(final.tensors[u], pack[u], want[u], rtol=rtol, atol=atol)
        assert bad is None, bad


CASES = {
    "dense": {},
    "dense_no_lengths": {"padding": False},
    "paged16": {"layout": "paged"},
    "paged8": {"layout": "paged", "page": 8},  # pages smaller than a key block: a gather a key
    "packed": {"layout": "packed"},
    "causal_br": {"use_causal_mask_bottom_right": True},
    "window_br": {"use_causal_mask_bottom_right": True, "sliding_window_length": 20},
    "sink_stats": {"sink": True, "stats_out": True, "layout": "paged"},
    "dropout_softcap": {"drop": True, "mod": True},
    "bias_alibi": {"bias": True, "use_causal_mask_bottom_right": True},
}


def _knobs(group, sq, split):
    """The tile the candidates offer: rows = the queries times the group, a power of two >= 16."""
    bm = 16
    while bm < sq * group:
        bm *= 2
    return FwdKnobs(bm, 16, 4, 1, SPLIT=split, PACK_GQA=1)


@pytest.mark.parametrize("split", [None, 3])
@pytest.mark.parametrize("sq", [1, 3])
@pytest.mark.parametrize("group", [2, 4, 8])
@pytest.mark.parametrize("case", list(CASES))
def test_packed_forward(case, group, sq, split):
    opts = CASES[case]
    g = decode(group, sq=sq, **opts)
    run_packed(g, prepare(g, sq, 90, opts.get("layout", "dense"), opts.get("page", 16)), _knobs(group, sq, split))


@pytest.mark.parametrize("io", [DT.HALF, DT.BFLOAT16])
@pytest.mark.parametrize("split", [None, 4])
def test_packed_half(io, split):
    g = decode(4, io, sq=3, layout="paged", use_causal_mask_bottom_right=True, sink=True)
    run_packed(g, prepare(g, 3, 90, "paged"), _knobs(4, 3, split), io)


@pytest.mark.parametrize("split", [None, 2])
@pytest.mark.parametrize("group, sq", [(8, 3), (3, 3), (3, 1)])
def test_rows_over_several_tiles(group, sq, split):
    """16-row tiles holding part of the packed rows (24 of 8 x 3: two blocks) or groups split across
    tiles (G = 3: a tile ends inside a query's heads), causal: each block's key range covers its queries."""
    g = decode(group, sq=sq, use_causal_mask_bottom_right=True, sink=True, stats_out=True)
    run_packed(g, prepare(g, sq, 90, "dense"), FwdKnobs(16, 16, 4, 1, SPLIT=split, PACK_GQA=1))


def test_packed_query_rows():
    """Packed (THD) queries, outputs and Stats: a few draft tokens of speculative decode per sequence."""
    g = og.Graph("spec", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    hq, sq, skv, d, t = 8, 3, 60, 16, 11
    thd = packed_strides((1, hq, t, d), BSHD)
    q = g.tensor(dim=[1, hq, t, d], stride=thd, name="q")
    k, v = (g.tensor(dim=[B, HK, skv, d], name=n) for n in "kv")
    off = g.tensor(dim=[B + 1, 1, 1, 1], data_type=DT.INT64, name="off_q")
    lens = {n: g.tensor(dim=[B, 1, 1, 1], data_type=DT.INT32, name=n) for n in ("seq_len_q", "seq_len_kv")}
    o, st = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.25,
        use_padding_mask=True,
        use_causal_mask_bottom_right=True,
        q_ragged_offset=off,
        o_ragged_offset=off,
        stats_ragged_offset=off,
        max_seq_len_q=sq,
        generate_stats=True,
        **lens,
    )
    o.set_output(True).set_stride(thd)
    st.set_output(True)

    def prep(pack):
        final = g.final
        by = {final.tensors[u].name: u for u in final.inputs}
        pack[by["seq_len_q"]][...] = np.array([3, 1, 2]).reshape(B, 1, 1, 1)
        pack[by["seq_len_kv"]][...] = np.array([60, 7, 33]).reshape(B, 1, 1, 1)
        pack[by["off_q"]][...] = np.array([1, 4, 6, 8]).reshape(-1, 1, 1, 1)
        pack[by["q"]][:, :, [0, 5, 8, 9, 10]] = np.nan  # rows no sequence covers

    for split in (None, 2):
        run_packed(g, prep, _knobs(4, sq, split))


def test_pack_needs_one_value_head_per_key_head():
    g = og.Graph("mixed", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[1, 4, 1, 16], name="q")
    k = g.tensor(dim=[1, 2, 32, 16], name="k")
    v = g.tensor(dim=[1, 1, 32, 16], name="v")
    o, _ = g.sdpa(q, k, v, attn_scale=0.25, generate_stats=False)
    o.set_output(True)
    final = g.final
    spec = fwd_template.TEMPLATE.matched(make_piece(final, 0, list(final.nodes)), Device("cpu")).spec()
    from opgraph.engines.triton.attention import forward

    with pytest.raises(AttributeValueError, match="PACK_GQA"):
        forward(spec, FwdKnobs(16, 16, 4, 1, PACK_GQA=1))
    with pytest.raises(AttributeValueError, match="PACK_GQA=2"):
        FwdKnobs(16, 16, 4, 1, PACK_GQA=2)


# -- the build's choice ------------------------------------------------------------------------------------


def _configs(b, hq, hk, sq, skv, layout="dense", device=H100):
    g = og.Graph("dec", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[b, hq, sq, 128], name="q")
    kw = {}
    if layout == "paged":
        k, v = (g.tensor(dim=[b * skv // 64, hk, 64, 128], name=n) for n in "kv")
        for r in "kv":
            kw[f"paged_attention_{r}_table"] = g.tensor(dim=[b, 1, skv // 64, 1], data_type=DT.INT32, name=r + "t")
    else:
        k, v = (g.tensor(dim=[b, hk, skv, 128], name=n) for n in "kv")
    o, _ = g.sdpa(q, k, v, attn_scale=128**-0.5, generate_stats=False, **kw)
    o.set_output(True)
    final = g.final
    piece = make_piece(final, 0, list(final.nodes))
    configs = get_engine("triton").configs(piece, device, HeurMode.A)
    return split_kv.order(piece, configs, device)


@pytest.mark.parametrize(
    "b, hq, hk, sq, skv, layout, block_m, split",
    [
        (64, 32, 8, 1, 8192, "dense", 16, None),  # the decode rows: 512 programs, no split
        (64, 32, 8, 1, 32768, "paged", 16, None),
        (1, 32, 8, 1, 32768, "dense", 16, 16),  # 8 programs: 16 splits fill a wave
        (2, 32, 8, 3, 8192, "paged", 16, 8),  # 12 rows: one 16-row tile
        (4, 64, 8, 3, 8192, "dense", 32, 4),  # 24 rows
        (8, 16, 4, 1, 2048, "dense", 16, 4),  # the zoo's Llama (GQA 16/4): 32 programs, 4 splits
    ],
)
def test_policy_packs_decode_steps(b, hq, hk, sq, skv, layout, block_m, split):
    configs = _configs(b, hq, hk, sq, skv, layout)
    first = configs[0]
    assert first.knob("PACK_GQA") == 1 and first.knob("BLOCK_M") == block_m, [str(c) for c in configs[:3]]
    assert first.knob("SPLIT") == split, [str(c) for c in configs[:3]]
    assert "gqa_pack" in first.why


@pytest.mark.parametrize(
    "b, hq, hk, sq",
    [
        (4, 8, 8, 1),  # no groups
        (4, 32, 8, 17),  # not a decode step (more than 16 queries: the split's cut too)
        (1, 64, 1, 3),  # MQA: 192 rows, more than a tile
    ],
)
def test_policy_does_not_pack(b, hq, hk, sq):
    configs = _configs(b, hq, hk, sq, 8192)
    assert not configs[0].knob("PACK_GQA"), [str(c) for c in configs[:3]]


def test_a_planned_packed_decode_runs_under_the_interpreter(rng):
    """Built for the CPU (the interpreter), a decode step of two sequences, GQA 8/2, 2 queries each, takes
    the packed config; the plan matches the reference."""
    g = og.Graph("dec", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[2, 8, 2, 16], name="q")
    k, v = (g.tensor(dim=[2, 2, 200, 16], name=n) for n in "kv")
    o, st = g.sdpa(q, k, v, attn_scale=0.25, use_causal_mask_bottom_right=True)
    o.set_output(True)
    st.set_output(True)
    plan = g.build(device="cpu", engines=["triton"])
    assert [s.config.knob("PACK_GQA") for s in plan.steps] == [1], plan.describe()
    bad = check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


# -- Hopper (sm_90) compilation without a GPU -------------------------------------------------------------


def _decode_graph(layout, b=4, sq=1, sink=True, page=64):
    """A decode step: b sequences of sq queries, GQA 32/8, D 128, 8k-token caches (paged: `page`-token
    pages), bf16, padding and bottom-right causal masks (and a sink)."""
    hq, hk, skv = 32, 8, 8192
    g = og.Graph("dec", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[b, hq, sq, 128], name="q")
    kw = {"use_padding_mask": True, "use_causal_mask_bottom_right": True}
    if sink:
        kw["sink_token"] = g.tensor(dim=[1, hq, 1, 1])
    kw["seq_len_q"] = g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_q")
    kw["seq_len_kv"] = g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_kv")
    if layout == "paged":
        k, v = (g.tensor(dim=[b * skv // page, hk, page, 128], name=n) for n in "kv")
        for r in "kv":
            kw[f"paged_attention_{r}_table"] = g.tensor(dim=[b, 1, skv // page, 1], data_type=DT.INT32, name=r + "t")
    else:
        k, v = (g.tensor(dim=[b, hk, skv, 128], name=n) for n in "kv")
    o, st = g.sdpa(q, k, v, attn_scale=128**-0.5, **kw)
    o.set_output(True)
    st.set_output(True)
    return g


HOPPER_CASES = {
    f"pack_{layout}_sq{sq}_{'split' if split else 'whole'}": (
        lambda layout=layout, sq=sq: _decode_graph(layout, sq=sq, page=16 if layout == "paged" else 64),
        "attention",
        lambda c, split=split: [x for x in c if x.get("PACK_GQA") == 1 and x.get("SPLIT") == split],
    )
    for layout in ("dense", "paged")
    for sq in (1, 3)
    for split in (None, 4)
} | {
    # speculative decode's 16 draft tokens: 64 rows a tile
    "pack_dense_sq16_whole": (
        lambda: _decode_graph("dense", sq=16),
        "attention",
        lambda c: [x for x in c if x.get("PACK_GQA") == 1 and x.get("SPLIT") is None],
    )
}


def test_packed_forward_compiles_for_hopper():
    """The packed kernel (and split-KV's combining launch) compile for sm_90 (no GPU), without spills."""
    from .hopper_compile import attention_smem, compile_for_hopper

    out = compile_for_hopper(__name__)
    lines = [line.split() for line in out.splitlines() if line.startswith("compiled")]
    names = {(w[1], w[2]) for w in lines}
    for case in HOPPER_CASES:
        assert (case, "kernel_attn_fwd") in names, lines
        if case.endswith("split"):
            assert (case, "kernel_attn_fwd_combine") in names, lines
    for w in lines:
        assert int(w[w.index("spills") + 1]) == 0, w
    for case, kernel, smem, estimate in attention_smem(__name__, out):  # (the fit trusts the estimate)
        assert smem <= estimate, (case, kernel, smem, estimate)


# -- GPU --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("b, layout, page", [(2, "dense", 64), (2, "paged", 16), (16, "paged", 64), (16, "dense", 64)])
def test_gpu_decode_packed(b, layout, page):
    """GQA 32/8, D 128, 8k-token caches, bf16: the policy's packed config (batch 2: 16 programs, split;
    16: 128 programs fill an H100's or H200's 132 multiprocessors, no split) on the GPU against the
    reference engine, sequences of random lengths."""
    rng = np.random.default_rng(9)
    skv = 8192
    g = _decode_graph(layout, b=b, sink=False, page=page)
    plan = g.build(device="cuda", engines=["triton"])
    assert plan.steps[0].config.knob("PACK_GQA") == 1, plan.describe()
    assert bool(plan.steps[0].config.knob("SPLIT")) == (b == 2), plan.describe()

    def prep(pack):
        final = g.final
        by = {final.tensors[u].name: u for u in final.inputs}
        pack[by["seq_len_q"]][...] = 1
        pack[by["seq_len_kv"]][...] = rng.integers(1, skv + 1, size=b).reshape(b, 1, 1, 1)
        if layout == "paged":
            table = rng.permutation(b * skv // page).reshape(b, 1, skv // page, 1)
            for r in "kv":
                pack[by[r + "t"]][...] = table

    bad = check_plan(plan, rng, prepare=prep, rtol=5e-2, atol=5e-2)
    assert not bad, "\n".join(map(str, bad))
