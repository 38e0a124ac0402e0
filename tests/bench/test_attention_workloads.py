"""The attention workloads' own parts on the CPU: the float64 reference against PyTorch, the score
modifier's two definitions (opgraph's graph, the reference's formula) against each other, the
backward calls of the PyTorch peers, the TFLOP/s table; and the group's dry run end to end."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

from bench.core.aggregate import aggregate
from bench.core.floors import Floor
from bench.core.render import fmt_num, render
from bench.workloads import attention as A

from .helpers import dry_run, run


def _rel(a, b):
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())


@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_pytorch_float64(causal):
    g = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(2, 3, 24, 8, generator=g, dtype=torch.float64) for _ in range(4))
    got = A.attention64(q, k, v, 0.3, causal, do=do)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=0.3)
    grads = torch.autograd.grad(o, leaves, do)
    assert _rel(got["o"], o) < 1e-12
    for name, want in zip(("dq", "dk", "dv"), grads):
        assert _rel(got[name], want) < 1e-12, name
    s = (q @ k.transpose(-1, -2)) * 0.3
    if causal:
        s = s.masked_fill(torch.ones(24, 24, dtype=torch.bool).triu(1), -math.inf)
    assert _rel(got["lse"], torch.logsumexp(s, -1, keepdim=True)) < 1e-12


def test_score_modifier_graph_and_reference_agree():
    """The modifier as opgraph's graph (reference engine) and as the reference's formula: one function."""
    g = torch.Generator().manual_seed(2)
    b, h, s, d = 1, 4, 32, 16
    q, k, v, do = (torch.randn(b, h, s, d, generator=g).to(torch.bfloat16) for _ in range(4))
    slopes = torch.tensor(A.alibi_slopes(h), dtype=torch.float32)
    q = q * 4  # large scores: the soft-cap bends them
    want = A.attention64(q, k, v, d**-0.5, True, A.softcap_alibi64(A.alibi_slopes(h)), do=do)
    graph, inputs, (o,) = A.forward_graph("t", q, k, v, True, d**-0.5, slopes.view(1, h, 1, 1))
    out = torch.full((b, h, s, d), float("nan"), dtype=torch.bfloat16)
    graph.build(device="cpu", engines=["reference"]).execute({**inputs, o: out})
    assert _rel(out, want["o"]) < 2**-8
    plain = A.attention64(q, k, v, d**-0.5, True)["o"]
    assert _rel(plain, want["o"]) > 0.05  # the modifier changes the result: the check above can fail
    t = {
        "q": q,
        "k": k,
        "v": v,
        "o": want["o"].to(torch.bfloat16),
        "dO": do,
        "stats": want["lse"].float(),
        "slopes": slopes.view(1, h, 1, 1),
    }
    graph, inputs, outs = A.backward_graph("tb", t, True, d**-0.5)
    bufs = [torch.full((b, h, s, d), float("nan"), dtype=torch.bfloat16) for _ in outs]
    graph.build(device="cpu", engines=["reference"]).execute({**inputs, **dict(zip(outs, bufs))})
    for name, buf in zip(("dq", "dk", "dv"), bufs):
        assert _rel(buf, want[name]) < 2**-7, name


def test_backend_backward_is_the_node_called_directly_and_equals_autograd():
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(1, 2, 40, 16, generator=g).to(torch.bfloat16) for _ in range(4))

    def flash(q, k, v):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def math_(q, k, v):  # an autograd graph whose last node does not take q, k, v directly
        return (
            torch.softmax(
                (q @ k.transpose(-1, -2)).float().masked_fill(torch.ones(40, 40, dtype=torch.bool).triu(1), -math.inf),
                -1,
            ).to(q.dtype)
            @ v
        )

    for fn, direct in ((flash, True), (math_, False)):
        call, how, _ = A.grad_call(fn, (q, k, v), do)
        assert ("called directly" in how) == direct, how
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        want = torch.autograd.grad(fn(*leaves), leaves, do)
        for _ in range(2):  # the retained graph is differentiated again at every call
            got = call()
            assert len(got) == 3
            for a, b in zip(got, want):
                assert torch.equal(a, b)


def test_tflops_table_only_for_workloads_that_ask():
    runs = [run(1)]
    md = render(aggregate(runs), "t")
    assert "### Throughput" not in md
    w = runs[0].workloads[0]
    w.floor = Floor(bytes=3e6, flops=4e9, dtype="float16", tflops=True)
    md = render(aggregate(runs), "t")
    part = md.split("### Throughput", 1)[1].split("\n\n")
    rows = next(p for p in part if p.startswith("|")).splitlines()
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    row = dict(zip(head, [c.strip() for c in rows[2].strip("|").split("|")]))
    assert row["workload"] == "conv A fp16" and row["floor rate"] == fmt_num(660.0)
    assert row["opgraph"] == fmt_num(4e9 / 10e6)  # 4 GFLOP in 10 µs: 400 TFLOP/s
    assert row["best peer"] == f"{fmt_num(4e9 / 9e6)} (cuDNN FE tuned)"
    assert Floor.from_dict(w.floor.to_dict()).tflops


@pytest.mark.slow
def test_dry_run_of_the_attention_group(tmp_path):
    data = dry_run(tmp_path, "--suite", "attention", "--repeats", "1", timeout=900)
    (md_file,) = [p for p in os.listdir(tmp_path) if p.endswith(".md")]
    (repeat,) = data["runs"]
    by_id = {w["id"]: w for w in repeat["workloads"]}
    assert len(by_id) == 16 and not any(w["error"] for w in by_id.values())
    for wid, w in by_id.items():
        impls = {i["impl"]: i for i in w["impls"]}
        names = [o[0] for o in w["outputs"]]
        want_names = {"sdpa_fwd": ["o"], "softcap_alibi_fwd": ["o"], "block_fwd": ["y"]}.get(wid.split(".")[1], names)
        assert names == want_names, wid
        for name in ("opgraph", "generated"):  # every output checked
            assert impls[name]["status"] == "ok" and set(impls[name]["errors"]) == set(names), (wid, name)
        assert impls["opgraph"]["verdict"]["passed"], (wid, impls["opgraph"]["verdict"])
        assert "triton" in impls["generated"]["engine"], wid
        if wid.startswith("attention.sdpa"):
            assert impls["generated"]["verdict"]["passed"], wid
            assert impls["torch sdpa (flash)"]["verdict"]["passed"], wid
            for peer in ("torch sdpa (cudnn)", "torch sdpa (efficient)", "cuDNN FE heuristic", A.FLEX):
                assert impls[peer]["status"] == "unavailable", (wid, peer)
        if ".sdpa_bwd." in wid:
            assert "called directly" in impls["torch sdpa (flash)"]["notes"]
        if wid.startswith("attention.block"):
            assert impls["torch eager"]["verdict"]["passed"], wid
    assert len(by_id["attention.block_fwd_bwd.bf16"]["outputs"]) == 14  # y, dx and 12 parameter gradients
    md = open(tmp_path / md_file).read()
    assert "### Throughput: TFLOP/s" in md and "SDPA bwd B4 H16 S16384 D128 causal bf16" in md
