"""Launches that overlap their predecessor's end (programmatic dependent launch, Hopper and newer):
rewrite.overlapped puts the wait for the previous kernel and the signal to the next at the top of every
launched Triton kernel, bound.overlap_mode decides where, native.py launches with the attribute.
On the CPU: the rewrite, the launch structures' C layout, the kernels compiled for sm_90a (the wait before
any global access); on the GPU: plans of chained kernels against the reference, executed and in a graph."""

from __future__ import annotations

import ast
import ctypes

import pytest

import opgraph as og
from opgraph.core.device import Device
from opgraph.engines.triton import native
from opgraph.engines.triton.bound import overlap_mode
from opgraph.engines.triton.rewrite import OVERLAP, overlapped
from opgraph.engines.triton.templates.base import Generated, Launch

from ..helpers import assert_engine_matches, requires_cuda

DT = og.DataType
H200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)

_SOURCE = '''import triton
import triton.language as tl


@triton.jit
def _og_helper(x):
    return x + 1


def kernel(p1, p2, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(p2 + offs, _og_helper(tl.load(p1 + offs, mask=offs < n)), mask=offs < n)


def kernel_combine(p2, n):
    """A second launch, with a docstring."""
    if n > 0:
        tl.store(p2, 0.0)
'''


def _generated(source: str = _SOURCE) -> Generated:
    return Generated(source, (Launch("kernel", (4,), ()), Launch("kernel_combine", (1,), ())))


def test_every_launched_kernel_waits_first_and_helpers_do_not():
    out = overlapped(_generated())
    assert OVERLAP in out.notes
    functions = {f.name: f for f in ast.parse(out.source).body if isinstance(f, ast.FunctionDef)}
    for name in ("kernel", "kernel_combine"):
        body = [ast.unparse(s) for s in functions[name].body]
        start = 1 if name == "kernel_combine" else 0  # (after the docstring)
        assert body[start : start + 2] == ["tl.extra.cuda.gdc_wait()", "tl.extra.cuda.gdc_launch_dependents()"]
        assert sum("gdc_wait" in b for b in body) == 1
    assert "gdc" not in ast.unparse(functions["_og_helper"])


def test_the_overlap_is_undone_for_plan_files():
    """A plan file's source hash is taken without the waits (rewrite.without_overlap)."""
    from opgraph.engines.triton.rewrite import without_overlap

    g = _generated()
    assert without_overlap(overlapped(g).source) == g.source
    gluon = _generated(_SOURCE + "_OG_GLUON = True\n")
    assert without_overlap(overlapped(gluon, gluon=True).source) == gluon.source


def test_a_statement_after_other_text_is_refused_rather_than_misplaced():
    one_line = Generated("def kernel(p1):\n    x = 1; tl.store(p1, x)\n", (Launch("kernel", (1,), ()),))
    assert overlapped(one_line).source.split("\n")[1] == "    tl.extra.cuda.gdc_wait()"
    with pytest.raises(AssertionError, match="its own line"):
        overlapped(Generated("def kernel(p1): tl.store(p1, 1)\n", (Launch("kernel", (1,), ()),)))
    tabs = overlapped(Generated("def kernel(p1):\n\ttl.store(p1, 1)\n", (Launch("kernel", (1,), ()),)))
    assert tabs.source.split("\n")[1] == "\ttl.extra.cuda.gdc_wait()"


def test_a_kernel_launched_twice_waits_once():
    g = _generated()
    twice = Generated(g.source, (g.launches[0], g.launches[0]))
    assert overlapped(twice).source.count("gdc_wait") == 1


def test_a_gluon_module_waits_in_tritons_language_and_a_module_without_launches_is_left_alone():
    plain = _generated(_SOURCE + "_OG_GLUON = True\n")
    assert overlapped(plain) is plain  # (bound.overlap_mode "all" only: not yet run overlapped on a GPU)
    gluon = overlapped(plain, gluon=True)
    assert gluon.source.count("_og_tl.extra.cuda.gdc_wait()") == 2
    empty = Generated(_SOURCE, ())
    assert overlapped(empty) is empty


def test_only_hopper_and_newer_overlap(monkeypatch):
    monkeypatch.delenv("OPGRAPH_LAUNCH_OVERLAP", raising=False)
    assert overlap_mode(H200) == "triton"
    assert overlap_mode(Device("cuda", 0, "A100", (8, 0), 108)) == "off"
    assert overlap_mode(Device("cpu")) == "off"
    monkeypatch.setenv("OPGRAPH_LAUNCH_OVERLAP", "0")
    assert overlap_mode(H200) == "off"
    monkeypatch.setenv("OPGRAPH_LAUNCH_OVERLAP", "all")
    assert overlap_mode(H200) == "all"


def test_the_launch_config_has_the_drivers_layout():
    """CUlaunchAttribute is 72 bytes (an id, padding, a 64-byte union); CUlaunchConfig 56 (cuda.h)."""
    assert ctypes.sizeof(native.LaunchAttribute) == 72 and native.LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(native.LaunchConfig) == 56
    assert (native.LaunchConfig.hStream.offset, native.LaunchConfig.attrs.offset) == (32, 40)
    config = native.overlapping_config((3, 2, 1), 8, 4096)
    assert (config.gridDimX, config.gridDimY, config.blockDimX, config.sharedMemBytes) == (3, 2, 256, 4096)
    attribute = config.attrs[0]
    assert (attribute.id, attribute.value, config.numAttrs) == (6, 1, 1)


def test_the_cpu_engine_generates_no_waits(rng):
    """The interpreter's kernels are the templates' own (the rewrite is for CUDA devices of 9.0 and newer)."""
    g = og.Graph("chain", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[64, 32], name="x")
    g.exp(g.matmul(x, g.tensor(dim=[32, 16], name="w"))).set_output(True)
    plan = assert_engine_matches(g, rng)
    assert all("gdc_wait" not in plan.source(i) for i in range(len(plan.steps)))


def _chain() -> og.Graph:
    """A matmul with its epilogue, a row reduction (two launches), a pointwise step reading both: each
    kernel reads what the one before it wrote."""
    g = og.Graph("chain", io_data_type=DT.BFLOAT16, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[1, 512, 256], name="x")
    y = g.matmul(x, g.tensor(dim=[1, 256, 384], name="w"), name="proj")
    y = g.add(y, g.tensor(dim=[1, 1, 384], name="bias"))
    s = g.reduction(g.mul(y, y), mode="add").set_dim([1, 512, 1])
    g.mul(y, g.rsqrt(g.add(s, 1e-5))).set_output(True)
    return g


HOPPER_CASES = {
    "pointwise": (lambda: _one(lambda g, x: g.exp(x)), "pointwise", None),
    "matmul": (lambda: _product(), "matmul", 2),  # the persistent TMA kernel and the WS=1 one (Gluon's)
}


def _one(body):
    g = og.Graph("one", io_data_type=DT.BFLOAT16, compute_data_type=DT.FLOAT)
    body(g, g.tensor(dim=[4096, 1024], name="x")).set_output(True)
    return g


def _product():
    g = og.Graph("product", io_data_type=DT.BFLOAT16, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[1, 4096, 1024], name="x")
    g.matmul(x, g.tensor(dim=[1, 1024, 1024], name="w")).set_output(True)
    return g


@pytest.mark.parametrize("mode", ["triton", "all"])
def test_kernels_wait_before_any_global_access_on_hopper(mode, monkeypatch):
    """Compiled for sm_90a: each kernel has the wait, before its first global load, store or copy; Gluon's
    (the WS=1 matmul) only where OPGRAPH_LAUNCH_OVERLAP=all."""
    from .hopper_compile import compile_for_hopper

    monkeypatch.setenv("OPGRAPH_LAUNCH_OVERLAP", "1" if mode == "triton" else "all")
    out = compile_for_hopper(__name__)
    lines = [line.split() for line in out.splitlines() if line.startswith("compiled")]
    assert {w[1] for w in lines} == set(HOPPER_CASES), out
    assert any("'WS': 1" in " ".join(w) for w in lines), out
    for w in lines:
        waits = (w[w.index("gdc.wait") + 1], w[w.index("gdc.first") + 1])
        gluon = "'WS': 1" in " ".join(w)
        assert waits == (("0", "0") if gluon and mode == "triton" else ("1", "1")), w


@requires_cuda
@pytest.mark.gpu
def test_chained_kernels_launched_overlapping_match_the_reference(rng):
    """Executed, then replayed in a CUDA graph (programmatic edges), against the reference."""
    import numpy as np
    import torch

    from opgraph.core.torch_interop import pack_to_device, torch_to_numpy
    from opgraph.testing import random_pack, reference_outputs

    plan = _chain().build(device="cuda", engines=["triton"])
    assert all("gdc_wait" in plan.source(i) for i in range(len(plan.steps))), plan.describe()
    f = plan.graph
    pack = random_pack(f, rng)
    want = reference_outputs(f, pack)
    dev = pack_to_device(pack, "cuda:0")
    for u in f.outputs:
        dev[u].fill_(float("nan"))
    plan.execute(dev)
    torch.cuda.synchronize()
    (u,) = f.outputs
    w = np.asarray(want[u], dtype=np.float64)
    got = np.asarray(torch_to_numpy(dev[u]), dtype=np.float64)
    assert np.linalg.norm(got - w) / np.linalg.norm(w) < 1e-2
    graph = plan.populate_cuda_graph(dev)
    for _ in range(3):
        dev[u].fill_(float("nan"))
        graph.replay()
    torch.cuda.synchronize()
    again = np.asarray(torch_to_numpy(dev[u]), dtype=np.float64)
    assert np.array_equal(again, got)
