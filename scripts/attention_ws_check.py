#!/usr/bin/env python3
"""Check and time the warp-specialised attention forward (knob WS=1, opgraph/engines/triton/attention/
warpspec.py) on a Hopper GPU, before it joins the candidates (attention/knobs.py `ws_candidates`).

For each case (bf16, B 4, H 16, D 128; S 1k / 4k / 16k, causal or not) it builds the forward with the
generated engine, then runs the heuristic's config and each `ws_candidates` config: every output (O and
the statistics) against PyTorch's float64 math on the GPU (outputs poisoned first), then the device time
of one call (CUDA events, median of 20 after a warm-up), beside PyTorch's cuDNN SDPA. One line per config
and a JSON file. Each config runs in a process of its own under a deadline (`--deadline`, seconds): a
kernel that faults cannot poison the next one's CUDA context, and one that never finishes (a deadlock
between warp groups) is a row saying so, not a hung check:

    python3 scripts/attention_ws_check.py --out $OUT [--cases s4k_causal,s16k] [--deadline 120]
    TRITON_INTERPRET=1 python3 scripts/attention_ws_check.py --dry-run   # CPU: the wiring, tiny shapes
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = {f"s{s // 1024}k{'_causal' if c else ''}": (s, c) for s in (1024, 4096, 16384) for c in (False, True)}


def _time(fn, reps: int = 20, dev: str = "cuda") -> float:
    """µs a call: `reps` calls between one pair of CUDA events (launch overhead amortised), median of 5."""
    import time

    import torch

    fn()
    if dev != "cuda":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def run_case(
    name: str, s: int, causal: bool, dry: bool = False, only: int | None = None
) -> tuple[list[dict], list[str]]:
    """The case's rows, each config's (`only`: the one at that index, -1 the cuDNN peer's), and the
    labels of all its configs."""
    import torch

    import opgraph as og
    from opgraph.build.planner import Step
    from opgraph.core.piece import make_piece
    from opgraph.engines import EngineConfig, get_engine
    from opgraph.engines.triton.attention.knobs import ws_candidates
    from opgraph.engines.triton.templates import attention as fwd_template
    from opgraph.runtime.plan import ExecutionPlan

    b, h, d = (1, 2, 16) if dry else (4, 16, 128)
    s = 48 if dry else s
    dev = "cpu" if dry else "cuda"
    g = og.Graph(f"ws_{name}", io_data_type=og.DataType.BFLOAT16, intermediate_data_type=og.DataType.FLOAT)
    q, k, v = (g.tensor(dim=[b, h, s, d], name=n) for n in "qkv")
    o, st = g.sdpa(q, k, v, attn_scale=d**-0.5, generate_stats=True, use_causal_mask=causal, name="fwd")
    o.set_output(True)
    st.set_output(True)
    plan = g.build(device=dev, engines=["triton"])
    device = plan.device
    (step,) = plan.steps
    spec = fwd_template.TEMPLATE.match(make_piece(plan.graph, 0, list(step.piece.nodes)), device).spec()
    configs = [("heuristic", step.config)]
    found = ws_candidates(spec, hopper=True)
    if dry:  # (the interpreter's tiles)
        found = [k.replace(BLOCK_M=16, BLOCK_N=16, num_stages=1) for k in found[:1]]
    for knobs in found:
        pairs = dict(knobs.pairs()) | {"template": "attention"}
        configs.append(
            (
                f"WS {knobs.BLOCK_M}x{knobs.BLOCK_N} s{knobs.num_stages}",
                EngineConfig("triton", tuple(sorted(pairs.items()))),
            )
        )

    labels = [label for label, _ in configs]
    if only is not None:
        configs = configs[only : only + 1] if 0 <= only < len(configs) else []
        if not configs and only != -1:
            return [], labels
    gen = torch.Generator(device=dev).manual_seed(0)
    qv, kv, vv = (torch.randn(b, h, s, d, device=dev, generator=gen).to(torch.bfloat16) for _ in range(3))

    def reference(bi: int, hi: int):
        """O and the statistics of one (batch, head) in float64 (a head at a time: at 16k tokens the
        scores of every head would take 137 GB)."""
        with torch.no_grad():
            q64, k64, v64 = (x[bi, hi].double() for x in (qv, kv, vv))
            scores = (q64 @ k64.T) * d**-0.5
            if causal:
                scores = scores.masked_fill(torch.ones(s, s, device=dev, dtype=torch.bool).triu(1), float("-inf"))
            return torch.softmax(scores, dim=-1) @ v64, torch.logsumexp(scores, dim=-1, keepdim=True)

    peer = not dry and only in (None, -1)  # (the cuDNN row: checked against the same reference)
    wants = {(bi, hi): reference(bi, hi) for bi in range(b) for hi in range(h)} if configs or peer else {}
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    rows = []
    for label, config in configs:
        row: dict = {"case": name, "config": label, "knobs": dict(config.knobs)}
        try:
            kernel = get_engine("triton").compile(step.piece, config, device)
            p = ExecutionPlan(plan.graph, device, (Step(0, step.piece, config, kernel),), plan.cuts)
            out = torch.full((b, h, s, d), float("nan"), device=dev, dtype=torch.bfloat16)
            stats = torch.full((b, h, s, 1), float("nan"), device=dev, dtype=torch.float32)
            pack = {q: qv, k: kv, v: vv, o: out, st: stats}
            p.execute(pack)
            if not dry:
                torch.cuda.synchronize()
            row["o_max_err"] = max(float((out[bh].double() - w[0]).abs().max()) for bh, w in wants.items())
            row["stats_max_err"] = max(float((stats[bh].double() - w[1]).abs().max()) for bh, w in wants.items())
            row["nan"] = bool(out.isnan().any() or stats.isnan().any())  # (every head written)
            row["ok"] = row["o_max_err"] < 2e-2 and row["stats_max_err"] < 1e-2 and not row["nan"]
            row["us"] = _time(lambda p=p, pack=pack: p.execute(pack), dev=dev)
            binary = kernel.binary(0) if hasattr(kernel, "binary") and not dry else None
            if binary is not None:  # (a warp-specialised kernel has 12 warps: proof Triton split the loop)
                row["num_warps"] = binary.meta("num_warps", None)
                row["shared"] = binary.meta("shared", None)
            row["tflops"] = flops / row["us"] / 1e6
        except Exception as err:  # noqa: BLE001 - a config that fails is a row saying so
            row["error"] = f"{type(err).__name__}: {err}"[:400]
        rows.append(row)
    if not peer:
        return rows, labels
    sdpa = torch.nn.functional.scaled_dot_product_attention
    try:
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            got = sdpa(qv, kv, vv, is_causal=causal)
            err = max(float((got[bh].double() - w[0]).abs().max()) for bh, w in wants.items())
            us = _time(lambda: sdpa(qv, kv, vv, is_causal=causal))
        rows.append(
            {
                "case": name,
                "config": "torch SDPA (cuDNN)",
                "us": us,
                "tflops": flops / us / 1e6,
                "o_max_err": err,
                "ok": err < 2e-2,
            }
        )
    except Exception as err:  # noqa: BLE001 - the peer's row says why it is missing
        rows.append({"case": name, "config": "torch SDPA (cuDNN)", "error": f"{type(err).__name__}: {err}"[:300]})
    return rows, labels


def _isolated(name: str, index: int, label: str, deadline: float, dry: bool) -> tuple[list[dict], list[str]]:
    """The rows of one config of a case (index -1: the cuDNN peer's) and the case's config labels, from a
    child process given `deadline` seconds; a child that dies or hangs is a row saying so."""
    import subprocess

    cmd = [sys.executable, "-u", __file__, "--child", f"{name}:{index}", *(["--dry-run"] if dry else [])]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=deadline, check=False)
    except subprocess.TimeoutExpired:
        return [{"case": name, "config": label, "error": f"no answer in {deadline:.0f} s (killed): a hang?"}], []
    lines = [x for x in done.stdout.splitlines() if x.startswith("ROWS ")]
    if done.returncode != 0 or not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-4:])
        return [{"case": name, "config": label, "error": f"exit status {done.returncode}: {tail}"[:400]}], []
    rows, labels = json.loads(lines[-1][5:])
    return rows, labels


def _print(row: dict) -> None:
    us = f"{row['us']:9.1f} µs {row['tflops']:6.1f} TFLOP/s" if "us" in row else ""
    state = row.get("error") or (
        "ok" if row.get("ok") else f"WRONG o {row.get('o_max_err')} stats {row.get('stats_max_err')}"
    )
    warps = f" ({row['num_warps']} warps, {row['shared']} B shared)" if row.get("num_warps") else ""
    print(f"{row['case']:12s} {row['config']:22s} {us} {state}{warps}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/ws-check")
    p.add_argument("--cases", default="s4k,s4k_causal,s1k_causal,s16k_causal", help=f"of {', '.join(CASES)}")
    p.add_argument("--deadline", type=float, default=120.0, help="seconds a config's process may take")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, one WS config: the wiring")
    p.add_argument("--child", help=argparse.SUPPRESS)  # case:index, run here (the parent's isolation)
    args = p.parse_args()
    if args.child:
        name, index = args.child.rsplit(":", 1)
        print("ROWS " + json.dumps(run_case(name, *CASES[name], dry=args.dry_run, only=int(index))), flush=True)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.dry_run:
        import torch

        cap = torch.cuda.get_device_capability()
        if cap < (9, 0):
            sys.exit(f"attention_ws_check: a Hopper GPU (compute capability 9.0+) is needed, this one is {cap}")
    rows: list[dict] = []

    def keep(found: list[dict]) -> None:  # (written and printed as each child answers)
        for row in found:
            rows.append(row)
            (out / "attention_ws_check.json").write_text(json.dumps(rows, indent=1))
            _print(row)

    for name in args.cases.split(","):
        # the first child (the heuristic's config) names the case's configs; a hang there: the heuristic
        # and the WS configs of ws_candidates' order, as many as it offers for D 128 on Hopper
        found, labels = _isolated(name, 0, "heuristic", args.deadline, args.dry_run)
        keep(found)
        labels = labels or ["heuristic", "WS #1", "WS #2"]
        for index in range(1, len(labels)):
            keep(_isolated(name, index, labels[index], args.deadline, args.dry_run)[0])
        keep(_isolated(name, -1, "torch SDPA (cuDNN)", args.deadline, args.dry_run)[0])


if __name__ == "__main__":
    main()
