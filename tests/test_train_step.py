"""opgraph.training.train_step against PyTorch: the same module trained by autograd + torch.optim
(+ clip_grad_norm_, autocast, GradScaler) and by one opgraph step graph.

On the CPU: float64 modules on the reference engine, parameters, optimizer state, the loss and the
gradient norm within 1e-12 (relative) over several steps, for every optimizer and option, on an MLP,
a batchnorm CNN and small GPTs (tied embedding, learned or rotary positions, LayerNorm or RMSNorm,
GELU or SwiGLU, attention as matmuls or as F.scaled_dot_product_attention, a custom op); bf16 and fp16
mixed precision against torch.autocast (+ GradScaler) on the CPU at 16-bit tolerance; the plan's
structure (updates fused into GEMM epilogues under the interpreter). Marked gpu: bf16 AdamW with
clipping and fp16 loss scaling against PyTorch on CUDA, CUDA-graph replay against execute, example 15.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest

import opgraph as og
from opgraph.training import MSE, SGD, AdamW, CrossEntropy, train_step

from .helpers import requires_cuda, requires_interpreter, run_example

torch = pytest.importorskip("torch")
F = torch.nn.functional
nn = torch.nn
EXAMPLES = Path(__file__).parent.parent / "examples"


def mlp(dtype=torch.float64, classes=5):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.LayerNorm(12), nn.Linear(12, classes)).to(dtype).train()


def gpt(dtype=torch.float64, **kw):
    from .frontends.gpt_models import GPT

    torch.manual_seed(0)
    return GPT(**kw).to(dtype).train()


def torch_optimizer(opt, params):
    h = opt.hyper
    if isinstance(opt, AdamW):
        return torch.optim.AdamW(
            params, lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"], weight_decay=h["weight_decay"]
        )
    return torch.optim.SGD(
        params, lr=h["lr"], momentum=h["momentum"], nesterov=opt.nesterov, weight_decay=h["weight_decay"]
    )


def torch_step(model, opt, x, y, *, loss="cross_entropy", clip=None, autocast=None, scaler=None):
    opt.zero_grad(set_to_none=True)
    ctx = (
        torch.autocast("cpu" if x.device.type == "cpu" else "cuda", dtype=autocast)
        if autocast
        else torch.autocast("cpu", enabled=False)
    )
    with ctx:
        out = model(x)
        if loss == "cross_entropy":
            value = F.cross_entropy(
                out.reshape(-1, out.shape[-1]).float() if autocast else out.reshape(-1, out.shape[-1]), y.reshape(-1)
            )
        else:
            value = F.mse_loss(out.float() if autocast else out, y)
    norm = None
    if scaler is not None:
        scaler.scale(value).backward()
        scaler.unscale_(opt)
    else:
        value.backward()
    if clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    return value.detach(), norm


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def assert_same_training(model, ref, step, topt, *, tol):
    """Parameters and optimizer state of `model` (trained by `step`) and `ref` (by `topt`); a state
    tensor near zero (a conv bias before batchnorm gets rounding noise as gradient) is measured
    against its kind's largest norm."""
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert rel(p, q) <= tol, (name, rel(p, q))
    scale: dict[str, float] = {}
    for q in ref.parameters():
        for key, value in topt.state[q].items():
            if isinstance(value, torch.Tensor) and value.numel() > 1:
                scale[key] = max(scale.get(key, 0.0), float(value.double().norm()))
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        for key, value in step.param_state(name).items():
            want = topt.state[q][key].double()
            err = float((value.double() - want).norm()) / max(float(want.norm()), 1e-3 * scale[key], 1e-30)
            assert err <= tol, (name, key, err)


# -- one and several steps, every optimizer and option, float64 on the CPU -------------------------------

OPTIMIZERS = {
    "sgd": lambda: SGD(0.1),
    "sgd_momentum": lambda: SGD(0.05, momentum=0.9),
    "sgd_nesterov_decay": lambda: SGD(0.05, momentum=0.8, nesterov=True, weight_decay=0.01),
    "sgd_decay": lambda: SGD(0.1, weight_decay=0.05),
    "adamw": lambda: AdamW(1e-2),
    "adamw_betas": lambda: AdamW(3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("clip", [None, 0.5])
def test_optimizers_match_torch(name, clip):
    model = mlp()
    ref = copy.deepcopy(model)
    x = torch.randn(8, 6, dtype=torch.float64)
    y = torch.arange(8) % 5
    opt = OPTIMIZERS[name]()
    step = train_step(og.from_torch(model, (x,)), "cross_entropy", opt, grad_clip_norm=clip)
    topt = torch_optimizer(opt, ref.parameters())
    for i in range(3):
        loss = step.run(x, y)
        want, norm = torch_step(ref, topt, x, y, clip=clip)
        assert loss.shape == () and abs(float(loss) - float(want)) <= 1e-12 * float(want), i
        if clip is not None:
            assert abs(float(step.grad_norm) - float(norm)) <= 1e-12 * float(norm)
            assert float(norm) > clip  # the clip acts
    assert_same_training(model, ref, step, topt, tol=1e-12)
    if isinstance(opt, AdamW):
        assert step.step_count == 3


def test_hyper_parameters_are_device_scalars_read_every_step():
    """A schedule writes lr (and weight decay) between steps; no rebuild, the same plan."""
    model = mlp()
    ref = copy.deepcopy(model)
    x = torch.randn(8, 6, dtype=torch.float64)
    y = torch.arange(8) % 5
    opt = AdamW(1e-2, weight_decay=0.0)
    step = train_step(og.from_torch(model, (x,)), optimizer=opt)
    topt = torch_optimizer(opt, ref.parameters())
    plan = None
    for i, (lr, wd) in enumerate([(1e-2, 0.0), (3e-3, 0.1), (5e-4, 0.2)]):
        opt.set(lr=lr)
        opt.weight_decay = wd
        for group in topt.param_groups:
            group["lr"], group["weight_decay"] = lr, wd
        step.run(x, y)
        torch_step(ref, topt, x, y)
        plan = plan or step.plan
        assert step.plan is plan
    assert_same_training(model, ref, step, topt, tol=1e-12)
    assert opt.lr == 5e-4


def test_mse_and_a_loss_function():
    """loss='mse' on a regression net, and the same loss written as ops (differentiated by opgraph.grad)."""
    torch.manual_seed(1)
    base = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double().train()
    x = torch.randn(5, 4, dtype=torch.float64)
    t = torch.randn(5, 3, dtype=torch.float64)

    def half_mse(g, out, target):
        d = g.sub(out, target)
        r = g.reduction(g.mul(d, d), "avg").set_dim([1, 1]).set_data_type("double")
        return g.reshape(g.mul(r, 2.0), [1])  # = mse * 2

    for loss, scale in (("mse", 1.0), (MSE(), 1.0), (half_mse, 2.0)):
        model, ref = copy.deepcopy(base), copy.deepcopy(base)
        step = train_step(og.from_torch(model, (x,)), loss, SGD(0.1, momentum=0.5))
        topt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.5)
        for _ in range(2):
            got = step.run(x, t)
            topt.zero_grad()
            want = F.mse_loss(ref(x), t) * scale
            want.backward()
            topt.step()
            assert abs(float(got) - float(want)) <= 1e-12 * float(want)
        assert_same_training(model, ref, step, topt, tol=1e-12)


def test_cross_entropy_ignore_index_and_label_smoothing():
    model = gpt()
    ref = copy.deepcopy(model)
    idx = torch.randint(0, 17, (2, 8))
    y = torch.randint(0, 17, (2, 8))
    y[0, :3] = -100
    step = train_step(og.from_torch(model, (idx,)), CrossEntropy(label_smoothing=0.1), SGD(0.2))
    topt = torch.optim.SGD(ref.parameters(), lr=0.2)
    for _ in range(2):
        got = step.run(idx, y)
        topt.zero_grad()
        want = F.cross_entropy(ref(idx).reshape(-1, 17), y.reshape(-1), ignore_index=-100, label_smoothing=0.1)
        want.backward()
        topt.step()
        assert abs(float(got) - float(want)) <= 1e-12 * float(want)
    assert_same_training(model, ref, step, topt, tol=1e-12)


GPTS = [
    dict(),
    dict(positions="rotary", norm="rms", mlp="swiglu"),
    dict(positions="rotary", attention="sdpa", layers=1),
]


@pytest.mark.parametrize("kw", GPTS, ids=["learned-layernorm-gelu", "rotary-rmsnorm-swiglu", "sdpa-custom-op"])
def test_gpt_trains_like_torch(kw):
    """Tied embedding/head (one parameter, gradients of both uses summed, updated once), every part of a
    GPT block, AdamW and clipping; F.scaled_dot_product_attention as a custom op whose backward is
    torch.autograd's (listed in the import report)."""
    model = gpt(**kw)
    ref = copy.deepcopy(model)
    idx = torch.randint(0, 17, (3, 8))
    y = torch.randint(0, 17, (3, 8))
    imported = og.from_torch(model, (idx,))
    if kw.get("attention") == "sdpa":  # a custom op until opgraph translates it (then no custom op)
        assert {e.target for e in imported.report.custom_ops} <= {"aten.scaled_dot_product_attention.default"}
    else:
        assert not imported.report.custom_ops, imported.report
    opt = SGD(0.1, momentum=0.9)
    step = train_step(imported, "cross_entropy", opt, grad_clip_norm=1.0)
    topt = torch_optimizer(opt, ref.parameters())
    for _ in range(2):
        got = step.run(idx, y)
        want, norm = torch_step(ref, topt, idx, y, clip=1.0)
        assert abs(float(got) - float(want)) <= 1e-12 * float(want)
        assert abs(float(step.grad_norm) - float(norm)) <= 1e-12 * float(norm)
    assert_same_training(model, ref, step, topt, tol=1e-12)
    # the tied weight: one input of the step graph, written by one op
    final = step.graph.final
    tied = [p for p in step.params if p.source is None]
    assert [p.key for p in tied] == ["head.weight"]
    writers = [n for n in final.nodes if tied[0].uid in n.output_uids()]
    assert len(writers) == 1 and tied[0].uid in writers[0].input_uids()


def test_batchnorm_running_stats_are_written_back():
    torch.manual_seed(0)
    model = (
        nn.Sequential(
            nn.Conv2d(2, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4, 3),
        )
        .double()
        .train()
    )
    ref = copy.deepcopy(model)
    x = torch.randn(4, 2, 5, 5, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 1])
    opt = SGD(0.1, momentum=0.9)  # (AdamW would blow up the rounding noise of the conv bias's zero gradient)
    step = train_step(og.from_torch(model, (x,)), optimizer=opt)
    topt = torch_optimizer(opt, ref.parameters())
    for _ in range(2):
        step.run(x, y)
        torch_step(ref, topt, x, y)
    assert_same_training(model, ref, step, topt, tol=1e-12)
    for a, b in zip(model.buffers(), ref.buffers()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert int(model[1].num_batches_tracked) == 2


# -- mixed precision on the CPU (reference engine rounding as the GPU does) --------------------------------


def test_bf16_mixed_precision_like_autocast():
    """fp32 master weights and optimizer state, bf16 compute copies and GEMMs: within bf16 error of
    torch.autocast (CPU) over three SGD steps, and the graph has what autocast makes."""
    model = gpt(torch.float32)
    ref, fp32 = copy.deepcopy(model), copy.deepcopy(model)
    idx = torch.randint(0, 17, (2, 8))
    y = torch.randint(0, 17, (2, 8))
    step = train_step(og.from_torch(model, (idx,)), "cross_entropy", SGD(0.5, momentum=0.9), mixed_precision="bf16")
    topt = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9)
    fopt = torch.optim.SGD(fp32.parameters(), lr=0.5, momentum=0.9)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    for _ in range(3):
        got = step.run(idx, y)
        want, _ = torch_step(ref, topt, idx, y, autocast=torch.bfloat16)
        exact, _ = torch_step(fp32, fopt, idx, y)
        assert abs(float(got) - float(want)) <= 2e-2 * float(want)
        assert abs(float(got) - float(exact)) > 0  # bf16 really rounds
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.dtype == torch.float32
        assert rel(p - start[name], q - start[name]) <= 5e-2, name  # the updates agree to bf16 accuracy
    final = step.graph.final
    gemms = [n for n in final.nodes if n.kind == "matmul"]
    assert gemms and all(final.tensors[u].data_type is og.DataType.BFLOAT16 for n in gemms for u in n.input_uids())
    assert final.tensors[step.loss.uid].data_type is og.DataType.FLOAT
    assert all(final.tensors[p.uid].data_type is og.DataType.FLOAT for p in step.params)


class _ClassToken(torch.nn.Module):
    """ViT's front: an fp32 class token concatenated before the patch embeddings (a 16-bit GEMM's
    result under autocast), then a pooled head."""

    def __init__(self) -> None:
        super().__init__()
        self.cls = torch.nn.Parameter(torch.randn(1, 1, 8))
        self.proj = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.cat([self.cls.expand(x.shape[0], -1, -1), self.proj(x)], dim=1)
        return self.head(t.mean(1))


def test_bf16_mixed_precision_concatenates_as_autocast_promotes():
    """cat of an fp32 and a bf16 operand runs in fp32 (autocast's promotion), as torch.autocast computes
    it: the timm ViT training row failed to build on the GPU with concatenate's type rule."""
    torch.manual_seed(0)
    model = _ClassToken().train()
    ref = copy.deepcopy(model)
    x = torch.randn(3, 5, 4)
    y = torch.tensor([0, 4, 2])
    step = train_step(og.from_torch(model, (x,)), "cross_entropy", SGD(0.5), mixed_precision="bf16")
    topt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for _ in range(2):
        got = step.run(x, y)
        want, _ = torch_step(ref, topt, x, y, autocast=torch.bfloat16)
        assert abs(float(got) - float(want)) <= 2e-2 * float(want)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert rel(p, q) <= 2e-2
    final = step.graph.final
    (cat,) = [n for n in final.nodes if n.kind == "concatenate"]
    assert {final.tensors[u].data_type for u in cat.input_uids()} == {og.DataType.FLOAT}


def test_fp16_dynamic_loss_scale_like_grad_scaler():
    """An initial scale that overflows: steps are skipped (nothing changes, the step counter neither)
    and the scale halves, as GradScaler does; clean steps grow it every growth_interval."""
    model = mlp(torch.float32)
    ref = copy.deepcopy(model)
    x = torch.randn(8, 6)
    y = torch.arange(8) % 5
    cfg = {"init_scale": 2.0**40, "growth_interval": 2}
    opt = AdamW(1e-2)
    step = train_step(
        og.from_torch(model, (x,)), optimizer=opt, mixed_precision="fp16", grad_clip_norm=1.0, loss_scale=cfg
    )
    topt = torch_optimizer(opt, ref.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=cfg["init_scale"], growth_interval=cfg["growth_interval"])
    scales, counts = [], []
    before = [p.detach().clone() for p in model.parameters()]
    for i in range(30):
        got = step.run(x, y)
        want, _ = torch_step(ref, topt, x, y, clip=1.0, autocast=torch.float16, scaler=scaler)
        assert abs(float(got) - float(want)) <= 1e-2 * float(want)
        scales.append((step.loss_scale, scaler.get_scale()))
        counts.append(step.step_count)
        if i == 0:  # skipped: the parameters did not move
            assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert all(a == b for a, b in scales), scales
    assert scales[0][0] == 2.0**39 and max(s for s, _ in scales) > min(s for s, _ in scales[5:])
    assert counts[-1] == topt.state[next(iter(ref.parameters()))]["step"]
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert rel(p, q) <= 2e-2, name


def test_fp16_loss_scale_seeds_a_loss_function():
    """A loss written as ops (differentiated by opgraph.grad) is seeded with the loss scale."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).train()
    ref = copy.deepcopy(model)
    x, t = torch.randn(5, 4), torch.randn(5, 3)

    def mse(g, out, target):
        d = g.sub(out, target)
        return g.reduction(g.mul(d, d), "avg").set_dim([1, 1]).set_data_type("float")

    step = train_step(
        og.from_torch(model, (x,)), mse, SGD(0.1), mixed_precision="fp16", loss_scale={"init_scale": 1024.0}
    )
    topt = torch.optim.SGD(ref.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for _ in range(3):
        got = step.run(x, t)
        want, _ = torch_step(ref, topt, x, t, loss="mse", autocast=torch.float16, scaler=scaler)
        assert abs(float(got) - float(want)) <= 1e-3 * float(want)
    assert step.loss_scale == scaler.get_scale() == 1024.0
    for p, q in zip(model.parameters(), ref.parameters()):
        assert rel(p, q) <= 1e-3


# -- the pack, the plan, errors ------------------------------------------------------------------------------


def test_run_builds_once_and_returns_a_copy_of_the_loss():
    model = mlp()
    x = torch.randn(8, 6, dtype=torch.float64)
    step = train_step(og.from_torch(model, (x,)), optimizer=SGD(0.1))
    first = step.run(x, torch.arange(8) % 5)
    plan, pack = step.plan, step._pack
    second = step.run(x.flip(0), (torch.arange(8) + 1) % 5)
    assert step.plan is plan and step.pack(x, target=torch.arange(8) % 5) is pack
    assert float(first) != float(second)
    assert step.plan.device.kind == "cpu"


@pytest.mark.parametrize("allow_tf32", [False, True])
def test_the_plan_computes_fp32_products_as_the_import_allows(allow_tf32, monkeypatch):
    """TF32 (NumericalNote.DOWN_CONVERT_INPUTS) only where from_torch's allow_tf32 (or PyTorch's settings
    at import) allowed it, as ImportedGraph.run; build's own allow_tf32 and filters override and add."""
    from opgraph.core.config import NumericalNote

    model = mlp(torch.float32)
    x = torch.randn(8, 6)
    step = train_step(og.from_torch(model, (x,), allow_tf32=allow_tf32), optimizer=SGD(0.1))
    seen: list[dict] = []
    build = step.graph.build
    monkeypatch.setattr(step.graph, "build", lambda **kw: seen.append(kw) or build(**kw))
    step.run(x, torch.arange(8) % 5)
    step.build("cpu", allow_tf32=not allow_tf32, deselect_numeric_notes=["TENSOR_CORE"])
    run, explicit = (list(kw.get("deselect_numeric_notes", ())) for kw in seen)
    assert run == ([] if allow_tf32 else [NumericalNote.DOWN_CONVERT_INPUTS])
    assert explicit == (["TENSOR_CORE", NumericalNote.DOWN_CONVERT_INPUTS] if allow_tf32 else ["TENSOR_CORE"])
    assert seen[0]["device"] == "cpu" and step.plan.device.kind == "cpu"


def test_errors_name_the_rule():
    model = mlp()
    x = torch.randn(8, 6, dtype=torch.float64)
    imported = og.from_torch(model, (x,))
    cases = [
        (lambda: train_step(imported, mixed_precision="fp8"), "training.mixed_precision"),
        (lambda: train_step(imported, grad_clip_norm=0.0), "training.clip"),
        (lambda: train_step(imported, loss="hinge"), "training.loss"),
        (lambda: train_step(imported, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)), "training.optimizer"),
        (lambda: SGD(0.1, nesterov=True), "training.nesterov"),
        (lambda: AdamW(0.1, betas=(1.0, 0.9)), "training.betas"),
        (lambda: SGD(0.1).set(beta1=0.9), "training.hyper"),
        (
            lambda: train_step(
                imported, loss_scale={"init_scale": 2.0}, mixed_precision="fp16", optimizer=SGD(0.1)
            ).run(x),
            "training.target",
        ),
        (lambda: train_step(imported, optimizer=SGD(0.1)).run(x, torch.arange(7)), "training.target_shape"),
        (lambda: train_step(og.from_torch(model.half(), (x.half(),)), mixed_precision="bf16"), "training.master_type"),
    ]
    for make, rule in cases:
        with pytest.raises(og.GraphError) as err:
            make()
        assert err.value.rule == rule, (rule, err.value)

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 2)

        def forward(self, x):
            return self.a(x), self.b(x)

    with pytest.raises(og.GraphError) as err:
        train_step(og.from_torch(TwoHeads().double(), (torch.randn(2, 4, dtype=torch.float64),)))
    assert err.value.rule == "training.outputs"


# -- generated kernels under the interpreter -------------------------------------------------------------------


@requires_interpreter
@pytest.mark.interpreter
def test_updates_fuse_into_gradient_kernels_under_the_interpreter():
    """Without clipping, each weight's AdamW update runs in the epilogue of the GEMM that makes its
    gradient, in place on the parameter and its two moments; losses and parameters equal the
    reference engine's over three steps."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 8)).float().train()
    x = torch.randn(4, 8)
    y = torch.randint(0, 8, (4,))
    models, steps = {}, {}
    for engines in (("reference",), ("triton", "torch")):
        models[engines] = copy.deepcopy(base)
        steps[engines] = train_step(og.from_torch(models[engines], (x,)), optimizer=AdamW(1e-2))
        steps[engines].build("cpu", engines=list(engines))
    losses = {e: [float(s.run(x, y)) for _ in range(3)] for e, s in steps.items()}
    np.testing.assert_allclose(losses[("triton", "torch")], losses[("reference",)], rtol=1e-5)
    for p, q in zip(models[("triton", "torch")].parameters(), models[("reference",)].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    step = steps[("triton", "torch")]
    weights = {p.uid for p in step.params if step.graph.final.tensors[p.uid].dim[0] > 1}
    fused = set()
    for s in step.plan.steps:
        if s.config.knob("template") == "matmul":
            written = set(s.piece.outputs) & weights
            fused |= written
    assert fused == weights, step.plan.describe()


# -- on the GPU ---------------------------------------------------------------------------------------------------


def _gpu_gpt(**kw):
    from .frontends.gpt_models import GPT

    torch.manual_seed(0)
    return GPT(vocab=97, d=64, heads=4, seq=32, layers=2, **kw).cuda().train()


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("mixed,clip", [("bf16", 1.0), ("fp16", 1.0), ("bf16", None)])
def test_gpt_mixed_precision_on_the_gpu(mixed, clip):
    model = _gpu_gpt()
    ref = copy.deepcopy(model)
    idx = torch.randint(0, 97, (4, 32), device="cuda")
    y = torch.randint(0, 97, (4, 32), device="cuda")
    opt = AdamW(1e-3)
    step = train_step(og.from_torch(model, (idx,)), "cross_entropy", opt, mixed_precision=mixed, grad_clip_norm=clip)
    topt = torch_optimizer(opt, ref.parameters())
    dt = torch.bfloat16 if mixed == "bf16" else torch.float16
    scaler = torch.amp.GradScaler("cuda") if mixed == "fp16" else None
    for _ in range(5):
        got = step.run(idx, y)
        want, norm = torch_step(ref, topt, idx, y, clip=clip, autocast=dt, scaler=scaler)
        assert abs(float(got) - float(want)) <= 2e-2 * float(want)
        if clip is not None:
            assert abs(float(step.grad_norm) - float(norm)) <= 5e-2 * float(norm)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        m, mr = step.param_state(name)["exp_avg"], topt.state[q]["exp_avg"]
        assert rel(m, mr) <= 0.1, name  # the first moments (linear in the gradients) at 16-bit accuracy
    if mixed == "fp16":
        assert step.loss_scale == scaler.get_scale()


@pytest.mark.gpu
@requires_cuda
def test_cuda_graph_replay_equals_run():
    """A captured step replayed on new batches, the learning rate changed between replays, gives the
    losses and parameters of step.run on a copy of the module."""
    model = _gpu_gpt()
    twin = copy.deepcopy(model)
    batches = [
        (torch.randint(0, 97, (4, 32), device="cuda"), torch.randint(0, 97, (4, 32), device="cuda")) for _ in range(6)
    ]
    steps = {}
    for name, m in (("run", model), ("graph", twin)):
        steps[name] = train_step(
            og.from_torch(m, (batches[0][0],)), "cross_entropy", AdamW(1e-3), mixed_precision="bf16", grad_clip_norm=1.0
        )
    captured = steps["graph"].capture(*batches[0])
    for i, (idx, y) in enumerate(batches):
        lr = 1e-3 * (1 + math.cos(math.pi * i / len(batches))) / 2
        for s in steps.values():
            s.optimizer.set(lr=lr)
        a = float(steps["run"].run(idx, y))
        b = float(captured.replay(idx, y))
        assert abs(a - b) <= 1e-6 * abs(a), i
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert steps["graph"].step_count == len(batches)


@pytest.mark.gpu
@requires_cuda
def test_example_15_on_the_gpu():
    run_example("15_train_char_gpt.py", "--steps", "60", timeout=900)


def test_capture_warm_up_undoes_its_step():
    """capture() warms up with one real step and must undo all of it (parameters and optimizer state
    are updated in place: outputs of the step graph, not its inputs): the next step equals a twin's."""
    model = gpt(torch.float32, vocab=37, d=32, heads=2, seq=16, layers=1)
    twin = copy.deepcopy(model)
    idx, y = torch.randint(0, 37, (2, 16)), torch.randint(0, 37, (2, 16))
    a, b = (
        train_step(og.from_torch(m, (idx,)), "cross_entropy", AdamW(1e-2), grad_clip_norm=1.0) for m in (model, twin)
    )
    pack = b.pack(idx, y)
    b.build("cpu")
    saved = b._snapshot(pack)
    b.plan.execute(pack)
    b.imported.write_back(pack)
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))  # it stepped
    b._restore(saved)
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)
    assert float(a.run(idx, y)) == float(b.run(idx, y))
    assert b.step_count == a.step_count == 1
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):  # the state the step read too
        assert torch.equal(p, q), name
        for key, value in a.param_state(name).items():
            assert torch.equal(value, b.param_state(name)[key]), (name, key)
