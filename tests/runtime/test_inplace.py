"""In-place updates in multi-op graphs: W = W - lr * dW sharing W's UID, fused into the producing
kernel, with every read of the old W ordered before the update."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.tools.samples import nhwc
from opgraph.testing import clone, random_pack

DT = og.DataType


def _sgd_graph():
    """Forward conv reads W; backward wgrad; W updated in place with a device learning rate."""
    xd, wd = [2, 4, 5, 5], [4, 4, 3, 3]
    g = og.Graph("sgd", io_data_type=DT.FLOAT)
    x = g.tensor(dim=xd, stride=nhwc(xd), name="x")
    w = g.tensor(dim=wd, stride=nhwc(wd), name="W", uid=100)
    dy = g.tensor(dim=xd, stride=nhwc(xd), name="dy")
    lr = g.tensor(dim=[1], name="lr")
    g.relu(g.conv_fprop(x, w, padding=1)).set_output(True).set_name("y")  # reads the old W
    dw = g.conv_wgrad(x, dy, padding=1).set_dim(wd).set_stride(nhwc(wd))
    g.sub(w, g.mul(dw, lr), name="sgd").set_uid(100).set_output(True)
    return g


def _check(plan, rng):
    f = plan.graph
    pack = random_pack(f, rng)
    w0 = clone(pack[100])
    want = og.testing.reference_outputs(f, pack)
    plan.execute(pack)
    x, dy, lr = (pack[f.tensor(n).uid].astype(np.float64) for n in ("x", "dy", "lr"))
    import torch

    ref_dw = torch.nn.grad.conv2d_weight(torch.from_numpy(x), w0.shape, torch.from_numpy(dy), padding=1).numpy()
    np.testing.assert_allclose(pack[100], w0 - lr.reshape(()) * ref_dw, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pack[f.tensor("y").uid], want[f.tensor("y").uid], rtol=1e-4, atol=1e-4)


def test_reference_engine(rng):
    pytest.importorskip("torch")
    _check(_sgd_graph().build(device="cpu"), rng)


@pytest.mark.interpreter
def test_generated_kernels_keep_the_forward_conv_apart_from_the_update(rng):
    pytest.importorskip("torch")
    plan = _sgd_graph().build(device="cpu", engines=["triton"])
    writer = next(s for s in plan.steps if any(n.name == "sgd" for n in s.piece.nodes))
    assert "conv_fprop" not in writer.piece.kinds, plan.describe()
    _check(plan, rng)


def test_forward_conv_and_update_never_share_a_kernel():
    from opgraph.build.partition import _inplace_race

    f = _sgd_graph().final
    conv = next(n for n in f.nodes if n.kind == "conv_fprop")
    sgd = next(n for n in f.nodes if n.name == "sgd")
    assert "reads at other elements" in _inplace_race([conv], sgd, f)
