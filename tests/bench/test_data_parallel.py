"""The data-parallel benchmark's checks (bench/data_parallel.py): `param_check` on tensors (agreeing
parameters pass; one parameter off by half a step, a step ddp did not take or a missing parameter fail,
naming the parameter), `report` marking a failed row; and the CPU dry run (gloo, the tiny MLP, 1 and 2
ranks): every opgraph implementation's parameters after the first step agree with DDP's, and an
implementation perturbed after its first step (--perturb) fails the run, naming the parameter."""

from __future__ import annotations

import argparse
import json

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from bench import data_parallel as dp  # noqa: E402


def states(seed: int = 0) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    start = {"a.weight": torch.randn(8, 4, generator=g), "a.bias": torch.randn(8, generator=g)}
    ref = {k: v - 0.1 * torch.randn(v.shape, generator=g) for k, v in start.items()}
    return start, ref


def test_param_check_passes_agreeing_parameters_and_names_the_worst():
    start, ref = states()
    got = {k: v + 1e-6 * (v - start[k]) for k, v in ref.items()}  # 1e-6 of the step off
    res = dp.param_check(got, ref, start, 1e-3)
    assert res["ok"] and 0 < res["rel"] < 2e-6
    got["a.bias"] = ref["a.bias"] + 0.5 * (ref["a.bias"] - start["a.bias"])
    res = dp.param_check(got, ref, start, 1e-3)
    assert not res["ok"] and res["worst"] == "a.bias" and res["rel"] == pytest.approx(0.5, rel=1e-5)


def test_param_check_in_fp32_of_half_precision_parameters():
    start, ref = states()
    half = {k: v.half() for k, v in ref.items()}
    res = dp.param_check(half, ref, start, 0.1)
    assert res["ok"] and res["rel"] > 0  # fp16 rounding of the parameters: well under 0.1 of the step


def test_param_check_fails_a_step_ddp_did_not_take_and_a_missing_parameter():
    start, ref = states()
    assert dp.param_check(dict(start), dict(start), start, 1e-3)["ok"]  # both skipped (GradScaler): equal
    res = dp.param_check(ref, dict(start), start, 1e-3)  # ddp skipped, this one stepped
    assert not res["ok"] and res["rel"] == float("inf")
    res = dp.param_check({"a.weight": ref["a.weight"]}, ref, start, 1e-3)
    assert not res["ok"] and res["worst"] == "a.bias"
    res = dp.param_check({**ref, "a.bias": ref["a.bias"] * float("nan")}, ref, start, 1e-3)
    assert not res["ok"] and res["worst"] == "a.bias"


def test_tolerances_per_precision_and_optimizer():
    assert dp.param_tolerance(None, True) == dp.PARAM_TOL[None]
    assert dp.param_tolerance("bf16", False) == dp.PARAM_TOL["bf16"] * dp.ADAMW_FACTOR
    assert dp.param_tolerance("fp16", True) == dp.PARAM_TOL["fp16"]


def test_report_marks_a_row_whose_parameters_failed(capsys):
    ok = {"ok": True, "worst": "w", "rel": 1e-7, "tol": 1e-3}
    bad = {"ok": False, "worst": "layer.2.bias", "rel": 0.5, "tol": 1e-3}
    rows = {
        "opgraph": {"ms": 1.0, "first_loss": 2.0, "params": ok},
        "opgraph-run": {"ms": 1.0, "first_loss": 2.0, "params": bad},
        "ddp": {"ms": 1.0, "first_loss": 2.0},
    }
    args = argparse.Namespace()
    assert dp.report(1, {1: {"rows": rows, "items": 16, "unit": "samples/s"}}, args) == 1
    out = capsys.readouterr().out.splitlines()
    assert "FAILED" not in out[0] and "FAILED" not in out[2]
    assert "FAILED CHECK: parameter 'layer.2.bias'" in out[1] and "tolerance 0.001" in out[1]


needs_gloo = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo is not available"
)


@pytest.mark.slow
@needs_gloo
def test_dry_run_checks_every_opgraph_implementations_parameters(tmp_path):
    out = tmp_path / "dp.json"
    assert dp.main(["--dry-run", "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert sorted(results) == ["1", "2"]
    for res in results.values():
        rows = res["rows"]
        assert "params" not in rows["ddp"]
        for mode in ("opgraph", "opgraph-run", "opgraph-zero1"):
            pc = rows[mode]["params"]
            assert pc["ok"] and 0 <= pc["rel"] <= pc["tol"] == dp.PARAM_TOL[None], (mode, pc)


@pytest.mark.slow
@needs_gloo
def test_dry_run_fails_when_an_implementation_is_perturbed(tmp_path, capsys):
    out = tmp_path / "dp.json"
    assert dp.main(["--dry-run", "--gpus", "1", "--perturb", "opgraph-zero1", "--out", str(out)]) == 1
    rows = json.loads(out.read_text())["results"]["1"]["rows"]
    assert rows["opgraph"]["params"]["ok"] and rows["opgraph-run"]["params"]["ok"]
    bad = rows["opgraph-zero1"]["params"]
    assert not bad["ok"] and bad["worst"] == "2.bias" and bad["rel"] == pytest.approx(0.5, rel=1e-3)
    assert "FAILED CHECK: parameter '2.bias'" in capsys.readouterr().out
