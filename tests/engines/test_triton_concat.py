"""Concatenations in the generated pointwise kernels (templates/_concat.py) against the reference engine,
under Triton's interpreter: operands of 2 and 3, along inner and outer axes, slices, transposes and
broadcasts as operands, nested joins, and the rotary embedding as transformers writes it; the part walk
(knob PARTS: the joined innermost axis walked a part at a time, each address loaded once)."""

from __future__ import annotations

import pytest

import opgraph as og

from opgraph.engines.triton.knobs import PointwiseKnobs

from ..helpers import assert_candidates_match, assert_engine_matches, candidate_configs, plan_with, requires_cuda

pytestmark = pytest.mark.interpreter
DT = og.DataType
DTYPES = [DT.FLOAT, DT.HALF, DT.BFLOAT16]
ALL = slice(None)


def _rotary(g, x, cos, sin, heads: int, dim: int, dt):
    """q * cos + rotate_half(q) * sin over q = x.view(B, S, heads, dim).transpose(1, 2), as transformers'
    apply_rotary_pos_emb: rotate_half(q) = cat(-q[..., dim/2:], q[..., :dim/2])."""
    b, s, _ = x.dim
    q = g.transpose(g.reshape(x, [b, s, heads, dim]), [0, 2, 1, 3])
    x1 = g.slice(q, [ALL, ALL, ALL, slice(0, dim // 2)])
    x2 = g.slice(q, [ALL, ALL, ALL, slice(dim // 2, None)])
    rotated = g.concatenate([g.neg(x2).set_data_type(dt), x1], axis=-1)
    return g.add(g.mul(q, cos), g.mul(rotated, sin))


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
def test_the_rotary_embedding_is_one_kernel(dt, rng):
    b, s, heads, dim = 3, 5, 3, 6
    g = og.Graph("rope", io_data_type=dt)
    x = g.tensor(dim=[b, s, heads * dim], name="x")
    cos = g.tensor(dim=[b, 1, s, dim], name="cos")
    sin = g.tensor(dim=[b, 1, s, dim], name="sin")
    _rotary(g, x, cos, sin, heads, dim, dt).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    source = plan.source(0)
    assert "tl.where(c3 < 3," in source
    # each operand's loads are masked where it does not apply
    assert "mask=mask & (c3 < 3)" in source and "mask=mask & (c3 >= 3)" in source


def test_the_rotary_embedding_of_queries_and_keys_is_one_kernel_each(rng):
    """q and k of other head counts (grouped-query attention): the walk looks ahead to each join."""
    b, s, dim = 2, 7, 4
    g = og.Graph("rope_qk", io_data_type=DT.FLOAT)
    xq = g.tensor(dim=[b, s, 4 * dim], name="xq")
    xk = g.tensor(dim=[b, s, 2 * dim], name="xk")
    cos = g.tensor(dim=[1, 1, s, dim], name="cos")
    sin = g.tensor(dim=[1, 1, s, dim], name="sin")
    _rotary(g, xq, cos, sin, 4, dim, DT.FLOAT).set_output(True)
    _rotary(g, xk, cos, sin, 2, dim, DT.FLOAT).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=2)
    assert all("concatenate" in step.piece.kinds for step in plan.steps)


def _rope_graph(dt, b=2, s=5, heads=3, dim=16):
    g = og.Graph("rope", io_data_type=dt)
    x = g.tensor(dim=[b, s, heads * dim], name="x")
    cos = g.tensor(dim=[1, 1, s, dim], name="cos")
    sin = g.tensor(dim=[1, 1, s, dim], name="sin")
    _rotary(g, x, cos, sin, heads, dim, dt).set_output(True)
    return g


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
def test_the_rotary_embedding_walks_in_halves(dt, rng):
    """D = 16: two parts of 8, no selects; x's halves, cos's and sin's loaded once each and read by both parts."""
    plan = assert_engine_matches(_rope_graph(dt), rng, expect_steps=1)
    assert plan.steps[0].config.knob("PARTS") == 2
    source = plan.source(0)
    assert "tl.where" not in source and "mask = lin < 240" in source  # (the space with its last axis cut to 8)
    loads = [line.split("=", 1)[1] for line in source.splitlines() if "tl.load(" in line]
    assert len(loads) == 6 == len(set(loads)), loads  # x, cos and sin: each half once
    assert "tl.load(p1 + r0_1 * 16 + c3 + 8," in source and "tl.store(p12 + r0_1 * 16 + c3 + 8," in source


@pytest.mark.parametrize("dt", [DT.FLOAT, DT.BFLOAT16], ids=lambda d: d.name)
def test_every_config_of_a_rotary_embedding_matches(dt, rng):
    """The part walk's configs first, then the flat walk's; an odd element count (the last program's tail)."""
    plan, step, configs = candidate_configs(_rope_graph(dt, b=1, s=7, heads=5, dim=32))
    assert configs[0].knob("PARTS") == 2 and configs[-1].knob("PARTS") is None
    assert_candidates_match(plan, step, configs, rng)


def test_parts_of_unequal_operands_and_a_join_inside_a_join(rng):
    """cat(a [.., 8], cat(relu(b) [.., 16], c [.., 8]) * 2, d [.., 16]) over 48 columns: bounds 0, 8, 24, 32, 48,
    every one a multiple of 8, so six parts of 8, each resolved to its one operand."""
    g = og.Graph("parts", io_data_type=DT.HALF)
    a, b, c, d = (g.tensor(dim=[6, w], name=n) for n, w in (("a", 8), ("b", 16), ("c", 8), ("d", 16)))
    inner = g.mul(g.concatenate([g.relu(b).set_data_type(DT.HALF), c], axis=1), 2.0).set_data_type(DT.HALF)
    joined = g.concatenate([a, inner, d], axis=1)
    g.add(joined, g.tensor(dim=[1, 48], name="bias")).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert plan.steps[0].config.knob("PARTS") == 6 and "tl.where(c1 <" not in plan.source(0)


def test_a_join_under_a_one_operand_join_counts_for_the_parts(rng):
    """cat(cat(a [.., 4], b [.., 12])) (a join of one operand: a copy, its operand in the same frame) beside
    cat(x, y) of 8 each: the inner join's bound at 4 leaves no parts of 8 (the part walk took W = 8 and stopped
    at its own assertion); with b's bound at 8 the part walk takes it. (From a review of the branch.)"""
    for split, parts in ((4, None), (8, 2)):
        g = og.Graph("hidden", io_data_type=DT.FLOAT)
        x, y = g.tensor(dim=[3, 8], name="x"), g.tensor(dim=[3, 8], name="y")
        a, b = g.tensor(dim=[3, split], name="a"), g.tensor(dim=[3, 16 - split], name="b")
        hidden = g.concatenate([g.concatenate([a, b], axis=1)], axis=1)
        g.add(g.concatenate([x, y], axis=1), hidden).set_output(True)
        plan = assert_engine_matches(g, rng, expect_steps=1)
        assert plan.steps[0].config.knob("PARTS") == parts


def test_parts_with_gen_index_and_a_broadcast_operand(rng):
    """Three operands of 8 along the last axis (three parts): gen_index counts from each operand's start in its
    part, a per-row scale broadcast along the axis, and the space laid out column-major (its innermost axis in
    memory is the joined one all the same)."""
    g = og.Graph("parts_idx", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[5, 8], name="x")
    s = g.tensor(dim=[5, 1], name="s")
    t = g.exp(x)
    idx = g.gen_index(g.add(x, 0.0), axis=1).set_data_type(DT.FLOAT)
    joined = g.concatenate([g.add(t, idx), g.mul(t, s), idx], axis=1)
    g.mul(joined, 0.5).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert plan.steps[0].config.knob("PARTS") == 3


def test_parts_of_a_join_written_in_a_transposed_layout(rng):
    """The output [16, 6] stored with its joined axis (0) innermost: the walk's axis is the one contiguous in
    memory, whatever its logical position."""
    g = og.Graph("parts_t", io_data_type=DT.HALF)
    a = g.tensor(dim=[8, 6], name="a")
    b = g.tensor(dim=[8, 6], name="b")
    y = g.add(g.concatenate([a, g.neg(b).set_data_type(DT.HALF)], axis=0), 1.0)
    y.set_output(True).set_stride([1, 16])
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert plan.steps[0].config.knob("PARTS") == 2


@pytest.mark.parametrize(
    "build,why",
    [
        (lambda: _rope_graph(DT.FLOAT, dim=6), "a part of 3"),  # (narrower than a vector: the selects stay)
        (lambda: _outer_join(), "along the outer axis"),
    ],
)
def test_pieces_without_parts_keep_the_selects(build, why, rng):
    plan = assert_engine_matches(build(), rng, expect_steps=1)
    assert plan.steps[0].config.knob("PARTS") is None and "tl.where" in plan.source(0), why
    with pytest.raises(og.AttributeValueError, match="PARTS=2 does not fit this piece") as err:
        plan_with(build(), {"BLOCK": 64, "PARTS": 2})
    assert err.value.rule == "triton.pointwise.knob"


def _outer_join():
    g = og.Graph("outer", io_data_type=DT.FLOAT)
    joined = g.concatenate([g.tensor(dim=[2, 16], name="a"), g.tensor(dim=[2, 16], name="b")], axis=0)
    g.mul(joined, 3.0).set_output(True)
    return g


def _llama_query_rope():
    return _rope_graph(DT.BFLOAT16, b=8, s=1024, heads=16, dim=64)


HOPPER_CASES = {  # (tests/engines/hopper_compile.py: compiled for sm_90a without a GPU)
    "flat": (_llama_query_rope, "pointwise", [dict(BLOCK=2048, num_warps=4)]),
    "parts": (_llama_query_rope, "pointwise", [dict(BLOCK=1024, PARTS=2, num_warps=4)]),
}


def test_the_part_walk_loads_128_bit_vectors_on_hopper():
    """The Llama's query RoPE (D 64, parts of 32), 16 outputs a thread: the part walk's six loads a part pair each
    one 128-bit vector (x's, cos's and sin's halves), none of one element, against the flat walk's ten (its
    partners' masked loads). Its first version re-divided the whole space's index and loaded per element."""
    from .hopper_compile import compile_for_hopper

    out = compile_for_hopper(__name__, gpu="H200")
    access = {}
    for w in (line.split() for line in out.splitlines() if line.startswith("compiled")):
        assert w[6] == "0", w  # spills
        access[w[1]] = dict(zip(w[15:21:2], map(int, w[16:21:2])))
    assert access["flat"] == {"ld.v4": 10, "st.v4": 2, "ld.1": 0}, access
    assert access["parts"] == {"ld.v4": 6, "st.v4": 2, "ld.1": 0}, access


def test_parts_need_the_flat_walks_block():
    with pytest.raises(og.AttributeValueError, match="PARTS is the flat walk's") as err:
        PointwiseKnobs(ROWS=4, COLS=128, PARTS=2)
    assert err.value.rule == "triton.pointwise.knob"
    with pytest.raises(og.AttributeValueError, match="PARTS=1 must be >= 2"):
        PointwiseKnobs(BLOCK=128, PARTS=1)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_three_operands_slices_transposes_and_broadcasts(axis, dt, rng):
    """cat(slice of x, transpose of w, a * c broadcast) along each axis of [5, 7, 3] pieces, then * 2 + 1."""
    g = og.Graph("cat3", io_data_type=dt)
    sizes = [2, 3, 4]
    dims = [[5, 7, 3] for _ in sizes]
    for d, n in zip(dims, sizes):
        d[axis] = n
    x = g.tensor(dim=[d + 1 if i == axis % 3 else d for i, d in enumerate(dims[0])], name="x")
    sliced = g.slice(x, [slice(1, None) if i == axis % 3 else ALL for i in range(3)])
    w = g.tensor(dim=[dims[1][2], dims[1][0], dims[1][1]], name="w")
    transposed = g.transpose(w, [1, 2, 0])
    a = g.tensor(dim=[dims[2][0], 1, dims[2][2]], name="a")
    c = g.tensor(dim=[1, dims[2][1], 1], name="c")
    joined = g.concatenate([sliced, transposed, g.mul(a, c).set_data_type(dt)], axis=axis)
    g.add(g.mul(joined, 2.0), 1.0).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
def test_two_operands_along_the_outer_axis_written_out_and_read_on(dt, rng):
    g = og.Graph("cat2", io_data_type=dt)
    a = g.tensor(dim=[3, 2, 9], name="a")
    b = g.tensor(dim=[4, 2, 9], name="b")
    bias = g.tensor(dim=[1, 2, 1], name="bias")
    joined = g.concatenate([g.relu(a).set_data_type(dt), b], axis=0).set_output(True)
    g.add(joined, bias).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


def test_a_value_read_in_two_operands_and_gen_index_coordinates(rng):
    """t = exp(x) in both operands (computed in each frame); gen_index along the axis counts from the
    operand's own start."""
    g = og.Graph("frames", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[3, 5], name="x")
    t = g.exp(x)
    idx = g.gen_index(g.add(x, 0.0), axis=1).set_data_type(DT.FLOAT)
    g.concatenate([g.add(t, idx), g.mul(t, 2.0), idx], axis=1).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


def test_nested_concatenations_along_two_axes(rng):
    g = og.Graph("nested", io_data_type=DT.HALF)
    a = g.tensor(dim=[2, 3], name="a")
    b = g.tensor(dim=[1, 3], name="b")
    c = g.tensor(dim=[3, 5], name="c")
    inner = g.concatenate([g.neg(a).set_data_type(DT.HALF), b], axis=0)  # [3, 3]
    outer = g.concatenate([inner, g.sqrt(g.abs(c)).set_data_type(DT.HALF), inner], axis=1)  # [3, 11]
    g.mul(outer, g.tensor(dim=[3, 1], name="s")).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


def test_a_concatenation_broadcast_into_the_space(rng):
    """cat(a, b) of dims [1, 6] added to x [5, 6]: the join's value broadcast along rows."""
    g = og.Graph("bcast", io_data_type=DT.FLOAT)
    a = g.tensor(dim=[1, 2], name="a")
    b = g.tensor(dim=[1, 4], name="b")
    x = g.tensor(dim=[5, 6], name="x")
    g.add(x, g.concatenate([a, b], axis=1)).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


def test_operands_of_other_dims_written_out_are_not_this_kernels():
    """An operand's value needed outside the piece has other dims than the join: two kernels."""
    g = og.Graph("split", io_data_type=DT.FLOAT)
    a = g.tensor(dim=[3, 2], name="a")
    b = g.tensor(dim=[3, 4], name="b")
    r = g.relu(a).set_output(True)
    g.concatenate([r, b], axis=1).set_output(True)
    plan = g.build(device="cpu", engines=["triton"])
    assert [s.piece.kinds for s in plan.steps] == [("pointwise",), ("concatenate",)]


def test_rotary_embedding_from_transformers(rng):
    """transformers' own rotate_half / apply_rotary_pos_emb, imported from PyTorch: one kernel for q and
    one for k, matching the reference."""
    modeling = pytest.importorskip("transformers.models.llama.modeling_llama")
    import torch

    class Rope(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = torch.nn.Linear(12, 12, bias=False)
            self.k = torch.nn.Linear(12, 6, bias=False)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            q = self.q(x).view(b, s, -1, 6).transpose(1, 2)
            k = self.k(x).view(b, s, -1, 6).transpose(1, 2)
            q, k = modeling.apply_rotary_pos_emb(q, k, cos, sin)
            return q.sum(1, keepdim=True) + k

    torch.manual_seed(0)
    inputs = (torch.randn(2, 5, 12), torch.randn(2, 5, 6), torch.randn(2, 5, 6))
    imported = og.from_torch(Rope().eval(), inputs)
    plan = assert_engine_matches(imported.graph, rng)
    joins = [s for s in plan.steps if "concatenate" in s.piece.kinds]
    assert len(joins) == 2 and all(s.config.engine == "triton" for s in plan.steps)
    for step in joins:  # the slices, the negation, the join and the multiply-adds in one kernel
        assert {"slice", "concatenate", "pointwise"} <= set(step.piece.kinds)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
def test_gpu_rotary_embedding_at_llama_sizes(dt, rng):
    """Llama-7B's queries at 2 x 1024 tokens: 32 heads of 128, one kernel."""
    b, s, heads, dim = 2, 1024, 32, 128
    g = og.Graph("rope", io_data_type=dt)
    x = g.tensor(dim=[b, s, heads * dim], name="x")
    cos = g.tensor(dim=[b, 1, s, dim], name="cos")
    sin = g.tensor(dim=[b, 1, s, dim], name="sin")
    _rotary(g, x, cos, sin, heads, dim, dt).set_output(True)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1)


# -- slice_backward: dy into zeros, framed like a concatenation's operand ------------------------------


def _slice_backward_graph(dt, dims, window, scale_dy: bool):
    """dx = slice_backward(dy) (the gradient of `x[window]` that og.grad makes), with a multiply by 2
    before it (computed in the slice's frame) or after it (in the full space)."""
    from opgraph.ops.layout import SliceBackward

    g = og.Graph("slice_bwd", io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    bounds = tuple((s.start or 0, d if s.stop is None else s.stop, s.step or 1) for s, d in zip(window, dims))
    dy = g.tensor(dim=[len(range(*b)) for b in bounds], name="dy")
    src = g.mul(dy, 2.0) if scale_dy else dy
    (dx,) = g._add_op(SliceBackward(in_dim=tuple(dims), slices=bounds), [src], name="dx", outputs=["dx"])
    out = dx if scale_dy else g.mul(dx, 2.0)
    out.set_output(True).set_name("out").set_data_type(dt)
    return g


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("scale_dy", [True, False], ids=["in_frame", "after"])
@pytest.mark.parametrize(
    "dims,window",
    [
        ((3, 5, 8), (ALL, slice(0, 1), ALL)),  # a class token's pooling, x[:, 0]
        ((4, 3, 8), (slice(1, 3), ALL, slice(2, 6))),  # a window along two axes
        ((6, 7), (slice(5, 6), slice(0, 7))),  # the last row
    ],
    ids=["cls_token", "two_axes", "last_row"],
)
def test_slice_backward_runs_in_a_generated_kernel(dims, window, scale_dy, dt, rng):
    g = _slice_backward_graph(dt, dims, window, scale_dy)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert "slice_backward" in plan.steps[0].piece.kinds and "tl.where(" in plan.source(0)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("scale_dy", [True, False], ids=["in_frame", "after"])
@pytest.mark.parametrize(
    "dims,window",
    [
        ((8, 4), (slice(0, 8, 2), ALL)),  # every other row
        ((2, 7, 6, 3), (ALL, slice(1, 7, 2), slice(0, 6, 2), ALL)),  # Swin's patch merging, x[:, 1::2, 0::2]
        ((9, 5), (slice(2, 9, 3), slice(1, 4))),  # a step of 3 from 2, beside a plain window
        ((5, 6), (slice(0, 5, 2), slice(1, 2))),  # a strided axis beside one of one element
    ],
    ids=["rows", "patch_merging", "step3", "with_single"],
)
def test_slice_backward_of_a_strided_slice(dims, window, scale_dy, dt, rng):
    """The positions the strided slice read get dy at (c - start) // step, the others zero (Swin's training step
    ran these on the torch engine)."""
    g = _slice_backward_graph(dt, dims, window, scale_dy)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert "slice_backward" in plan.steps[0].piece.kinds and " % " in plan.source(0)
