"""Parameters a module reads through views, trained by opgraph.training.train_step as torch.optim trains
them (issue 40): a learned position table read as pos[:T] (every row decayed and moved by its moments,
not only the rows read), a class token expanded over the batch (its gradient summed over the broadcast
axis), and tied weights; losses, gradients (through the first step's optimizer state) and parameters
against autograd + torch.optim in float64 over several steps. Also the step graph's seam for gradient
hooks."""

from __future__ import annotations

import copy

import pytest

import opgraph as og
from opgraph.training import SGD, AdamW, train_step

from .helpers import requires_cuda, requires_interpreter
from .test_train_step import assert_same_training, rel, torch_optimizer, torch_step

torch = pytest.importorskip("torch")
nn = torch.nn


class PosTable(nn.Module):
    """Token embedding plus a learned position table longer than the sequence (24 rows, T used)."""

    def __init__(self, vocab=11, rows=24, d=6):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(rows, d))
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        t = idx.shape[1]
        return self.head(torch.tanh(self.tok(idx) + self.pos[:t]))


class ClsToken(nn.Module):
    """A class token nn.Parameter(1, 1, D) expanded to (B, 1, D) and concatenated before the patches
    (timm's ViT), then a linear head on the token."""

    def __init__(self, d=8, classes=5):
        super().__init__()
        self.cls_token = nn.Parameter(torch.randn(1, 1, d))
        self.proj = nn.Linear(d, d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        tokens = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), self.proj(x)], dim=1)
        return self.head(torch.tanh(tokens).mean(dim=1) + tokens[:, 0])


class Tied(nn.Module):
    def __init__(self, vocab=9, d=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, idx):
        return self.out(torch.tanh(self.emb(idx)))


def _train(model, x, y, opt, steps=3):
    model = model.to(torch.float64).train()
    ref = copy.deepcopy(model)
    step = train_step(og.from_torch(model, (x,)), "cross_entropy", opt)
    topt = torch_optimizer(opt, ref.parameters())
    for i in range(steps):
        loss = step.run(x, y)
        want, _ = torch_step(ref, topt, x, y)
        assert abs(float(loss) - float(want)) <= 1e-12 * abs(float(want)), (i, float(loss), float(want))
    assert_same_training(model, ref, step, topt, tol=1e-12)
    return model, ref, step


def test_a_sliced_position_table_is_updated_whole_like_torch_adamw():
    """pos[:8] of 24 rows with AdamW (weight decay 0.05): rows 8..23 get no gradient but decay, and rows
    read once keep moving by their moments, as in torch.optim.AdamW (as a view they did not)."""
    torch.manual_seed(0)
    x = torch.randint(0, 11, (3, 8))
    y = torch.randint(0, 11, (3, 8))
    model, ref, step = _train(PosTable(), x, y, AdamW(1e-2, weight_decay=0.05), steps=3)
    pos_slot = next(s for s in step.params if s.key == "pos")
    assert pos_slot.source is None and step.graph.final.tensors[pos_slot.uid].dim == (24, 6)
    state = step.param_state("pos")
    assert tuple(state["exp_avg"].shape) == (24, 6)
    untouched = model.pos.detach()[8:]
    assert rel(untouched, ref.pos.detach()[8:]) <= 1e-12 and float(state["exp_avg"][8:].abs().max()) == 0.0


def test_an_expanded_class_token_gets_the_summed_gradient():
    """The class token read through expand: one input of its own dims (1, 1, D) times ones of (B, 1, D); its
    gradient is summed over the batch (the step used to fail to build: grad_cls_token with stride 0)."""
    torch.manual_seed(1)
    x = torch.randn(4, 3, 8, dtype=torch.float64)
    y = torch.randint(0, 5, (4,))
    for opt in (SGD(0.1, momentum=0.9), AdamW(1e-2, weight_decay=0.05)):
        model, ref, step = _train(ClsToken(), x, y, opt)
        slot = next(s for s in step.params if s.key == "cls_token")
        assert step.graph.final.tensors[slot.uid].dim == (1, 1, 8)
        assert rel(model.cls_token, ref.cls_token) <= 1e-12


def test_the_first_steps_gradient_of_an_expanded_parameter_matches_autograd():
    """SGD without momentum and lr 1: the update is the gradient itself."""
    torch.manual_seed(2)
    x = torch.randn(4, 3, 8, dtype=torch.float64)
    y = torch.randint(0, 5, (4,))
    model = ClsToken().to(torch.float64).train()
    ref = copy.deepcopy(model)
    before = model.cls_token.detach().clone()
    train_step(og.from_torch(model, (x,)), "cross_entropy", SGD(1.0)).run(x, y)
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    assert rel(before - model.cls_token.detach(), ref.cls_token.grad) <= 1e-12


def test_tied_weights_still_train_as_one():
    torch.manual_seed(3)
    x = torch.randint(0, 9, (2, 5))
    y = torch.randint(0, 9, (2, 5))
    model, _, step = _train(Tied(), x, y, AdamW(1e-2))
    assert [s.key for s in step.params].count("emb.weight") + [s.key for s in step.params].count("out.weight") == 1
    assert model.out.weight is model.emb.weight


def test_a_gradient_hook_sees_each_gradient_before_the_update():
    """The seam for a process group: a hook returning half of each gradient is SGD at half the rate."""
    torch.manual_seed(4)
    x = torch.randn(8, 6, dtype=torch.float64)
    y = torch.arange(8) % 5
    model = nn.Sequential(nn.Linear(6, 7), nn.Tanh(), nn.Linear(7, 5)).to(torch.float64).train()
    ref = copy.deepcopy(model)
    seen = []

    def halve(g, slot, grad):
        seen.append(slot.key)
        return g.mul(grad, 0.5, name=f"halve.{slot.key}")

    step = train_step(og.from_torch(model, (x,)), "cross_entropy", SGD(0.2), on_gradient=[halve])
    topt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(2):
        step.run(x, y)
        torch_step(ref, topt, x, y)
    assert sorted(seen) == sorted(k for k, _ in model.named_parameters())
    for p, q in zip(model.parameters(), ref.parameters()):
        assert rel(p, q) <= 1e-12


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("make", [PosTable, ClsToken], ids=["pos_table", "cls_token"])
def test_views_on_the_gpu(make):
    """The same modules in float32 on CUDA with the default engines (generated kernels reading the
    stride-0 ones of an expand), AdamW with weight decay, three steps against torch.optim (TF32 off there;
    opgraph's fp32 products may use TF32: a loose bound)."""
    torch.manual_seed(5)
    model = make().cuda().train()
    ref = copy.deepcopy(model)
    if make is PosTable:
        x, y = torch.randint(0, 11, (4, 8), device="cuda"), torch.randint(0, 11, (4, 8), device="cuda")
    else:
        x, y = torch.randn(4, 3, 8, device="cuda"), torch.randint(0, 5, (4,), device="cuda")
    opt = AdamW(1e-2, weight_decay=0.05)
    step = train_step(og.from_torch(model, (x,)), "cross_entropy", opt)
    topt = torch_optimizer(opt, ref.parameters())
    for _ in range(3):
        loss = step.run(x, y)
        want, _ = torch_step(ref, topt, x, y)
        assert abs(float(loss) - float(want)) <= 1e-3 * abs(float(want))
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert rel(p, q) <= 1e-3, name


@requires_interpreter
@pytest.mark.interpreter
def test_an_expanded_parameter_on_generated_kernels_matches_the_reference_engine():
    """The class token's ones (an input with zero strides) and its summed gradient through generated
    kernels (Triton's interpreter) against the reference engine, one AdamW step in float32."""
    torch.manual_seed(6)
    x, y = torch.randn(2, 3, 8), torch.randint(0, 5, (2,))
    base = ClsToken().train()
    results = []
    for engines in (["reference"], ["triton", "torch"]):
        model = copy.deepcopy(base)
        step = train_step(og.from_torch(model, (x,)), "cross_entropy", AdamW(1e-2, weight_decay=0.05))
        step.build("cpu", engines=engines)
        step.run(x, y)
        results.append({n: p.detach().clone() for n, p in model.named_parameters()})
    assert any(s.config.engine == "triton" for s in step.plan.steps)
    for name, p in results[0].items():
        assert rel(results[1][name], p) <= 1e-5, name
