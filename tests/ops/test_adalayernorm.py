"""adalayernorm / adalayernorm_backward (DiT-style per-batch scale and shift) against PyTorch float64
(F.layer_norm, then the per-batch affine), on the reference engine; the torch engine against the
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


def _graph(io=D.DOUBLE, dims=(3, 5, 8), backward=False, phase="TRAINING"):
    g = og.Graph("ada", io_data_type=io, intermediate_data_type=D.FLOAT if io != D.DOUBLE else D.DOUBLE)
    x = g.tensor(dim=dims, name="x")
    sd = (dims[0],) + (1,) * (len(dims) - 2) + (dims[-1],)
    scale, bias = g.tensor(dim=sd, name="scale"), g.tensor(dim=sd, name="bias")
    y, mean, inv = g.adalayernorm(phase, x, scale, bias, epsilon=1e-3, name="adaln")
    y.set_output(True)
    if mean is not None:
        mean.set_output(True).set_data_type(D.DOUBLE if io == D.DOUBLE else D.FLOAT)
        inv.set_output(True).set_data_type(D.DOUBLE if io == D.DOUBLE else D.FLOAT)
    if backward:
        dy = g.tensor(dim=dims, name="dy")
        for t in g.adalayernorm_backward(dy, x, scale, mean, inv, name="dadaln"):
            t.set_output(True).set_data_type(io)
    return g


@pytest.mark.parametrize("dims", [(3, 5, 8), (2, 4, 3, 6)])
def test_forward_and_backward_against_torch(dims):
    rng = np.random.default_rng(0)
    g = _graph(dims=dims, backward=True)
    final = g.final
    by_name = {t.name: t for t in final.tensors.values()}
    vals = {n: rng.uniform(-1, 1, by_name[n].dim) for n in ("x", "scale", "bias", "dy")}
    pack = {n: v for n, v in vals.items()}
    outs = {u: poison(empty_like_desc(final.tensors[u])) for u in final.outputs}
    g.build(device="cpu").execute({**pack, **outs})
    x, scale, bias = (torch.tensor(vals[n], requires_grad=True) for n in ("x", "scale", "bias"))
    y = F.layer_norm(x, (dims[-1],), eps=1e-3) * scale + bias
    dx, dscale, dbias = torch.autograd.grad(y, [x, scale, bias], torch.tensor(vals["dy"]))
    got = {final.tensors[u].name: v for u, v in outs.items()}
    np.testing.assert_allclose(got["adaln::y"], y.detach().numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(got["adaln::mean"], vals["x"].mean(-1, keepdims=True), rtol=1e-9, atol=1e-11)
    inv = 1 / np.sqrt(vals["x"].var(-1, keepdims=True) + 1e-3)
    np.testing.assert_allclose(got["adaln::inv_variance"], inv, rtol=1e-9)
    for name, want in (("dadaln::dx", dx), ("dadaln::dscale", dscale), ("dadaln::dbias", dbias)):
        np.testing.assert_allclose(got[name], want.numpy(), rtol=1e-9, atol=1e-11, err_msg=name)


@pytest.mark.parametrize("io", [D.FLOAT, D.HALF])
def test_torch_engine_matches_the_reference(io, rng):
    assert_engine_matches(_graph(io=io, backward=True), rng, engines=("torch",))
    assert_engine_matches(_graph(io=io, phase="INFERENCE"), rng, engines=("torch",))


def test_gradients_through_grad(rng):
    g = fgraph()
    x = g.tensor(dim=[2, 3, 6], name="x")
    scale, bias = g.tensor(dim=[2, 1, 6], name="scale"), g.tensor(dim=[2, 1, 6], name="bias")
    y = g.adalayernorm("INFERENCE", x, scale, bias, epsilon=1e-3)[0].set_output(True)
    check(g, y, [x, scale, bias], lambda x, scale, bias: F.layer_norm(x, (6,), eps=1e-3) * scale + bias, rng)


def test_rules():
    g = og.Graph("ada", io_data_type=D.FLOAT)
    x = g.tensor(dim=[2, 4, 6], name="x")
    s = g.tensor(dim=[2, 4, 5], name="scale")
    g.adalayernorm("INFERENCE", x, s, s, epsilon=1e-3)[0].set_output(True)
    raises_rule(g, og.ShapeError, "norm.scale_dims", "scale")
    g = og.Graph("ada", io_data_type=D.FLOAT)
    x = g.tensor(dim=[2, 4, 6], name="x")
    s = g.tensor(dim=[2, 1, 1], name="scale")
    g.adalayernorm("INFERENCE", x, s, s, epsilon=1e-3)[0].set_output(True)
    raises_rule(g, og.ShapeError, "norm.scale_dims", "scale")
