"""opgraph.compile: an nn.Module whose forward and backward are opgraph plans, sharing the module's
parameters, against eager PyTorch (float64, the CPU reference engine)."""

from __future__ import annotations

import copy
import gc

import pytest

import opgraph as og

torch = pytest.importorskip("torch")
nn = torch.nn

from .compile_models import AUTOCAST, CASES, TOLERANCE, compare_training, make_case, mlp  # noqa: E402


@pytest.mark.parametrize("name", list(CASES))
def test_training_matches_eager(name):
    case = make_case(name)
    if case is None:
        pytest.skip("transformers is not installed")
    model, batches = case
    compiled = compare_training(model, batches, lambda m, example: og.compile(m, example), **TOLERANCE.get(name, {}))
    assert compiled._variants, "the plans were not used"


def test_parameters_are_the_modules_own():
    model = mlp().double()
    compiled = og.compile(model, (torch.randn(5, 6, dtype=torch.float64),))
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in model.parameters()]
    assert list(compiled.state_dict()) == list(model.state_dict())
    compiled.load_state_dict(model.state_dict())


def test_state_dict_is_the_modules_also_inside_a_parent(tmp_path):
    """compiled.state_dict() is the module's (its keys, its tensors: storage shared) and loads into the
    plain module class; a parent holding the compiled module saves and loads under the parent's keys,
    and what is loaded is what the plans read next."""
    torch.manual_seed(0)
    model = make_case("cnn_batchnorm")[0]
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    compiled = og.compile(model, (x,))
    sd = compiled.state_dict()
    assert list(sd) == list(model.state_dict())
    assert all(sd[k].data_ptr() == v.data_ptr() for k, v in model.state_dict().items())
    torch.save(sd, tmp_path / "m.pt")
    plain = make_case("cnn_batchnorm")[0]
    plain.load_state_dict(torch.load(tmp_path / "m.pt", weights_only=True))
    parent = nn.Sequential(compiled, nn.Linear(3, 2).double())
    assert list(parent.state_dict()) == [f"0.{k}" for k in sd] + ["1.weight", "1.bias"]
    torch.manual_seed(1)
    other = nn.Sequential(og.compile(make_case("cnn_batchnorm")[0], (x,)), nn.Linear(3, 2).double())
    result = other.load_state_dict(parent.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    for k, v in parent.state_dict().items():
        assert torch.equal(other.state_dict()[k], v), k
    model.eval()
    other.eval()
    with torch.no_grad():
        torch.testing.assert_close(other(x), parent(x), rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match="Missing key"):
        other.load_state_dict({k: v for k, v in parent.state_dict().items() if k != "0.1.weight"})


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
    ddp = None
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
        sd = ddp.state_dict()  # DDP's keys ("module." + the module's), and back
        assert list(sd) == [f"module.{k}" for k in model.state_dict()]
        ddp.load_state_dict(sd)
    finally:
        # DDP's reducer holds the group: dropped while the group lives (the last reference to a destroyed
        # gloo group, released later, can wait for good in its destructor's join: seen in CI)
        ddp = None
        gc.collect()
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


# -- autocast: the outputs have eager PyTorch's types ------------------------------------------------------------


@pytest.mark.parametrize("name", list(AUTOCAST))
def test_autocast_outputs_have_eager_types(name):
    """Under torch.autocast(bfloat16) on the CPU: each output has the type eager PyTorch gives it (bf16
    for matmul and convolution results and what follows them in their type, fp32 for a layer norm's),
    values within bf16 error of eager's, gradients as far from fp32's as eager's bf16 ones are (a conv
    bias before a batchnorm, whose gradient is rounding noise, left out); outside autocast, the
    module's type again."""
    torch.manual_seed(0)
    model, x = AUTOCAST[name]()
    eager, exact = copy.deepcopy(model), copy.deepcopy(model)
    compiled = og.compile(model, (x,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs = torch.utils._pytree.tree_leaves(compiled(x))
        refs = torch.utils._pytree.tree_leaves(eager(x))
    assert [o.dtype for o in outs] == [r.dtype for r in refs]
    assert any(r.dtype == torch.bfloat16 for r in refs)
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o.float(), r.float(), rtol=5e-2, atol=5e-2)
    sum(o.float().square().mean() for o in outs).backward()
    sum(r.float().square().mean() for r in refs).backward()
    sum(r.square().mean() for r in torch.utils._pytree.tree_leaves(exact(x))).backward()
    for (key, p), q, e in zip(model.named_parameters(), eager.parameters(), exact.parameters()):
        norm = float(e.grad.norm())
        if norm < 1e-4 * max(float(t.grad.norm()) for t in exact.parameters()):
            continue
        ours, theirs = float((p.grad - e.grad).norm()) / norm, float((q.grad - e.grad).norm()) / norm
        # (4x: the bf16 batchnorm backward of cnn_batchnorm's first block is ~3.3x eager's distance from fp32)
        assert ours <= max(4 * theirs, 2e-2), (key, ours, theirs)
    plain = torch.utils._pytree.tree_leaves(compiled(x))
    assert all(o.dtype == torch.float32 for o in plain)


def test_autocast_types_without_a_fake_run(monkeypatch):
    """Where the module cannot run on fake tensors, each output takes the autocast type of the op that
    makes it (a linear's: bf16)."""
    import torch.func

    def fails(*args, **kwargs):
        raise RuntimeError("no fake run")

    monkeypatch.setattr(torch.func, "functional_call", fails)
    torch.manual_seed(0)
    model = make_case("mlp")[0].float()
    compiled = og.compile(model, (torch.randn(5, 6),))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiled(torch.randn(5, 6))
    assert out.dtype == torch.bfloat16


# -- double backward -----------------------------------------------------------------------------------------------


def test_double_backward_is_a_typed_error():
    """create_graph=True gives the gradients' values (as eager's); differentiating them (a gradient
    penalty) raises UnsupportedGraphError naming the rule, not PyTorch's generic message."""
    torch.manual_seed(0)
    model = mlp().double()
    eager = copy.deepcopy(model)
    compiled = og.compile(model, (torch.randn(5, 6, dtype=torch.float64),))
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(compiled(x).square().sum(), x, create_graph=True)
    (want,) = torch.autograd.grad(eager(x).square().sum(), x)
    torch.testing.assert_close(gx, want, rtol=1e-10, atol=1e-10)
    assert gx.requires_grad
    with pytest.raises(og.UnsupportedGraphError, match="compile.double_backward") as info:
        gx.square().sum().backward()
    assert "eager module" in info.value.hint
    out = compiled(x)
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(og.UnsupportedGraphError, match="compile.double_backward"):
        (out.sum() + gx.norm()).backward()  # a gradient penalty
    grads = torch.autograd.grad(compiled(x).sum(), list(model.parameters()), create_graph=True)
    want = torch.autograd.grad(eager(x).sum(), list(eager.parameters()))
    for g, w in zip(grads, want):  # gradients as values: fine
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


def test_second_backward_after_retain_graph_is_a_typed_error():
    model = mlp().double()
    compiled = og.compile(model, (torch.randn(5, 6, dtype=torch.float64),))
    loss = compiled(torch.randn(5, 6, dtype=torch.float64)).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(og.UnsupportedGraphError, match="compile.retain_graph"):
        loss.backward()
