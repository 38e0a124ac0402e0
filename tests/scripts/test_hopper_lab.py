"""scripts/hopper_lab: the GEMM and attention lab kernels stay correct under the interpreter, and the
GEMM sweep's scheduler survives children that crash and hang (stand-in children, no GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[2] / "scripts" / "hopper_lab"


def _run(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=full, check=False
    )


@pytest.mark.interpreter
@pytest.mark.slow
def test_gemm_variants_match_torch_under_the_interpreter():
    done = _run(
        str(LAB / "gemm_sweep.py"), "--selftest", "--variants", "plain,tma_dev,persist,persist_ws,persist_flat_sub"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "0 failed" in done.stdout and " passed" in done.stdout


@pytest.mark.interpreter
@pytest.mark.slow
def test_attention_variants_match_sdpa_under_the_interpreter():
    done = _run(str(LAB / "attn_sweep.py"), "--selftest")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "8 passed, 0 failed" in done.stdout


@pytest.mark.slow
def test_sweep_records_crashes_hangs_and_the_budget(tmp_path):
    # stand-in children: a compile crash (tma_dev 256-row tiles), compile errors (persist_flat_sub) and a
    # measurement that hangs (persist_ptr 128x256): each is recorded, the sweep ends at its budget
    done = _run(
        str(LAB / "gemm_sweep.py"),
        "--fake",
        "--budget",
        "12",
        "--grace",
        "2",
        "--jobs",
        "2",
        "--measure-timeout",
        "2",
        "--shapes",
        "square8k.nk,llama.o",
        "--out",
        str(tmp_path),
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    res = json.loads((tmp_path / "gemm_sweep.json").read_text())
    first = res["shapes"]["square8k.nk"]["variants"]
    errors = {c.get("error") or "" for v in first.values() for c in v["configs"]}
    assert any("process died" in e for e in errors)
    assert any("timed out" in e for e in errors)
    assert any("PassManager" in e for e in errors)
    assert first["persist"]["best"]["tflops"] > 0
    assert "cublas" in res["shapes"]["square8k.nk"]["library"]
    assert (tmp_path / "gemm_sweep.md").read_text().startswith("# Hopper GEMM lab")
