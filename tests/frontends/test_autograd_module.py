"""opgraph.compile: an nn.Module whose forward and backward are opgraph plans, sharing the module's
parameters, against eager PyTorch (float64, the CPU reference engine)."""

from __future__ import annotations

import copy

import pytest

import opgraph as og

torch = pytest.importorskip("torch")
nn = torch.nn

from .compile_models import CASES, compare_training, make_case, mlp  # noqa: E402


@pytest.mark.parametrize("name", list(CASES))
def test_training_matches_eager(name):
    case = make_case(name)
    if case is None:
        pytest.skip("transformers is not installed")
    model, batches = case
    compiled = compare_training(model, batches, lambda m, example: og.compile(m, example))
    assert compiled._variants, "the plans were not used"


def test_parameters_are_the_modules_own():
    model = mlp().double()
    compiled = og.compile(model, (torch.randn(5, 6, dtype=torch.float64),))
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in model.parameters()]
    assert list(compiled.state_dict()) == list(model.state_dict())
    compiled.load_state_dict(model.state_dict())


def test_input_gradient_hooks_and_two_forwards_before_backward():
    torch.manual_seed(0)
    model = mlp().double()
    eager = copy.deepcopy(model)
    compiled = og.compile(model, (torch.randn(5, 6, dtype=torch.float64),))
    seen = []
    model[0].weight.register_hook(lambda g: seen.append(g.clone()))
    x1 = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    x2 = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    # two forwards, then one backward: each keeps its own saved activations
    loss = compiled(x1).square().sum() + compiled(x2).sin().sum()
    loss.backward()
    y1 = x1.detach().clone().requires_grad_()
    y2 = x2.detach().clone().requires_grad_()
    (eager(y1).square().sum() + eager(y2).sin().sum()).backward()
    torch.testing.assert_close(x1.grad, y1.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(x2.grad, y2.grad, rtol=1e-10, atol=1e-10)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-10)
    assert len(seen) == 1 and torch.equal(seen[0], model[0].weight.grad)


def test_eval_mode_no_grad_and_mode_switch():
    torch.manual_seed(0)
    model = make_case("cnn_batchnorm")[0]
    eager = copy.deepcopy(model)
    x = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    compiled = og.compile(model, (x,))
    model.eval()
    eager.eval()
    with torch.no_grad():
        out = compiled(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, eager(x), rtol=1e-10, atol=1e-10)
    # eval-mode batchnorm is differentiable too (weight and bias get gradients)
    compiled(x).sum().backward()
    eager(x).sum().backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-10, msg=name)
    model.train()
    eager.train()
    torch.testing.assert_close(compiled(x), eager(x), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(model[1].running_mean, eager[1].running_mean, rtol=1e-12, atol=1e-12)


def test_frozen_parameters_get_no_gradient():
    torch.manual_seed(0)
    model = mlp().double()
    model[0].requires_grad_(False)
    compiled = og.compile(model, (torch.randn(5, 6, dtype=torch.float64),))
    compiled(torch.randn(5, 6, dtype=torch.float64)).sum().backward()
    assert model[0].weight.grad is None and model[2].weight.grad is not None


def test_new_input_shape_imports_again(caplog):
    torch.manual_seed(0)
    model = mlp().double()
    eager = copy.deepcopy(model)
    compiled = og.compile(model, (torch.randn(5, 6, dtype=torch.float64),))
    x = torch.randn(3, 6, dtype=torch.float64)
    with caplog.at_level("INFO", logger="opgraph.dynamo"):
        out = compiled(x)
    torch.testing.assert_close(out, eager(x), rtol=1e-10, atol=1e-10)
    assert "importing Sequential again" in caplog.text


def test_autocast_and_grad_scaler_work_around_it():
    torch.manual_seed(0)
    model = mlp()  # float32: autocast's bf16 compute, fp32 master weights
    eager = copy.deepcopy(model)
    x = torch.randn(5, 6)
    compiled = og.compile(model, (x,))
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiled(x)
        ref = eager(x)
    torch.testing.assert_close(out.float(), ref.float(), rtol=3e-2, atol=3e-2)
    scaler.scale(out.float().square().mean()).backward()
    ref.float().square().mean().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad / 64.0, q.grad, rtol=5e-2, atol=5e-2)
    scaler.step(opt)
    scaler.update()
    assert model[0].weight.dtype == torch.float32


def test_not_a_module_is_a_typed_error():
    with pytest.raises(og.UnsupportedGraphError, match="compile.module"):
        og.compile(lambda x: x, (torch.randn(2),))


def test_distributed_data_parallel_wraps_it(tmp_path):
    """DDP (one process, gloo) wraps the compiled module: its reducer sees the gradients the plan
    makes, through the module's own parameters."""
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = mlp().double()
        eager = copy.deepcopy(model)
        x = torch.randn(5, 6, dtype=torch.float64)
        ddp = nn.parallel.DistributedDataParallel(og.compile(model, (x,)))
        ddp(x).square().sum().backward()
        eager(x).square().sum().backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-10)
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_gpu_gpt_training_steps(autocast):
    """On a GPU (the generated kernels): the GPT trained 5 AdamW steps by opgraph.compile and by eager
    PyTorch, fp32 (TF32 off on both sides) or under bf16 autocast."""
    from .compile_models import make_case

    model, batches = make_case("gpt")
    model = model.float().cuda()
    eager = copy.deepcopy(model)
    (ids,), _ = batches(0)
    compiled = og.compile(model, (ids.cuda(),), deselect_numeric_notes=["DOWN_CONVERT_INPUTS"])  # no TF32
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt_eager = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    tol = 3e-2 if autocast else 2e-3
    for step in range(5):
        (ids,), target = batches(step)
        ids, target = ids.cuda(), target.cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = nn.functional.cross_entropy(compiled(ids).flatten(0, 1).float(), target.flatten())
            loss_eager = nn.functional.cross_entropy(eager(ids).flatten(0, 1).float(), target.flatten())
        torch.testing.assert_close(loss, loss_eager, rtol=tol, atol=tol)
        loss.backward()
        loss_eager.backward()
        opt.step()
        opt_eager.step()
        opt.zero_grad()
        opt_eager.zero_grad()
