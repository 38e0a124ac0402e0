"""The generated attention forward on paged KV caches (opgraph/engines/triton/attention/paged.py):
sdpa graphs with k and v in containers of pages read through page tables, built for the triton
engine alone, run under Triton's interpreter (key blocks of 16) against the reference engine with
poisoned outputs. Pages no table entry reaches hold NaN, and table entries past a sequence point
outside the container, so a read of either shows. Decode (1 to 3 queries) and prefill, pages smaller
than a key block (a gather per key), a multiple of it (one page a block) and neither, padding, causal
either alignment and a band, GQA, separate k and v tables, packed queries (chunked prefill), fp16 /
bf16, the GPU's knobs; a GPU test (marked gpu) at decode sizes."""

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
from .test_triton_attention_ragged import offsets

DT = og.DataType
BSHD = (0, 2, 1, 3)
H100 = Device("cuda", 0, "H100", (9, 0), 132)

pytestmark = pytest.mark.interpreter


def graph(
    b,
    sq,
    skv,
    block,
    io=DT.FLOAT,
    *,
    hq=4,
    hk=2,
    d=16,
    dv=16,
    lens=None,
    shared_table=True,
    packed_q=False,
    bshd=True,
    **opts,
):
    """sdpa with q [b, hq, sq, d] (packed with `packed_q`), k / v paged in `block`-row pages,
    `skv` keys a sequence (max_seq_len_kv); `lens` (lq, lkv) turn the padding mask on."""
    slots = -(-skv // block) + 1  # one slot more than needed: past the sequence
    pages = b * slots + 3
    g = og.Graph("att", io_data_type=io, intermediate_data_type=DT.FLOAT)
    perm = BSHD if bshd else None
    if packed_q:
        tq = offsets(lens[0])[1]
        q = g.tensor(dim=[1, hq, tq, d], stride=packed_strides((1, hq, tq, d), perm), name="q")
    else:
        q = g.tensor(dim=[b, hq, sq, d], stride=packed_strides((b, hq, sq, d), perm), name="q")
    k = g.tensor(dim=[pages, hk, block, d], stride=packed_strides((pages, hk, block, d), perm), name="k")
    v = g.tensor(dim=[pages, hk, block, dv], stride=packed_strides((pages, hk, block, dv), perm), name="v")
    tk = g.tensor(dim=[b, 1, slots, 1], data_type=DT.INT32, name="table_k")
    tv = tk if shared_table else g.tensor(dim=[b, 1, slots, 1], data_type=DT.INT64, name="table_v")
    kw = dict(opts)
    if lens is not None:
        kw["use_padding_mask"] = True
        kw["seq_len_q"] = g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_q")
        kw["seq_len_kv"] = g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_kv")
    if packed_q:
        off = g.tensor(dim=[b + 1, 1, 1, 1], data_type=DT.INT32, name="off_q")
        kw.update(q_ragged_offset=off, o_ragged_offset=off, stats_ragged_offset=off, max_seq_len_q=sq)
    o, st = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.3,
        paged_attention_k_table=tk,
        paged_attention_v_table=tv,
        paged_attention_max_seq_len_kv=skv,
        name="fwd",
        **kw,
    )
    o.set_output(True)
    if packed_q:
        o.set_dim([1, hq, tq, dv]).set_stride(packed_strides((1, hq, tq, dv), perm))
    st.set_output(True)
    return g


def prepare(pack, g, lens=None):
    """Tables of shuffled pages (a fresh shuffle for v's own table); entries past each sequence's keys
    outside the container; NaN in every page no used entry reaches; lengths and offsets."""
    final = g.final
    by_name = {final.tensors[u].name: u for u in final.inputs}
    rng = np.random.default_rng(3)
    node = next(n for n in final.nodes if n.kind == "sdpa")
    skv = node.op.max_seq_len_kv
    for name, cache in (("table_k", "k"), ("table_v", "v")):
        if name not in by_name:
            continue
        table = pack[by_name[name]]
        container = pack[by_name[cache]]
        b, _, slots, _ = table.shape
        pages, block = container.shape[0], container.shape[2]
        table[...] = rng.permutation(pages)[: b * slots].reshape(table.shape)
        used = np.zeros(pages, dtype=bool)
        for bi in range(b):
            n = skv if lens is None else min(int(lens[1][bi]), skv)
            need = -(-n // block)
            table[bi, 0, need:, 0] = np.where(np.arange(slots - need) % 2, -1, pages + 7)[: slots - need]
            used[table[bi, 0, :need, 0]] = True
        container[~used] = np.nan
    if lens is not None:
        pack[by_name["seq_len_q"]][...] = np.array(lens[0]).reshape(-1, 1, 1, 1)
        pack[by_name["seq_len_kv"]][...] = np.array(lens[1]).reshape(-1, 1, 1, 1)
    if "off_q" in by_name:
        pack[by_name["off_q"]][...] = offsets(lens[0])[0].reshape(-1, 1, 1, 1)
        q = pack[by_name["q"]]
        covered = np.zeros(q.shape[2], dtype=bool)
        for o_, n in zip(offsets(lens[0])[0], lens[0]):
            covered[o_ : o_ + n] = True
        q[:, :, ~covered] = np.nan


def check(g, rng, lens=None, io=DT.FLOAT):
    tol = {} if io is DT.FLOAT else {"rtol": 3e-2, "atol": 3e-2}
    return assert_engine_matches(
        g, rng, engines=("triton",), expect_steps=1, prepare=lambda p: prepare(p, g, lens), **tol
    )


BANDS = {
    "none": {},
    "causal": {"use_causal_mask": True},
    "causal_br": {"use_causal_mask_bottom_right": True},
    "band_br": {"diagonal_band_left_bound": 9, "diagonal_band_right_bound": 2, "diagonal_alignment": "BOTTOM_RIGHT"},
}


@pytest.mark.parametrize("block", [4, 16, 24, 32])
@pytest.mark.parametrize("sq", [1, 3])
@pytest.mark.parametrize("band", ["none", "causal_br"])
def test_decode(block, sq, band, rng):
    check(graph(3, sq, 45, block, **BANDS[band]), rng)


@pytest.mark.parametrize("block", [4, 16, 24])
@pytest.mark.parametrize("band", list(BANDS))
def test_prefill(block, band, rng):
    check(graph(2, 37, 37, block, hk=1, bshd=False, **BANDS[band]), rng)


@pytest.mark.parametrize("block", [8, 32])
@pytest.mark.parametrize("band", ["none", "causal_br", "band_br"])
def test_padded_sequences(block, band, rng):
    """Sequences of 45, 1 and 0 keys in one cache (the table of the empty one points nowhere)."""
    lens = ((2, 1, 2), (45, 1, 0))
    check(graph(3, 2, 45, block, lens=lens, shared_table=False, **BANDS[band]), rng, lens)


@pytest.mark.parametrize("block", [4, 16])
def test_chunked_prefill(block, rng):
    """Packed queries (a chunk of each sequence) against the paged cache of the whole sequence."""
    lens = ((1, 17, 0, 9), (30, 40, 5, 9))
    g = graph(4, 17, 40, block, lens=lens, packed_q=True, use_causal_mask_bottom_right=True)
    check(g, rng, lens)


@pytest.mark.parametrize("io", [DT.HALF, DT.BFLOAT16])
def test_half_types(io, rng):
    check(graph(3, 2, 45, 8, io, hq=8, hk=2, d=32, dv=24, use_causal_mask_bottom_right=True), rng, io=io)


@pytest.mark.parametrize(
    "knobs", [{"BLOCK_M": 16, "BLOCK_N": 32, "ONELOOP": 1}, {"BLOCK_M": 32, "BLOCK_N": 64, "ORDER": 1}]
)
@pytest.mark.parametrize("block", [8, 64])
def test_with_the_gpu_knobs(knobs, block, rng):
    import torch

    from opgraph.engines.triton.attention import FwdKnobs, forward
    from opgraph.engines.triton.attention.run import launch
    from opgraph.testing import compare, random_pack, reference_outputs

    lens = ((2, 1, 2), (45, 1, 0))
    g = graph(3, 2, 100, block, DT.HALF, lens=lens, use_causal_mask_bottom_right=True)
    final = g.final
    spec = fwd_template.TEMPLATE.matched(make_piece(final, 0, list(final.nodes)), Device("cpu")).spec()
    pack = random_pack(final, rng)
    prepare(pack, g, lens)
    want = reference_outputs(final, pack)
    buffers = {u: torch.from_numpy(x) for u, x in pack.items()}
    launch(forward(spec, FwdKnobs(num_warps=4, num_stages=1, **knobs)), buffers, interpret=True)
    for u in final.outputs:
        bad = compare(final.tensors[u], buffers[u].numpy(), want[u], rtol=3e-2, atol=3e-2)
        assert bad is None, bad


def test_declines_prologues_on_paged_caches():
    g = og.Graph("att", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[2, 4, 3, 16], name="q")
    k, v = (g.tensor(dim=[9, 2, 4, 16], name=n) for n in "kv")
    table = g.tensor(dim=[2, 1, 3, 1], data_type=DT.INT32, name="table")
    o, _ = g.sdpa(
        q, g.mul(k, 0.5), v, generate_stats=False, paged_attention_k_table=table, paged_attention_v_table=table
    )
    o.set_output(True)
    final = g.final
    why = fwd_template.TEMPLATE.match(make_piece(final, 0, list(final.nodes)), H100)
    assert not why and "paged" in why.reason and "prologue" in why.reason, why.reason


def _packed_table_graph(b, sq, skv, block, tokens, per_row, **opts):
    import dataclasses

    g = og.Graph("att", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    pages = b * (-(-skv // block)) + 4
    q = g.tensor(dim=[b, 4, sq, 16], stride=packed_strides((b, 4, sq, 16), BSHD), name="q")
    k, v = (g.tensor(dim=[pages, 2, block, 16], name=n) for n in "kv")
    table = g.tensor(dim=[1, 1, tokens, 1], data_type=DT.INT32, name="table")
    toff = g.tensor(dim=[b + 1, 1, 1, 1], data_type=DT.INT64, name="toff")
    o, st = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.3,
        paged_attention_k_table=table,
        paged_attention_v_table=table,
        paged_attention_k_table_ragged_offset=toff,
        paged_attention_v_table_ragged_offset=toff,
        paged_attention_max_seq_len_kv=skv,
        use_padding_mask=True,
        seq_len_q=g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="lq"),
        seq_len_kv=g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="lkv"),
        **opts,
    )
    o.set_output(True)
    st.set_output(True)
    if per_row != 1:  # offsets counted in elements (cuDNN's: one element a table row here, times per_row)
        rec = next(r for r in g._records if r.op.kind == "sdpa")
        strides = tuple((f"paged_attention_{r}_table", per_row) for r in "kv")
        rec.op = dataclasses.replace(rec.op, ragged_offset_strides=strides)
        g._invalidate()
    return g


@pytest.mark.parametrize("block", [4, 16, 32])
@pytest.mark.parametrize("per_row", [1, 3])
def test_packed_page_tables(block, per_row, rng):
    """One packed table [1, 1, T, 1] for every sequence (cuDNN's ragged page table): sequence b's slots
    from its offset on, the gaps between sequences holding pages outside the container, the last
    sequence's slots running past T (page 0 there, for keys past its length)."""
    b, sq, skv = 3, 2, 45
    need = -(-skv // block)
    lkv = (45, 9, 30)
    starts = [1, need + 3, 2 * need + 5]
    tokens = starts[-1] + -(-lkv[-1] // block)  # the last sequence's unused slots fall past the table
    g = _packed_table_graph(b, sq, skv, block, tokens, per_row, use_causal_mask_bottom_right=True)

    def prep(pack):
        final = g.final
        by = {final.tensors[u].name: u for u in final.inputs}
        k, v = pack[by["k"]], pack[by["v"]]
        pages = k.shape[0]
        table = pack[by["table"]]
        table[...] = pages + 7  # rows no sequence needs: outside the container
        perm = np.random.default_rng(4).permutation(np.arange(1, pages))
        used = np.zeros(pages, dtype=bool)
        used[0] = True  # (page 0: what a slot past the table reads)
        at = 0
        for s0, n in zip(starts, lkv):
            m = -(-n // block)
            table[0, 0, s0 : s0 + m, 0] = perm[at : at + m]
            used[perm[at : at + m]] = True
            at += m
        k[~used] = np.nan
        v[~used] = np.nan
        pack[by["toff"]][...] = (np.array([*starts, tokens]) * per_row).reshape(-1, 1, 1, 1)
        pack[by["lq"]][...] = np.array([2, 1, 2]).reshape(-1, 1, 1, 1)
        pack[by["lkv"]][...] = np.array(lkv).reshape(-1, 1, 1, 1)

    assert_engine_matches(g, rng, engines=("triton",), expect_steps=1, prepare=prep)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("io", [DT.HALF, DT.BFLOAT16])
@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("sq", [1, 4])
def test_gpu_decode_against_the_reference(io, block, sq, rng):
    """Decode at realistic sizes: 8 sequences of up to 4k cached keys, GQA 32/8, D 128, 16- and
    64-token pages; every output against the reference engine."""
    lkv = (4096, 1, 3000, 17, 4095, 2048, 64, 1000)
    lens = ((sq,) * 8, lkv)
    g = graph(8, sq, 4096, block, io, hq=32, hk=8, d=128, dv=128, lens=lens, use_causal_mask_bottom_right=True)
    plan = g.build(device="cuda", engines=["triton"])
    assert len(plan.steps) == 1, plan.describe()
    bad = check_plan(plan, rng, prepare=lambda p: prepare(p, g, lens), rtol=2e-2, atol=2e-2)
    assert not bad, "\n".join(map(str, bad))
