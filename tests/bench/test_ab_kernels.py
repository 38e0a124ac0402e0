"""scripts/ab_kernels.py: the verdict and noise rule, when a row is a regression to look at, the tables,
and (slow) a dry run of the whole A/B on the CPU, the repository against itself."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ab_kernels.py"


def _load():
    spec = importlib.util.spec_from_file_location("ab_kernels", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["ab_kernels"] = mod
    spec.loader.exec_module(mod)
    return mod


ab = _load()


def side(
    engine="triton",
    knobs=(("template", "conv_fprop"), ("BLOCK_M", 64)),
    kernel="spec:abc",
    passed=True,
    ratio=0.2,
    status="ok",
):
    return {
        "status": status,
        "engines": f"{engine}:conv_fprop",
        "steps": [
            {"engine": engine, "knobs": [list(k) for k in knobs], "ops": "conv_fprop+bias+relu", "kernel": kernel}
        ],
        "check": {"passed": passed, "worst_output": "y", "worst_ratio": ratio, "reason": "" if passed else "y: big"},
    }


def test_spread_needs_two_samples():
    assert ab.spread([10.0]) is None
    assert ab.spread([]) is None
    assert ab.spread([9.0, 10.0, 11.0]) == pytest.approx(0.2)


def test_compare_same_within_noise_and_the_floor():
    c = ab.compare([100.0, 100.2, 99.9, 100.1], [100.5, 100.4, 100.6, 100.5], floor=0.01)
    assert c["verdict"] == "same" and c["noise"] == pytest.approx(0.01)  # spreads 0.3% < the 1% floor
    assert c["ratio"] == pytest.approx(100.5 / 100.05)


def test_compare_slower_and_faster_beyond_noise():
    slow = ab.compare([100.0, 101.0, 100.0, 100.5], [110.0, 111.0, 110.5, 110.0])
    assert slow["verdict"] == "SLOWER" and slow["old_us"] == pytest.approx(100.25)
    fast = ab.compare([100.0, 101.0, 100.0, 100.5], [90.0, 90.5, 90.2, 90.1])
    assert fast["verdict"] == "faster"


def test_compare_wide_repeats_widen_the_noise():
    # new is 8% slower, but old's own repeats spread 20%: same
    c = ab.compare([90.0, 100.0, 110.0, 100.0], [108.0, 108.0, 108.5, 107.5])
    assert c["noise"] == pytest.approx(0.2) and c["verdict"] == "same"


def test_compare_without_samples():
    c = ab.compare([], [10.0])
    assert c["verdict"] == "-" and c["ratio"] is None and c["new_us"] == 10.0


def test_same_steps():
    a, b = side()["steps"], side(knobs=(("template", "conv_fprop"), ("BLOCK_M", 128)))["steps"]
    assert ab.same_steps(a, a) == ("same", "same")
    assert ab.same_steps(a, b) == ("differ", "same")
    assert ab.same_steps(a, side(kernel="spec:def")["steps"]) == ("same", "differ")
    cudnn = side(engine="cudnn", knobs=(), kernel="")["steps"]
    assert ab.same_steps(cudnn, cudnn) == ("same", "-")
    assert ab.same_steps(None, a) == ("-", "-")


SLOW = ([100.0, 100.5, 100.2, 100.1], [120.0, 120.5, 120.2, 120.1])


def test_next_setup_prefers_what_the_other_version_compiled():
    pending = ["a", "b", "c", "d"]
    assert ab.next_setup(pending, {"a", "b", "c"}, {"c"}) == "c"  # set up by the other: its kernels are cached
    assert ab.next_setup(pending, {"a", "b"}, set()) == "c"  # else one the other has not started
    assert ab.next_setup(pending, {"a", "b", "c", "d"}, set()) == "a"  # else the next


def test_regression_needs_slower_and_a_difference():
    assert not ab.make_row("w", "t", "generated", side(), side(), *SLOW)["regression"]  # same code: noise or clocks
    row = ab.make_row("w", "t", "generated", side(), side(knobs=(("template", "conv_fprop"), ("BLOCK_M", 128))), *SLOW)
    assert row["regression"] and "configs differ" in row["why"]
    row = ab.make_row("w", "t", "generated", side(), side(kernel="spec:other"), *SLOW)
    assert row["regression"] and "kernels differ" in row["why"]
    faster = ab.make_row(
        "w", "t", "generated", side(), side(knobs=(("template", "conv_fprop"), ("BLOCK_M", 128))), SLOW[1], SLOW[0]
    )
    assert faster["verdict"] == "faster" and not faster["regression"]


def test_the_aa_spread_is_measured_on_rows_running_the_same_code():
    library = {"status": "ok", "steps": [{"engine": "cudnn", "knobs": []}]}
    aa = ab.make_row("w1", "t", "opgraph", library, library, [100.0, 100.0], [102.5, 102.5])  # same code: 2.5%
    same = ab.make_row("w2", "t", "opgraph", side(), side(), [100.0, 100.0], [99.0, 99.0])
    changed = ab.make_row("w3", "t", "generated", side(), side(kernel="spec:other"), [100.0, 100.0], [102.0, 102.0])
    assert changed["regression"]  # 2% > the 1% floor
    assert ab.aa_spread([aa, same, changed]) == pytest.approx(0.025)  # the changed row does not count
    assert ab.aa_spread([changed]) == 0.0
    again = ab.make_row(
        "w3", "t", "generated", side(), side(kernel="spec:other"), [100.0, 100.0], [102.0, 102.0], 0.025
    )
    assert not again["regression"] and again["verdict"] == "same"  # within what the same code moved


def test_regression_on_a_check_or_a_failure_new_brings():
    same = ([100.0, 100.0], [100.0, 100.0])
    assert ab.make_row("w", "t", "opgraph", side(), side(passed=False, ratio=3.0), *same)["regression"]
    assert not ab.make_row("w", "t", "opgraph", side(passed=False), side(passed=False), *same)["regression"]
    broken = {"status": "error", "error": "GraphError: no engine"}
    row = ab.make_row("w", "t", "opgraph", side(), broken, same[0], [])
    assert row["regression"] and "GraphError" in row["why"] and row["verdict"] == "-"
    assert not ab.make_row("w", "t", "opgraph", broken, side(), [], same[1])["regression"]


def test_totals_and_exit_status():
    rows = [
        ab.make_row("a", "t", "opgraph", side(), side(), [100.0, 100.0], [100.0, 100.0]),
        ab.make_row(
            "b",
            "t",
            "opgraph",
            side(),
            side(knobs=(("template", "conv_fprop"), ("BLOCK_M", 128))),
            [100.0, 100.0],
            [121.0, 121.0],
        ),
        ab.make_row("a", "t", "generated", side(), side(), [50.0, 50.0], [40.0, 40.0]),
    ]
    by = {t["variant"]: t for t in ab.totals(rows)}
    assert by["opgraph"]["timed"] == 2 and by["opgraph"]["old_us"] == 200.0 and by["opgraph"]["new_us"] == 221.0
    assert by["opgraph"]["geomean"] == pytest.approx(math.sqrt(1.21))
    assert (by["opgraph"]["same"], by["opgraph"]["SLOWER"], by["opgraph"]["configs_differ"]) == (1, 1, 1)
    assert by["all"]["faster"] == 1 and by["all"]["regressions"] == 1
    assert ab.exit_status(rows) == 1 and ab.exit_status(rows[:1] + rows[2:]) == 0


def test_render_names_rows_differences_and_regressions():
    rows = [
        ab.make_row(
            "conv.a", "t", "generated", side(), side(knobs=(("template", "conv_fprop"), ("BLOCK_M", 128))), *SLOW
        ),
        ab.make_row("conv.b", "t", "opgraph", side(), {"status": "not set up", "error": "budget"}, [1.0], []),
    ]
    meta = {
        "old": {"label": "aee2b8b", "root": "/x/.old", "env": {}},
        "new": {"label": "86670c6", "root": "/x", "env": {"device": "NVIDIA H200", "date": "2026-11-29"}},
        "suite": ["conv-fp16"],
        "variants": ["opgraph", "generated"],
        "rounds": 5,
        "passes": 2,
        "noise_floor": 0.01,
    }
    md = ab.render(meta, rows)
    assert md.startswith("# opgraph A/B: aee2b8b → 86670c6")
    assert "NVIDIA H200" in md and "(exit status 1)" in md
    assert "| conv.a | generated | 100.2 | 120.2 | 1.200 | 1.0% | **SLOWER** | differ | same |" in md
    assert "step 0 (conv_fprop+bias+relu): triton:conv_fprop[BLOCK_M=64] → triton:conv_fprop[BLOCK_M=128]" in md
    assert "- conv.b [opgraph]: new: not set up budget" in md
    assert "- conv.a [generated]: slower beyond noise" in md


@pytest.mark.slow
@pytest.mark.interpreter
def test_dry_run_of_the_repository_against_itself(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH", "OUT")}
    env["OPGRAPH_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--old",
            str(ROOT),
            "--new",
            str(ROOT),
            "--dry-run",
            "--suite",
            "memory.layernorm_fwd.bf16",
            "--passes",
            "1",
            "--rounds",
            "2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / "ab_kernels.json").read_text())
    rows = {r["variant"]: r for r in data["rows"]}
    assert set(rows) == {"opgraph", "generated"}
    for r in rows.values():
        assert r["old"]["status"] == r["new"]["status"] == "ok"
        assert r["configs"] == "same" and len(r["old_samples"]) == len(r["new_samples"]) == 2
        assert r["old"]["check"]["passed"] and r["new"]["check"]["passed"]
        assert r["old"]["tolerances"]["y"]["basis"].startswith("fallback")
    assert rows["generated"]["kernels"] == "same" and rows["generated"]["new"]["engines"] == "triton:rownorm"
    assert data["meta"]["old"]["opgraph"].startswith(str(ROOT))
    assert (tmp_path / "ab_kernels.md").read_text().startswith("# opgraph A/B")


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_ab_of_the_repository_against_itself(tmp_path):
    """The CUDA path: plans checked, captured, timed in CUDA graphs with one K for both versions."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "OUT")}
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--old",
            str(ROOT),
            "--new",
            str(ROOT),
            "--workers",
            "1",
            "--suite",
            "conv.r50_3x3_c64.fp16",
            "memory.layernorm_fwd.bf16",
            "--budget",
            "200",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / "ab_kernels.json").read_text())
    assert len(data["rows"]) == 4
    for r in data["rows"]:
        assert r["old"]["status"] == r["new"]["status"] == "ok", r
        assert r["old"]["how"].startswith("CUDA graph of") and r["k"] >= 1
        assert (r["configs"], r["verdict"] != "-") == ("same", True)
        assert r["kernels"] in ("same", "-") and len(r["old_samples"]) == len(r["new_samples"]) == 4
        assert r["ratio"] == pytest.approx(1.0, rel=0.25)  # the same code: only noise
    assert "NVIDIA" in data["meta"]["new"]["env"]["device"]
