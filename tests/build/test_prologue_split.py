"""A matmul's operand prologue run as a piece of its own where the estimates say so
(opgraph/build/prologue_split.py): an RMSNorm before an LM head runs apart, a prologue before a small
product stays fused, and the plan's cuts say why."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph import DataType as DT
from opgraph.build.partition import partition
from opgraph.build.planner import usable_engines
from opgraph.build.prologue_split import split_prologues
from opgraph.core.config import HeurMode, Support
from opgraph.engines import get_engine

from .fakes import H200


@pytest.fixture
def triton_on_h200(monkeypatch):
    monkeypatch.setattr(type(get_engine("triton")), "available", lambda self, device: Support.yes())
    return usable_engines(["triton"], H200)


def normed_product(m, k, n):
    """(x * rstd) * gamma, cast to bf16, @ W: a final norm's scaling as the LM head's A prologue."""
    g = og.Graph("head", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=[m, k], name="x")
    rstd = g.tensor(dim=[m, 1], name="rstd", data_type=DT.FLOAT)
    gamma = g.tensor(dim=[1, k], name="gamma")
    w = g.tensor(dim=[k, n], name="w")
    a = g.mul(g.mul(x, rstd, name="scale"), gamma, name="gamma").set_data_type(DT.BFLOAT16)
    y = g.matmul(a, w, name="head").set_output(True).set_data_type(DT.BFLOAT16)
    return g, {"x": x, "rstd": rstd, "gamma": gamma, "w": w, "y": y}


def test_a_norm_before_a_wide_product_runs_apart(triton_on_h200):
    graph = normed_product(8192, 1024, 32000)[0].final
    pieces, cuts = partition(graph, triton_on_h200, H200)
    assert len(pieces) == 1  # (the partitioner fused the norm as the matmul's prologue)
    split, new_cuts = split_prologues(pieces, cuts, triton_on_h200, H200, [HeurMode.A])
    assert [[n.name for n in p.nodes] for p in split] == [["scale", "gamma"], ["head"]]
    assert [p.index for p in split] == [0, 1]
    (cut,) = new_cuts
    assert cut.before == 0 and cut.node.name == "head"
    assert "build.prologue_split" in cut.reasons[0][1]


def test_a_prologue_before_a_small_product_stays_fused(triton_on_h200):
    graph = normed_product(64, 64, 64)[0].final
    pieces, cuts = partition(graph, triton_on_h200, H200)
    assert split_prologues(pieces, cuts, triton_on_h200, H200, [HeurMode.A]) == (pieces, cuts)


def test_the_cpu_and_fallback_builds_are_left_alone(triton_on_h200):
    from opgraph.core.device import CPU

    graph = normed_product(8192, 1024, 32000)[0].final
    pieces, cuts = partition(graph, triton_on_h200, H200)
    assert split_prologues(pieces, cuts, triton_on_h200, CPU, [HeurMode.A]) == (pieces, cuts)
    assert split_prologues(pieces, cuts, triton_on_h200, H200, [HeurMode.FALLBACK]) == (pieces, cuts)


@pytest.mark.gpu
def test_gpu_a_split_plan_computes_the_product(rng):
    import torch

    g, t = normed_product(4096, 1024, 16000)
    plan = g.build(device="cuda")
    assert [len(s.piece.nodes) for s in plan.steps] == [2, 1], plan.describe()
    x, w = (torch.randn(*d, device="cuda").bfloat16() for d in ((4096, 1024), (1024, 16000)))
    rstd, gamma = torch.rand(4096, 1, device="cuda") + 0.5, torch.randn(1, 1024, device="cuda").bfloat16()
    out = torch.full((4096, 16000), float("nan"), device="cuda", dtype=torch.bfloat16)
    plan.execute({t["x"]: x, t["rstd"]: rstd, t["gamma"]: gamma, t["w"]: w, t["y"]: out})
    a = ((x.double() * rstd.double()) * gamma.double()).bfloat16().double()
    torch.testing.assert_close(out.double(), a @ w.double(), rtol=2e-2, atol=2e-1)


def test_the_ways_of_cutting_are_weighed_in_one_engines_model(monkeypatch):
    """With cuBLAS (the library engine) leading on the lone LM head, the split is still weighed in the fused
    piece's engine: the generated kernel's estimates of the norm and of the plain product, not cuBLAS's
    on another scale; the product then runs on the engine that leads on it."""
    from opgraph.build.heuristics import rank_configs
    from opgraph.build.prologue_split import estimate_in, first_estimate

    for name in ("triton", "torch"):
        monkeypatch.setattr(type(get_engine(name)), "available", lambda self, device: Support.yes())
    engines = usable_engines(["triton", "library", "torch"], H200)
    graph = normed_product(8192, 1024, 32000)[0].final
    pieces, cuts = partition(graph, engines, H200)
    split, _ = split_prologues(pieces, cuts, engines, H200, [HeurMode.A])
    assert [[n.name for n in p.nodes] for p in split] == [["scale", "gamma"], ["head"]]
    head = split[1]
    assert first_estimate(head, engines, H200, [HeurMode.A])[1] == "library"
    assert rank_configs(head, engines, H200, [HeurMode.A]).configs[0].engine == "library"
    generated = estimate_in(head, engines, H200, [HeurMode.A], "triton")
    assert generated is not None and generated != first_estimate(head, engines, H200, [HeurMode.A])[0]
