"""A 2-D matmul's epilogue through reshapes that regroup its rows (engines/triton/templates/_matmul_regroup.py),
and memory views read by the epilogue (a bias reshaped to the output's rank): AOTAutograd's Linear over
[N, H, W, C] (`view -> mm -> view`) fused as from_torch's batched matmul is. Which pieces regroup (CPU), and
that the kernels compute what the reference engine does under Triton's interpreter."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.core.piece import make_piece
from opgraph.engines.triton.templates._matmul_regroup import regroup_rows
from opgraph.engines.triton.templates.matmul import MatmulTemplate

from ..helpers import assert_candidates_match, assert_engine_matches, candidate_configs

DT = og.DataType


def aten_linear(dt=DT.BFLOAT16, after=None, scale_dims=None):
    """view(x [2, 4, 4, 16] -> [32, 16]) @ W^T + b.reshape([1, 24]), viewed back to [2, 4, 4, 24], GELU,
    then `after` ("residual": + an [2, 4, 4, 24] operand, "back": viewed to [32, 24] again) or a product
    with an operand of `scale_dims`."""
    g = og.Graph("aten_linear", io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 4, 4, 16], name="x")
    w = g.tensor(dim=[24, 16], name="w")
    b = g.tensor(dim=[24], name="b")
    mm = g.matmul(g.reshape(x, [32, 16], name="view"), g.transpose(w, [1, 0], name="t"), name="mm")
    y = g.add(mm, g.reshape(b, [1, 24], name="b2"), name="bias").set_data_type(dt)
    out = g.gelu(g.reshape(y, [2, 4, 4, 24], name="unview"), name="gelu")
    if after == "residual":
        out = g.add(out, g.tensor(dim=[2, 4, 4, 24], name="res"), name="residual")
    if after == "back":
        out = g.reshape(out, [32, 24], name="back")
    if scale_dims is not None:
        out = g.mul(out, g.tensor(dim=list(scale_dims), name="scale"), name="scale")
    out.set_output(True)
    return g


def whole(g):
    final = g.final
    return make_piece(final, 0, list(final.nodes))


def test_the_reshapes_become_identities_over_merged_rows():
    piece = whole(aten_linear(after="residual"))
    r = regroup_rows(piece)
    assert r is not None
    unview = next(n for n in r.nodes if n.name == "unview")
    assert unview.kind == "pointwise" and unview.op.mode is og.PointwiseMode.IDENTITY
    res = next(n for n in r.nodes if n.name == "residual")
    assert r.tensor(res.input_uids()[1]).dim == (32, 24) and r.tensor(res.output_uids()[0]).dim == (32, 24)
    assert piece.tensor(res.input_uids()[1]).dim == (2, 4, 4, 24)  # the plan's graph is untouched
    gp, support = MatmulTemplate().analyze(piece)
    assert gp is not None, support.reason
    assert gp.views[next(n for n in piece.nodes if n.name == "b2").output_uids()[0]].desc.dim == (1, 24)


def test_pieces_that_do_not_regroup():
    assert regroup_rows(whole(aten_linear(scale_dims=(2, 1, 1, 24)))) is None  # a per-sample scale
    g = og.Graph("plain", io_data_type=DT.HALF)
    g.matmul(g.tensor(dim=[8, 16], name="a"), g.tensor(dim=[16, 4], name="b")).set_output(True)
    assert regroup_rows(whole(g)) is None  # nothing to regroup


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "kw",
    [{}, {"after": "residual"}, {"after": "back"}, {"dt": DT.HALF}, {"scale_dims": (2, 1, 1, 24)}],
    ids=["gelu", "residual", "back", "half", "per_sample_scale"],
)
def test_regrouped_epilogues_compute_the_reference(kw, rng):
    g = aten_linear(**kw)
    plan = assert_engine_matches(g, rng, rtol=3e-2, atol=3e-2)
    if "scale_dims" not in kw:
        assert len(plan.steps) == 1, plan.describe()
        plan, step, configs = candidate_configs(g)
        assert_candidates_match(plan, step, configs, rng, rtol=3e-2, atol=3e-2)


def _after_unview(kind: str) -> og.Graph:
    """view -> mm -> view to [2, 4, 4, 24], then an op whose attributes name axes of the wider tensors, or a
    view of memory at that rank: none of them means the same over merged rows (found in review)."""
    g = og.Graph(kind, io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 4, 4, 16], name="x")
    mm = g.matmul(g.reshape(x, [32, 16], name="view"), g.tensor(dim=[16, 24], name="w"), name="mm")
    y = g.reshape(mm, [2, 4, 4, 24], name="unview")
    if kind == "gen_index":
        y = g.add(y, g.gen_index(y, axis=1, name="gi").set_data_type(DT.FLOAT), name="add")
    elif kind == "bias_view":
        y = g.add(y, g.reshape(g.tensor(dim=[24], name="b"), [1, 1, 1, 24], name="bv"), name="add")
    elif kind == "residual_view":
        y = g.add(y, g.reshape(g.tensor(dim=[32, 24], name="r"), [2, 4, 4, 24], name="rv"), name="add")
    elif kind == "transposed_residual":
        y = g.add(y, g.transpose(g.tensor(dim=[2, 4, 4, 24], name="r"), [0, 2, 1, 3], name="rt"), name="add")
    if kind == "genstats":
        y = g.gelu(y, name="gelu")
        y.set_output(True)
        for t in g.genstats(y, name="gs"):
            t.set_output(True)
    else:
        y.set_output(True)
    return g


KINDS = ["gen_index", "bias_view", "residual_view", "transposed_residual", "genstats"]


@pytest.mark.parametrize("kind", KINDS)
def test_ops_naming_axes_keep_the_piece_from_regrouping(kind):
    assert regroup_rows(whole(_after_unview(kind))) is None


@pytest.mark.interpreter
@pytest.mark.parametrize("kind", KINDS)
def test_pieces_that_keep_their_axes_compute_the_reference(kind, rng):
    assert_engine_matches(_after_unview(kind), rng, rtol=1e-4, atol=1e-4)
