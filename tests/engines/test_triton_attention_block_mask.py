"""Block masks (`block_mask`: one bit a 128 x 128 score tile) in the generated attention forward and
backward (opgraph/engines/triton/attention/common.py mask_expr): under Triton's interpreter (tiles of
16, so each 128-wide mask tile spans several kernel tiles) against the reference engine on random
inputs and random bits, with poisoned outputs: alone, with a causal mask of either alignment and with
padding, GQA, split-KV decode; a GPU test (marked gpu)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import opgraph as og
from opgraph.testing import check_plan

from ..helpers import assert_engine_matches, requires_cuda

DT = og.DataType
TOL = {"rtol": 2e-3, "atol": 2e-4}

pytestmark = pytest.mark.interpreter


def graph(b=1, hq=2, hk=1, sq=140, skv=280, d=16, io=DT.FLOAT, backward=True, padding=False, **opts):
    g = og.Graph("att", io_data_type=io, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[b, hq, sq, d], name="q")
    k, v = (g.tensor(dim=[b, hk, skv, d], name=n) for n in "kv")
    col_tiles = -(-skv // 128)
    tiles = (b, hq, -(-sq // 128), -(-col_tiles // 8))
    kw = dict(opts, attn_scale=d**-0.5, block_mask=g.tensor(dim=list(tiles), data_type=DT.UINT8, name="bm"))
    if padding:
        kw["use_padding_mask"] = True
        kw["seq_len_q"] = g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_q")
        kw["seq_len_kv"] = g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_kv")
    o, st = g.sdpa(q, k, v, name="fwd", **kw)
    outs = [o, st]
    if backward:
        do = g.tensor(dim=[b, hq, sq, d], name="dO")
        outs += g.sdpa_backward(q, k, v, o, do, st, name="bwd", **kw)
    for x in outs:
        x.set_output(True)
    return g


def prepare(g, seed=0, lens=None):
    def prep(pack):
        final = g.final
        by = {final.tensors[u].name: u for u in final.inputs}
        bits = np.random.default_rng(seed).integers(0, 256, pack[by["bm"]].shape)
        bits[..., 0, 0] |= 1  # (tile (0, 0) kept: a causal top-left row 0 sees something)
        pack[by["bm"]][...] = bits
        if lens is not None:
            pack[by["seq_len_q"]][...] = np.array(lens[0]).reshape(-1, 1, 1, 1)
            pack[by["seq_len_kv"]][...] = np.array(lens[1]).reshape(-1, 1, 1, 1)

    return prep


@pytest.mark.parametrize(
    "opts",
    [{}, {"use_causal_mask": True}, {"use_causal_mask_bottom_right": True}, {"sliding_window_length": 150}],
    ids=["alone", "causal", "causal_br", "window"],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_block_mask_forward_and_backward(opts, seed, rng):
    g = graph(**opts)
    assert_engine_matches(g, rng, engines=("triton",), expect_steps=2, prepare=prepare(g, seed), **TOL)


@pytest.mark.parametrize("opts", [{}, {"use_causal_mask": True}], ids=["alone", "causal"])
@pytest.mark.parametrize("b, hq", [(1, 1), (2, 2)])
def test_block_mask_of_one_tile(b, hq, opts, rng):
    """Sequences shorter than a mask tile (one byte a batch entry and head, read as a scalar) with
    ragged kernel tiles (memory predicates on both axes)."""
    g = graph(b=b, hq=hq, hk=1, sq=20, skv=27, **opts)
    for seed in (0, 1):
        assert_engine_matches(g, rng, engines=("triton",), expect_steps=2, prepare=prepare(g, seed), **TOL)


def test_block_mask_with_padding_and_batches(rng):
    g = graph(b=2, hq=4, hk=2, sq=136, skv=260, padding=True, use_causal_mask_bottom_right=True)
    prep = prepare(g, 3, lens=((136, 70), (260, 129)))
    assert_engine_matches(g, rng, engines=("triton",), expect_steps=2, prepare=prep, **TOL)


def test_block_mask_split_kv_decode(rng):
    """A decode step over a long cache with tiles of keys masked out, split over programs."""
    g = graph(b=1, hq=2, hk=1, sq=1, skv=1100, backward=False)
    plan = g.build(device="cpu", engines=["triton"])
    assert plan.steps[0].config.knob("SPLIT"), plan.describe()
    bad = check_plan(plan, rng, prepare=prepare(g, 5), **TOL)
    assert not bad, "\n".join(map(str, bad))


def _hopper(backward):
    """One node: bf16, B 2, H 8/2, S 2048, D 128, causal, a block mask (the backward reads o, dO, Stats)."""
    g = og.Graph("att", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[2, 8, 2048, 128], name="q")
    k, v = (g.tensor(dim=[2, 2, 2048, 128], name=n) for n in "kv")
    kw = {"attn_scale": 128**-0.5, "use_causal_mask": True}
    kw["block_mask"] = g.tensor(dim=[2, 8, 16, 2], data_type=DT.UINT8, name="bm")
    if backward:
        o, do = (g.tensor(dim=[2, 8, 2048, 128], name=n) for n in ("o", "dO"))
        st = g.tensor(dim=[2, 8, 2048, 1], data_type=DT.FLOAT, name="stats")
        outs = g.sdpa_backward(q, k, v, o, do, st, **kw)
    else:
        outs = [x for x in g.sdpa(q, k, v, **kw) if x is not None]
    for x in outs:
        x.set_output(True)
    return g


def _gpu_test_forward():
    """The GPU test's forward (bf16, D 128, GQA 8/2, Sq 1000, Skv 1500, bottom-right causal)."""
    return graph(
        b=2, hq=8, hk=2, sq=1000, skv=1500, d=128, io=DT.BFLOAT16, use_causal_mask_bottom_right=True, backward=False
    )


HOPPER_CASES = {
    "block_mask_fwd": (lambda: _hopper(False), "attention", None),
    "block_mask_bwd": (lambda: _hopper(True), "attention_bwd", None),
    # the build's two configs (128 x 128 tiles, ONELOOP 1 and 0)
    "gpu_test_fwd": (_gpu_test_forward, "attention", lambda c: [k for k in c if k["BLOCK_M"] == k["BLOCK_N"] == 128]),
}


def test_block_mask_kernels_compile_for_hopper():
    """The forward and backward with a block mask compile for sm_90 (no GPU) with the heuristic's knobs,
    within the shared memory the template estimated for them (the configs the build takes for the GPU
    test's forward once needed 233,472 bytes of an H200's 232,448: the block mask's tile was not counted)."""
    from .hopper_compile import attention_smem, compile_for_hopper

    out = compile_for_hopper(__name__)
    lines = [line.split() for line in out.splitlines() if line.startswith("compiled")]
    names = {(w[1], w[2]) for w in lines}
    assert {("block_mask_fwd", "kernel_attn_fwd"), ("block_mask_bwd", "kernel_attn_bwd_dkdv")} <= names, lines
    assert ("gpu_test_fwd", "kernel_attn_fwd") in names, lines
    for w in lines:
        if w[1] != "gpu_test_fwd":
            assert int(w[w.index("spills") + 1]) <= (160 if w[2] == "kernel_attn_bwd_dkdv" else 0), w
    for case, kernel, smem, estimate in attention_smem(__name__, out):
        assert smem <= estimate, (case, kernel, smem, estimate)


def test_block_mask_counts_in_the_shared_memory_estimate():
    """The block mask's score-shaped tile is part of the estimate, so the GPU test's forward (bf16, D 128)
    cuts its 128 x 128 tiles to 2 stages instead of taking 3 that do not fit (no GPU: candidates for H100)."""
    from opgraph.core.device import Device
    from opgraph.core.piece import make_piece
    from opgraph.engines.triton.attention import FwdKnobs
    from opgraph.engines.triton.attention.knobs import SMEM_LIMIT, fwd_smem
    from opgraph.engines.triton.templates import attention as fwd_template

    h100 = Device("cuda", 0, "H100", (9, 0), 132)
    final = _gpu_test_forward().final
    piece = make_piece(final, 0, final.nodes)
    spec = fwd_template.TEMPLATE.matched(piece, h100).spec()
    plain = dataclasses.replace(spec, block_mask=None)
    k = FwdKnobs(128, 128, 8, 3)
    assert fwd_smem(plain, k) <= SMEM_LIMIT < fwd_smem(spec, k)
    cands = fwd_template.TEMPLATE.candidates(piece, h100)
    assert (cands[0]["BLOCK_M"], cands[0]["BLOCK_N"], cands[0]["num_stages"]) == (128, 128, 2), cands[0]
    for c in cands:
        assert fwd_smem(spec, FwdKnobs(**{n: c[n] for n in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")})) <= (
            SMEM_LIMIT
        )


@pytest.mark.gpu
@requires_cuda
def test_gpu_block_mask():
    rng = np.random.default_rng(0)
    g = graph(b=2, hq=8, hk=2, sq=1000, skv=1500, d=128, io=DT.BFLOAT16, use_causal_mask_bottom_right=True)
    plan = g.build(device="cuda", engines=["triton"])
    bad = check_plan(plan, rng, prepare=prepare(g, 7), rtol=5e-2, atol=5e-2)
    assert not bad, "\n".join(map(str, bad))
