"""The conv templates' image prologue run as its own pass (PROLOGUE_PASS=1): the pointwise kernel writes
the conv's input into the step's scratch, the plain conv kernel reads it there; the piece, its outputs
and its results are those of the fused kernel (against the reference engine, under the interpreter)."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph import DataType as DT
from opgraph.core.device import Device
from opgraph.core.errors import AttributeValueError
from opgraph.core.piece import make_piece
from opgraph.engines.triton import TEMPLATE_BY_NAME
from opgraph.tools.samples import nhwc

from ..helpers import assert_engine_close_l2, candidate_configs, plan_with, requires_cuda, templates
from .test_triton_conv import sbr_conv_genstats
from .test_triton_conv_bwd import sbr_wgrad

pytestmark = pytest.mark.interpreter

H100 = Device("cuda", 0, "NVIDIA H100 80GB HBM3", (9, 0), 132)
KNOB = "PROLOGUE_PASS"


def _checked(g: og.Graph, rng, **knobs):
    plan = plan_with(g, {KNOB: 1, **knobs})
    generated = plan.steps[0].kernel.generated
    assert generated.launches[0].kernel == "kernel_prologue_pass" and generated.scratch_bytes > 0
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))
    return plan


@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
@pytest.mark.parametrize("stride", [1, 2])
def test_sbr_conv_genstats_with_the_pass(dt, stride, rng):
    """The padding reads 0 (the conv pads its input, the pass's output), not relu(b); genstats after."""
    g = sbr_conv_genstats(n=2, c=8, k=16, hw=6, dt=dt, intermediate=dt, stride=stride)
    plan = _checked(g, rng)
    assert templates(plan) == ["conv_fprop"]


@pytest.mark.parametrize("stride", [1, 2])
def test_sbr_wgrad_with_the_pass(stride, rng):
    g, _ = sbr_wgrad(stride=stride, intermediate=DT.HALF)
    _checked(g, rng)


def test_sbr_wgrad_and_sgd_with_the_pass_and_a_split(rng):
    """The pass's scratch comes after the split wgrad's own (its partials): neither overwrites the other."""
    g, _ = sbr_wgrad(n=3, c=8, k=16, hw=8, sgd=True)
    plan = _checked(g, rng, SPLIT_K=3)
    generated = plan.steps[0].kernel.generated
    offsets = {a.offset for launch in generated.launches for a in launch.args if a.kind == "scratch"}
    assert len(offsets) >= 2 and min(offsets) == 0


def test_the_cpu_heuristic_keeps_the_fused_kernel_and_offers_the_pass():
    g = sbr_conv_genstats()
    plan, _, configs = candidate_configs(g)
    assert not configs[0].knob(KNOB, 0)
    assert any(c.knob(KNOB, 0) for c in configs)
    assert not plan.steps[0].config.knob(KNOB, 0)


def test_on_the_gpu_a_filter_of_many_taps_tries_the_pass_first():
    conv = TEMPLATE_BY_NAME["conv_fprop"]

    def first(r: int) -> dict:
        g = sbr_conv_genstats(n=32, c=64, k=64, hw=56, r=r, padding=r // 2)
        return conv.candidates(make_piece(g.final, 0, g.final.nodes), H100)[0]

    assert first(3).get(KNOB) == 1  # nine taps: the prologue would run nine times on each element
    assert not first(1).get(KNOB)  # one tap: fused, the image read once
    g = sbr_conv_genstats(n=32, c=64, k=64, hw=56)
    piece = make_piece(g.final, 0, g.final.nodes)
    fused = next(c for c in conv.candidates(piece, H100) if not c.get(KNOB))
    # the pass's estimate: the plain conv's plus one read and one write of the image
    assert conv.estimate(piece, first(3), H100) > 0 and conv.estimate(piece, fused, H100) > 0


def cast_filter_conv(n=2, c=3, hw=8, k=16, patch=4, dt=DT.BFLOAT16, image_prologue=False):
    """A mixed-precision step's patch embedding: the float32 filter cast to the image's type in the
    conv's prologue (NCHW, patches at their own stride), then the bias; optionally a prologue on the
    image too."""
    g = og.Graph("cast", io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[n, c, hw, hw], name="x")
    w = g.tensor(dim=[k, c, patch, patch], data_type=DT.FLOAT, name="w")
    image = g.relu(g.add(x, 0.5)).set_data_type(dt) if image_prologue else x
    y = g.conv_fprop(image, g.identity(w).set_data_type(dt), padding=[0, 0], stride=[patch, patch])
    g.add(y.set_data_type(dt), g.tensor(dim=[1, k, 1, 1], data_type=DT.FLOAT, name="b")).set_output(True)
    return g


@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
def test_a_filter_cast_with_the_pass(dt, rng):
    """The filter's cast runs once into scratch, the plain conv (MERGE_TAPS too) reads it there."""
    g = cast_filter_conv(dt=dt)
    _checked(g, rng)
    _checked(g, rng, MERGE_TAPS=1, BLOCK_K=16, SPLIT_K=1, BLOCK_M=32, BLOCK_N=16)


def test_on_the_gpu_a_filter_prologue_tries_the_pass_first_and_the_image_goes_before_it():
    conv = TEMPLATE_BY_NAME["conv_fprop"]
    g = cast_filter_conv(n=64, hw=224, k=768, patch=16)
    piece = make_piece(g.final, 0, g.final.nodes)
    assert conv.candidates(piece, H100)[0].get(KNOB) == 1  # the cast would run once per row tile
    m = conv.match(piece, H100)
    assert m.prologue_pass is not None and m.prologue_pass.role == "weight"
    g2 = cast_filter_conv(image_prologue=True)
    m2 = conv.match(make_piece(g2.final, 0, g2.final.nodes), H100)
    assert m2.prologue_pass is not None and m2.prologue_pass.role == "image"


def test_the_pass_needs_a_prologue_on_the_image():
    g = og.Graph("plain", io_data_type=DT.HALF)
    xd = [2, 8, 5, 5]
    x = g.tensor(dim=xd, stride=nhwc(xd), name="x")
    w = g.tensor(dim=[16, 8, 3, 3], stride=nhwc([16, 8, 3, 3]), name="w")
    g.conv_fprop(x, w, padding=[1, 1]).set_output(True)
    with pytest.raises(AttributeValueError) as err:
        plan_with(g, {KNOB: 1})
    assert err.value.rule == "triton.conv.prologue_pass" and "no prologue" in err.value.hint


def test_only_the_conv_templates_take_the_knob():
    g = og.Graph("pw", io_data_type=DT.HALF)
    x = g.tensor(dim=[4, 8], name="x")
    g.relu(g.mul(x, 2.0)).set_output(True)
    with pytest.raises(AttributeValueError) as err:
        plan_with(g, {KNOB: 1})
    assert err.value.rule == "triton.knob" and "not a knob of the pointwise template" in str(err.value)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
def test_gpu_the_heuristic_runs_a_3x3_prologue_as_a_pass(dt, rng):
    """The benchmark's SBR shapes (N32 C64 56², 3x3) on the GPU: the generated plan's one step takes the
    pass (its first config there) and matches the reference; the statistics and DW are long sums, so
    relative L2 errors."""
    g, _ = sbr_wgrad(n=32, c=64, k=64, hw=56, dt=dt, intermediate=dt)
    plan = assert_engine_close_l2(g, rng, max_rel_l2=2e-2 if dt is DT.BFLOAT16 else 5e-3)
    assert [s.config.knob(KNOB, 0) for s in plan.steps] == [1]
    g = sbr_conv_genstats(n=32, c=64, k=64, hw=56, dt=dt, intermediate=dt)
    plan = assert_engine_close_l2(g, rng, max_rel_l2=2e-2 if dt is DT.BFLOAT16 else 5e-3)
    assert [s.config.knob(KNOB, 0) for s in plan.steps] == [1]


def test_a_prologue_reading_a_slice_of_the_piece_stays_fused(rng):
    """slice(X) -> relu -> conv: the slice is a view the conv reads through; the prologue cannot run apart
    (its piece would read a value of the conv's), so no pass is offered and the build is as before."""
    g = og.Graph("sliced", io_data_type=DT.HALF)
    xd = [2, 16, 5, 5]
    x = g.tensor(dim=xd, stride=nhwc(xd), name="x")
    w = g.tensor(dim=[16, 8, 3, 3], stride=nhwc([16, 8, 3, 3]), name="w")
    half = g.slice(x, [slice(0, 2), slice(0, 8)], name="half")
    g.conv_fprop(g.relu(half), w, padding=[1, 1]).set_output(True)
    plan = g.build(device="cpu", engines=["triton"])
    assert not og.testing.check_plan(plan, rng)
    piece = make_piece(g.final, 0, g.final.nodes)
    if TEMPLATE_BY_NAME["conv_fprop"].match(piece, H100).ok:
        assert not any(c.get(KNOB) for c in TEMPLATE_BY_NAME["conv_fprop"].candidates(piece, H100))


@pytest.mark.parametrize("split", [1, 2])
def test_scratch_after_an_odd_sized_image_stays_aligned(split, rng):
    """An fp16 image of 75 elements (150 bytes): the step's scratch is a whole number of 256-byte blocks,
    so the split-K and genstats partials (float32 views of the scratch) still line up."""
    g = sbr_conv_genstats(n=1, c=3, k=16, hw=5)
    plan = _checked(g, rng, SPLIT_K=split)
    assert plan.steps[0].kernel.generated.scratch_bytes % 256 == 0


def test_the_fallback_config_stays_fused():
    g = sbr_conv_genstats()
    _, _, configs = candidate_configs(g)
    assert not configs[-1].knob(KNOB, 0)
