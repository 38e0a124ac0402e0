"""bench.plan_cost plans the GPT-2 bench's training step for an H100 without a GPU (one layer, batch 1,
the real widths and vocabulary): the plan's structure where the analysis of 2026-11-25 found extra
device traffic, on the benchmark's own shapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_gpt2_plan_for_an_h100_reads_the_logits_twice_and_recomputes_no_attention(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    out = tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "bench.plan_cost", "--layers", "1", "--batch", "1", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| total |" in done.stdout
    rows = json.loads(out.read_text())
    logits = [
        r for r in rows if any(t[1] == [1, 1024, 50304] and t[3] == "in" and "grad" not in t[0] for t in r["tensors"])
    ]
    assert [r["template"] for r in logits] == ["reduction", "pointwise"], [r["names"] for r in logits]
    assert {"ce.sum", "ce.picked"} <= set(logits[0]["names"])
    templates = [r["template"] for r in rows]
    assert templates.count("attention") == 1 and templates.count("attention_bwd") == 1, templates
    assert not [n for r in rows for n in r["names"] if "sdpa_recompute" in n]
    gemms = [r for r in rows if r["template"] == "matmul" or r["engine"] == "library"]
    assert len(gemms) == 3 * 5 and all(r["engine"] == "triton" for r in gemms if r["engine"] != "library")
    # (cuBLAS leads on the LM head's data gradient: K = 50,304 over 48 output tiles of 128 x 128; and, with
    # a separate update, on the large weight gradients whose epilogue reads and writes AdamW's moments and
    # parameters after the main loop, few tiles to overlap it: policy.RULES, constants.md#exposed-epilogue)
    library = [r["names"][1] for r in gemms if r["engine"] == "library"]
    assert library == [
        "dlinear_4.matmul.dA.2",
        "dlinear_3.matmul.dB.15",
        "dlinear_2.matmul.dB.22",
        "dlinear.matmul.dB.50",
    ]
