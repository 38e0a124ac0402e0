"""from_torch with attention: F.scaled_dot_product_attention (is_causal, bool and float masks, scale,
GQA, rank 3, dropout in train mode), nn.MultiheadAttention and nn.TransformerEncoderLayer in eval
and train mode, matching PyTorch (float64 on the reference engine, float32 on the torch engine);
gradients through an imported encoder layer against autograd."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

import opgraph as og
from opgraph.autodiff import grad
from opgraph.ops import attention_ref as R

from ..helpers import requires_cuda
from ..ops.attention_torch import attention

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from opgraph.frontends import from_torch

D64 = torch.float64


def _err(got, want) -> float:
    return float((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30))


def _poisoned_outputs(graph, pack) -> None:
    """NaN buffers (declared strides) for the outputs of `graph` that `pack` lacks."""
    final = graph.final
    for uid in final.outputs:
        if uid not in pack:
            d = final.tensors[uid]
            pack[uid] = torch.empty_strided(d.dim, d.stride, dtype=d.data_type.to_torch()).fill_(float("nan"))


class Sdpa(nn.Module):
    def __init__(self, **kw) -> None:
        super().__init__()
        self.kw = kw

    def forward(self, q, k, v, *mask):
        kw = dict(self.kw)
        if mask:
            kw["attn_mask"] = mask[0]
        return F.scaled_dot_product_attention(q, k, v, **kw)


def _qkv(hk=4, sq=5, skv=7, rank=4, dtype=D64):
    shape = (2, 4, sq, 8) if rank == 4 else (2, sq, 8)
    kshape = (2, hk, skv, 8) if rank == 4 else (2, skv, 8)
    return torch.randn(shape, dtype=dtype), torch.randn(kshape, dtype=dtype), torch.randn(kshape, dtype=dtype)


@pytest.mark.parametrize(
    "kw,mask",
    [
        ({}, None),
        ({"is_causal": True}, None),
        ({"scale": 0.2}, None),
        ({"enable_gqa": True}, None),
        ({}, "float"),
        ({}, "bool"),
        ({"enable_gqa": True, "scale": 0.5}, "bool4"),
        ({}, "rank3"),
    ],
)
@pytest.mark.parametrize("engines", [None, ["torch"]], ids=["reference", "torch"])
def test_sdpa(kw, mask, engines):
    torch.manual_seed(0)
    dtype = D64 if engines is None else torch.float32
    q, k, v = _qkv(hk=2 if kw.get("enable_gqa") else 4, rank=3 if mask == "rank3" else 4, dtype=dtype)
    args = [q, k, v]
    if mask == "float":
        args.append(torch.randn(5, 7, dtype=dtype))
    elif mask == "bool":
        args.append(torch.rand(5, 7) > 0.3)
    elif mask == "bool4":
        m = torch.rand(2, 1, 5, 7) > 0.3
        m[0, 0, 1] = False  # a row with no key: O = 0 in both
        args.append(m)
    model = Sdpa(**kw)
    imported = from_torch(model, tuple(args))
    assert [n.kind for n in imported.graph.final.nodes].count("sdpa") == 1, imported.report.summary()
    assert "custom" not in imported.report.counts()
    got = imported.run(*args, engines=engines)
    want = model(*args)
    assert _err(got, want.nan_to_num()) <= (1e-12 if engines is None else 1e-5)
    if mask == "bool4":
        assert got[0, :, 1].abs().max() == 0


def test_sdpa_dropout_in_train_mode():
    """dropout_p > 0: the op's Philox dropout with a seed drawn per call; O equals the formula with the
    mask that seed draws, another call draws another mask; gradients follow the same mask."""
    torch.manual_seed(1)
    q, k, v = _qkv(hk=2)
    model = Sdpa(dropout_p=0.25, enable_gqa=True).train()
    imported = from_torch(model, (q, k, v))
    (node,) = [n for n in imported.graph.final.nodes if n.kind == "sdpa"]
    assert node.op.dropout_probability == 0.25
    assert any("Philox" in n for n in imported.report.notes)
    pack = imported.variant_pack(q, k, v)
    imported.plan("cpu").execute(pack)
    seed = int(pack[node.input("dropout_seed")].reshape(-1)[0])
    offset = int(pack[node.input("dropout_offset")].reshape(-1)[0])
    drop = torch.tensor(R.dropout_keep(0.25, seed, offset, (2, 4, 5, 7)) / 0.75)
    want, _ = attention(q, k, v, scale=1 / math.sqrt(8), drop=drop)
    (got,) = [pack[t.uid] for t in imported.outputs]
    assert _err(got, want) <= 1e-12
    other = imported.run(q, k, v)
    assert _err(other, want) > 1e-3
    # opgraph.grad through the imported graph: the backward draws the forward's mask
    res = grad(imported.graph, imported.outputs[0], wrt=imported.inputs[:3], combined=True)
    pack = imported.variant_pack(q, k, v)
    dy = torch.randn(2, 4, 5, 8, dtype=D64)
    pack[res.grad_inputs[imported.outputs[0].uid].uid] = dy
    _poisoned_outputs(res.graph, pack)
    res.graph.build(device="cpu").execute(pack)
    seed = int(pack[node.input("dropout_seed")].reshape(-1)[0])
    drop = torch.tensor(R.dropout_keep(0.25, seed, 0, (2, 4, 5, 7)) / 0.75)
    tq, tk, tv = (x.clone().requires_grad_(True) for x in (q, k, v))
    attention(tq, tk, tv, scale=1 / math.sqrt(8), drop=drop)[0].backward(dy)
    for x, t in zip((tq, tk, tv), imported.inputs[:3]):
        assert _err(pack[res.grads[t.uid].uid], x.grad) <= 1e-10


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("padding", [False, True])
def test_multihead_attention(mode, need_weights, padding):
    torch.manual_seed(2)
    mha = nn.MultiheadAttention(16, 4, batch_first=True, dropout=0.0).double()
    getattr(mha, mode)()
    x, y = torch.randn(2, 5, 16, dtype=D64), torch.randn(2, 7, 16, dtype=D64)

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = mha

        def forward(self, x, y, *kpm):
            out, w = self.mha(x, y, y, need_weights=need_weights, key_padding_mask=kpm[0] if kpm else None)
            return out if w is None else (out, w)

    args = (x, y) + ((torch.tensor([[False] * 5 + [True] * 2, [False] * 7]),) if padding else ())
    model = M()
    imported = from_torch(model, args)
    kinds = [n.kind for n in imported.graph.final.nodes]
    assert ("sdpa" in kinds) == (not need_weights), imported.report.summary()
    assert "custom" not in imported.report.counts()
    got, want = imported.run(*args), model(*args)
    for a, b in zip(got if need_weights else [got], want if need_weights else [want]):
        assert _err(a, b.detach()) <= 1e-12


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("engines", [None, ["torch"]], ids=["reference", "torch"])
def test_transformer_encoder_layer(mode, norm_first, engines):
    torch.manual_seed(3)
    dtype = D64 if engines is None else torch.float32
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
    layer = layer.to(dtype)
    getattr(layer, mode)()
    x = torch.randn(2, 6, 16, dtype=dtype)
    ref = copy.deepcopy(layer)
    imported = from_torch(layer, (x,))
    assert [n.kind for n in imported.graph.final.nodes].count("sdpa") == 1
    assert not any("is random" in n for n in imported.report.notes)
    assert "custom" not in imported.report.counts(), imported.report.summary()
    got = imported.run(x, engines=engines)
    with torch.no_grad():
        want = ref(x)
    assert _err(got, want) <= (1e-12 if engines is None else 1e-5)


def test_transformer_encoder_layer_train_with_dropout_and_its_gradients():
    """Train mode with attention dropout (the other dropouts off): the op's Philox dropout seeded per
    call; with the seed one pack drew, the output and opgraph.grad's gradients (combined graph) equal
    PyTorch's layer and autograd with that mask applied in its attention."""
    torch.manual_seed(4)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).double().train()
    layer.self_attn.dropout = 0.2  # attention dropout only
    x = torch.randn(2, 6, 16, dtype=D64)
    imported = from_torch(layer, (x,))
    (node,) = [n for n in imported.graph.final.nodes if n.kind == "sdpa"]
    assert node.op.dropout_probability == 0.2
    out = imported.outputs[0]
    names = ["self_attn.in_proj_weight", "self_attn.out_proj.weight", "linear1.weight"]
    sources = {s.key: (t, s) for t, s in imported.bound_inputs if s.kind == "parameter"}
    wrt = [sources[n][0].uid for n in names]
    res = grad(imported.graph, out, wrt=wrt + [imported.inputs[0]], combined=True)
    pack = imported.variant_pack(x)
    dy = torch.randn(2, 6, 16, dtype=D64)
    pack[res.grad_inputs[out.uid].uid] = dy
    _poisoned_outputs(res.graph, pack)
    res.graph.build(device="cpu").execute(pack)
    seed = int(pack[node.input("dropout_seed")].reshape(-1)[0])
    keep = torch.tensor(R.dropout_keep(0.2, seed, 0, (2, 4, 6, 6)) / 0.8)

    def attn_with_mask(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return attention(q, k, v, scale=scale or 1 / math.sqrt(q.shape[-1]), drop=keep)[0]

    ref = copy.deepcopy(layer)
    xr = x.clone().requires_grad_(True)
    orig = F.scaled_dot_product_attention
    try:
        F.scaled_dot_product_attention = attn_with_mask  # the layer calls it through F
        y = ref(xr)
    finally:
        F.scaled_dot_product_attention = orig
    assert _err(pack[out.uid], y.detach()) <= 1e-12
    y.backward(dy)
    params = dict(ref.named_parameters())
    for name, uid in zip(names, wrt):  # the graph reads the parameter through bind-time views
        want = sources[name][1].apply(params[name].grad)
        assert _err(pack[res.grads[uid].uid].reshape(want.shape), want) <= 1e-10, name
    assert _err(pack[res.grads[imported.inputs[0].uid].uid], xr.grad) <= 1e-10


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_gpu_transformer_encoder_layer_bf16(mode):
    torch.manual_seed(5)
    layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True).cuda().to(torch.bfloat16)
    getattr(layer, mode)()
    x = torch.randn(4, 128, 256, device="cuda", dtype=torch.bfloat16)
    ref = copy.deepcopy(layer)
    imported = from_torch(layer, (x,))
    got = imported.run(x)
    with torch.no_grad():
        want = ref(x)
    assert _err(got, want) <= 3e-2, og.__name__
    assert np.isfinite(got.float().cpu().numpy()).all()
