"""Gather ops: embedding lookup and its scatter-add backward against PyTorch (float64), out-of-range
indices, padding_idx, the torch engine, the gradient rule, and one test per validation rule."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og

from ..helpers import requires_cuda

torch = pytest.importorskip("torch")
DT = og.DataType


def _lookup_graph(v, d, idx_dims, dtype=DT.DOUBLE, padding_idx=-1, index_type=DT.INT64):
    g = og.Graph("emb", io_data_type=dtype, intermediate_data_type=dtype, compute_data_type=dtype)
    w = g.tensor(dim=[v, d], name="w")
    idx = g.tensor(dim=idx_dims, data_type=index_type, name="idx")
    y = g.embedding(w, idx, padding_idx=padding_idx).set_output(True).set_name("y")
    return g, w, idx, y


def _poisoned(desc):
    return np.full(desc.dim, np.nan, dtype=desc.data_type.numpy)


@pytest.mark.parametrize("engine", ["reference", "torch"])
@pytest.mark.parametrize("idx_dims", [[7], [2, 5]])
def test_embedding_vs_torch(engine, idx_dims, rng):
    g, w, idx, y = _lookup_graph(11, 4, idx_dims)
    wv = rng.standard_normal((11, 4))
    iv = rng.integers(0, 11, size=idx_dims)
    pack = {w: wv, idx: iv, y: _poisoned(g.final.tensors[y.uid])}
    g.build(device="cpu", engines=[engine]).execute(pack)
    want = torch.nn.functional.embedding(torch.from_numpy(iv), torch.from_numpy(wv)).numpy()
    np.testing.assert_array_equal(pack[y], want)


@pytest.mark.parametrize("engine", ["reference", "torch"])
def test_out_of_range_indices_read_zeros(engine, rng):
    g, w, idx, y = _lookup_graph(5, 3, [6], dtype=DT.FLOAT, index_type=DT.INT32)
    wv = rng.standard_normal((5, 3)).astype(np.float32)
    iv = np.array([0, -1, 4, 5, 1 << 20, 2], dtype=np.int32)
    pack = {w: wv, idx: iv, y: _poisoned(g.final.tensors[y.uid])}
    g.build(device="cpu", engines=[engine]).execute(pack)
    want = np.where(((iv >= 0) & (iv < 5))[:, None], wv[np.clip(iv, 0, 4)], 0.0)
    np.testing.assert_array_equal(pack[y], want)


@pytest.mark.parametrize("engine", ["reference", "torch"])
@pytest.mark.parametrize("padding_idx", [-1, 2])
def test_embedding_backward_vs_torch_autograd(engine, padding_idx, rng):
    v, d, dims = 9, 3, [4, 6]
    iv = rng.integers(0, v, size=dims)
    iv[0, :3] = 2  # repeated rows accumulate; row 2 is the padding row in one case
    dy = rng.standard_normal((*dims, d))
    g = og.Graph("emb_bwd", io_data_type=DT.DOUBLE)
    gy = g.tensor(dim=[*dims, d], name="dy")
    idx = g.tensor(dim=dims, data_type=DT.INT64, name="idx")
    dw = g.embedding_backward(gy, idx, v, padding_idx=padding_idx).set_output(True)
    pack = {gy: dy, idx: iv, dw: _poisoned(g.final.tensors[dw.uid])}
    g.build(device="cpu", engines=[engine]).execute(pack)
    wt = torch.zeros(v, d, dtype=torch.float64, requires_grad=True)
    out = torch.nn.functional.embedding(torch.from_numpy(iv), wt, padding_idx=None if padding_idx < 0 else padding_idx)
    out.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(pack[dw], wt.grad.numpy(), rtol=1e-14, atol=1e-14)


def test_gradient_rule_scatters_into_the_table(rng):
    """opgraph.grad of sum(embedding(W, idx) * c) w.r.t. W against torch.autograd, padding_idx kept."""
    g, w, idx, y = _lookup_graph(6, 2, [3, 4], padding_idx=1)
    y.set_output(False)
    c = g.tensor(dim=[3, 4, 2], name="c")
    loss = g.reduction(g.mul(y, c), "add").set_dim([1, 1, 1]).set_data_type(DT.DOUBLE).set_output(True)
    res = og.grad(g, [loss], [w])
    f = res.graph.final
    assert [n.kind for n in f.nodes if n.kind.startswith("embedding")] == ["embedding_backward"]
    wv, iv, cv = rng.standard_normal((6, 2)), rng.integers(0, 6, size=(3, 4)), rng.standard_normal((3, 4, 2))
    pack = {u: h for u, h in ((w.uid, wv), (idx.uid, iv), (c.uid, cv)) if u in f.tensors}
    pack[res.grad_inputs[loss.uid].uid] = np.ones((1, 1, 1))
    gw = res.grads[w.uid]
    pack[gw.uid] = _poisoned(f.tensors[gw.uid])
    res.graph.build(device="cpu").execute(pack)
    wt = torch.from_numpy(wv).requires_grad_(True)
    (torch.nn.functional.embedding(torch.from_numpy(iv), wt, padding_idx=1) * torch.from_numpy(cv)).sum().backward()
    np.testing.assert_allclose(pack[gw.uid], wt.grad.numpy(), rtol=1e-14, atol=1e-14)


def test_validation_rules():
    cases = []
    g = og.Graph("e", io_data_type=DT.FLOAT)
    w, idx = g.tensor(dim=[4, 2], name="w"), g.tensor(dim=[3], data_type=DT.FLOAT, name="idx")
    g.embedding(w, idx).set_output(True)
    cases.append((g, "gather.index_type", "idx"))
    g = og.Graph("e", io_data_type=DT.FLOAT)
    w, idx = g.tensor(dim=[4, 2, 1], name="w"), g.tensor(dim=[3], data_type=DT.INT64, name="idx")
    g.embedding(w, idx).set_output(True)
    cases.append((g, "embedding.weight_rank", "w"))
    g = og.Graph("e", io_data_type=DT.FLOAT)
    w, idx = g.tensor(dim=[4, 2], data_type=DT.INT32, name="w"), g.tensor(dim=[3], data_type=DT.INT64, name="idx")
    g.embedding(w, idx).set_output(True)
    cases.append((g, "gather.float", "w"))
    g = og.Graph("e", io_data_type=DT.FLOAT)
    w, idx = g.tensor(dim=[4, 2], name="w"), g.tensor(dim=[3], data_type=DT.INT64, name="idx")
    g.embedding(w, idx, padding_idx=4).set_output(True)
    cases.append((g, "embedding.padding_idx", "w"))
    g = og.Graph("e", io_data_type=DT.FLOAT)
    dy, idx = g.tensor(dim=[3, 5, 2], name="dy"), g.tensor(dim=[3, 4], data_type=DT.INT64, name="idx")
    g.embedding_backward(dy, idx, 7).set_output(True)
    cases.append((g, "embedding_backward.dims", "dy"))
    g = og.Graph("e", io_data_type=DT.FLOAT)
    dy, idx = g.tensor(dim=[3, 2], name="dy"), g.tensor(dim=[3], data_type=DT.INT64, name="idx")
    g.embedding_backward(dy, idx, 0).set_output(True)
    cases.append((g, "embedding_backward.num_weights", "dy"))
    for graph, rule, name in cases:
        with pytest.raises(og.GraphError) as err:
            graph.validate()
        assert err.value.rule == rule, (rule, err.value)
        assert name in str(err.value), (rule, str(err.value))


def test_json_round_trip(rng):
    g = _lookup_graph(5, 3, [2, 2], padding_idx=0)[0]
    g2 = og.Graph.from_json(g.to_json())
    assert g2.final.nodes[0].op == g.final.nodes[0].op


@pytest.mark.gpu
@requires_cuda
def test_embedding_and_backward_on_the_gpu():
    v, d = 50304, 64
    w = torch.randn(v, d, device="cuda", dtype=torch.bfloat16)
    iv = torch.randint(0, v, (8, 128), device="cuda")
    dy = torch.randn(8, 128, d, device="cuda", dtype=torch.bfloat16)
    g = og.Graph("emb", io_data_type=DT.BFLOAT16)
    tw, ti = g.tensor_like(w, name="w"), g.tensor_like(iv, name="idx")
    ty = g.embedding(tw, ti).set_output(True)
    tdy = g.tensor_like(dy, name="dy")
    tdw = g.embedding_backward(tdy, ti, v).set_output(True).set_data_type(DT.FLOAT)
    out, dw = torch.empty(8, 128, d, device="cuda", dtype=torch.bfloat16), torch.empty(v, d, device="cuda")
    g.build(device="cuda").execute({tw: w, ti: iv, ty: out, tdy: dy, tdw: dw})
    torch.testing.assert_close(out, torch.nn.functional.embedding(iv, w))
    want = torch.zeros(v, d, device="cuda").index_add_(0, iv.reshape(-1), dy.reshape(-1, d).float())
    torch.testing.assert_close(dw, want, rtol=1e-5, atol=1e-5)
