"""TrainStep.state_dict / load_state_dict (opgraph.training.checkpoint): a resumed run continues bit for
bit in a new process; a checkpoint moves between a training step and torch.optim (both ways); a
checkpoint that does not fit is a StateDictError naming the key, before anything changes."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest

import opgraph as og
from opgraph.training import SGD, AdamW, train_step

from ..helpers import ROOT, example_env, requires_cuda

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

SPLIT, TOTAL = 10, 20
INIT_SCALE = 2.0**15  # (fp16: a step skipped before the split and after it; the growth tracker at 2 at the split)


def cnn(seed: int = 0):
    torch.manual_seed(seed)
    return (
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


def mlp(seed: int = 0, dtype=torch.float64):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.LayerNorm(12), nn.Linear(12, 3)).to(dtype).train()


# name -> (model factory, input shape, train_step options)
CASES = {
    "sgd_nesterov_batchnorm": (
        cnn,
        (4, 2, 5, 5),
        lambda: dict(optimizer=SGD(0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ),
    "adamw_fp16_clip": (
        lambda seed=0: mlp(seed, torch.float32),
        (8, 6),
        lambda: dict(
            optimizer=AdamW(1e-2),
            mixed_precision="fp16",
            grad_clip_norm=1.0,
            loss_scale={"init_scale": INIT_SCALE, "growth_interval": 3},
        ),
    ),
}


def batch(case: str, i: int):
    """Step i's batch (the same in every process)."""
    _, shape, _ = CASES[case]
    gen = torch.Generator().manual_seed(1000 + i)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64)
    return x.to(torch.float32) if case.startswith("adamw") else x, torch.randint(0, 3, (shape[0],), generator=gen)


def make_step(case: str, seed: int = 0):
    factory, shape, options = CASES[case]
    model = factory(seed)
    x, _ = batch(case, 0)
    return model, train_step(og.from_torch(model, (x,)), "cross_entropy", **options())


def run(case: str, step, first: int, last: int) -> list:
    return [step.run(*batch(case, i)) for i in range(first, last)]


def main(case: str, ckpt: str, out: str) -> None:
    """The resumed half, in a process of its own: a model initialised otherwise, loaded, 10 more steps."""
    model, step = make_step(case, seed=123)
    step.load_state_dict(torch.load(ckpt, weights_only=True))
    loaded = copy.deepcopy(step.state_dict())
    losses = run(case, step, SPLIT, TOTAL)
    torch.save({"loaded": loaded, "losses": losses, "state": step.state_dict()}, out)


def assert_same_state(a: dict, b: dict) -> None:
    """Two training-step checkpoints equal exactly (every tensor bit for bit, every number)."""
    assert a.keys() == b.keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys() and sa
    for i in sa:
        for name in sa[i]:
            assert torch.equal(sa[i][name], sb[i][name]), (i, name)
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    assert a["loss_scale"] == b["loss_scale"] and a["step"] == b["step"]


@pytest.mark.parametrize("case", list(CASES))
def test_resumed_run_continues_bit_for_bit_in_a_new_process(case, tmp_path):
    _, whole = make_step(case)
    want = run(case, whole, 0, TOTAL)
    _, first = make_step(case)
    got = run(case, first, 0, SPLIT)
    assert all(torch.equal(a, b) for a, b in zip(got, want[:SPLIT]))
    saved = first.state_dict()
    if case.startswith("adamw"):  # the loss scale moved (skips and growth) and the tracker matters
        assert saved["loss_scale"]["scale"] != INIT_SCALE and saved["loss_scale"]["_growth_tracker"] > 0
        assert saved["step"] < SPLIT
    torch.save(saved, tmp_path / "ckpt.pt")
    code = "import sys; from tests.training.test_checkpoint import main; main(*sys.argv[1:])"
    proc = subprocess.run(
        [sys.executable, "-c", code, case, str(tmp_path / "ckpt.pt"), str(tmp_path / "out.pt")],
        capture_output=True,
        text=True,
        env=example_env(),
        cwd=str(ROOT),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = torch.load(tmp_path / "out.pt", weights_only=True)
    assert_same_state(resumed["loaded"], saved)  # what was loaded is what was saved, counters included
    assert [float(v) for v in resumed["losses"]] == [float(v) for v in want[SPLIT:]]
    assert all(torch.equal(a, b) for a, b in zip(resumed["losses"], want[SPLIT:]))
    assert_same_state(resumed["state"], whole.state_dict())
    if case.startswith("adamw"):
        assert resumed["state"]["step"] == whole.step_count < TOTAL - 1


def test_state_dict_layout_is_torch_optims():
    model, step = make_step("adamw_fp16_clip")
    sd = step.state_dict()
    assert sd["optimizer"]["state"] == {} and sd["step"] == 0  # torch's lazily made state
    assert sd["loss_scale"] == {
        "scale": INIT_SCALE,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 3,
        "_growth_tracker": 0,
    }
    run("adamw_fp16_clip", step, 0, 3)
    sd = step.state_dict()
    want = torch.optim.AdamW(model.parameters(), lr=1e-2).state_dict()["param_groups"]
    assert sd["optimizer"]["param_groups"] == want
    assert list(sd["optimizer"]["state"]) == list(range(len(list(model.parameters()))))
    for i, p in enumerate(model.parameters()):
        entry = sd["optimizer"]["state"][i]
        assert list(entry) == ["step", "exp_avg", "exp_avg_sq"]
        assert entry["exp_avg"].shape == p.shape and entry["step"].dtype == torch.float32
        assert float(entry["step"]) == step.step_count
    assert list(sd["model"]) == list(model.state_dict())
    scaler = torch.amp.GradScaler("cpu")
    scaler.load_state_dict(sd["loss_scale"])
    assert scaler.get_scale() == step.loss_scale


# -- between a training step and torch.optim -------------------------------------------------------------------

OPTIMIZERS = {
    "adamw": (
        lambda: AdamW(3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
        lambda params: torch.optim.AdamW(params, lr=1.0),
    ),
    "sgd": (
        lambda: SGD(0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
        lambda params: torch.optim.SGD(params, lr=1.0, momentum=0.5, nesterov=True, weight_decay=0.5),
    ),
}


def eager_step(model, opt, x, y):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_opgraph_checkpoint_loads_into_torch_optim(name):
    """10 opgraph steps; the checkpoint into an eager model and a torch optimizer made with other
    hyper-parameters (loading restores them); one more step each: equal within float64 rounding."""
    make_opt, make_torch = OPTIMIZERS[name]
    model = mlp()
    x = torch.randn(8, 6, dtype=torch.float64)
    y = torch.arange(8) % 3
    step = train_step(og.from_torch(model, (x,)), "cross_entropy", make_opt())
    for _ in range(SPLIT):
        step.run(x, y)
    sd = copy.deepcopy(step.state_dict())  # (a snapshot: the step's own tensors go on changing)
    eager = mlp(seed=5)
    eager.load_state_dict(sd["model"])
    topt = make_torch(eager.parameters())
    topt.load_state_dict(sd["optimizer"])
    assert topt.param_groups[0]["lr"] == step.optimizer.lr
    want = eager_step(eager, topt, x, y)
    got = step.run(x, y)
    assert rel(got, want) <= 1e-12
    for (key, p), q in zip(model.named_parameters(), eager.parameters()):
        assert rel(p, q) <= 1e-12, key
        for sname, value in step.param_state(key).items():
            assert rel(value, topt.state[q][sname]) <= 1e-10, (key, sname)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_torch_optim_checkpoint_loads_into_a_step(name):
    """10 eager steps with torch.optim; {"model", "optimizer"} into a training step of a model
    initialised otherwise (and a step made with other hyper-parameters); one more step each."""
    make_opt, _ = OPTIMIZERS[name]
    eager = mlp()
    hyper = make_opt().hyper
    if name == "adamw":
        topt = torch.optim.AdamW(
            eager.parameters(),
            lr=hyper["lr"],
            betas=(hyper["beta1"], hyper["beta2"]),
            eps=hyper["eps"],
            weight_decay=hyper["weight_decay"],
        )
        other = AdamW(1.0)
    else:
        topt = torch.optim.SGD(
            eager.parameters(),
            lr=hyper["lr"],
            momentum=hyper["momentum"],
            nesterov=True,
            weight_decay=hyper["weight_decay"],
        )
        other = SGD(1.0, momentum=0.1, nesterov=True, weight_decay=0.3)
    x = torch.randn(8, 6, dtype=torch.float64)
    y = torch.arange(8) % 3
    for _ in range(SPLIT):
        eager_step(eager, topt, x, y)
    model = mlp(seed=7)
    step = train_step(og.from_torch(model, (x,)), "cross_entropy", other)
    step.run(x, y)  # (a step that ran already: loading replaces all of its state)
    step.load_state_dict(copy.deepcopy({"model": eager.state_dict(), "optimizer": topt.state_dict()}))
    assert step.optimizer.hyper == hyper
    if name == "adamw":
        assert step.step_count == SPLIT
    want = eager_step(eager, topt, x, y)
    got = step.run(x, y)
    assert rel(got, want) <= 1e-12
    for (key, p), q in zip(model.named_parameters(), eager.parameters()):
        assert rel(p, q) <= 1e-12, key
        for sname, value in step.param_state(key).items():
            assert rel(value, topt.state[q][sname]) <= 1e-10, (key, sname)


def test_grad_scaler_state_loads_into_an_fp16_step():
    model, step = make_step("adamw_fp16_clip")
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=3)
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    scaler._scale.fill_(1024.0)
    scaler._growth_tracker.fill_(2)
    eager = copy.deepcopy(model)
    topt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    step.load_state_dict(
        {"model": eager.state_dict(), "optimizer": topt.state_dict(), "loss_scale": scaler.state_dict()}
    )
    assert step.loss_scale == 1024.0 and step.state_dict()["loss_scale"]["_growth_tracker"] == 2
    step.run(*batch("adamw_fp16_clip", 0))
    assert step.loss_scale == 2048.0  # the third clean step in a row grows it


# -- bad checkpoints ---------------------------------------------------------------------------------------------


def _bad(sd, key, *words):
    model, step = make_step("adamw_fp16_clip")
    run("adamw_fp16_clip", step, 0, 2)
    before = copy.deepcopy(step.state_dict())
    with pytest.raises(og.StateDictError) as info:
        step.load_state_dict(sd(step))
    err = info.value
    assert err.rule == "training.state_dict" and f"key {key!r}" in str(err) and err.hint, str(err)
    for word in words:
        assert word in str(err), str(err)
    assert isinstance(err, ValueError)
    assert_same_state(step.state_dict(), before)  # nothing changed


def _with(change):
    def make(step):
        sd = copy.deepcopy(step.state_dict())
        change(sd)
        return sd

    return make


def _sgd_state(step):
    model = copy.deepcopy(step.imported.module)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(batch("adamw_fp16_clip", 0)[0]).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "loss_scale": None}


def _adam_state(step, **kw):
    model = copy.deepcopy(step.imported.module)
    opt = torch.optim.Adam(model.parameters(), **kw)
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "loss_scale": None}


BAD = {
    "not_a_dict": (lambda step: [1, 2], "", ["list"]),
    "unknown_key": (_with(lambda sd: sd.update(epoch=3)), "epoch", ["unknown"]),
    "missing_optimizer": (_with(lambda sd: sd.pop("optimizer")), "optimizer", ["missing"]),
    "missing_model_key": (_with(lambda sd: sd["model"].pop("3.bias")), "model.3.bias", ["missing"]),
    "unexpected_model_key": (
        _with(lambda sd: sd["model"].update({"_orig_mod.0.weight": torch.zeros(1)})),
        "model._orig_mod.0.weight",
        ["unexpected"],
    ),
    "model_shape": (
        _with(lambda sd: sd["model"].update({"0.weight": torch.zeros(12, 7)})),
        "model.0.weight",
        ["[12, 7]"],
    ),
    "state_shape": (
        _with(lambda sd: sd["optimizer"]["state"][1].update(exp_avg=torch.zeros(3))),
        "optimizer.state[1].exp_avg",
        ["'0.bias'"],
    ),
    "param_count": (
        _with(lambda sd: sd["optimizer"]["param_groups"][0].update(params=[0, 1])),
        "optimizer.param_groups.params",
        ["2 parameters"],
    ),
    "two_groups": (
        _with(lambda sd: sd["optimizer"]["param_groups"].append({})),
        "optimizer.param_groups",
        ["one parameter group"],
    ),
    "sgd_into_adamw": (_sgd_state, "optimizer.param_groups", ["SGD's", "AdamW"]),
    "adam_coupled_decay": (lambda step: _adam_state(step, weight_decay=0.1), "optimizer.param_groups", ["Adam's"]),
    "amsgrad": (
        lambda step: _adam_state(step, amsgrad=True, weight_decay=0.0),
        "optimizer.param_groups.amsgrad",
        ["amsgrad"],
    ),
    "another_optimizers_state": (
        _with(lambda sd: sd["optimizer"]["state"][0].update(momentum_buffer=torch.zeros(1))),
        "optimizer.state[0]",
        ["another optimizer"],
    ),
    "partial_state": (_with(lambda sd: sd["optimizer"]["state"][0].pop("exp_avg_sq")), "optimizer.state[0]", ["lacks"]),
    "string_state_keys": (
        _with(lambda sd: sd["optimizer"].update(state={str(k): v for k, v in sd["optimizer"]["state"].items()})),
        "optimizer.state",
        ["'0'"],
    ),
    "steps_differ": (
        _with(lambda sd: sd["optimizer"]["state"][0].update(step=torch.tensor(99.0))),
        "optimizer.state",
        ["differ"],
    ),
    "step_disagrees": (_with(lambda sd: sd.update(step=5)), "step", ["5"]),
    "scaler_settings": (
        _with(lambda sd: sd["loss_scale"].update(growth_interval=2000)),
        "loss_scale.growth_interval",
        ["2000"],
    ),
    "missing_loss_scale": (_with(lambda sd: sd.pop("loss_scale")), "loss_scale", ["missing"]),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_checkpoints_are_typed_errors(name):
    sd, key, words = BAD[name]
    _bad(sd, key, *words)


def test_sgd_structure_and_loss_scale_mismatches():
    model = mlp()
    x = torch.randn(8, 6, dtype=torch.float64)
    step = train_step(og.from_torch(model, (x,)), "cross_entropy", SGD(0.1, momentum=0.9))
    sd = step.state_dict()
    nesterov = copy.deepcopy(sd)
    nesterov["optimizer"]["param_groups"][0]["nesterov"] = True
    with pytest.raises(og.StateDictError, match="nesterov=True"):
        step.load_state_dict(nesterov)
    plain = {"model": model.state_dict(), "optimizer": torch.optim.SGD(model.parameters(), lr=0.1).state_dict()}
    with pytest.raises(og.StateDictError, match="'optimizer.param_groups.momentum'"):
        step.load_state_dict(plain)
    with pytest.raises(og.StateDictError, match="'loss_scale'.*not fp16"):
        step.load_state_dict({**sd, "loss_scale": {"scale": 2.0, "_growth_tracker": 0}})
    step.load_state_dict({**sd, "loss_scale": None})  # (set to None: loads the rest)


@pytest.mark.gpu
@requires_cuda
def test_state_moves_with_the_module_to_the_gpu():
    """3 steps on the CPU, the module moved to the GPU: the moments, the step count and the loss scale
    go on (not made again), and the next step matches torch.optim's from the same checkpoint."""
    model, step = make_step("adamw_fp16_clip")
    run("adamw_fp16_clip", step, 0, 3)
    sd = copy.deepcopy(step.state_dict())
    model.cuda()
    x, y = batch("adamw_fp16_clip", 3)
    step.run(x.cuda(), y.cuda())
    assert all(v.is_cuda for k, _ in model.named_parameters() for v in step.param_state(k).values())
    eager = mlp(dtype=torch.float32).cuda()
    eager.load_state_dict(sd["model"])
    topt = torch.optim.AdamW(eager.parameters())
    topt.load_state_dict(sd["optimizer"])
    scaler = torch.amp.GradScaler("cuda")
    scaler.load_state_dict(sd["loss_scale"])
    topt.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = F.cross_entropy(eager(x.cuda()).float(), y.cuda())
    scaler.scale(loss).backward()
    scaler.unscale_(topt)
    torch.nn.utils.clip_grad_norm_(eager.parameters(), 1.0)
    scaler.step(topt)
    scaler.update()
    assert step.loss_scale == scaler.get_scale()
    assert sd["step"] > 0 and step.step_count == float(topt.state[next(iter(eager.parameters()))]["step"])
    for (key, p), q in zip(model.named_parameters(), eager.parameters()):
        assert rel(p, q) <= 1e-2, key
