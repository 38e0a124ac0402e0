"""The serving benchmark of issue 42 (bench/serving.py) dry-runs on the CPU: each implementation in its
own process with empty caches, its outputs checked against float64, opgraph's builds reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .helpers import ROOT

pytest.importorskip("transformers")


@pytest.mark.slow
def test_dry_run_serves_every_request_and_checks_it(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "bench.serving", "--dry-run", "--requests", "4", "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (result,) = tmp_path.glob("*-cpu-serving-dry-run.json")
    by_impl = {r["impl"]: r for r in json.loads(result.read_text())}
    assert set(by_impl) == {"opgraph", "torch eager"}
    for r in by_impl.values():
        assert len(r["request_ms"]) == 4 and r["wall_s"] > 0
        assert max(r["errors"]) < 1e-5, r["errors"]  # fp32 on the CPU
        assert r["engine"], r  # every row names what ran it
        gc = r["gc"]  # the collector's passes during the loop (the full ones within all of them)
        assert gc["passes"] >= gc["full_passes"] >= 0 and gc["seconds"] >= gc["full_seconds"] >= 0
    ours = by_impl["opgraph"]
    assert ours["built"] and ours["built"][0]["request"] == 0  # the first request builds
    built = {b["request"] for b in ours["built"]}
    assert len(built) == ours["built"][-1]["stats"]["bucket_plans"]  # a bucket's first request only builds
    assert ours["new_shapes"] and not built & set(ours["new_shapes"])  # the others re-pointed its kernels
    assert "opgraph" in ours["env"] and "PyTorch" in ours["env"]
    assert all("static_ms" in a for a in ours["alone"])
    assert ours["engine"] == "reference" and len(ours["errors"]) == 2 * len(ours["alone"])  # (the static plans too)
    assert "GC: full passes" in (tmp_path / result.name.replace(".json", ".md")).read_text()


def test_the_sampled_requests_include_the_shortest_and_the_median():
    from bench.serving import SAMPLED, sampled

    reqs = [
        (b, s)
        for b, s in zip(
            [3, 16, 1, 8, 2, 9, 4, 12, 5, 7, 6, 11], [900, 2000, 17, 64, 300, 40, 1500, 800, 120, 33, 256, 700]
        )
    ]
    picked = sampled(reqs)
    tokens = sorted(range(len(reqs)), key=lambda i: reqs[i][0] * reqs[i][1])
    assert tokens[0] in picked and tokens[len(reqs) // 2] in picked
    assert len(set(picked)) == len(picked) and SAMPLED <= len(picked) <= SAMPLED + 2
