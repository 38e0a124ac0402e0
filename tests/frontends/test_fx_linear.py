"""Linear layers in AOTAutograd's form (view -> mm / addmm -> view) rewritten as one batched matmul
(opgraph/frontends/fx_linear.py): which graphs are rewritten, that the rewritten graph computes what the
traced one does, and that a rewritten linear imports as from_torch imports it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from opgraph.frontends.fx_linear import fold_linear_views  # noqa: E402

F = torch.nn.functional


def traced(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(2, 3), (2, 3, 4)])
def test_a_linear_over_a_batch_becomes_one_matmul(bias, lead):
    torch.manual_seed(0)
    x = torch.randn(*lead, 5, dtype=torch.float64)
    w = torch.randn(7, 5, dtype=torch.float64)
    b = torch.randn(7, dtype=torch.float64) if bias else None

    def f(x, w, b):
        return F.linear(x, w, b).tanh()

    gm = traced(f, x, w, b)
    assert any("mm" in t for t in targets(gm)), targets(gm)
    assert fold_linear_views(gm) == 1
    names = targets(gm)
    assert not any(t.startswith("aten.mm") or t.startswith("aten.addmm") for t in names), names
    assert "aten.linear.default" in names and "aten.t.default" not in names, names  # (the weight read as it is)
    torch.testing.assert_close(gm(x, w, b), f(x, w, b), rtol=1e-12, atol=1e-12)


def test_a_product_with_an_untransposed_right_operand_becomes_a_matmul():
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    w = torch.randn(5, 7, dtype=torch.float64)

    def f(x, w):
        return (x.reshape(6, 5) @ w).view(2, 3, 7)

    gm = traced(f, x, w)
    assert fold_linear_views(gm) == 1
    assert "aten.matmul.default" in targets(gm) and "aten.linear.default" not in targets(gm)
    torch.testing.assert_close(gm(x, w), f(x, w), rtol=1e-12, atol=1e-12)


def test_a_product_read_as_rows_is_left_alone():
    """The 2-D product is read by something else than the view back to the batch: no rewrite."""
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    w = torch.randn(5, 7, dtype=torch.float64)

    def f(x, w):
        rows = x.reshape(6, 5) @ w
        return rows.view(2, 3, 7), rows.sum(0)

    gm = traced(f, x, w)
    assert fold_linear_views(gm) == 0
    for got, want in zip(gm(x, w), f(x, w)):
        torch.testing.assert_close(got, want)


def test_rows_of_a_matrix_are_left_alone():
    x = torch.randn(6, 5, dtype=torch.float64)
    w = torch.randn(7, 5, dtype=torch.float64)
    gm = traced(lambda x, w: F.linear(x, w), x, w)
    assert fold_linear_views(gm) == 0


def test_the_rewritten_linear_imports_as_from_torch_imports_it():
    from opgraph.frontends.fx_graph import import_fx

    x = torch.randn(2, 3, 5, dtype=torch.float64)
    w = torch.randn(7, 5, dtype=torch.float64)
    b = torch.randn(7, dtype=torch.float64)
    gm = traced(lambda x, w, b: F.linear(x, w, b), x, w, b)
    fold_linear_views(gm)
    imported = import_fx(gm)
    kinds = [n.kind for n in imported.graph.final.nodes]
    assert kinds.count("matmul") == 1 and "reshape" not in [
        n.kind for n in imported.graph.final.nodes if n.output_uids()[0] in imported.graph.final.outputs
    ]
    (got,) = imported.run(x, w, b)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-12, atol=1e-12)


def test_an_addmm_bias_of_more_than_one_row_is_left_alone():
    """addmm broadcasts its bias over the rows; linear would broadcast it over the leading axes: only a
    bias of one row means the same in both."""
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    w = torch.randn(5, 7, dtype=torch.float64)
    b = torch.randn(6, 7, dtype=torch.float64)

    def f(x, w, b):
        return torch.addmm(b, x.view(6, 5), w).view(2, 3, 7)

    gm = traced(f, x, w, b)
    assert fold_linear_views(gm) == 0
    torch.testing.assert_close(gm(x, w, b), f(x, w, b))
