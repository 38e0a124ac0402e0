"""The scan template (templates/scan.py: cumsum) against the reference engine under Triton's
interpreter: forward and reverse scans along the first, a middle and the last axis (strided rows and
columns), axes longer than a chunk (the carry), float, integer and bool inputs, a fused prologue and
epilogue (RoBERTa's position ids) and views read in place; every candidate of the GPU and CPU
heuristics. Marked gpu: long axes at the sizes of a language model's batch."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.build.planner import Step
from opgraph.core.config import EngineConfig
from opgraph.core.device import Device
from opgraph.core.errors import AttributeValueError
from opgraph.engines import get_engine
from opgraph.engines.triton.knobs import ScanKnobs
from opgraph.engines.triton.templates import scan
from opgraph.runtime.plan import ExecutionPlan
from opgraph.testing import check_plan

from ..helpers import assert_engine_matches, requires_cuda, requires_interpreter
from .hopper_compile import compile_for_hopper

DT = og.DataType
H100 = Device("cuda", 0, "H100", (9, 0), 132)
CPU = Device("cpu")


def every_candidate(g, rng, **kw):
    """Run g's single scan piece with every candidate of the GPU and CPU heuristics."""
    plan = g.build(device="cpu", engines=["triton"])
    assert [s.config.knob("template") for s in plan.steps] == ["scan"], plan.describe()
    piece = plan.steps[0].piece
    seen = []
    for device in (H100, CPU):
        for k in scan.TEMPLATE.candidates(piece, device):
            if k in seen:
                continue
            seen.append(k)
            cfg = EngineConfig("triton", (("template", "scan"), *sorted(k.items())))
            kernel = get_engine("triton").compile(piece, cfg, plan.device)
            one = ExecutionPlan(plan.graph, plan.device, (Step(0, piece, cfg, kernel),), ())
            bad = check_plan(one, rng, **kw)
            assert not bad, f"{k}: " + "\n".join(map(str, bad))
    return seen


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("dims,axis", [([3, 37], 1), ([37, 3], 0), ([2, 21, 3], 1), ([5, 1], 1)])
@requires_interpreter
def test_cumsum_float(dims, axis, reverse, rng):
    """fp32 along the last, first and a middle axis, lengths that no chunk divides (37 in chunks of 16
    and 4: the carry crosses chunks), and a length-1 axis."""
    g = og.Graph("scan", io_data_type=DT.FLOAT)
    x = g.tensor(dim=dims, name="x")
    g.cumsum(x, axis, reverse=reverse, name="cumsum").set_output(True)
    seen = every_candidate(g, rng)
    assert any(-(-dims[axis] // k["BLOCK"]) > 1 for k in seen) or dims[axis] == 1


@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16, DT.INT32, DT.BOOLEAN], ids=lambda d: d.name)
@requires_interpreter
def test_cumsum_input_types(dt, rng):
    """16-bit floats sum in fp32 and round once; integer and bool inputs count exactly (in fp64) into
    an INT64 output (a float output for the 16-bit types)."""
    g = og.Graph("scan", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[4, 19], data_type=dt, name="x")
    y = g.cumsum(x, 1, name="cumsum").set_output(True)
    if dt in (DT.INT32, DT.BOOLEAN):
        y.set_data_type(DT.INT64)
    else:
        y.set_data_type(dt)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert plan.steps[0].config.knob("template") == "scan"


@requires_interpreter
def test_roberta_position_ids_are_one_kernel(rng):
    """position ids = cumsum(ids != pad) * (ids != pad) + pad: the comparison and cast before the scan
    and the product and sum after it in one kernel."""
    pad = 1
    g = og.Graph("pos", io_data_type=DT.INT64)
    ids = g.tensor(dim=[2, 11], name="ids")
    ne = g.cmp_neq(ids, pad, name="ne").set_data_type(DT.BOOLEAN)
    mask = g.identity(ne, name="mask").set_data_type(DT.INT32)
    count = g.cumsum(mask, 1, name="cumsum").set_data_type(DT.INT64)
    g.add(g.mul(count, mask, name="keep"), pad, name="shift").set_output(True).set_name("positions")

    def prepare(pack):
        pack[ids.uid][...] = rng.integers(0, 3, size=(2, 11))

    plan = assert_engine_matches(g, rng, expect_steps=1, prepare=prepare)
    assert plan.steps[0].piece.kinds.count("cumsum") == 1
    every_candidate(g, rng, prepare=prepare)


@requires_interpreter
def test_cumsum_of_a_transposed_slice(rng):
    """The scanned tensor a slice of a transposed tensor in memory, read in place (no copy step)."""
    g = og.Graph("scan", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[9, 4], name="x")
    view = g.slice(g.transpose(x, [1, 0]), [slice(1, 4), slice(2, 9)])
    g.cumsum(view, 1, reverse=True, name="cumsum").set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert plan.steps[0].piece.kinds == ("transpose", "slice", "cumsum")


@requires_interpreter
def test_two_scans_are_two_kernels(rng):
    """One scan a kernel: the template says so where a piece would hold two, and the plan runs two."""
    g = og.Graph("scan", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[3, 6], name="x")
    g.cumsum(g.cumsum(x, 1, name="first"), 0, name="second").set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=2)
    assert any("one cumsum op per kernel" in why for c in plan.cuts for _, why in c.reasons), plan.describe()


def test_scan_knobs_are_checked():
    with pytest.raises(AttributeValueError, match="BLOCK=12 must be a power of two"):
        ScanKnobs(ROWS=2, BLOCK=12)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dims,dt", [([64, 4096], DT.BFLOAT16), ([4, 100_000], DT.FLOAT), ([8, 2048], DT.BOOLEAN)])
def test_gpu_cumsum(dims, dt, rng):
    """On the GPU: a mask's counts over a batch of sequences, and an axis of 100000 in chunks of 1024."""
    g = og.Graph("scan", io_data_type=DT.FLOAT)
    x = g.tensor(dim=dims, data_type=dt, name="x")
    y = g.cumsum(x, 1, name="cumsum").set_output(True)
    y.set_data_type(DT.INT64 if dt is DT.BOOLEAN else DT.FLOAT)
    plan = assert_engine_matches(g, rng, device="cuda", expect_steps=1, rtol=1e-4, atol=1e-3)
    assert plan.steps[0].config.knob("template") == "scan"


def _scan_graph(dims, dt, out):
    def build():
        g = og.Graph("scan", io_data_type=DT.FLOAT)
        g.cumsum(g.tensor(dim=dims, data_type=dt, name="x"), 1).set_output(True).set_data_type(out)
        return g

    return build


HOPPER_CASES = {  # name: (graph, template, knobs: see hopper_compile.compile_cases)
    "cumsum_bf16": (_scan_graph([64, 4096], DT.BFLOAT16, DT.BFLOAT16), "scan", 2),
    "cumsum_mask_int64": (_scan_graph([8, 2048], DT.BOOLEAN, DT.INT64), "scan", 2),
}


def test_kernels_compile_for_hopper():
    """The heuristic's kernels compile for sm_90 (Triton's NVIDIA backend, ptxas) without spilling."""
    lines = [line for line in compile_for_hopper(__name__).splitlines() if line.startswith("compiled")]
    assert {line.split()[1] for line in lines} == set(HOPPER_CASES)
    for line in lines:
        assert int(line.split()[6]) == 0, line
