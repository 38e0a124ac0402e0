"""The decode attention workloads (bench/workloads/attention_decode.py) on the CPU: the float64 reference
and the paged container against PyTorch, the plan the build makes for the issue's shapes on an H100
(GQA-packed, opgraph/build/gqa_pack.py), and the group's dry run end to end."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bench.workloads import attention_decode as A
from opgraph.build import split_kv
from opgraph.core.config import HeurMode
from opgraph.core.device import Device
from opgraph.core.piece import make_piece
from opgraph.engines import get_engine

from .helpers import dry_run

H100 = Device("cuda", 0, "H100", (9, 0), 132)


def test_reference_and_pages_match_pytorch():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 8, 1, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(3, 2, 48, 16, generator=g, dtype=torch.float64) for _ in range(2))
    want = F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True)
    got = A.decode64(q, k, v, 0.3)
    assert float((got - want).abs().max()) < 1e-12
    perm = torch.randperm(3 * 3, generator=g)
    pages = A.paged(k, 16, perm)
    table = perm.view(3, 3)
    back = torch.stack([torch.cat([pages[table[b, p]] for p in range(3)], dim=1) for b in range(3)])
    assert torch.equal(back, k)


@pytest.mark.parametrize("skv", [8192, 32768])
@pytest.mark.parametrize("page", [0, 16, 64])
def test_the_plan_packs_the_query_heads(skv, page):
    """The issue's rows (B 64, GQA 32/8, D 128) on an H100: the packed generated forward goes first."""
    g, _, _ = A.decode_graph("t", (64, 32, 8, skv, 128), page)
    final = g.final
    piece = make_piece(final, 0, list(final.nodes))
    configs = split_kv.order(piece, get_engine("triton").configs(piece, H100, HeurMode.A), H100)
    first = configs[0]
    assert first.knob("template") == "attention" and first.knob("PACK_GQA") == 1, [str(c) for c in configs[:3]]
    assert not first.knob("SPLIT")  # 512 programs fill 132 multiprocessors


@pytest.mark.slow
def test_dry_run_of_the_decode_group(tmp_path):
    data = dry_run(tmp_path, "--suite", "decode", "--repeats", "1", timeout=900)
    (repeat,) = data["runs"]
    by_id = {w["id"]: w for w in repeat["workloads"]}
    assert len(by_id) == 6 and not any(w["error"] for w in by_id.values()), by_id
    for wid, w in by_id.items():
        impls = {i["impl"]: i for i in w["impls"]}
        for name in ("opgraph", "generated"):
            assert impls[name]["status"] == "ok" and impls[name]["verdict"]["passed"], (wid, name, impls[name])
        assert "triton" in impls["generated"]["engine"], wid
        assert impls["torch sdpa (flash)"]["verdict"]["passed"], wid
