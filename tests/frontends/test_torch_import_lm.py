"""from_torch on what language models use: embedding lookup (padding_idx carried to the backward),
masked_fill with a boolean mask and its negation, RMSNorm, rotary positions, tied weights; and an
untranslated op as a custom op whose backward is torch.autograd's (float64 against PyTorch)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import opgraph as og

from .gpt_models import GPT

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(positions="rotary", norm="rms", mlp="swiglu")],
    ids=["learned-layernorm-gelu", "rotary-rmsnorm-swiglu"],
)
def test_gpt_forward_is_translated(kw):
    torch.manual_seed(0)
    model = GPT(**kw).double().eval()
    idx = torch.randint(0, 17, (2, 8))
    imported = og.from_torch(model, (idx,))
    assert not imported.report.custom_ops, imported.report
    kinds = {n.kind for n in imported.graph.final.nodes}
    assert "embedding" in kinds and ("rmsnorm" in kinds) == (kw.get("norm") == "rms")
    out = imported.run(idx)
    torch.testing.assert_close(out, model(idx), rtol=1e-12, atol=1e-12)


def test_masked_fill_and_bitwise_not():
    class M(nn.Module):
        def forward(self, x, mask):
            return x.masked_fill(~mask, -3.5) + x.masked_fill(mask, torch.tensor(2.0, dtype=x.dtype))

    x = torch.randn(3, 4, dtype=torch.float64)
    mask = torch.rand(3, 4) > 0.5
    imported = og.from_torch(M(), (x, mask))
    assert not imported.report.custom_ops, imported.report
    torch.testing.assert_close(imported.run(x, mask), M()(x, mask))


def test_rms_norm_default_eps_and_no_weight():
    class M(nn.Module):
        def forward(self, x):
            return F.rms_norm(x, (x.shape[-1],))

    x = torch.randn(3, 5, 8, dtype=torch.float64)
    imported = og.from_torch(M(), (x,))
    node = next(n for n in imported.graph.final.nodes if n.kind == "rmsnorm")
    assert node.input("epsilon").value == torch.finfo(torch.float64).eps
    torch.testing.assert_close(imported.run(x), M()(x), rtol=1e-12, atol=1e-12)


def test_padding_idx_row_gets_no_update():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4, padding_idx=0), nn.Flatten(), nn.Linear(12, 3)).double().train()
    ref = copy.deepcopy(model)
    idx = torch.tensor([[0, 3, 0], [5, 0, 9]])
    y = torch.tensor([1, 2])
    imported = og.from_torch(model, (idx,))
    node = next(n for n in imported.graph.final.nodes if n.kind == "embedding")
    assert node.op.padding_idx == 0
    step = og.training.train_step(imported, "cross_entropy", og.training.SGD(0.5))
    before = model[0].weight.detach().clone()
    step.run(idx, y)
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    F.cross_entropy(ref(idx), y).backward()
    opt.step()
    torch.testing.assert_close(model[0].weight, ref[0].weight, rtol=1e-14, atol=1e-14)
    assert torch.equal(model[0].weight[0], before[0])


def test_untranslated_op_trains_through_torch_autograd():
    """cumprod has no translation: a custom op running aten.cumprod, differentiated by a `_vjp` custom
    op (torch.autograd in float64 on the reference engine)."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(torch.cumprod(self.lin(x), dim=1)).tanh()

    torch.manual_seed(0)
    model = M().double()
    x = torch.randn(3, 4, dtype=torch.float64)
    imported = og.from_torch(model, (x,))
    assert [e.target for e in imported.report.custom_ops] == ["aten.cumprod.default"]
    (out,) = imported.outputs
    params = [t for t, s in imported.bound_inputs if s.kind == "parameter"]
    res = og.grad(imported.graph, [out], params, combined=True)
    f = res.graph.final
    assert any(n.kind == "custom" and n.op.op_name.endswith("_wrt_0") for n in f.nodes)
    dy = torch.randn(3, 4, dtype=torch.float64)
    forward = imported.variant_pack(x)
    pack = {u: forward[u] for u in f.inputs if u in forward}
    pack[res.grad_inputs[out.uid].uid] = dy
    for uid in f.outputs:
        d = f.tensors[uid]
        pack[uid] = torch.full(d.dim, float("nan"), dtype=torch.float64).as_strided(d.dim, d.stride)
    res.graph.build(device="cpu").execute(pack)
    model(x).backward(dy)
    for t in params:
        source = dict(imported.bound_inputs)[t]
        want = source.apply(model.get_parameter(source.key).grad)
        np.testing.assert_allclose(pack[res.grads[t.uid].uid].numpy(), want.numpy(), rtol=1e-12, atol=1e-14)
