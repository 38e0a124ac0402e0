"""Data-parallel training-step benchmark of issue 44: opgraph's data-parallel step
(`train_step(..., process_group=...)`, captured in one CUDA graph with its NCCL calls) against PyTorch DDP,
eager and under torch.compile, on 1..8 GPUs of one host, one process a GPU. Self-contained:

    python -m bench.data_parallel resnet50 --gpus 1,2,4,8          # ResNet-50, 224², batch 64 a GPU, fp16, SGD
    python -m bench.data_parallel llama --gpus 1,2 --seq 1024      # transformers' Llama of bench.workloads.zoo, bf16, AdamW
    python -m bench.data_parallel gpt --gpus 1,8 --layers 12        # GPT-2 small, bf16, AdamW (bench.gpt's model)
    python -m bench.data_parallel --dry-run                        # CPU, gloo, 1 and 2 ranks, a tiny MLP: wiring, checks

Implementations, all from the same weights on the same shards (each rank its own batch of --batch):
  opgraph          train_step(..., process_group=WORLD) captured (step.capture), replayed
  opgraph-run      the same step executed by plain calls (step.run): the like of ddp's plain calls, since
                   PyTorch's stack cannot capture DDP's NCCL calls in a CUDA graph
  opgraph-zero1    the same with zero=True (optimizer state sharded; a broadcast of parameters after)
  ddp              DistributedDataParallel + autocast (+ GradScaler for fp16) + torch.optim (fused on CUDA)
  ddp-compile      the same with torch.compile(ddp_model)
Checked before timing: every implementation's first-step loss (rank 0's shard) within 2% of ddp's, and
every opgraph implementation's parameters after that first step against ddp's after its first step,
from the same weights and batches (`param_check`: per parameter, in fp32, the distance to ddp's
parameter relative to the size of ddp's step; the worst parameter is reported by name; PARAM_TOL).
A failed check marks its row, and the run exits non-zero.
Timed: per world size and implementation, the median over --iters steps (after --warmup) of the slowest
rank's step time (CUDA events). Reported: ms per step, items/s over all GPUs, the scaling efficiency
(throughput at N GPUs / (N x throughput at 1 GPU), targets >= 0.95 at 8), and opgraph's step time over
ddp-compile's (target <= 0.9). NCCL's NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and friends).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

for _var, _value in (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
):
    os.environ[_var] = _value

MODES = ("opgraph", "opgraph-run", "opgraph-zero1", "ddp", "ddp-compile")
LOSS_TOL = 0.02  # the first-step loss, relative to ddp's
# The parameters after the first step: ||p - p_ddp|| / ||p_ddp - p_0|| per parameter (in fp32), the error
# relative to the size of ddp's step (a step left out, of the wrong sign or size is >= 0.5 of it). fp32
# (--dry-run): sums in another order, ~1e-6. 16-bit mixed precision: the gradients of fp16 / bf16 kernels
# that differ from cuDNN's and cuBLAS's by their rounding (2^-11 / 2^-8, grown over their sums): up to
# 0.1 of the step. AdamW's first step is lr * g / |g| an element: a gradient element near 0 whose sign the
# rounding flips moves by 2 lr (a relative error of 2 sqrt(the fraction flipped)), hence ADAMW_FACTOR.
PARAM_TOL = {None: 1e-3, "fp16": 0.1, "bf16": 0.1}
ADAMW_FACTOR = 3.0


def param_tolerance(precision: str | None, sgd: bool) -> float:
    """The parameter check's tolerance for a workload's precision and optimizer (see PARAM_TOL)."""
    return PARAM_TOL[precision] * (1.0 if sgd else ADAMW_FACTOR)


def param_check(got: dict[str, Any], ref: dict[str, Any], start: dict[str, Any], tol: float) -> dict[str, Any]:
    """Parameters after one step (`got`, name -> tensor) against ddp's (`ref`) from the same `start`: per
    parameter ||got - ref|| / ||ref - start|| in fp32 (0 when both equal; a step where ddp took none,
    as GradScaler's skipped first step, is inf); {"ok", "worst" (its name), "rel", "tol"}."""
    import torch

    worst, worst_rel = "", 0.0
    missing = sorted(set(ref) - set(got))
    for name, want in ref.items():
        if name not in got:
            continue
        g, w, w0 = got[name].float(), want.float(), start[name].float()
        diff = float(torch.linalg.vector_norm(g - w))
        step = float(torch.linalg.vector_norm(w - w0))
        rel = 0.0 if diff == 0.0 else (diff / step if step > 0.0 else float("inf"))
        if not rel <= worst_rel:  # (nan counts as the worst)
            worst, worst_rel = name, rel
    if missing:
        return {"ok": False, "worst": missing[0], "rel": float("inf"), "tol": tol}
    return {"ok": worst_rel <= tol, "worst": worst, "rel": worst_rel, "tol": tol}


def parameters(model: Any) -> dict[str, Any]:
    """The model's parameters by name: fp32 copies on the host."""
    return {k: p.detach().float().cpu().clone() for k, p in model.named_parameters()}


def workload(name: str, args: argparse.Namespace, device: Any) -> dict[str, Any]:
    """The model (fp32, train mode), a batch maker, the optimizers and the precision of `name`."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    if name == "tiny":
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        make = lambda g: (torch.randn(args.batch, 32, generator=g), torch.randint(0, 10, (args.batch,), generator=g))  # noqa: E731
        return {
            "model": model.to(device).train(),
            "make": make,
            "items": args.batch,
            "unit": "samples/s",
            "precision": None,
            "sgd": True,
        }
    if name == "resnet50":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.frontends.tv_models import build

        model = build("resnet50").to(device).to(memory_format=torch.channels_last).train()

        def make(g: Any) -> tuple[Any, Any]:
            x = torch.randn(args.batch, 3, 224, 224, generator=g).to(memory_format=torch.channels_last)
            return x, torch.randint(0, 1000, (args.batch,), generator=g)

        return {"model": model, "make": make, "items": args.batch, "unit": "images/s", "precision": "fp16", "sgd": True}
    if name == "llama":  # the real-models issue's Llama step: 8 layers, d 1024, GQA 16/4, bf16, AdamW
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.frontends.zoo_models import Logits

        from .workloads.zoo import LLAMA_SIZES, llama_model

        vocab = LLAMA_SIZES[-1]
        model = Logits(llama_model(*LLAMA_SIZES), flatten=True, field="logits").to(device).train()

        def make_llama(g: Any) -> tuple[Any, Any]:
            x = torch.randint(0, vocab, (args.batch, args.seq), generator=g)
            return x, torch.randint(0, vocab, (args.batch * args.seq,), generator=g)

        return {
            "model": model,
            "make": make_llama,
            "items": args.batch * args.seq,
            "unit": "tokens/s",
            "precision": "bf16",
            "sgd": False,
        }
    from .gpt import GPT, GPTConfig

    c = GPTConfig(seq=args.seq, layers=args.layers)
    model = GPT(c).to(device).train()

    def make_tokens(g: Any) -> tuple[Any, Any]:
        return (
            torch.randint(0, c.vocab, (args.batch, c.seq), generator=g),
            torch.randint(0, c.vocab, (args.batch, c.seq), generator=g),
        )

    return {
        "model": model,
        "make": make_tokens,
        "items": args.batch * c.seq,
        "unit": "tokens/s",
        "precision": "bf16",
        "sgd": False,
    }


def time_steps(fn: Any, warmup: int, iters: int, cuda: bool) -> list[float]:
    import torch

    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def implementation(mode: str, w: dict[str, Any], x: Any, y: Any, cuda: bool, cap_mb: float) -> tuple[Any, float, Any]:
    """(one step, the first step's loss, the model it trains: its parameters after the first step)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import opgraph as og
    from opgraph.training import SGD, AdamW, train_step

    model = copy.deepcopy(w["model"])
    if mode.startswith("opgraph"):
        opt = SGD(0.1, momentum=0.9) if w["sgd"] else AdamW(3e-4)
        step = train_step(
            og.from_torch(model, (x,)),
            "cross_entropy",
            opt,
            mixed_precision=w["precision"],
            process_group=dist.group.WORLD,
            bucket_cap_mb=cap_mb,
            zero=mode.endswith("zero1"),
        )
        if not cuda or mode == "opgraph-run":
            first = float(step.run(x, y))
            return (lambda: step.run(x, y)), first, model
        captured = step.capture(x, y)  # (its warm-up step is undone)
        first = float(captured.replay())
        return captured.replay, first, model
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[x.device.index] if cuda else None, bucket_cap_mb=cap_mb, gradient_as_bucket_view=True
    )
    net = torch.compile(ddp) if mode == "ddp-compile" else ddp
    fused = {"fused": True} if cuda else {}
    topt = (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, **fused)
        if w["sgd"]
        else torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, **fused)
    )
    low = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(w["precision"])
    scaler = torch.amp.GradScaler("cuda") if w["precision"] == "fp16" and cuda else None

    def run() -> Any:
        topt.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=low, enabled=low is not None):
            out = net(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(topt)
            scaler.update()
        else:
            loss.backward()
            topt.step()
        return loss

    return run, float(run().detach()), model


def rank_main(rank: int, world: int, args: argparse.Namespace, store: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    cuda = not args.dry_run
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        w = workload(args.workload, args, device)
        x, y = w["make"](torch.Generator().manual_seed(rank))
        x, y = x.to(device), y.to(device)
        rows: dict[str, Any] = {}
        after: dict[str, dict[str, Any]] = {}  # rank 0: each mode's parameters after its first step
        for mode in args.modes:
            fn, first, model = implementation(mode, w, x, y, cuda, args.bucket_cap_mb)
            if mode == args.perturb:  # (tests: the check must fail) this mode's step of one parameter x 1.5
                name, p = list(model.named_parameters())[-1]
                with torch.no_grad():
                    p.add_(p - w["model"].get_parameter(name), alpha=0.5)
            if rank == 0:
                after[mode] = parameters(model)
            ms = time_steps(fn, args.warmup, args.iters, cuda)
            if hasattr(getattr(fn, "__self__", None), "release"):  # a captured step: its graph freed before
                fn.__self__.release()  # the process group is destroyed (NCCL would wait for good)
            slowest = [0.0] * len(ms)
            for i, t in enumerate(ms):  # per step, the slowest rank's time
                v = torch.tensor([t], dtype=torch.float64, device=device)
                dist.all_reduce(v, op=dist.ReduceOp.MAX)
                slowest[i] = float(v)
            rows[mode] = {"ms": statistics.median(slowest), "first_loss": first}
            del fn, model  # (ddp's reducer holds the group: none may outlive destroy_process_group below)
        if rank == 0 and "ddp" in after:
            start = parameters(w["model"])
            tol = param_tolerance(w["precision"], w["sgd"])
            for mode in rows:
                if mode.startswith("opgraph"):
                    rows[mode]["params"] = param_check(after[mode], after["ddp"], start, tol)
        if rank == 0:
            Path(out).write_text(json.dumps({"rows": rows, "items": w["items"], "unit": w["unit"]}))
        # Every rank done with the group before any destroys it; with gloo, a rank that tears down while
        # its peer is still inside a collective aborts in gloo's threads at exit ("terminate called").
        # (torch.compile's caches may hold the compiled DDP module, and with it the group)
        torch._dynamo.reset()
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workload", nargs="?", default="resnet50", choices=["resnet50", "llama", "gpt", "tiny"])
    p.add_argument("--gpus", default=None, help="world sizes, comma-separated (one GPU a rank; default 1,2)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--batch", type=int, default=None, help="per GPU (default 64 images, 4 Llama / 8 GPT sequences)")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--dry-run", action="store_true", help="CPU, gloo, the tiny model (world sizes 1,2 unless --gpus)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument(
        "--perturb", default=None, metavar="MODE", help="for tests: scale MODE's first step of one parameter by 1.5"
    )
    args = p.parse_args(argv)
    args.gpus = args.gpus or "1,2"
    if args.dry_run:
        args.workload, args.iters, args.warmup = "tiny", 3, 1
        args.modes = "opgraph,opgraph-run,opgraph-zero1,ddp"  # (torch.compile on the CPU compiles C++ for minutes)
    args.batch = args.batch or {"resnet50": 64, "llama": 4, "gpt": 8, "tiny": 16}[args.workload]
    args.modes = [m for m in args.modes.split(",") if m]
    import torch.multiprocessing as mp

    results: dict[int, Any] = {}
    failed = 0
    print(f"{args.workload}, batch {args.batch} a GPU: ms per step (slowest rank, median), throughput, scaling")
    for world in (int(n) for n in args.gpus.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rank0.json")
            mp.spawn(rank_main, args=(world, args, os.path.join(tmp, "store"), out), nprocs=world, join=True)
            results[world] = json.loads(Path(out).read_text())
        failed += report(world, results, args)  # (each world size as it ends: a later one may be cut off)
        if args.out:
            Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 1 if failed else 0


def report(world: int, results: dict[int, Any], args: argparse.Namespace) -> int:
    """Print world size `world`'s rows; the number that failed a check against ddp (the first loss, the
    parameters after the first step)."""
    failed = 0
    res = results[world]
    rows, base = res["rows"], results[min(results)]["rows"]
    ref = rows.get("ddp", {}).get("first_loss")
    for mode, r in rows.items():
        loss_ok = ref is None or abs(r["first_loss"] - ref) <= LOSS_TOL * abs(ref)
        pc = r.get("params")
        ok = loss_ok and (pc is None or pc["ok"])
        failed += not ok
        rate = res["items"] * world / (r["ms"] / 1e3)
        one = base.get(mode)  # the same per-GPU batch: efficiency = time at the fewest GPUs / time here
        scale = (
            ""
            if one is None or world == min(results)
            else f"  scaling {one['ms'] / r['ms']:.3f} of {min(results)} GPU(s)"
        )
        vs = (
            ""
            if "ddp-compile" not in rows or not mode.startswith("opgraph")
            else f"  / ddp-compile {r['ms'] / rows['ddp-compile']['ms']:.2f}"
        )
        checks = "" if pc is None else f"  params {pc['rel']:.2g} of ddp's step ({pc['worst']})"
        if not loss_ok:
            checks += f"  FAILED CHECK: first loss {r['first_loss']:.4g} vs ddp {ref:.4g}"
        if pc is not None and not pc["ok"]:
            checks += (
                f"  FAILED CHECK: parameter '{pc['worst']}' after the first step {pc['rel']:.3g} of ddp's step "
                f"from ddp's (tolerance {pc['tol']:g})"
            )
        print(
            f"  {world} GPU(s) {mode:14s} {r['ms']:9.2f} ms  {rate:12.0f} {res['unit']}{scale}{vs}{checks}", flush=True
        )
    return failed


if __name__ == "__main__":
    sys.exit(main())
