"""Neighbouring pieces whose matmuls multiply one A merged into one piece where the estimates say so
(opgraph/build/sibling_merge.py): a Llama block's SwiGLU and its key and value projections on an H200;
the CPU and fallback builds left alone."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph import DataType as DT
from opgraph.build.partition import partition
from opgraph.build.planner import usable_engines
from opgraph.build.sibling_merge import merge_siblings, refine
from opgraph.core.config import HeurMode, Support
from opgraph.core.device import CPU
from opgraph.engines import get_engine

from .fakes import H200


@pytest.fixture
def triton_on_h200(monkeypatch):
    monkeypatch.setattr(type(get_engine("triton")), "available", lambda self, device: Support.yes())
    return usable_engines(["triton"], H200)


def _weight(g, k, n, name):
    return g.tensor(dim=[1, k, n], stride=[k * n, 1, k], name=name)  # an nn.Linear weight [N, K], transposed


def llama_mlp():
    """x -> SiLU(x @ Wg) * (x @ Wu) -> @ Wd, batch 8 x 1024 tokens, d 1024, hidden 2816, bf16."""
    g = og.Graph("mlp", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[8, 1024, 1024], name="x")
    act = g.swish(g.matmul(x, _weight(g, 1024, 2816, "w_gate"), name="gate"), name="silu")
    y = g.mul(act, g.matmul(x, _weight(g, 1024, 2816, "w_up"), name="up"), name="y")
    g.matmul(y, _weight(g, 2816, 1024, "w_down"), name="down").set_output(True)
    return g


def projections():
    """q, k and v of one activation (16 query and 4 key-value heads of 64): k and v are one shape."""
    g = og.Graph("qkv", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[8, 1024, 1024], name="x")
    for name, n in (("q", 1024), ("k", 256), ("v", 256)):
        g.matmul(x, _weight(g, 1024, n, f"w_{name}"), name=name).set_output(True)
    return g


def test_swiglu_is_one_piece(triton_on_h200):
    pieces, cuts = partition(llama_mlp().final, triton_on_h200, H200)
    assert [[n.name for n in p.nodes] for p in pieces] == [["gate", "silu"], ["up", "y"], ["down"]]
    merged, kept = merge_siblings(pieces, cuts, triton_on_h200, H200, [HeurMode.A])
    assert [[n.name for n in p.nodes] for p in merged] == [["gate", "silu", "up", "y"], ["down"]]
    assert [p.index for p in merged] == [0, 1]
    assert [(c.before, c.node.name) for c in kept] == [(0, "down")]


def test_key_and_value_projections_merge_and_the_query_stays(triton_on_h200):
    pieces, cuts = partition(projections().final, triton_on_h200, H200)
    merged, _ = refine(pieces, cuts, triton_on_h200, H200, [HeurMode.A])
    assert [[n.name for n in p.nodes] for p in merged] == [["q"], ["k", "v"]]


def test_the_cpu_and_fallback_builds_are_left_alone(triton_on_h200):
    pieces, cuts = partition(llama_mlp().final, triton_on_h200, H200)
    assert merge_siblings(pieces, cuts, triton_on_h200, CPU, [HeurMode.A]) == (pieces, cuts)
    assert merge_siblings(pieces, cuts, triton_on_h200, H200, [HeurMode.FALLBACK]) == (pieces, cuts)


def test_a_dynamic_plans_bucket_merges_them_too(triton_on_h200):
    """The SwiGLU of a graph planned for a bucket (batch 1-16, sequence 1-2048; its `origin` set) merges as
    a static one does (the estimates the hint's), and the merged kernel takes its sizes at run time."""
    from opgraph.build.buckets import choose
    from opgraph.core.device import Device
    from opgraph.engines.triton.templates.matmul import TEMPLATE

    batch, seq = og.Dim("batch", 1, 16), og.Dim("seq", 1, 2048)
    g = og.Graph("mlp", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[batch, seq, 1024], name="x")
    act = g.swish(g.matmul(x, _weight(g, 1024, 2816, "w_gate"), name="gate"), name="silu")
    g.mul(act, g.matmul(x, _weight(g, 1024, 2816, "w_up"), name="up"), name="y").set_output(True)
    final = g.final
    (bucket,) = choose(final, "one").buckets
    hint = final.in_bucket(bucket.hint_map, bucket)
    pieces, cuts = partition(hint, triton_on_h200, H200)
    merged, _ = merge_siblings(pieces, cuts, triton_on_h200, H200, [HeurMode.A])
    assert [[n.name for n in p.nodes] for p in merged] == [["gate", "silu", "up", "y"]]
    cpu = Device("cpu", 0, "cpu", (0, 0), 1)  # (generated for the interpreter: the sized source)
    match = TEMPLATE.matched(merged[0], cpu)
    assert match.generate(match.candidates()[0]).sized


def test_products_alike_only_at_the_hint_stay_apart(triton_on_h200):
    """Key and value projections whose widths are two dynamic dims (64-512 each, equal at the hint): merged,
    no kernel would serve the bucket's shapes where they differ, so they stay apart in a bucket."""
    from opgraph.build.buckets import choose

    tokens = og.Dim("tokens", 1024, 8192)
    n1, n2 = og.Dim("n1", 64, 512), og.Dim("n2", 64, 512)
    g = og.Graph("kv", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[tokens, 1024], name="x")
    for name, n in (("k", n1), ("v", n2)):
        g.matmul(x, g.tensor(dim=[1024, n], name=f"w_{name}"), name=name).set_output(True)
    final = g.final
    (bucket,) = choose(final, "one").buckets
    hint = final.in_bucket(bucket.hint_map, bucket)
    assert bucket.hint_map["n1"] == bucket.hint_map["n2"]
    pieces, cuts = partition(hint, triton_on_h200, H200)
    merged, _ = merge_siblings(pieces, cuts, triton_on_h200, H200, [HeurMode.A])
    assert [[n.name for n in p.nodes] for p in merged] == [["k"], ["v"]]


def test_products_led_by_different_engines_stay_apart(monkeypatch):
    """One engine's cost model weighs both ways or none: with the library engine leading on the lone query
    projection (cuBLAS) and the generated kernel on the key, the two stay apart whatever the merged piece's
    estimate; the key and value, both the generated kernel's, still merge."""
    for name in ("triton", "torch"):
        monkeypatch.setattr(type(get_engine(name)), "available", lambda self, device: Support.yes())
    engines = usable_engines(["triton", "library", "torch"], H200)
    g = og.Graph("qk", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[8, 1024, 1024], name="x")
    g.matmul(x, _weight(g, 1024, 1024, "w_q"), name="q").set_output(True)
    g.relu(g.matmul(x, _weight(g, 1024, 1024, "w_k"), name="k"), name="k_relu").set_output(True)
    pieces, cuts = partition(g.final, engines, H200)
    assert [[n.name for n in p.nodes] for p in pieces] == [["q"], ["k", "k_relu"]]
    merged, _ = merge_siblings(pieces, cuts, engines, H200, [HeurMode.A])
    assert [[n.name for n in p.nodes] for p in merged] == [["q"], ["k", "k_relu"]]
    pieces, cuts = partition(projections().final, engines, H200)
    merged, _ = refine(pieces, cuts, engines, H200, [HeurMode.A])
    assert [[n.name for n in p.nodes] for p in merged] == [["q"], ["k", "v"]]
