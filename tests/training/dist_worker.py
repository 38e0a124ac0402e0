"""One rank of the data-parallel tests (tests/training/test_distributed.py): run as
`python -m tests.training.dist_worker RANK WORLD INIT_FILE OUT_FILE SCENARIO...`, it joins a gloo group
through the file store, runs each scenario (a data-parallel opgraph step on its shard; for batchnorm,
torch DDP on the same shards as the reference too; rank 0 also trains one process on the global batch)
and saves what the test compares (torch.save of a dict: scenario -> results)."""

from __future__ import annotations

import copy
import gc
import os
import sys
import traceback
from datetime import timedelta

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


def mlp(dtype):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.LayerNorm(12), nn.Linear(12, 5)).to(dtype).train()


def cnn(dtype):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return (
        nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.Conv2d(4, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4, 5),
        )
        .to(dtype)
        .train()
    )


# name -> (model, optimizer, grad_clip_norm, bucket_cap_mb, dtype name, engines, zero)
SCENARIOS = {
    "mlp_sgd": ("mlp", "sgd", None, 25.0, "float64", None, False),
    "mlp_sgd_clip": ("mlp", "sgd", 0.5, 25.0, "float64", None, False),
    "mlp_adamw_buckets": (
        "mlp",
        "adamw",
        None,
        100 / 2**20,
        "float64",
        None,
        False,
    ),  # ~100 bytes: a tensor or two each
    "mlp_adamw_clip_buckets": ("mlp", "adamw", 0.5, 300 / 2**20, "float64", None, False),
    "mlp_adamw_f32_torch": ("mlp", "adamw", 0.5, 200 / 2**20, "float32", ["torch"], False),
    "mlp_sgd_zero": ("mlp", "sgd", None, 300 / 2**20, "float64", None, True),
    "mlp_adamw_clip_zero": ("mlp", "adamw", 0.5, 300 / 2**20, "float64", None, True),
    "mlp_sgd_small_buckets": ("mlp", "sgd", None, 300 / 2**20, "float64", None, False),  # mlp_sgd_zero's twin
    "cnn_sgd_bn": ("cnn", "sgd", None, 400 / 2**20, "float64", None, False),
    "cnn_adamw_bn_clip": ("cnn", "adamw", 0.5, 400 / 2**20, "float64", None, False),
    "cnn_cl_sgd_bn_zero": ("cnn_cl", "sgd", None, 400 / 2**20, "float64", None, True),  # channels_last
}
STEPS = 3
GLOBAL_BATCH = 8


def optimizer(name):
    from opgraph.training import SGD, AdamW

    return SGD(0.1, momentum=0.9) if name == "sgd" else AdamW(1e-2, weight_decay=0.05)


def torch_optimizer(opt, params):
    import torch

    from opgraph.training import AdamW

    h = opt.hyper
    if isinstance(opt, AdamW):
        return torch.optim.AdamW(
            params, lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"], weight_decay=h["weight_decay"]
        )
    return torch.optim.SGD(params, lr=h["lr"], momentum=h["momentum"])


def batches(kind, dtype):
    import torch

    g = torch.Generator().manual_seed(1)
    shape = (GLOBAL_BATCH, 6) if kind == "mlp" else (GLOBAL_BATCH, 3, 6, 6)
    return [
        (torch.randn(*shape, generator=g, dtype=dtype), torch.randint(0, 5, (GLOBAL_BATCH,), generator=g))
        for _ in range(STEPS)
    ]


def torch_steps(model, opt, data, clip):
    """Plain torch (or a DDP-wrapped model): losses, parameters after each step."""
    import torch
    import torch.nn.functional as F

    topt = torch_optimizer(opt, model.parameters())
    losses, params, norms = [], [], []
    for x, y in data:
        topt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        topt.step()
        losses.append(float(loss))
        params.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return losses, params, norms


def run(name, rank, world):
    import torch
    import torch.distributed as dist

    import opgraph as og
    from opgraph.training import train_step

    kind, opt_name, clip, cap, dtype_name, engines, zero = SCENARIOS[name]
    dtype = getattr(torch, dtype_name)
    model = (mlp if kind == "mlp" else cnn)(dtype)
    if kind == "cnn_cl":
        model = model.to(memory_format=torch.channels_last)
    start = copy.deepcopy(model)
    data = batches(kind, dtype)
    per = GLOBAL_BATCH // world
    shards = [(x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]) for x, y in data]
    opt = optimizer(opt_name)
    step = train_step(
        og.from_torch(model, (shards[0][0],)),
        "cross_entropy",
        opt,
        grad_clip_norm=clip,
        process_group=dist.group.WORLD,
        bucket_cap_mb=cap,
        zero=zero,
    )
    if engines is not None:
        step.build("cpu", engines=engines)
    out = {
        "buckets": sum(1 for n in step.graph.final.nodes if n.kind == "all_reduce"),
        "losses": [],
        "params": [],
        "norms": [],
    }
    after = OpCounter()  # the torch ops TrainStep runs after the plan (the last step's)
    plain = step._after_execute

    def counted(pack):
        after.ops.clear()
        with after:
            plain(pack)

    step._after_execute = counted
    for i, (x, y) in enumerate(shards):
        if i == len(shards) - 1:  # the torch ops of a whole step
            with OpCounter() as whole:
                out["losses"].append(float(step.run(x, y)))
            out["run_ops"] = dict(whole.ops)
        else:
            out["losses"].append(float(step.run(x, y)))
        out["params"].append({k: v.detach().clone() for k, v in model.state_dict().items()})
        out["norms"].append(None if clip is None else float(step.grad_norm))
    out["state"] = {s.key: sorted(step.param_state(s.key)) for s in step.params}
    out["updates"] = sum(1 for n in step.graph.final.nodes if ".update." in n.name)
    out["after_ops"] = dict(after.ops)
    out["graph"] = step.graph.to_json(indent=None)
    out["storages"] = len({p.untyped_storage().data_ptr() for p in model.parameters()})
    out["strides"] = {k: tuple(p.stride()) for k, p in model.named_parameters()}
    out["start_strides"] = {k: tuple(p.stride()) for k, p in start.named_parameters()}
    if zero:  # a parameter given a new tensor: the step lays the parameters out again, and trains on
        first = next(model.parameters())
        first.data = first.data.clone()
        step.run(*shards[0])
        out["relaid"] = {
            "storages": len({p.untyped_storage().data_ptr() for p in model.parameters()}),
            "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
        }
    if kind.startswith(
        "cnn"
    ):  # DDP semantics: per-rank batch statistics; torch DDP (no buffer broadcast) as the reference
        twin = torch.nn.parallel.DistributedDataParallel(
            copy.deepcopy(start), broadcast_buffers=False, bucket_cap_mb=cap
        )
        out["ddp_losses"], out["ddp_params"], out["ddp_norms"] = torch_steps(twin, optimizer(opt_name), shards, clip)
        out["ddp_params"] = [{k.removeprefix("module."): v for k, v in p.items()} for p in out["ddp_params"]]
    if rank == 0:  # one process, the global batch
        out["global_losses"], out["global_params"], out["global_norms"] = torch_steps(
            copy.deepcopy(start), optimizer(opt_name), data, clip
        )
    return out


def OpCounter():
    """A context counting the torch ops run inside it by name (`.ops`), copies' bytes too (`copy_bytes`)."""
    import collections

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            self.ops[name] += 1
            if name in ("cat", "copy_", "clone") and isinstance(out, torch.Tensor):
                self.ops["copy_bytes"] += 2 * out.numel() * out.element_size()
            return out

    return Counter()


def layout(rank, world):
    """owned_params on parameters of two types, contiguous, channels_last and strided (not dense), each
    rank's values its rank + 1: after the broadcast each parameter holds its owner's values."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from opgraph.training.distributed import ALIGN_BYTES, owned_params

    made = {
        "a": torch.empty(5, 3),
        "b": torch.empty(4, 3, 3, 3).to(memory_format=torch.channels_last),
        "c": torch.empty(7, dtype=torch.float64),
        "d": torch.empty(6, 8)[:, ::2],  # (strides (8, 2): not dense)
        "e": torch.empty(3, 3),
    }
    params = {k: nn.Parameter(v.fill_(rank + 1)) for k, v in made.items()}
    strides = {k: p.stride() for k, p in params.items()}
    owners = {"a": 0, "b": 1, "c": 0, "d": 1, "e": 1}
    owned = owned_params(list(params.items()), owners, dist.group.WORLD)
    held = owned.holds(list(params.values()))
    owned.broadcast()
    params["a"].data = params["a"].data.clone()  # a new tensor: no longer the laid-out view
    return {
        "values": {k: float(p.detach().unique().item()) for k, p in params.items()},
        "strides": {k: p.stride() == strides[k] for k, p in params.items()},
        "flats": [(src, str(t.dtype), t.numel()) for src, t in owned.flats],
        "loose": [src for src, _ in owned.loose],
        "aligned": all(  # (offsets in the flat buffers: a CUDA allocation starts aligned, a host one need not)
            (p.data_ptr() - t.data_ptr()) % ALIGN_BYTES == 0
            for k, p in params.items()
            if k in "bce"
            for _, t in owned.flats
            if t.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
        ),
        "held": held,
        "held_after": owned.holds(list(params.values())),
    }


def mismatch(rank, world):
    """Rank 1 builds its step with a shard of another size: every rank gets a DistributedError."""
    import torch
    import torch.distributed as dist

    import opgraph as og
    from opgraph.training import SGD, train_step

    model = mlp(torch.float64)
    x = torch.randn(4 if rank == 0 else 3, 6, dtype=torch.float64)
    try:
        train_step(og.from_torch(model, (x,)), "cross_entropy", SGD(0.1), process_group=dist.group.WORLD)
    except og.DistributedError as err:
        return {"error": type(err).__name__, "message": str(err), "rule": err.rule}
    return {"error": None}


def main(argv):
    rank, world, init_file, out_file, *names = argv
    rank, world = int(rank), int(world)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {}
    try:
        for name in names:
            try:
                special = {"mismatch": mismatch, "layout": layout}
                results[name] = special[name](rank, world) if name in special else run(name, rank, world)
            except Exception:  # noqa: BLE001 (reported to the test, which fails with it)
                results[name] = {"traceback": traceback.format_exc()}
                break  # the other rank may be waiting in a collective: stop here, the test reports it
        torch.save(results, out_file)
        # Every rank done with the group before any destroys it: with gloo, a rank that tears down while
        # its peer is still inside a collective aborts in gloo's threads ("terminate called", CI's red of
        # 2026-12-01). The steps and DDP's reducer hold the group: none may outlive its destruction. A
        # monitored barrier: a rank that stopped early (its traceback saved) does not hang the other.
        gc.collect()
        dist.monitored_barrier(timeout=timedelta(seconds=120))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
