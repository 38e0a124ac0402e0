"""The fp8 GEMM group's wiring on the CPU (bench.run --dry-run, tiny shapes): every implementation of every
workload ran and passed its checks (opgraph's builds, `torch._scaled_mm` in both accumulations, eager's
scaled_mm + amax + cast), outputs in fp8 and bf16 checked against float64 with the fp8 tolerances."""

from __future__ import annotations

import pytest

from .helpers import dry_run

pytest.importorskip("torch")


@pytest.mark.slow
def test_matmul_fp8_group_runs_and_checks_every_output(tmp_path):
    data = dry_run(tmp_path, "--suite", "matmul-fp8", "--repeats", "1", "--no-tune")
    by_id = {w["id"]: w for w in data["runs"][0]["workloads"]}
    assert set(by_id) == {"matmul.fp8.tensorwise", "matmul.fp8.rowwise", "matmul.fp8.amax_fp8_out"}
    for wid, w in by_id.items():
        assert not w["error"], (wid, w["error"])
        impls = {i["impl"]: i for i in w["impls"]}
        ran = [n for n, i in impls.items() if i["status"] != "unavailable"]
        peers = (
            {"torch._scaled_mm", "torch._scaled_mm (fast accumulation)"}
            if wid != "matmul.fp8.amax_fp8_out"
            else {"torch eager"}
        )
        assert {"opgraph", "generated"} | peers <= set(ran), (wid, ran)
        for name in ran:
            assert impls[name]["verdict"]["passed"], (wid, name, impls[name]["verdict"])
        assert impls["generated"]["engine"] == "triton:matmul", impls["generated"]["engine"]
    assert set(by_id["matmul.fp8.amax_fp8_out"]["impls"][0]["errors"]) == {"y", "amax"}
