"""The packed and sliding-window attention workloads' own parts on the CPU (bench/workloads/attention_llm.py):
the sequence lengths, the float64 references against dense masked attention, FlexAttention's masks against
the references' pairs, the cuDNN peer's output views; and the group's dry run end to end (opgraph's plans
against the references)."""

from __future__ import annotations

import math

import pytest
import torch

from bench.workloads import attention_llm as L

from .helpers import dry_run


def _rel(a, b):
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())


def _dense(q, k, v, keep, do):
    """Dense float64 attention of [H, S, D] over the pairs `keep` [S, S] holds, and its gradients."""
    leaves = [t.double().clone().requires_grad_() for t in (q, k, v)]
    s = (leaves[0] @ leaves[1].transpose(-1, -2)) * 0.25
    s = s.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(s, -1, keepdim=True)
    o = torch.exp(s - lse) @ leaves[2]
    return {"o": o, "lse": lse, **dict(zip(("dq", "dk", "dv"), torch.autograd.grad(o, leaves, do.double())))}


@pytest.mark.parametrize(
    "count,total,lo,hi", [(32, 32768, 128, 4096), (8, 8192, 128, 2048), (5, 640, 128, 128), (3, 40, 1, 30)]
)
def test_packed_lengths_sum_to_the_total_within_bounds(count, total, lo, hi):
    lengths = L.packed_lengths(count, total, lo, hi)
    assert len(lengths) == count and sum(lengths) == total and all(lo <= n <= hi for n in lengths)
    assert L.packed_lengths(count, total, lo, hi) == lengths  # (seeded)


def test_packed_reference_is_dense_attention_under_the_document_mask():
    g = torch.Generator().manual_seed(3)
    lengths = [5, 1, 9, 4]
    t = sum(lengths)
    q, k, v, do = (torch.randn(t, 2, 8, generator=g, dtype=torch.float64) for _ in range(4))
    got = L.packed64(q, k, v, lengths, 0.25, do)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    keep = (doc[i] == doc[j]) & (j <= i)
    want = _dense(*(x.transpose(0, 1) for x in (q, k, v)), keep, do.transpose(0, 1))
    for n in ("o", "lse", "dq", "dk", "dv"):
        assert _rel(got[n], want[n].transpose(0, 1)) < 1e-12, n
    # FlexAttention's mask_mod holds on the same pairs
    mask = L.document_mask(lengths, "cpu")
    assert torch.equal(mask(0, 0, i.expand(t, t), j.expand(t, t)), keep)


@pytest.mark.parametrize("block", [4, 7, 64])
def test_window_reference_in_blocks_is_dense_attention_under_the_band(block):
    """Blocks of queries against the keys their window reaches (a key block's gradient summed over the
    query blocks that see it) equal the dense band."""
    g = torch.Generator().manual_seed(4)
    s, window = 29, 6
    q, k, v, do = (torch.randn(2, s, 8, generator=g, dtype=torch.float64) for _ in range(4))
    got = L.window64(q, k, v, window, 0.25, do, block=block)
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    keep = (j <= i) & (j > i - window)
    want = _dense(q, k, v, keep, do)
    for n in ("o", "lse", "dq", "dk", "dv"):
        assert _rel(got[n], want[n]) < 1e-12, n
    assert torch.equal(L.window_mask(window)(0, 0, i.expand(s, s), j.expand(s, s)), keep)


@pytest.mark.parametrize("backward", [False, True])
def test_cudnn_outputs_read_as_the_packed_tokens(backward):
    """The frontend's ragged [B, H, Smax, D] buffers (BSHD strides over the packed tokens) read as [1, H, T, D];
    its dense statistics [B, H, Smax, 1] gathered to the packed [1, H, T, 1]."""
    lengths, h, d = [3, 5, 2], 2, 4
    t, smax, b = sum(lengths), max(lengths), len(lengths)
    tokens = torch.randn(t, h, d)
    buf = torch.full((b * smax * h * d,), math.nan)
    buf[: t * h * d] = tokens.reshape(-1)
    ragged = buf.as_strided((b, h, smax, d), (smax * h * d, d, h * d, 1))
    stats = torch.randn(b, h, smax, 1)
    outs = [ragged] * 3 if backward else [ragged, stats]
    got = L.fe_packed_views(lengths, h, d, backward)(outs)
    assert torch.equal(got[0], tokens.unsqueeze(0).transpose(1, 2))
    if not backward:
        want = torch.cat([stats[i, :, :n] for i, n in enumerate(lengths)], dim=1).unsqueeze(0)
        assert torch.equal(got[1], want) and got[1].shape == (1, h, t, 1)


@pytest.mark.slow
def test_dry_run_of_the_llm_attention_group(tmp_path):
    """opgraph's plans (reference engine) and the generated kernels (interpreter) against the float64
    references: the training forward's O and statistics, the backward's gradients."""
    data = dry_run(tmp_path, "--suite", "llm-attention", "--repeats", "1")
    by_id = {w["id"]: w for w in data["runs"][0]["workloads"]}
    assert sorted(by_id) == [
        "attention.packed_bwd.t32k",
        "attention.packed_fwd.t32k",
        "attention.window_bwd.w4k_s32k",
        "attention.window_fwd.w4k_s32k",
    ]
    for wid, w in by_id.items():
        assert not w["error"], (wid, w["error"])
        names = [o[0] for o in w["outputs"]]
        assert names == (["dq", "dk", "dv"] if "_bwd" in wid else ["o", "stats"]), wid
        impls = {i["impl"]: i for i in w["impls"]}
        for name in ("opgraph", "generated"):
            assert impls[name]["status"] == "ok" and set(impls[name]["errors"]) == set(names), (wid, name)
            assert impls[name]["verdict"]["passed"], (wid, name, impls[name]["verdict"])
        assert "attention" in impls["generated"]["engine"], wid
