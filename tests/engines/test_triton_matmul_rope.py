"""A projection whose epilogue splits its columns into heads (templates/_matmul_split_cols.py): the rotary
embedding of a language model's queries and keys fused into the matmul, its rotate_half a swap of the
halves of each head in registers (gemm/epilogue.py `emit_half`), against the reference engine under
Triton's interpreter; the knobs that would cut a head; what stays apart."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.core.piece import make_piece
from opgraph.engines.triton.templates._matmul_split_cols import split_columns
from opgraph.engines.triton.templates.matmul import MatmulTemplate

from ..helpers import (
    assert_candidates_match,
    assert_engine_close_l2,
    assert_engine_matches,
    candidate_configs,
    plan_with,
    requires_cuda,
)
from .test_triton_concat import _rotary

pytestmark = pytest.mark.interpreter
DT = og.DataType
ALL = slice(None)


def _projected(dt, b=2, s=8, k=32, heads=2, dim=16, positions=1, bias=False, sibling=False):
    """x @ w (a Linear over [b, s, k] tokens: w broadcast as [1, k, heads * dim]), then the rotary embedding
    as transformers writes it; with `sibling` a second product of x beside it (the value projection)."""
    g = og.Graph("projected_rope", io_data_type=dt)
    x = g.tensor(dim=[b, s, k], name="x")
    w = g.tensor(dim=[1, k, heads * dim], name="w")
    cos = g.tensor(dim=[positions, 1, s, dim], name="cos")
    sin = g.tensor(dim=[positions, 1, s, dim], name="sin")
    q = g.matmul(x, w, name="q_proj").set_dim([b, s, heads * dim]).set_data_type(dt)
    if bias:
        q = g.add(q, g.tensor(dim=[1, 1, heads * dim], name="bias")).set_dim([b, s, heads * dim]).set_data_type(dt)
    if sibling:
        v = g.matmul(x, g.tensor(dim=[1, k, heads * dim], name="w_v"), name="v_proj")
        v.set_dim([b, s, heads * dim]).set_data_type(dt).set_output(True)
    _rotary(g, q, cos, sin, heads, dim, dt).set_output(True)
    return g


@pytest.mark.parametrize("dt", [DT.FLOAT, DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
def test_a_projection_and_its_rotary_embedding_are_one_kernel(dt, rng):
    plan = assert_engine_matches(_projected(dt), rng, expect_steps=1)
    source = plan.source(0)
    assert "tl.dot(" in source and "tl.split(" in source and "tl.join(" in source
    assert "tl.where(" not in source  # (no selects: the halves are swapped in registers)


def test_a_bias_and_positions_per_sample(rng):
    """cos and sin of [B, 1, S, D] (positions per sequence) index by the tile's rows; the bias by its columns."""
    assert_engine_matches(_projected(DT.FLOAT, b=3, s=5, positions=3, bias=True), rng, expect_steps=1)


def test_every_candidate_holds_whole_heads(rng):
    """Heads of 32 columns: the candidates' tiles (and epilogue halves) are raised to whole heads."""
    plan, step, configs = candidate_configs(_projected(DT.FLOAT, heads=3, dim=32, k=16))
    assert len(plan.steps) == 1
    assert all(dict(c.knobs)["BLOCK_N"] % 32 == 0 for c in configs)
    assert_candidates_match(plan, step, configs, rng)


def test_a_tile_cutting_a_head_is_refused():
    with pytest.raises(og.AttributeValueError) as info:
        plan_with(_projected(DT.FLOAT, heads=2, dim=32), {"BLOCK_N": 16})
    assert info.value.rule == "triton.gemm.knob" and "whole heads" in str(info.value)


def test_a_product_beside_it_splits_too(rng):
    """The value projection computed beside the keys' (GemmPiece.siblings) after their RoPE, as the build's
    sibling merge orders them (the keys' piece, then the values' product): one kernel, both stored right."""
    plan = plan_with(
        _projected(DT.BFLOAT16, sibling=True),
        {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16},
        engines=("triton", "reference"),
        allow_partition=False,
    )
    assert "acc_s0" in plan.source(0) and "tl.join(" in plan.source(0)
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


def test_views_alone_are_left_to_their_reader():
    """A product split into heads and transposed with no op after it (the value projection, which attention
    reads in place) is not split: nothing would fuse."""
    g = og.Graph("views", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 8, 32], name="x")
    v = g.matmul(x, g.tensor(dim=[1, 32, 32], name="w"), name="v_proj").set_dim([2, 8, 32]).set_data_type(DT.FLOAT)
    g.transpose(g.reshape(v, [2, 8, 2, 16]), [0, 2, 1, 3]).set_output(True)
    final = g.final
    piece = make_piece(final, 0, list(final.nodes))
    assert split_columns(piece) is None
    assert MatmulTemplate().analyze(piece)[0] is None


def test_a_slice_other_than_a_half_stays_apart(rng):
    """cat(x[..., D/4:], x[..., :D/4]): not a swap of halves; the product and the rest run as two kernels."""
    dt = DT.FLOAT
    g = og.Graph("quarters", io_data_type=dt)
    x = g.tensor(dim=[2, 8, 32], name="x")
    q = g.matmul(x, g.tensor(dim=[1, 32, 32], name="w"), name="q_proj").set_dim([2, 8, 32]).set_data_type(dt)
    h = g.transpose(g.reshape(q, [2, 8, 2, 16]), [0, 2, 1, 3])
    a = g.slice(h, [ALL, ALL, ALL, slice(4, None)])
    b = g.slice(h, [ALL, ALL, ALL, slice(0, 4)])
    g.mul(g.concatenate([a, b], axis=-1), g.tensor(dim=[1, 1, 8, 16], name="cos")).set_output(True)
    plan = assert_engine_matches(g, rng)
    assert len(plan.steps) == 2


@requires_cuda
@pytest.mark.gpu
def test_the_llama_query_projection_with_its_rotary_embedding_on_the_gpu(rng):
    """Queries of 16 heads of 64 over 2 x 256 tokens, bf16, the generated kernel alone, by the relative L2 error:
    q is rounded to bf16 before q * cos + rotate_half(q) * sin cancels, so where the tensor cores' sum and the
    reference's round q to neighbouring bf16 values (one unit: 0.125 at |q| >= 16) an output of 2.5 differs by
    that much, as the two kernels of the unfused plan differ from the reference (seen on an H200)."""
    g = _projected(DT.BFLOAT16, b=2, s=256, k=256, heads=16, dim=64, positions=2)
    plan = assert_engine_close_l2(g, rng, max_rel_l2=1e-2)
    assert len(plan.steps) == 1, plan.describe()


@requires_cuda
@pytest.mark.gpu
def test_the_llama_key_and_value_projections_with_the_keys_rotary_embedding_on_the_gpu(rng):
    """Keys of 4 heads of 64 and the values' product beside them (the build's sibling merge), bf16, on the GPU:
    one kernel, both outputs by the relative L2 error (the keys' bf16 rounding before the RoPE, as above)."""
    g = _projected(DT.BFLOAT16, b=2, s=256, k=256, heads=4, dim=64, positions=2, sibling=True)
    plan = assert_engine_close_l2(g, rng, max_rel_l2=1e-2)
    assert len(plan.steps) == 1, plan.describe()


def test_the_split_piece_reads_a_from_memory():
    """A prologue (a cast of A) keeps the piece unsplit: the split space reads A's rows merged, in place."""
    dt = DT.FLOAT
    g = og.Graph("prologue", io_data_type=dt)
    x = g.tensor(dim=[2, 8, 32], name="x")
    a = g.mul(x, 2.0).set_data_type(dt)
    q = g.matmul(a, g.tensor(dim=[1, 32, 32], name="w"), name="q_proj").set_dim([2, 8, 32]).set_data_type(dt)
    h = g.transpose(g.reshape(q, [2, 8, 2, 16]), [0, 2, 1, 3])
    g.mul(h, g.tensor(dim=[1, 1, 8, 16], name="cos")).set_output(True)
    final = g.final
    assert split_columns(make_piece(final, 0, list(final.nodes))) is None


def test_split_k_is_refused_and_left_out_of_the_candidates():
    """Split-K's epilogue launch tiles the columns its own way (a head of 128 cut to a 64-column tile)."""
    g = _projected(DT.FLOAT, s=8, k=256, heads=1, dim=128)
    with pytest.raises(og.AttributeValueError) as info:
        plan_with(g, {"SPLIT_K": 2, "BLOCK_M": 16, "BLOCK_N": 128})
    assert info.value.rule == "triton.gemm.knob" and "SPLIT_K" in str(info.value)
    _, _, configs = candidate_configs(g)
    assert all(dict(c.knobs).get("SPLIT_K", 1) == 1 for c in configs)


def test_an_operand_per_head_and_position_is_read_in_its_order(rng):
    """A [1, H, S, 1] operand reshaped from [H, S] in the transposed world: read as a reshape to the space's
    order it would swap H and S, so the piece is not split (review of the split space)."""
    dt = DT.FLOAT
    g = og.Graph("per_head", io_data_type=dt)
    x = g.tensor(dim=[2, 8, 32], name="x")
    q = g.matmul(x, g.tensor(dim=[1, 32, 32], name="w"), name="q_proj").set_dim([2, 8, 32]).set_data_type(dt)
    h = g.transpose(g.reshape(q, [2, 8, 2, 16]), [0, 2, 1, 3])
    g.mul(h, g.reshape(g.tensor(dim=[2, 8], name="scale"), [1, 2, 8, 1])).set_output(True)
    assert_engine_matches(g, rng)


@pytest.mark.parametrize("operand", ["A", "B"])
def test_an_epilogue_reading_a_or_b_is_not_split(operand, rng):
    """x @ w + x (or + w) before the heads' split: A and B are described as the merged product's matrices, which
    an epilogue op in the split space cannot index (review of the split space)."""
    dt = DT.FLOAT
    g = og.Graph("reads_operand", io_data_type=dt)
    k = 32 if operand == "A" else 8
    x = g.tensor(dim=[2, 8, k], name="x")
    w = g.tensor(dim=[1, k, 32], name="w")
    q = g.matmul(x, w, name="q_proj").set_dim([2, 8, 32]).set_data_type(dt)
    r = g.add(q, x if operand == "A" else w).set_dim([2, 8, 32]).set_data_type(dt)
    g.mul(g.transpose(g.reshape(r, [2, 8, 2, 16]), [0, 2, 1, 3]), 2.0).set_output(True)
    final = g.final
    assert split_columns(make_piece(final, 0, list(final.nodes))) is None
    assert_engine_matches(g, rng)
