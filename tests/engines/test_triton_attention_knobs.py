"""The attention forward's knob candidates on a Hopper GPU (attention/knobs.py), checked without one: the
short-KV rule (32-key steps where there are at most 64 keys) and, marked gpu, the graph that showed why
(NVIDIA's test_mhas case: S_kv 32, D 56, Dv 32, GQA 6/2, a bf16 bias) with every candidate."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.core.config import HeurMode
from opgraph.core.device import Device
from opgraph.core.piece import make_piece
from opgraph.core.tensor import packed_strides
from opgraph.engines.triton.attention.knobs import SHORT_KV, SHORT_KV_BLOCK_N
from opgraph.engines.triton.templates import attention as fwd_template

from ..helpers import assert_candidates_match, requires_cuda

DT = og.DataType
H200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
BSHD = (0, 2, 1, 3)


def short_kv(skv=32, *, b=2, sq=2048, d=56, dv=32):
    """The test_mhas case: BSHD q/k/v, 6 query heads over 2 key/value heads, a bf16 bias [1, 6, Sq, Skv]."""
    g = og.Graph("short_kv", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)

    def t(name, dims, **kw):
        return g.tensor(dim=list(dims), stride=packed_strides(dims, BSHD), name=name, **kw)

    q, k, v = t("q", (b, 6, sq, d)), t("k", (b, 2, skv, d)), t("v", (b, 2, skv, dv))
    bias = g.tensor(dim=[1, 6, sq, skv], data_type=DT.BFLOAT16, name="bias")
    o, _ = g.sdpa(q, k, v, attn_scale=0.125, bias=bias, generate_stats=False, name="fwd")
    o.set_output(True).set_stride(packed_strides((b, 6, sq, dv), BSHD))
    return g


def candidates(g):
    final = g.final
    piece = make_piece(final, 0, [n for n in final.nodes if n.kind == "sdpa"])
    return fwd_template.TEMPLATE.match(piece, H200).candidates()


@pytest.mark.parametrize("skv", [16, 32, SHORT_KV])
def test_short_kv_steps_32_keys(skv):
    found = candidates(short_kv(skv))
    assert found and all(k.BLOCK_N <= SHORT_KV_BLOCK_N for k in found), found


def test_longer_kv_keeps_its_tiles():
    assert any(k.BLOCK_N > SHORT_KV_BLOCK_N for k in candidates(short_kv(SHORT_KV + 1)))


def test_a_bucket_past_the_short_kv_keeps_its_tiles():
    """A dynamic decode plan's bucket of 17-256 keys (its hint 64): the run-time-sized kernel serves every
    shape of the bucket, so its tiles are chosen for the largest (256 keys), not the hint."""
    from opgraph.build.buckets import choose

    from .test_triton_attention_dynamic import h100_decode, ranked_on_h100

    dynamic = h100_decode(og.Dim("batch", 1, 4), og.Dim("kv", 1, 8192))
    seen = set()
    for b in choose(dynamic).buckets:
        _, configs = ranked_on_h100(dynamic.in_bucket(b.hint_map, b))
        widest = max(dict(c.knobs)["BLOCK_N"] for c in configs)
        top = {name: hi for name, _, hi in b.ranges}["kv"]
        assert (widest <= SHORT_KV_BLOCK_N) == (top <= SHORT_KV), (b.ranges, widest)
        seen.add(top <= SHORT_KV)
    assert seen == {True, False}


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("skv", [32, 64])
def test_gpu_short_kv_every_candidate(skv, rng):
    g = short_kv(skv)
    plan = g.build(device="cuda", engines=["triton"], heur_mode=[HeurMode.B])
    step = plan.steps[0]
    assert_candidates_match(plan, step, (step.config, *step.alternatives), rng, rtol=2e-2, atol=2e-2)
