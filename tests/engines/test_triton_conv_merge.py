"""conv_fprop's MERGE_TAPS configs (the K lanes over a filter row's taps and the channels together, for
convs of few channels per group: a stem) against the reference engine: geometries, layouts, split-K,
prologues and epilogues, types; which pieces get the configs; the stem's kernels compiled for Hopper.
Under the interpreter on the CPU with tiny shapes; marked gpu, on CUDA at the benchmark's stem size."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.build.planner import Step
from opgraph.core.config import EngineConfig
from opgraph.core.device import Device
from opgraph.core.piece import make_piece
from opgraph.engines import get_engine
from opgraph.engines.triton.knobs import TileKnobs
from opgraph.engines.triton.templates.conv_fprop import MERGE, TEMPLATE
from opgraph.runtime.plan import ExecutionPlan

from ..helpers import layout_stride, plan_with, requires_cuda
from .hopper_compile import compile_for_hopper
from .test_triton_conv import conv_graph

pytestmark = pytest.mark.interpreter
DT = og.DataType
H100 = Device("cuda", 0, "NVIDIA H100 80GB HBM3", (9, 0), 132)

CASES = {  # x dims, w dims, conv attributes
    "stem_stride2": ((2, 3, 11, 12), (16, 3, 7, 7), dict(padding=[3, 3], stride=[2, 2])),
    "dilated_flipped_asymmetric": (
        (1, 2, 9, 10),
        (8, 2, 3, 5),
        dict(pre_padding=[1, 0], post_padding=[0, 3], dilation=[1, 2], convolution_mode="convolution"),
    ),
    "1d": ((2, 3, 13), (8, 3, 5), dict(padding=[2])),
    "3d": ((1, 2, 4, 5, 6), (8, 2, 3, 2, 3), dict(padding=[1, 1, 1], stride=[1, 2, 1])),
    "groups": ((2, 6, 7, 7), (16, 3, 3, 3), dict(padding=[1, 1])),
    "lanes_over_one_block": ((1, 5, 6, 18), (8, 5, 1, 15), dict(padding=[0, 2])),  # 75 lanes: 2 blocks of 64
    "one_channel_no_padding": ((2, 1, 6, 9), (8, 1, 2, 4), dict(padding=[0, 0])),
    "narrow_image": ((1, 3, 5, 2), (8, 3, 3, 3), dict(padding=[1, 2])),  # padding wider than the image
    "no_selects": ((2, 2, 10, 8), (8, 2, 3, 8), dict(padding=[0, 0])),  # 16 lanes, M = 16: nothing to mask
    "padding_beyond_width": ((1, 2, 5, 2), (8, 2, 3, 7), dict(padding=[1, 3])),  # columns from -3: wrapped by 4
    "patches": ((2, 3, 8, 12), (8, 3, 4, 4), dict(padding=[0, 0], stride=[4, 4])),  # a ViT's patch embedding
}


def _graph(case, layout="nhwc", dt=DT.HALF, prologue=False, epilogue=False):
    xd, wd, attrs = CASES[case]
    g = og.Graph(case, io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=list(xd), stride=layout_stride(xd, layout), name="x")
    w = g.tensor(dim=list(wd), stride=layout_stride(wd, layout), name="w")
    y = g.conv_fprop(g.relu(g.add(x, 0.5)) if prologue else x, w, name="conv", **attrs)
    if epilogue:
        k = [1, wd[0]] + [1] * (len(xd) - 2)
        y = g.relu(g.bias(y, g.tensor(dim=k, stride=layout_stride(k, layout), name="b")))
    y.set_output(True)
    return g


def _lanes(case):
    _, wd, _ = CASES[case]
    return wd[-1] * wd[1]


def _check(plan, rng, **tolerance):
    assert "lane = " in plan.source(0), "not the MERGE_TAPS main loop"
    bad = og.testing.check_plan(plan, rng, **tolerance)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_geometry(case, layout, rng):
    bk = 64 if _lanes(case) > 32 else 16
    _check(
        plan_with(
            _graph(case, layout),
            {"template": "conv_fprop", MERGE: 1, "BLOCK_K": bk, "SPLIT_K": 1, "BLOCK_M": 32, "BLOCK_N": 16},
        ),
        rng,
    )


def test_lanes_follow_the_image_layout():
    """NCHW lanes run (c, s) with s fastest (a lane row reads a filter row's columns, contiguous), NHWC
    lanes (s, c) with c fastest."""
    knobs = {"template": "conv_fprop", MERGE: 1, "BLOCK_K": 16, "SPLIT_K": 1, "BLOCK_M": 16, "BLOCK_N": 16}
    nchw, nhwc = (plan_with(_graph("patches", layout), knobs).source(0) for layout in ("nchw", "nhwc"))
    assert "ls = lw % 4" in nchw and "lc = lw // 4" in nchw
    assert "ls = lw // 3" in nhwc and "lc = lw % 3" in nhwc


def test_nchw_and_filter_prologue_merged_tiles_within_the_register_budget_come_first():
    """On the GPU, NCHW's (c, s) lanes and a filter prologue put the MERGE_TAPS tiles holding over
    MERGED_FLOATS accumulator and filter floats a thread last (128 x 256 and 256 x 128 spilled); NHWC keeps
    the estimate's order."""
    from opgraph.engines.triton.templates.conv_fprop import MERGED_FLOATS

    def first_merged(layout):
        g = og.Graph("p", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
        xd, wd = [64, 3, 224, 224], [768, 3, 16, 16]
        x = g.tensor(dim=xd, stride=layout_stride(xd, layout), name="x")
        w = g.tensor(dim=wd, stride=layout_stride(wd, layout), name="w")
        g.conv_fprop(x, w, padding=[0, 0], stride=[16, 16]).set_output(True)
        piece = make_piece(g.final, 0, g.final.nodes)
        return next(c for c in TEMPLATE.candidates(piece, H100) if c.get(MERGE))

    c = first_merged("nchw")
    assert (c["BLOCK_M"] + c["BLOCK_K"]) * c["BLOCK_N"] / (32 * c["num_warps"]) <= MERGED_FLOATS, c
    c = first_merged("nhwc")
    assert (c["BLOCK_M"] + c["BLOCK_K"]) * c["BLOCK_N"] / (32 * c["num_warps"]) > MERGED_FLOATS, c
    assert _patch_embedding_first()["PROLOGUE_PASS"] == 1


def _patch_embedding_first():
    final = _patch_embedding().final
    return TEMPLATE.candidates(make_piece(final, 0, final.nodes), H100)[0]


def test_no_masks_where_every_lane_and_row_is_in_bounds(rng):
    plan = plan_with(
        _graph("no_selects"),
        {"template": "conv_fprop", MERGE: 1, "BLOCK_K": 16, "SPLIT_K": 1, "BLOCK_M": 16, "BLOCK_N": 16},
    )
    loop = plan.source(0)[plan.source(0).index("for it in") :]
    assert "smask" not in loop and "amask" not in loop and "tl.where" not in loop.split("acc = ")[0]
    _check(plan, rng)


def test_int8(rng):
    """8-bit operands (int32 sums, exact) with the lanes padded to 32, tl.dot's least K for 8 bits."""
    g, _, _, y = conv_graph((2, 3, 9, 9), (16, 3, 3, 3), dt=DT.INT8, padding=[1, 1])
    y.set_output(True).set_data_type(DT.INT32)
    piece = make_piece(g.final, 0, g.final.nodes)
    assert all(c["BLOCK_K"] >= 32 for c in TEMPLATE.candidates(piece, H100) if c.get(MERGE))
    _check(plan_with(g, {MERGE: 1, "BLOCK_K": 32, "SPLIT_K": 1}), rng, rtol=0, atol=0)


@pytest.mark.parametrize("split", [2, 3])
def test_split_k(split, rng):
    """SPLIT_K over the filter rows (its slice index `ks` is not the lanes' names)."""
    _check(plan_with(_graph("stem_stride2"), {MERGE: 1, "BLOCK_K": 32, "SPLIT_K": split}), rng)


@pytest.mark.parametrize("case", ["stem_stride2", "groups", "narrow_image"])
def test_prologue_and_epilogue(case, rng):
    """relu(x + 0.5) on the gathered tile is zeroed where the lanes fall outside the image or past S * C."""
    plan = plan_with(_graph(case, prologue=True, epilogue=True), {MERGE: 1, "BLOCK_K": 32, "SPLIT_K": 1})
    _check(plan, rng)


@pytest.mark.parametrize("dt", [DT.BFLOAT16, DT.FLOAT], ids=lambda d: d.name)
def test_dtypes(dt, rng):
    _check(plan_with(_graph("stem_stride2", dt=dt, epilogue=True), {MERGE: 1, "BLOCK_K": 32, "SPLIT_K": 1}), rng)


def test_exact_on_small_integers(rng):
    """Every lane's product lands once: exact sums on small integers."""
    plan = plan_with(_graph("stem_stride2", epilogue=True), {MERGE: 1, "BLOCK_K": 32, "SPLIT_K": 2})
    _check(plan, rng, integers=True, low=-2, high=2, rtol=0, atol=0)


def test_needs_a_filter_row_of_several_taps():
    xd, wd = (2, 3, 6, 6), (8, 3, 3, 1)
    g = og.Graph("one_tap_rows", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=list(xd), stride=layout_stride(xd, "nhwc"), name="x")
    w = g.tensor(dim=list(wd), stride=layout_stride(wd, "nhwc"), name="w")
    g.conv_fprop(x, w, padding=[1, 0]).set_output(True)
    with pytest.raises(og.AttributeValueError, match="MERGE_TAPS=1 needs a filter whose last spatial axis"):
        plan_with(g, {MERGE: 1, "BLOCK_K": 16, "SPLIT_K": 1})


def _candidates(xd, wd, device, dt=DT.HALF, **attrs):
    g, _, _, y = conv_graph(xd, wd, dt=dt, **attrs)
    y.set_output(True)
    return TEMPLATE.candidates(make_piece(g.final, 0, g.final.nodes), device)


def test_candidates_for_few_channels_only():
    """Offered where C / groups < 8 and the filter row has several taps: first on the GPU for 16-bit
    operands, best estimate first (measured first on an H100's stem), after the first three for float32;
    on the CPU before the broadest config."""
    stem = _candidates((32, 3, 224, 224), (64, 3, 7, 7), H100, padding=[3, 3], stride=[2, 2])
    merged = [c for c in stem if c.get(MERGE)]
    assert merged == stem[: len(merged)] and all(c["BLOCK_K"] == 32 for c in merged)
    piece = _stem_match().piece
    cost = [TEMPLATE.estimate(piece, c, H100) for c in merged]
    assert cost == sorted(cost) and cost[0] < 0.5 * TEMPLATE.estimate(piece, stem[len(merged)], H100)
    wide = _candidates((32, 3, 224, 224), (64, 3, 7, 7), H100, padding=[3, 3], stride=[2, 2], dt=DT.FLOAT)
    assert not any(c.get(MERGE) for c in wide[:3]) and any(c.get(MERGE) for c in wide)
    m = _stem_match()
    assert all(m.steps(m.knobs(c)) // c["SPLIT_K"] >= 2 for c in merged)
    assert not any(c.get(MERGE) for c in _candidates((8, 8, 14, 14), (32, 8, 3, 3), H100, padding=[1, 1]))
    assert not any(c.get(MERGE) for c in _candidates((8, 3, 14, 14), (32, 3, 3, 1), H100, padding=[1, 0]))
    cpu = _candidates((2, 3, 11, 12), (16, 3, 7, 7), og.core.device.CPU, padding=[3, 3], stride=[2, 2])
    assert cpu[-2].get(MERGE) and not cpu[-1].get(MERGE) and not cpu[0].get(MERGE)


def _stem_match(dt=DT.HALF):
    g, _, _, y = conv_graph((32, 3, 224, 224), (64, 3, 7, 7), dt=dt, padding=[3, 3], stride=[2, 2])
    y.set_output(True)
    return TEMPLATE.matched(make_piece(g.final, 0, g.final.nodes), H100)


def test_iterations_and_estimates_per_filter_row():
    m = _stem_match()
    assert m.steps(TileKnobs(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)) == 49
    assert m.steps(TileKnobs(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, MERGE_TAPS=1)) == 7
    assert m.steps(TileKnobs(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, MERGE_TAPS=1)) == 14
    # both cost models count the merged trip count (fp16: conv_cost; fp32: the generic GEMM estimate)
    for dt in (DT.HALF, DT.FLOAT):
        piece = _stem_match(dt).piece
        knobs = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3}
        assert TEMPLATE.estimate(piece, {**knobs, MERGE: 1}, H100) < 0.5 * TEMPLATE.estimate(piece, knobs, H100)


# -- Hopper: the stem's merged kernels compiled (no GPU needed) --------------------------------------------------


def _stem(dt):
    def build():
        g, _, _, y = conv_graph((32, 3, 224, 224), (64, 3, 7, 7), dt=dt, padding=[3, 3], stride=[2, 2])
        g.relu(g.bias(y, g.tensor(dim=[1, 64, 1, 1], name="b"))).set_output(True)
        return g

    return build


def _merged_and_first(candidates):
    """The MERGE_TAPS candidates and the first per-tap one (the first pick before MERGE_TAPS)."""
    return [next(c for c in candidates if not c.get(MERGE)), *[c for c in candidates if c.get(MERGE)]]


def _patch_embedding():
    """ViT-B/16's patch embedding as a bf16 training step has it: the float32 weight cast to bf16 in the
    conv's prologue, NCHW image, 16 x 16 patches at stride 16, then the bias."""
    g = og.Graph("patches", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[64, 3, 224, 224], name="x")
    w = g.tensor(dim=[768, 3, 16, 16], data_type=DT.FLOAT, name="w")
    y = g.conv_fprop(
        x, g.identity(w, compute_data_type=DT.FLOAT).set_data_type(DT.BFLOAT16), padding=[0, 0], stride=[16, 16]
    )
    g.add(y.set_data_type(DT.BFLOAT16), g.tensor(dim=[1, 768, 1, 1], data_type=DT.FLOAT, name="b")).set_output(True)
    return g


HOPPER_CASES = {  # (graph, template, candidates compiled)
    "stem_fp16": (_stem(DT.HALF), "conv_fprop", _merged_and_first),
    "stem_bf16": (_stem(DT.BFLOAT16), "conv_fprop", _merged_and_first),
    "patch_embedding": (_patch_embedding, "conv_fprop", 1),  # the heuristic's pick
}


def test_stem_kernels_compile_for_hopper_without_spills():
    """The stem's first per-tap candidate and its MERGE_TAPS ones compiled for sm_90: no spills, shared memory
    within an SM's, and the merged main loop issuing fewer one-element loads an output tile than the
    per-tap one (7 steps of 32 lanes, 21 used, against 49 of 16, 3 used): less than half. The patch
    embedding's first pick, whose filter is cast in the prologue (staged as float32), likewise fits."""
    import re

    out = compile_for_hopper(__name__, gpu=H100.name, timeout=900)
    lines = [line for line in out.splitlines() if line.startswith("compiled")]
    assert {line.split()[1] for line in lines} == set(HOPPER_CASES), out
    loads = {}  # (case, merged): one-element global loads in the kernel, and trip count an output tile
    for line in lines:
        regs, spills, smem, ld1 = map(
            int, re.search(r"regs (\d+) spills (\d+) smem (\d+) .*ld\.1 (\d+)", line).groups()
        )
        assert spills == 0 and smem <= 227 * 1024 and regs <= 255, line
        if line.split()[1].startswith("stem"):
            loads.setdefault((line.split()[1], MERGE in line), ld1 * (7 if MERGE in line else 49))
    assert sum(MERGE in line for line in lines) >= 2, out
    for case in HOPPER_CASES:
        if case.startswith("stem"):
            assert loads[(case, True)] < loads[(case, False)] / 2, loads


# -- GPU --------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
def test_gpu_stem_merged(dt, rng):
    """The benchmark's stem (7x7/2, C3 -> K64, 224², N32, bias + relu) with each MERGE_TAPS candidate
    compiled for this GPU, against the reference engine."""
    from opgraph.core.device import resolve_device

    g = _stem(dt)()
    cpu = g.build(device="cpu", engines=["triton"])
    (step,) = cpu.steps
    dev = resolve_device("cuda")
    merged = [c for c in TEMPLATE.candidates(step.piece, dev) if c.get(MERGE)]
    assert merged
    for knobs in merged:
        config = EngineConfig("triton", (("template", TEMPLATE.name), *sorted(knobs.items())))
        kernel = get_engine("triton").compile(step.piece, config, dev)
        plan = ExecutionPlan(cpu.graph, dev, (Step(0, step.piece, config, kernel),), cpu.cuts)
        bad = og.testing.check_plan(plan, rng, rtol=2e-2, atol=2e-2)
        assert not bad, f"{knobs}: " + "\n".join(map(str, bad))
