"""causal_conv1d / causal_conv1d_backward against PyTorch float64 (F.conv1d over the input padded K - 1
on the left, groups = channels, then SiLU), on the reference engine; the torch engine against the
reference; gradients through og.grad; the rules."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.testing import empty_like_desc, poison

from ..autodiff.test_grad import check, fgraph
from ..helpers import assert_engine_matches, raises_rule

torch = pytest.importorskip("torch")
F = torch.nn.functional
D = og.DataType


def torch_conv(x, w, b, act):
    y = F.conv1d(F.pad(x, (w.shape[1] - 1, 0)), w.unsqueeze(1), bias=b, groups=x.shape[1])
    return F.silu(y) if act == "silu" else y


def _graph(io=D.DOUBLE, b=2, d=5, length=9, k=4, act="silu", bias=True, backward=False):
    g = og.Graph("cc", io_data_type=io, intermediate_data_type=D.FLOAT if io != D.DOUBLE else D.DOUBLE)
    x = g.tensor(dim=[b, d, length], name="x")
    w = g.tensor(dim=[d, k], name="w")
    bt = g.tensor(dim=[d], name="b") if bias else None
    g.causal_conv1d(x, w, bt, activation=act, name="conv").set_output(True)
    if backward:
        dy = g.tensor(dim=[b, d, length], name="dy")
        for t in g.causal_conv1d_backward(dy, x, w, bt, activation=act, name="dconv"):
            if t is not None:
                t.set_output(True).set_data_type(io)
    return g


@pytest.mark.parametrize("act", ["identity", "silu"])
@pytest.mark.parametrize("k", [1, 3, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_against_torch(act, k, bias):
    rng = np.random.default_rng(k)
    g = _graph(k=k, act=act, bias=bias, backward=True)
    final = g.final
    by_name = {t.name: t for t in final.tensors.values()}
    vals = {n: rng.uniform(-1, 1, by_name[n].dim) for n in ("x", "w", "b", "dy") if n in by_name}
    outs = {u: poison(empty_like_desc(final.tensors[u])) for u in final.outputs}
    g.build(device="cpu").execute({**vals, **outs})
    x, w = torch.tensor(vals["x"], requires_grad=True), torch.tensor(vals["w"], requires_grad=True)
    b = torch.tensor(vals["b"], requires_grad=True) if bias else None
    y = torch_conv(x, w, b, act)
    grads = torch.autograd.grad(y, [x, w] + ([b] if bias else []), torch.tensor(vals["dy"]))
    got = {final.tensors[u].name: v for u, v in outs.items()}
    np.testing.assert_allclose(got["conv::y"], y.detach().numpy(), rtol=1e-9, atol=1e-11)
    for name, want in zip(("dconv::dx", "dconv::dweight", "dconv::dbias"), grads):
        np.testing.assert_allclose(got[name], want.numpy(), rtol=1e-9, atol=1e-11, err_msg=name)


@pytest.mark.parametrize("io", [D.FLOAT, D.BFLOAT16])
@pytest.mark.parametrize("act", ["identity", "silu"])
def test_torch_engine_matches_the_reference(io, act, rng):
    assert_engine_matches(_graph(io=io, act=act, backward=True), rng, engines=("torch",))


def test_gradients_through_grad(rng):
    g = fgraph()
    x, w, b = g.tensor(dim=[2, 3, 7], name="x"), g.tensor(dim=[3, 3], name="w"), g.tensor(dim=[3], name="b")
    y = g.causal_conv1d(x, w, b, activation="silu").set_output(True)
    check(g, y, [x, w, b], lambda x, w, b: torch_conv(x, w, b, "silu"), rng)


def test_rules():
    g = og.Graph("cc", io_data_type=D.FLOAT)
    x, w = g.tensor(dim=[2, 3, 7], name="x"), g.tensor(dim=[4, 3], name="w")
    g.causal_conv1d(x, w).set_output(True)
    raises_rule(g, og.ShapeError, "causal_conv1d.dims", "w")
    with pytest.raises(og.AttributeValueError):
        og.Graph("cc").causal_conv1d(x, w, activation="gelu")
