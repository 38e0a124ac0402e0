"""Markdown tables from aggregated results: one section per group, one table per mode and metric.

No ratio crosses modes: each table holds one metric (CUDA-graph device time, CUDA-graph replay,
execute, latency), its ratios compare opgraph's plans with the best peer *in that table*, and each of
opgraph's plans (heuristic, tuned, generated-only heuristic and tuned) gets its own ratio column.
A cell is the median of the repeats with (min–max); ✗ marks a result outside the tolerance (never
used in a ratio); "err" an implementation that failed to run; — one that does not apply.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .aggregate import AggImpl, Aggregate, AggWorkload, Stat
from .floors import datasheet, evaluate
from .records import OURS

TIME_TABLES: tuple[tuple[str, str, str], ...] = (
    (
        "device_us",
        "CUDA graph: device time (µs per call)",
        (
            "Each implementation captured K times in one CUDA graph by the suite's helper (the same for all), "
            "replays timed with CUDA events, divided by K: device time, host hidden. † the profiler's kernel "
            "sum, for an implementation that cannot be captured."
        ),
    ),
    (
        "replay_us",
        "CUDA graph: replay as run (µs per call)",
        (
            "One captured call replayed back to back (at most a few hundred replays between synchronisations), host "
            'time of the replay included. torch.compile (CUDA graphs) is mode="max-autotune", replaying its own '
            "graphs."
        ),
    ),
    (
        "execute_us",
        "Execute: plain calls (µs per call)",
        (
            "Plain calls back to back, at most a few hundred between synchronisations: host time counts where it "
            'exceeds the device\'s. torch.compile is mode="max-autotune-no-cudagraphs".'
        ),
    ),
    (
        "latency_us",
        "Latency: one plain call (µs)",
        ("One plain call on an idle device, wall clock from the call until the device is done (median of many)."),
    ),
)
SHORT = {"opgraph": "opgraph", "opgraph tuned": "tuned", "generated": "generated", "generated tuned": "gen. tuned"}


def fmt_num(x: float) -> str:
    if x != x:
        return "nan"
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def fmt_stat(s: Stat | None) -> str:
    if s is None:
        return "—"
    if s.n > 1 and s.hi > s.lo:
        return f"{fmt_num(s.median)} ({fmt_num(s.lo)}–{fmt_num(s.hi)})"
    return fmt_num(s.median)


def cell(i: AggImpl | None, metric: str) -> str:
    if i is None:
        return "—"
    s = i.metrics.get(metric)
    if s is None:
        return "err" if i.status == "error" else "—"
    text = fmt_stat(s)
    if metric == "device_us" and i.methods.get("device_us", "").startswith("profiler"):
        text += " †"
    if i.verdict is not None and not i.verdict.passed:
        text += " ✗"
    return text


def best_peer(w: AggWorkload, metric: str) -> AggImpl | None:
    cands = [i for i in w.impls if i.role == "peer" and i.passed and metric in i.metrics]
    return min(cands, key=lambda i: i.metrics[metric].median) if cands else None


def ratio(w: AggWorkload, name: str, metric: str) -> float | None:
    i, b = w.impl(name), best_peer(w, metric)
    if i is None or b is None or not i.passed or metric not in i.metrics:
        return None
    return i.metrics[metric].median / b.metrics[metric].median


def geomean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def engines_text(w: AggWorkload) -> str:
    parts = []
    for name in OURS:
        i = w.impl(name)
        if i is not None:
            parts.append(i.engine or ("err" if i.status == "error" else "—"))
    return " · ".join(parts) if parts else "—"


def columns(ws: Sequence[AggWorkload], metric: str) -> tuple[list[str], list[str]]:
    ours = [n for n in OURS if any(w.impl(n) is not None for w in ws)]
    peers: list[str] = []
    for w in ws:
        for i in w.impls:
            if (
                i.role == "peer"
                and i.impl not in peers
                and any((x := v.impl(i.impl)) is not None and metric in x.metrics for v in ws)
            ):
                peers.append(i.impl)
    return ours, peers


def time_table(ws: Sequence[AggWorkload], metric: str, title: str, blurb: str, agg: Aggregate) -> list[str]:
    ws = [w for w in ws if any(metric in i.metrics for i in w.impls)]
    if not ws:
        return []
    ours, peers = columns(ws, metric)
    ours = [n for n in ours if any((i := w.impl(n)) is not None and metric in i.metrics for w in ws)]
    head = (
        ["workload", "floor (µs)", "engines (" + " · ".join(SHORT[n] for n in ours) + ")"]
        + ours
        + peers
        + ["best peer"]
        + [f"{SHORT[n]} / best" for n in ours]
    )
    lines = [f"### {title}", "", blurb, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios: dict[str, list[float]] = {n: [] for n in ours}
    for w in ws:
        floor = evaluate(w.floor, agg.ceilings).text() if agg.ceilings else "—"
        b = best_peer(w, metric)
        row = [w.title, floor, engines_text(w)]
        row += [cell(w.impl(n), metric) for n in ours + peers]
        row.append(f"{fmt_num(b.metrics[metric].median)} ({b.impl})" if b else "—")
        for n in ours:
            r = ratio(w, n, metric)
            if r is not None:
                ratios[n].append(r)
            row.append(f"{r:.2f}" if r is not None else "—")
        lines.append("| " + " | ".join(row) + " |")
    means = [f"{SHORT[n]} {g:.2f} over {len(ratios[n])}" for n in ours if (g := geomean(ratios[n])) is not None]
    if means:
        lines += ["", "Geometric mean of ratio to the best peer: " + "; ".join(means) + "."]
    return lines + [""]


def rate_table(ws: Sequence[AggWorkload], agg: Aggregate) -> list[str]:
    """TFLOP/s from the CUDA-graph device time, for workloads whose floor asks for it (`Floor(tflops=True)`):
    the workload's flops (the issue's count) over each implementation's median device time."""
    ws = [w for w in ws if w.floor.tflops and any("device_us" in i.metrics for i in w.impls)]
    if not ws:
        return []
    ours, peers = columns(ws, "device_us")
    ours = [n for n in ours if any((i := w.impl(n)) is not None and "device_us" in i.metrics for w in ws)]
    head = ["workload", "TFLOP", "floor rate"] + ours + peers + ["best peer"]
    lines = [
        "### Throughput: TFLOP/s (from the CUDA-graph device time)",
        "",
        (
            "The workload's floating-point operations over the median device time of the first table (its ✗ and † "
            "carry over). Floor rate: the cuBLAS GEMM rate measured for the type, the rate the math floor "
            "assumes."
        ),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]

    def tf(i: AggImpl | None, total: float) -> str:
        if i is None or "device_us" not in i.metrics or not i.metrics["device_us"].median:
            return "err" if i is not None and i.status == "error" else "—"
        text = fmt_num(total / (i.metrics["device_us"].median * 1e6))
        if i.methods.get("device_us", "").startswith("profiler"):
            text += " †"
        return text + ("" if i.verdict is None or i.verdict.passed else " ✗")

    for w in ws:
        total = w.floor.total_flops
        rate = agg.ceilings.rate(w.floor.dtype) if agg.ceilings else None
        b = best_peer(w, "device_us")
        row = [w.title, fmt_num(total / 1e12), fmt_num(rate) if rate else "—"]
        row += [tf(w.impl(n), total) for n in ours + peers]
        row.append(f"{tf(b, total)} ({b.impl})" if b else "—")
        lines.append("| " + " | ".join(row) + " |")
    return lines + [""]


def setup_table(ws: Sequence[AggWorkload], warm: bool = False) -> list[str]:
    ws = [w for w in ws if any("setup_s" in i.metrics for i in w.impls)]
    if not ws:
        return []
    ours, peers = columns(ws, "setup_s")
    names = ours + peers
    title = (
        "### Setup in the warm-up pass (s): the caches as the command found them"
        if warm
        else "### Setup: build, compile and tuning time (s; never inside a time above)"
    )
    blurb = (
        "The --warm-first pass: setup and checks only, before the timed repeats."
        if warm
        else "A repeat with cold caches compiles and tunes from scratch, later ones reuse the machine's caches "
        "(Inductor, Triton, opgraph's and the cuDNN peer's tuning); hence the ranges."
    )
    lines = [title, "", blurb, "", "| workload | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for w in ws:
        lines.append(f"| {w.title} | " + " | ".join(cell(w.impl(n), "setup_s") for n in names) + " |")
    return lines + [""]


def engines_table(ws: Sequence[AggWorkload]) -> list[str]:
    """What ran each implementation of each workload (opgraph's plans by engine and template, cuDNN's
    plan names, PyTorch's libraries)."""
    names: list[str] = [n for n in OURS if any(w.impl(n) for w in ws)]
    for w in ws:
        names += [i.impl for i in w.impls if i.role == "peer" and i.impl not in names]
    rows = []
    for w in ws:
        cells = []
        for n in names:
            i = w.impl(n)
            cells.append("—" if i is None or not i.engine else i.engine.replace("|", "/"))
        if any(c != "—" for c in cells):
            rows.append(f"| {w.title} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return (
        [
            "### Engines (what ran each implementation)",
            "",
            "| workload | " + " | ".join(names) + " |",
            "|" + "---|" * (len(names) + 1),
        ]
        + rows
        + [""]
    )


def check_cell(i: AggImpl | None) -> str:
    if i is None:
        return "—"
    if i.verdict is None:
        return "err" if i.status == "error" else "—"
    v = i.verdict
    r = "inf" if v.worst_ratio is None or math.isinf(v.worst_ratio) else f"{v.worst_ratio:.2f}"
    return f"✓ {r}" if v.passed else f"✗ {r} ({v.worst_output})"


def check_table(ws: Sequence[AggWorkload]) -> list[str]:
    ws = [w for w in ws if w.tolerances]
    if not ws:
        return []
    names: list[str] = [n for n in OURS if any(w.impl(n) for w in ws)]
    for w in ws:
        names += [i.impl for i in w.impls if i.role == "peer" and i.impl not in names]
    lines = [
        "### Correctness (every output, execute and CUDA-graph modes, worst repeat)",
        "",
        (
            "Cell: worst output's error / its tolerance (✓ within, ✗ outside, with the output). Tolerance per "
            "output: 3 x the larger of the best peer's relative L2 error against float64 and the type's unit "
            "roundoff (the most a correctly rounded result is off); an output that is zero in exact arithmetic "
            '(float64 reference below 1e-12 RMS) by its absolute RMS error, the same rule ("absolute" in its '
            "basis)."
        ),
        "",
        "| workload | outputs: tolerance (basis) | " + " | ".join(names) + " |",
        "|" + "---|" * (len(names) + 2),
    ]
    for w in ws:
        tols = "; ".join(f"{o} {t.value:.2g} ({t.basis})" for o, t in list(w.tolerances.items())[:4])
        if len(w.tolerances) > 4:
            n_abs = sum("absolute" in t.basis for t in w.tolerances.values())
            tols += f"; … {len(w.tolerances)} outputs" + (f" ({n_abs} absolute)" if n_abs else "")
        lines.append(f"| {w.title} | {tols} | " + " | ".join(check_cell(w.impl(n)) for n in names) + " |")
    return lines + [""]


def host_table(ws: Sequence[AggWorkload]) -> list[str]:
    ws = [w for w in ws if w.kind == "host"]
    if not ws:
        return []
    lines = [
        "### Host time (tiny shapes)",
        "",
        (
            "µs of host time per call, at most a few hundred calls between synchronisations; execute and "
            "latency as in the tables above."
        ),
        "",
        (
            "| measurement | implementation | engine | host µs | execute µs | latency µs | fresh process ms | check "
            "| note |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in ws:
        for i in w.impls:
            lines.append(
                f"| {w.title} | {i.impl} | {i.engine or '—'} | {cell(i, 'host_us')} | "
                f"{cell(i, 'execute_us')} | {cell(i, 'latency_us')} | {cell(i, 'fresh_ms')} | "
                f"{check_cell(i)} | "
                f"{(i.notes + ' ' + i.error).strip()[:160]} |"
            )
    return lines + [""]


def header(agg: Aggregate) -> list[str]:
    m = agg.meta
    c = agg.ceilings
    sheet = datasheet(str(m.get("device", ""))) or {}
    spread = ""
    if m.get("spread_gpus"):
        pinned = (
            f", pinned to {m['cores_per_worker']} cores of its own (its compiles too)"
            if m.get("cores_per_worker")
            else ""
        )
        spread = (
            f" Spread over {m['spread_gpus']} GPUs of the machine: each (repeat, group) a worker process on "
            f"one GPU{pinned}; the host-time rows never beside a cold (compiling) job or each other."
        )
    lines = [
        (
            f"Measured {', '.join(m.get('dates', [m.get('date', '?')]))} on **{m.get('device', '?')}** "
            f"(driver {m.get('driver', '?')}, {m.get('gpu_count', 1)} GPU(s) in the machine; host CPU "
            f"{m.get('cpu', '?')}), {agg.repeats} process-level repeat(s) (a group says where it has fewer); each cell "
            "the median (min–max)." + spread
        ),
        "",
        (
            f"Software: Python {m.get('python', '?')}, PyTorch {m.get('torch', '?')} (CUDA {m.get('cuda', '?')}, "
            f"cuDNN {m.get('cudnn', '?')}), Triton {m.get('triton', '?')}, cuDNN frontend "
            f"{m.get('cudnn_frontend') or 'not installed'}, torchvision {m.get('torchvision') or 'not installed'}, "
            f"opgraph {m.get('opgraph_commit', '?')}. Settings: {m.get('settings', '')}"
        ),
    ]
    if c:
        rates = ", ".join(f"{k} {v:.0f}" for k, v in c.gemm_tflops.items())
        peak = ", ".join(f"{k} {sheet[k]:.0f}" for k in c.gemm_tflops if k in sheet)
        hbm = f"{sheet['hbm_gbps']:.0f} GB/s" if "hbm_gbps" in sheet else "no datasheet entry"
        lines += [
            "",
            (
                f"Ceilings measured in the run: copy {c.copy_gbps:.0f} GB/s"
                + (f", read {c.read_gbps:.0f} GB/s" if c.read_gbps is not None else "")
                + f" (datasheet HBM bandwidth {hbm}); "
                f"cuBLAS GEMM 8192³ {rates} TFLOP/s (datasheet dense peak {peak or 'no entry'} TFLOP/s). Floors "
                "use the measured rates (bytes at the faster of copy and read)."
            ),
        ]
    if m.get("scale") and m.get("scale") != "full":
        lines += [
            "",
            (
                f"**Scale {m['scale']}**: shapes smaller than the titles say (smoke test or dry run); the "
                "numbers only show that the pipeline runs."
            ),
        ]
    return lines + [""]


def render(agg: Aggregate, title: str = "", warm: Aggregate | None = None) -> str:
    out = [f"# {title}" if title else "# Benchmark results", ""] + header(agg)
    groups: list[str] = []
    for w in agg.workloads:
        if w.group not in groups:
            groups.append(w.group)
    for g in groups:
        ws = [w for w in agg.workloads if w.group == g]
        out += [f"## {g}", ""]
        short = sorted({w.repeats for w in ws if w.repeats < agg.repeats and w.timed})
        if short:
            out += [
                f"**{'/'.join(map(str, short))} repeat(s) in this group** (the run's others: {agg.repeats}; the "
                "time limit or a failed worker ended it first).",
                "",
            ]
        kernels = [w for w in ws if w.kind != "host"]
        for metric, t, blurb in TIME_TABLES:
            out += time_table(kernels, metric, t, blurb, agg)
        out += rate_table(kernels, agg)
        out += host_table(ws)
        out += check_table(ws)
        out += engines_table(kernels)
        out += setup_table(ws)
        if warm is not None:
            out += setup_table([w for w in warm.workloads if w.group == g], warm=True)
        broken = [w for w in ws if w.error]
        for w in broken:
            out.append(f"- {w.title}: workload failed: {w.error[:300]}")
        notes = [w for w in ws if w.notes]
        if notes:
            out += ["Notes:", ""] + [f"- {w.title}: {w.notes}" for w in notes] + [""]
        said: dict[tuple[str, str], list[str]] = {}
        for w in ws:
            for i in w.impls:
                if i.notes and i.status == "ok":
                    said.setdefault((i.impl, i.notes[:300]), []).append(w.title)
        if said:
            out += (
                ["Implementation notes:", ""]
                + [
                    f"- {impl} ({titles[0] if len(titles) == 1 else f'{len(titles)} workloads'}): {note}"
                    for (impl, note), titles in said.items()
                ]
                + [""]
            )
        errs = [(w, i) for w in ws for i in w.impls if i.status != "ok" and i.error]
        if errs:
            out += ["Implementations that did not run:", ""]
            grouped: dict[tuple[str, str], list[str]] = {}
            for w, i in errs:
                grouped.setdefault((i.impl, i.error[:240]), []).append(w.title)
            for (impl, err), titles in grouped.items():
                where = titles[0] if len(titles) == 1 else f"{len(titles)} workloads"
                out.append(f"- {impl} ({where}): {err}")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def render_many(aggs: Sequence[tuple[str, Aggregate]], title: str) -> str:
    """Several tables (the groups of one session, each run by its own command) in one document, each
    with its own header: one machine per table."""
    parts = [f"# {title}", ""]
    for name, agg in aggs:
        parts += [("#" + line if line.startswith("#") else line) for line in render(agg, name).splitlines()]
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"
