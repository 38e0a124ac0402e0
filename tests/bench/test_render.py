"""Markdown tables (bench.core.render), on the CPU."""

from __future__ import annotations

from bench.core.aggregate import Stat, aggregate
from bench.core.render import fmt_num, fmt_stat, render, render_many

from .helpers import run


def header_cells(md: str, heading: str) -> list[str]:
    part = md.split(heading, 1)[1]
    first = next(ln for ln in part.splitlines() if ln.startswith("|"))
    return [c.strip() for c in first.strip("|").split("|")]


def table(md: str, heading: str) -> list[dict[str, str]]:
    head = header_cells(md, heading)
    part = md.split(heading, 1)[1].split("\n\n")
    block = next(p for p in part if p.startswith("|"))
    body = block.splitlines()[2:]
    return [dict(zip(head, [c.strip() for c in ln.strip("|").split("|")])) for ln in body]


def test_numbers():
    assert fmt_num(1234.5) == "1,234" or fmt_num(1234.5) == "1,235"
    assert fmt_num(12.34) == "12.3" and fmt_num(1.234) == "1.23" and fmt_num(0.01234) == "0.0123"
    assert fmt_stat(Stat(10.0, 9.0, 12.0, 3)) == "10.0 (9.00–12.0)"
    assert fmt_stat(Stat(10.0, 10.0, 10.0, 1)) == "10.0"


def test_header_names_machine_software_and_repeats():
    md = render(aggregate([run(1), run(2), run(3)]), "t")
    for text in (
        "NVIDIA H100 80GB HBM3",
        "driver 580.1",
        "Xeon",
        "PyTorch 2.11.0",
        "Triton 3.6.0",
        "3 process-level",
        "copy 3000 GB/s",
        "datasheet HBM bandwidth 3350 GB/s",
        "dense peak float16 989",
    ):
        assert text in md, text


def test_header_says_how_a_run_was_spread_and_pinned():
    runs = [run(r, meta={"spread_gpus": 4, "cores_per_worker": 16}) for r in (1, 2)]
    md = render(aggregate(runs), "t")
    assert "Spread over 4 GPUs" in md and "pinned to 16 cores of its own" in md
    md = render(aggregate([run(r, meta={"spread_gpus": 4}) for r in (1, 2)]), "t")
    assert "Spread over 4 GPUs" in md and "pinned" not in md
    assert "Spread over" not in render(aggregate([run(1)]), "t")


def test_ratios_stay_within_one_table_and_use_the_best_passing_peer():
    md = render(aggregate([run(1)]), "t")
    dev = table(md, "### CUDA graph: device time")
    a = next(r for r in dev if r["workload"] == "conv A fp16")
    assert a["best peer"] == "9.00 (cuDNN FE tuned)"
    assert a["opgraph / best"] == f"{10 / 9:.2f}" and a["tuned / best"] == f"{8 / 9:.2f}"
    ex = table(md, "### Execute: plain calls")
    a = next(r for r in ex if r["workload"] == "conv A fp16")
    assert a["best peer"] == "30.0 (cuDNN FE tuned)" and a["opgraph / best"] == f"{20 / 30:.2f}"
    # the compile row that replays its own CUDA graphs is in the replay table only
    assert "torch.compile (CUDA graphs)" not in header_cells(md, "### Execute: plain calls")
    assert "torch.compile (CUDA graphs)" in header_cells(md, "### CUDA graph: replay as run")


def test_a_result_outside_the_tolerance_is_flagged_and_never_in_a_ratio():
    md = render(aggregate([run(1, ours_err=5e-3)]), "t")
    a = next(r for r in table(md, "### CUDA graph: device time") if r["workload"] == "conv A fp16")
    assert a["opgraph"].endswith("✗") and a["opgraph / best"] == "—"
    assert a["tuned / best"] != "—"
    checks = table(md, "### Correctness")
    assert next(r for r in checks if r["workload"] == "conv A fp16")["opgraph"].startswith("✗")


def test_engine_column_and_geomean():
    md = render(aggregate([run(1)]), "t")
    a = next(r for r in table(md, "### CUDA graph: device time") if r["workload"] == "conv A fp16")
    assert a["engines (opgraph · tuned · generated)"] == "triton:conv_fprop · triton:conv_fprop · triton:conv_fprop"
    assert "Geometric mean of ratio to the best peer: opgraph" in md


def test_ranges_appear_with_several_repeats():
    md = render(aggregate([run(1, 1.0), run(2, 1.1), run(3, 0.9)]), "t")
    a = next(r for r in table(md, "### CUDA graph: device time") if r["workload"] == "conv A fp16")
    assert a["opgraph"] == "10.0 (9.00–11.0)"


def test_unavailable_implementations_are_listed_with_their_reason():
    md = render(aggregate([run(1)]), "t")
    assert "- torch.compile (conv A fp16): needs compile" in md


def test_many_tables_keep_their_own_headers():
    md = render_many([("conv-fp16", aggregate([run(1)])), ("memory", aggregate([run(1)]))], "suite")
    lines = md.splitlines()
    assert lines[0] == "# suite" and lines.count("## conv-fp16") == 1 and lines.count("## memory") == 1
    assert md.count("Measured ") == 2 and lines.count("### conv-fp16") == 2  # each run's groups one level down


def test_every_implementation_names_its_engine():
    md = render(aggregate([run(1)]), "t")
    rows_ = table(md, "### Engines")
    a = next(r for r in rows_ if r["workload"] == "conv A fp16")
    assert a["opgraph"] == "triton:conv_fprop" and a["cuDNN FE tuned"] == "cuDNN" and a["torch eager"] == "cuDNN"


def test_a_group_with_fewer_repeats_says_so_and_implementation_notes_are_listed():
    r1, r2 = run(1), run(2)
    r2.workloads = []  # the time limit ended repeat 2 before this group ran
    r3 = run(3)
    r1.workloads[0].impls[0].notes = r3.workloads[0].impls[0].notes = "CUDA-graph replay not timed: outputs wrong"
    md = render(aggregate([r1, r2, r3]))
    assert "3 process-level repeat(s)" in md and "**2 repeat(s) in this group**" in md
    assert "- opgraph (conv A fp16): CUDA-graph replay not timed: outputs wrong" in md
    assert "repeat(s) in this group" not in render(aggregate([run(1), run(2)]))
