"""bench/gpt.py's first-step check and the eager CUDA-graph peer's warm-up undo, on the CPU with tiny
models: the warm-up's steps are undone bit-exactly (the next step equals a fresh copy's first step), the
check passes a true first step and fails a step after a warm-up left in, a wrong loss and a wrong
update, and a failed row is not timed and fails the run. The whole bench on a small GPT is the GPU test."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from bench import gpt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LR = 1e-3


def _gpt_workload() -> gpt.Workload:
    c = gpt.GPTConfig(vocab=256, seq=32, layers=2, heads=2, d=32)
    torch.manual_seed(0)
    model = gpt.GPT(c).train()
    x = torch.randint(0, c.vocab, (2, c.seq))
    y = torch.randint(0, c.vocab, (2, c.seq))
    return gpt.Workload("tiny GPT", model, x, y, x.numel(), "tokens/s", model.flops_per_token() * x.numel())


def _conv_workload() -> gpt.Workload:
    """Batchnorm: running statistics and a step counter among the buffers a warm-up moves."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    ).train()
    x = torch.randn(4, 3, 8, 8)
    y = torch.randint(0, 10, (4,))
    return gpt.Workload("tiny CNN", model, x, y, 4, "images/s", 1.0)


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
    out = [(f"param {n}", p.detach().clone()) for n, p in model.named_parameters()]
    out += [(f"buffer {n}", b.clone()) for n, b in model.named_buffers()]
    names = {id(p): n for n, p in model.named_parameters()}
    out += [(f"{names[id(p)]}.{k}", t.clone()) for p, s in opt.state.items() for k, t in sorted(s.items())]
    return out


@pytest.mark.parametrize("make_workload", [_gpt_workload, _conv_workload], ids=["gpt", "cnn"])
def test_warmup_is_undone_bit_exactly(make_workload):
    w = make_workload()
    model = copy.deepcopy(w.model)
    step, opt = gpt.torch_step(model, w, LR, capturable=True)
    init = _state(model, opt)  # no optimizer state yet: AdamW makes it at its first step
    saved = gpt.torch_state(model, opt)
    for _ in range(3):
        step()
    assert gpt._adam_steps(opt) == 3
    moved = [n for (n, a), (_, b) in zip(init, _state(model, opt)) if not torch.equal(a, b)]
    assert any(n.startswith("param") for n in moved)  # the warm-up trained (so that the undo is tested)
    if any(n.startswith("buffer") for n, _ in init):
        assert any(n.startswith("buffer") for n in moved)

    gpt.restore_torch_state(saved, model, opt)
    for (name, a), (_, b) in zip(init, _state(model, opt)):
        assert torch.equal(a, b), name
    assert all(float(t.abs().max()) == 0 for s in opt.state.values() for t in s.values())  # a fresh AdamW's
    assert all(float(p.grad.abs().max()) == 0 for p in model.parameters())
    first = step()

    fresh = copy.deepcopy(w.model)
    fresh_step, fresh_opt = gpt.torch_step(fresh, w, LR, capturable=True)
    want = fresh_step()
    assert torch.equal(first, want)
    got, expected = _state(model, opt), _state(fresh, fresh_opt)
    assert [n for n, _ in got] == [n for n, _ in expected]
    for (name, a), (_, b) in zip(got, expected):
        assert torch.equal(a, b), name
    assert gpt._adam_steps(opt) == 1


def test_restore_refuses_an_optimizer_whose_fresh_state_is_not_zeros():
    w = _gpt_workload()
    opt = torch.optim.SGD(w.model.parameters(), lr=LR, momentum=0.9)
    with pytest.raises(TypeError, match="SGD"):
        gpt.restore_torch_state(gpt.torch_state(w.model, opt), w.model, opt)


def _eager(w: gpt.Workload, warmup: int = 0) -> tuple[gpt.Impl, float]:
    model = copy.deepcopy(w.model)
    step, opt = gpt.torch_step(model, w, LR)
    for _ in range(warmup):
        step()
    loss = float(step().detach())
    return gpt.Impl(step, "fused AdamW", model, lambda: gpt._adam_steps(opt)), loss


def test_check_passes_a_first_step_and_fails_what_is_not_one():
    w = _gpt_workload()
    ref = gpt.reference(w, LR)
    assert list(ref.after) == ["wte.weight", "blocks.0.fc_proj.weight", "blocks.1.fc_proj.weight"]
    impl, loss = _eager(w)  # autocast bf16 on the CPU, fused AdamW
    err, problems = gpt.check(ref, impl, loss)
    assert problems == [] and err < 1e-3

    err, problems = gpt.check(ref, impl, loss * 1.05)
    assert len(problems) == 1 and "first-step loss" in problems[0] and err > 0.04

    late, loss = _eager(w, warmup=3)  # the bench's eager CUDA-graph peer before the fix
    _, problems = gpt.check(ref, late, loss)
    assert any("step count 4" in p for p in problems)
    assert sum("not one step from the initial weights" in p for p in problems) == 3
    late.step_count = lambda: None  # an implementation without a readable counter: the weights still show it
    _, problems = gpt.check(ref, late, loss)
    assert not any("step count" in p for p in problems)
    assert sum("not one step from the initial weights" in p for p in problems) == 3

    wrong = copy.deepcopy(w.model)  # one step's size in random directions: within 2 lr, a wrong update
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in wrong.parameters():
            p -= LR * torch.randn(p.shape, generator=g).sign()
    _, problems = gpt.check(ref, gpt.Impl(impl.step, "", wrong, lambda: 1.0), ref.loss)
    assert len(problems) == 3 and all("cosine" in p for p in problems), problems


def test_a_failed_check_is_not_timed_and_fails_the_run(tmp_path):
    w = _gpt_workload()
    w.results = {
        "opgraph": {"loss": 5.9, "loss_err": 0.07, "check": ["first-step loss 5.9 vs fp32 eager 5.5"]},
        "eager": {"ms": 2.0, "rate": 1.0, "mfu": 0.1},
        "opgraph (CUDA graph)": {"ms": 1.0, "rate": 2.0, "mfu": 0.2},
        "eager (CUDA graph)": {"ms": 1.5, "rate": 1.5, "mfu": 0.15},
    }
    text = gpt.table([w], {"date": "today", "device": "cpu", "torch": torch.__version__})
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| tiny GPT")}
    assert "FAILED CHECK: first-step loss" in rows["opgraph"]
    assert rows["opgraph"].count("|") == 7 and not any(ch.isdigit() for ch in rows["opgraph"].split("|")[-2])
    assert rows["opgraph (CUDA graph)"].split("|")[-2].strip() == "0.67"  # a passing group keeps its ratio
    assert gpt.failures([w]) == ["tiny GPT / opgraph: first-step loss 5.9 vs fp32 eager 5.5"]
    del w.results["opgraph"]
    assert gpt.failures([w]) == []


@pytest.mark.gpu
@pytest.mark.slow
def test_bench_on_a_small_gpt_checks_every_row(tmp_path):
    """Eager, eager CUDA graph, opgraph and opgraph CUDA graph on a 2-layer GPT-2 (a subprocess: the bench
    sets TF32 and cudnn.benchmark): every row passes the first-step check (the eager graph's warm-up
    undone) and is timed; the run exits 0."""
    modes = "opgraph,opgraph-graph,eager,eager-graph"
    cmd = [
        sys.executable,
        "-m",
        "bench.gpt",
        "gpt2",
        "--layers",
        "2",
        "--seq",
        "128",
        "--batch",
        "2",
        "--modes",
        modes,
        "--warmup",
        "1",
        "--iters",
        "2",
        "--out",
        str(tmp_path),
    ]
    out = subprocess.run(
        cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=600, check=False
    )
    log = out.stdout[-3000:] + out.stderr[-3000:]
    assert "FAILED" not in out.stdout, log
    (name,) = [p for p in os.listdir(tmp_path) if p.endswith(".json")]
    (results,) = json.load(open(tmp_path / name))["results"].values()
    assert set(results) == {gpt.MODES[m] for m in modes.split(",")}
    for label, r in results.items():
        assert "ms" in r and "check" not in r and "error" not in r, (label, r)
        assert r["loss_err"] < gpt.LOSS_RTOL, (label, r)
    assert out.returncode == 0, log


def test_steps_profile_rows_name_each_steps_ops_and_config():
    """The --steps-profile rows kept in the JSON (a reference-engine plan on the CPU stands in)."""
    import numpy as np

    import opgraph as og

    g = og.Graph("prof", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 8], name="x")
    w = g.tensor(dim=[8, 3], name="w")
    g.relu(g.matmul(x, w)).set_output(True).set_name("y")
    plan = g.build(device="cpu")
    rng = np.random.default_rng(0)
    pack = {
        g.final.tensor("x").uid: rng.normal(size=(4, 8)).astype(np.float32),
        g.final.tensor("w").uid: rng.normal(size=(8, 3)).astype(np.float32),
        g.final.tensor("y").uid: np.full((4, 3), np.nan, np.float32),
    }
    rows = gpt.steps_profile(plan, plan.profile_steps(pack, repeat=1))
    assert [r["step"] for r in rows] == list(range(len(plan.steps)))
    assert sorted(op for r in rows for op in r["ops"]) == ["matmul", "pointwise"]
    assert all(r["device_us"] >= 0 and r["config"] for r in rows)


def test_attention_off_cudnn_names_the_engine_and_cudnns_reason():
    """bench.gpt's note says why attention steps did not run on cuDNN (the GPT-2 run of 2026-11-26 put
    them on the generated kernels with the cudnn engine present, and nothing said why)."""
    import opgraph as og
    from bench.gpt import attention_off_cudnn

    g = og.Graph("att", io_data_type=og.DataType.FLOAT)
    q, k, v = (g.tensor(dim=[1, 2, 8, 16], name=n) for n in "qkv")
    o, _ = g.sdpa(q, k, v, attn_scale=0.25, generate_stats=False, use_causal_mask=True)
    o.set_output(True)
    from opgraph.engines import get_engine

    plan = g.build(device="cpu", engines=["reference"])
    verdict = get_engine("cudnn").supports(plan.steps[0].piece, plan.device)
    assert not verdict.ok and verdict.reason  # (no GPU here: the engine says why)
    assert attention_off_cudnn(plan) == [f"1 x sdpa on reference, cudnn: {verdict.reason[:300]}"]
