"""conv_wgrad's MERGE_TAPS configs (the tile's rows over several filter taps and the channels together,
for wgrads of few channels per group: a stem) against the reference engine: geometries, layouts, tap
groups, split-K, types, an optimizer epilogue; which pieces get the configs and the typed errors; the
stem's kernels compiled for Hopper. Under the interpreter on the CPU with tiny shapes; marked gpu, on
CUDA at a stem's size."""

from __future__ import annotations

import math

import pytest

import opgraph as og
from opgraph.build.planner import Step
from opgraph.core.config import EngineConfig
from opgraph.core.piece import make_piece
from opgraph.engines import get_engine
from opgraph.engines.triton.templates._wgrad_merge import MAX_LANES
from opgraph.engines.triton.templates.conv_fprop import MERGE
from opgraph.engines.triton.templates.conv_wgrad import TEMPLATE
from opgraph.runtime.plan import ExecutionPlan

from ..helpers import candidate_configs, layout_stride, plan_with, requires_cuda, step_plan
from .hopper_compile import compile_for_hopper
from .test_triton_conv_bwd import sbr_wgrad, wgrad_graph
from .test_triton_conv_merge import CASES as FPROP_CASES
from .test_triton_conv_merge import H100

pytestmark = pytest.mark.interpreter
DT = og.DataType

CASES = {  # x dims, w dims, conv attributes: conv_fprop's merged geometries, and two of the wgrad's own
    **FPROP_CASES,
    "stride_dilation_padding_1d": ((2, 3, 17), (8, 3, 5), dict(padding=[3], stride=[2], dilation=[2])),
    "one_tap_rows": ((2, 3, 6, 6), (8, 3, 3, 1), dict(padding=[1, 0])),  # the last axis has one tap
}


def _graph(case, layout="nhwc", dt=DT.HALF):
    xd, wd, attrs = CASES[case]
    g, _, _, dw = wgrad_graph(xd, wd, dt=dt, layout=layout, **attrs)
    dw.set_output(True)
    return g


def _knobs(case, taps=None, **more):
    """MERGE_TAPS over `taps` taps (default: a filter row, or every tap where the row has one), the
    rows one tile of their lanes."""
    _, wd, _ = CASES[case]
    taps = taps or (wd[-1] if wd[-1] > 1 else math.prod(wd[2:]))
    lanes = taps * wd[1]
    return {
        "template": "conv_wgrad",
        MERGE: 1,
        "TAPS": taps,
        "BLOCK_M": max(16, 1 << (lanes - 1).bit_length()),
        "BLOCK_N": 16,
        "BLOCK_K": 16,
        "SPLIT_K": 1,
        **more,
    }


def _check(plan, rng, **tolerance):
    assert "lw = " in plan.source(0) and "ml = " in plan.source(0), "not the merged main loop"
    bad = og.testing.check_plan(plan, rng, **tolerance)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_geometry(case, layout, rng):
    _check(plan_with(_graph(case, layout), _knobs(case)), rng)


@pytest.mark.parametrize("case", ["stem_stride2", "dilated_flipped_asymmetric", "3d", "groups"])
@pytest.mark.parametrize("split", [1, 3])
def test_every_tap_in_one_tile(case, split, rng):
    """TAPS = every tap of the filter (one tap group: the rows of a tile are the whole filter), split or not."""
    _, wd, _ = CASES[case]
    _check(plan_with(_graph(case), _knobs(case, taps=math.prod(wd[2:]), SPLIT_K=split)), rng)


@pytest.mark.parametrize("case", ["stem_stride2", "groups"])
def test_one_tap_a_program(case, rng):
    """TAPS=1: the lanes are the channels of one tap (the program's tap is the output space's `bb`); a
    config without TAPS means the same."""
    _check(plan_with(_graph(case), _knobs(case, taps=1, BLOCK_M=16)), rng)
    knobs = _knobs(case, BLOCK_M=16)
    del knobs["TAPS"]
    _check(plan_with(_graph(case), knobs), rng)


@pytest.mark.parametrize("split", [1, 3])
def test_groups_with_a_filter_row_a_program(split, rng):
    """Two groups of 3 channels, TAPS = a filter row: the partials at (tap * groups + group, channel)."""
    _check(plan_with(_graph("groups"), _knobs("groups", SPLIT_K=split, BLOCK_N=16)), rng)


@pytest.mark.parametrize("split", [2, 4])
def test_split_k(split, rng):
    _check(plan_with(_graph("stem_stride2"), _knobs("stem_stride2", SPLIT_K=split, BLOCK_N=32)), rng)


@pytest.mark.parametrize("dt", [DT.BFLOAT16, DT.FLOAT], ids=lambda d: d.name)
def test_dtypes(dt, rng):
    _check(plan_with(_graph("stem_stride2", dt=dt), _knobs("stem_stride2", SPLIT_K=2)), rng)


def test_exact_on_small_integers(rng):
    """Every (lane, pixel) product lands once, at its own tap and channel: exact sums on small integers."""
    for taps in (7, 49):
        plan = plan_with(_graph("stem_stride2"), _knobs("stem_stride2", taps=taps, SPLIT_K=2))
        _check(plan, rng, integers=True, low=-2, high=2, rtol=0, atol=0)


def _sgd_stem(dt=DT.HALF):
    """W_new = W - lr * DW on a 3-channel wgrad: the optimizer step in the combine launch's epilogue."""
    xd, wd, attrs = CASES["stem_stride2"]
    g, _, _, dw = wgrad_graph(xd, wd, dt=dt, **attrs)
    w = g.tensor(dim=list(wd), stride=layout_stride(wd, "nhwc"), name="W")
    lr = g.tensor(dim=[1], data_type=DT.FLOAT, name="lr")
    g.sub(w, g.mul(dw, lr), name="sgd").set_output(True).set_name("W_new")
    return g


def test_optimizer_epilogue_and_plan_round_trip(rng, tmp_path):
    """The SGD step fused after the merged partials (one step, a main and a combine launch); a saved plan
    loads and runs the same kernels."""
    plan, step, configs = candidate_configs(_sgd_stem())
    merged = [c for c in configs if dict(c.knobs).get(MERGE)]
    assert len(plan.steps) == 1 and step.piece.nodes[0].kind == "conv_wgrad" and len(merged) == 2
    assert {dict(c.knobs)["TAPS"] for c in merged} == {7, 49} and all(dict(c.knobs)["SPLIT_K"] > 1 for c in merged)
    plan = step_plan(plan, step, merged[0])
    _check(plan, rng)
    path = tmp_path / "plan.json"
    plan.save(path)
    _check(og.load_plan(path), rng)


def test_typed_errors_for_configs_that_cannot_run():
    g, b = sbr_wgrad(c=3, r=3)
    with pytest.raises(og.AttributeValueError, match="no prologue on the image") as err:
        plan_with(g, {MERGE: 1, "TAPS": 3, "BLOCK_M": 16, "SPLIT_K": 1})
    assert err.value.rule == "triton.conv_wgrad.merge_taps"
    with pytest.raises(og.AttributeValueError, match="needs BLOCK_M >= TAPS x channels per group = 21"):
        plan_with(_graph("stem_stride2"), _knobs("stem_stride2", BLOCK_M=16))
    with pytest.raises(og.AttributeValueError, match="must divide the filter's 49 taps"):
        plan_with(_graph("stem_stride2"), _knobs("stem_stride2", taps=5))
    depthwise, _, _, dw = wgrad_graph((2, 4, 13), (4, 1, 5), padding=[2])
    dw.set_output(True)
    with pytest.raises(og.AttributeValueError, match="fewer than 8 channels per group"):
        plan_with(depthwise, {MERGE: 1, "TAPS": 1, "BLOCK_M": 16, "SPLIT_K": 1})
    wide, _, _, dw = wgrad_graph((2, 8, 6, 6), (8, 8, 3, 3), padding=[1, 1])
    dw.set_output(True)
    with pytest.raises(og.AttributeValueError, match="fewer than 8 channels per group"):
        plan_with(wide, {MERGE: 1, "TAPS": 3, "BLOCK_M": 32, "SPLIT_K": 1})


def _candidates(xd, wd, device, dt=DT.HALF, **attrs):
    g, _, _, dw = wgrad_graph(xd, wd, dt=dt, **attrs)
    dw.set_output(True)
    return TEMPLATE.candidates(make_piece(g.final, 0, g.final.nodes), device)


def test_candidates_on_the_gpu_for_few_channels_only():
    """A stem's merged configs (a filter row and every tap, 32 and 256 lanes) come after the heuristic's
    first config, not before it, until a GPU has timed them; none where the channels are 8 or more, the
    operands are integers, or the image has a prologue fused (with the prologue's pass first, the plain
    wgrad's configs); on the CPU before the broadest config."""
    stem = _candidates((32, 3, 224, 224), (64, 3, 7, 7), H100, padding=[3, 3], stride=[2, 2])
    merged = [c for c in stem if c.get(MERGE)]
    assert not stem[0].get(MERGE) and merged == stem[1 : 1 + len(merged)]
    assert {(c["TAPS"], c["BLOCK_M"]) for c in merged} == {(7, 32), (49, 256)}
    assert all(c["TAPS"] * 3 <= c["BLOCK_M"] <= MAX_LANES and c["SPLIT_K"] >= 8 for c in merged)
    narrow = [
        c for c in _candidates((32, 3, 224, 224), (32, 3, 3, 3), H100, padding=[1, 1], stride=[2, 2]) if c.get(MERGE)
    ]  # MobileNetV2's stem: 32 filters
    assert {(c["TAPS"], c["BLOCK_M"], c["BLOCK_N"]) for c in narrow} == {(3, 16, 32), (9, 32, 32)}
    assert not any(c.get(MERGE) for c in _candidates((8, 8, 14, 14), (32, 8, 3, 3), H100, padding=[1, 1]))
    assert not any(c.get(MERGE) for c in _candidates((8, 3, 14, 14), (32, 3, 3, 3), H100, dt=DT.INT8, padding=[1, 1]))
    g, _ = sbr_wgrad(c=3, r=3)  # merged only behind the prologue's own pass (the plain wgrad's configs)
    piece = make_piece(g.final, 0, g.final.nodes)
    assert not TEMPLATE.match(piece, H100).ok  # (3 channels with neighbours fused: left to a library on the GPU)
    match = TEMPLATE.match_class(TEMPLATE, TEMPLATE.analyze(piece)[0], H100)  # (past that verdict)
    sbr = [c for c in match.candidates() if c.merged]
    assert sbr and all(c.prologue_pass for c in sbr)
    cpu = _candidates((2, 3, 11, 12), (16, 3, 7, 7), og.core.device.CPU, padding=[3, 3], stride=[2, 2])
    assert [c.get(MERGE, 0) for c in cpu][-3:] == [1, 1, 0] and not cpu[0].get(MERGE)


# -- Hopper: the stem's merged kernels compiled (no GPU needed) --------------------------------------------------


def _stem(dt, n=32):
    def build():
        g, _, _, dw = wgrad_graph((n, 3, 224, 224), (64, 3, 7, 7), dt=dt, padding=[3, 3], stride=[2, 2])
        dw.set_output(True)
        return g

    return build


def _merged(candidates):
    return [c for c in candidates if c.get(MERGE)]


HOPPER_CASES = {  # (graph, template, candidates compiled)
    "stem_wgrad_fp16": (_stem(DT.HALF), "conv_wgrad", _merged),
    "stem_wgrad_bf16": (_stem(DT.BFLOAT16), "conv_wgrad", _merged),
}


def test_stem_kernels_compile_for_hopper_without_spills():
    """The stem wgrad's MERGE_TAPS candidates (and their combine launches) compiled for sm_90: no spills,
    registers and shared memory within an SM's."""
    import re

    out = compile_for_hopper(__name__, gpu=H100.name, timeout=900)
    lines = [line for line in out.splitlines() if line.startswith("compiled")]
    assert {line.split()[1] for line in lines} == set(HOPPER_CASES), out
    assert sum(MERGE in line and " kernel " in line for line in lines) >= 4, out
    for line in lines:
        regs, spills, smem = map(int, re.search(r"regs (\d+) spills (\d+) smem (\d+)", line).groups())
        assert spills == 0 and smem <= 227 * 1024 and regs <= 255, line


# -- GPU --------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
def test_gpu_stem_wgrad_merged(dt, rng):
    """A stem's wgrad (7x7/2, C3 -> K64, 224², N8) with each MERGE_TAPS candidate compiled for this GPU,
    against the reference engine."""
    from opgraph.core.device import resolve_device

    g = _stem(dt, n=8)()
    cpu = g.build(device="cpu", engines=["triton"])
    (step,) = cpu.steps
    dev = resolve_device("cuda")
    merged = _merged(TEMPLATE.candidates(step.piece, dev))
    assert merged
    for knobs in merged:
        config = EngineConfig("triton", (("template", TEMPLATE.name), *sorted(knobs.items())))
        kernel = get_engine("triton").compile(step.piece, config, dev)
        plan = ExecutionPlan(cpu.graph, dev, (Step(0, step.piece, config, kernel),), cpu.cuts)
        bad = og.testing.check_plan(plan, rng, rtol=2e-2, atol=2e-2)
        assert not bad, f"{knobs}: " + "\n".join(map(str, bad))
