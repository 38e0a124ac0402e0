"""Data-parallel training steps over torch.distributed: `train_step(imported, ..., process_group=group)`.

    dist.init_process_group("nccl")                    # torchrun, or init_method="file://..."
    step = opgraph.training.train_step(opgraph.from_torch(model.train(), (x_shard,)), "cross_entropy",
                                       opgraph.training.AdamW(3e-4), process_group=dist.group.WORLD)
    loss = step.run(x_shard, y_shard)                  # this rank's shard of the batch; its local loss

Every rank runs the same step graph on its shard of the batch. The gradients are averaged over the
group in buckets (`bucket_cap_mb`, as DDP's): `GradientBuckets`, a gradient hook of the step graph
(opgraph.training.step_graph), groups them in the order the backward makes them, and adds per bucket an
`all_reduce` placed right after the op that makes the bucket's last gradient and an `all_reduce_wait`
after the backward, which the bucket's parameter updates read (opgraph.ops.collective). The updates,
in-graph clipping (whose norm is then the global one) and fp16 loss scaling (its inf/NaN check too)
read the averaged gradients, so every rank takes the same step. On CUDA the torch engine reduces on a
communication stream while the rest of the backward runs, and `step.capture(...)` records the whole
step, NCCL calls included, in one CUDA graph.

Semantics are DDP's with `broadcast_buffers=False`: the loss is each rank's own (the mean of the ranks'
losses is the global batch's, for equal shards and a mean loss); batch normalization normalizes with
each rank's batch statistics and keeps its own running statistics (no SyncBatchNorm). Start every rank
from the same parameters (seed the model, or broadcast it), as DDP does at construction.

ZeRO-1 (`zero=True`): each parameter is updated, and its optimizer state kept, by one rank only
(`shard_owners`: whole parameters, the largest first to the least loaded rank); the others' updates are
left out of this rank's graph (`GradientBuckets.updated_elsewhere`), and after the step every rank
broadcasts its parameters (`OwnedParams.broadcast`, which TrainStep runs after the plan, captured with
it). Each owner's parameters (of a type) live in one flat buffer the module's parameters are views of
(`owned_params`, as FSDP's flat parameters), so the broadcast is one call per owner with no joining and
no copying back; with one rank there is nothing to broadcast.

At construction the ranks compare a fingerprint of their step graphs (an all_gather of a hash and the
inputs' dims): a rank whose graph or shapes differ is a `DistributedError` naming it, on every rank,
rather than a collective that hangs or reduces mismatched buckets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.errors import AttributeValueError, DistributedError
from ..core.tensor import Tensor
from ..core.torch_interop import is_dense
from ..graph.builder import Graph
from ..ops.collective import register_group
from .step_graph import ParamSlot, handles_by_uid

DEFAULT_BUCKET_CAP_MB = 25.0


@dataclass(frozen=True)
class GradientBuckets:
    """A gradient hook averaging every gradient over process group `group` (a key of
    opgraph.ops.collective.register_group) in buckets of at most `cap_bytes` (at least one gradient
    each), filled in the order the backward makes the gradients, one type per bucket."""

    group: str
    cap_bytes: int
    zero: bool = False  # ZeRO-1: this process updates (and keeps state for) only the parameters it owns
    rank: int = 0  # its rank in the group
    size: int = 1  # the group's size

    def updated_elsewhere(self, g: Graph, slots: Sequence[ParamSlot]) -> list[str]:
        """With ZeRO-1, the parameters another rank owns (`shard_owners`)."""
        if not self.zero:
            return []
        handles = handles_by_uid(g)
        owners = shard_owners([(s.key, _numel(handles[s.uid].known_dim())) for s in slots], self.size)
        return [k for k, r in owners.items() if r != self.rank]

    def __call__(self, g: Graph, slot: ParamSlot, grad: Tensor) -> Tensor:
        """One gradient alone (a bucket of its own)."""
        return self.gradients(g, [slot], {slot.uid: grad})[slot.uid]

    def gradients(self, g: Graph, slots: Sequence[ParamSlot], grads: Mapping[int, Tensor]) -> dict[int, Tensor]:
        producer = {id(o): i for i, r in enumerate(g._records) for o in r.outputs if o is not None}
        made = sorted(slots, key=lambda s: producer.get(id(grads[s.uid]), -1))  # (sorted is stable)
        out: dict[int, Tensor] = {}
        for k, bucket in enumerate(self.buckets(made, grads)):
            tensors = [grads[s.uid] for s in bucket]
            flat = g.all_reduce(tensors, group=self.group, average=True, name=f"ddp.bucket{k}")
            reduced = g.all_reduce_wait(flat, [t.known_dim() for t in tensors], name=f"ddp.bucket{k}.wait")
            for s, r in zip(bucket, reduced):
                out[s.uid] = r.set_name(f"ddp.{s.key}")
        return out

    def buckets(self, slots: Sequence[ParamSlot], grads: Mapping[int, Tensor]) -> list[list[ParamSlot]]:
        """`slots` cut into buckets: consecutive runs of one type, each at most cap_bytes (or one gradient)."""
        out: list[list[ParamSlot]] = []
        open_: dict[Any, tuple[list[ParamSlot], int]] = {}  # type -> (its open bucket, bytes)
        for s in slots:
            t = grads[s.uid]
            dt = t.known_data_type()
            size = _numel(t.known_dim()) * dt.itemsize
            bucket, used = open_.get(dt, ([], 0))
            if bucket and used + size > self.cap_bytes:
                out.append(bucket)
                bucket, used = [], 0
            bucket.append(s)
            open_[dt] = (bucket, used + size)
        out.extend(b for b, _ in open_.values() if b)
        return out


def shard_owners(sizes: Sequence[tuple[str, int]], world: int) -> dict[str, int]:
    """ZeRO-1's partition: parameter key -> the rank that updates it and keeps its optimizer state; the
    largest first, each to the least loaded rank (by elements; ties to the lowest rank), as
    torch.distributed.optim.ZeroRedundancyOptimizer balances them."""
    if len(sizes) < world:
        raise AttributeValueError(
            f"ZeRO-1 gives each of the {world} ranks whole parameters, and the step has {len(sizes)}",
            rule="training.zero_params",
            hint="use zero=False with more ranks than parameters",
        )
    load = [0] * world
    owners: dict[str, int] = {}
    for key, n in sorted(sizes, key=lambda kv: -kv[1]):  # (stable: equal sizes in parameter order)
        r = min(range(world), key=lambda i: (load[i], i))
        owners[key] = r
        load[r] += n
    return owners


ALIGN_BYTES = 512  # each parameter's offset in its owner's buffer: as the CUDA caching allocator aligns


@dataclass(frozen=True)
class OwnedParams:
    """ZeRO-1's parameters laid out for the broadcast after each step (`owned_params`): per owner and
    type one flat buffer, broadcast whole from its owner, whose views the module's parameters are;
    parameters of a layout that is not dense (`loose`) are broadcast one by one. Empty with one rank."""

    flats: tuple[tuple[int, Any], ...] = ()  # (the owner's rank in the default group, its flat buffer)
    loose: tuple[tuple[int, Any], ...] = ()  # (the owner's rank in the default group, a parameter)
    held: tuple[tuple[Any, int], ...] = ()  # (a parameter, its address in its flat buffer)
    group: Any = None  # the torch.distributed group (None: the default group)

    def holds(self, params: Sequence[Any]) -> bool:
        """Whether `params` (torch tensors) are still the views laid out here (a module moved to another
        device, or given new tensors, is not: lay it out again)."""
        if not self.flats and not self.loose:  # (one rank: nothing laid out)
            return True
        where = {id(p): at for p, at in self.held}
        loose = {id(p) for _, p in self.loose}
        return all(where.get(id(p)) == p.data_ptr() or id(p) in loose for p in params)

    def broadcast(self) -> None:
        """Every parameter from its owner to every rank: one broadcast per flat buffer (capturable in a
        CUDA graph)."""
        if not self.flats and not self.loose:
            return
        import torch.distributed as dist

        for src, t in self.flats:
            dist.broadcast(t, src=src, group=self.group)
        for src, p in self.loose:  # (collectives take contiguous tensors)
            t = p.detach().contiguous()
            dist.broadcast(t, src=src, group=self.group)
            if t.data_ptr() != p.data_ptr():
                p.detach().copy_(t)


def owned_params(params: Sequence[tuple[str, Any]], owners: Mapping[str, int], process_group: Any) -> OwnedParams:
    """Lay out ZeRO-1's parameters (key, torch parameter) for the broadcast: each owner's parameters of
    a type copied into one flat buffer (each at an ALIGN_BYTES offset, in its own strides) and the
    module's parameters made views of it (`param.data`), so that broadcasting the buffer updates them
    in place. With one rank nothing is broadcast: the parameters stay as they are."""
    import torch
    import torch.distributed as dist

    group = None if process_group is dist.group.WORLD else process_group
    if dist.get_world_size(group) == 1:
        return OwnedParams(group=group)
    unique: dict[int, tuple[str, Any]] = {}
    for key, p in params:
        unique.setdefault(id(p), (key, p))
    by_buffer: dict[tuple[int, Any], list[Any]] = {}
    loose: list[tuple[int, Any]] = []
    for key, p in unique.values():
        if key not in owners:
            continue
        src = owners[key] if group is None else dist.get_global_rank(group, owners[key])
        if is_dense(p):
            by_buffer.setdefault((src, p.dtype), []).append(p)
        else:
            loose.append((src, p))
    flats: list[tuple[int, Any]] = []
    held: list[tuple[Any, int]] = []
    for (src, dtype), ps in sorted(by_buffer.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        align = max(1, ALIGN_BYTES // ps[0].element_size())
        offsets, at = [], 0
        for p in ps:
            offsets.append(at)
            at += -(-p.numel() // align) * align
        flat = torch.zeros(at, dtype=dtype, device=ps[0].device)
        with torch.no_grad():
            for p, off in zip(ps, offsets):
                view = flat.as_strided(p.shape, p.stride(), off)
                view.copy_(p.detach())
                p.data = view
                held.append((p, view.data_ptr()))
        flats.append((src, flat))
    return OwnedParams(tuple(flats), tuple(loose), tuple(held), group)


def broadcast_params(params: Sequence[tuple[str, Any]], owners: Mapping[str, int], process_group: Any) -> None:
    """Each parameter (key, torch tensor) from the rank that owns it to every rank: one broadcast per
    owner of its parameters joined, then copied back (nothing with one rank). TrainStep lays the
    parameters out once instead (`owned_params`) and broadcasts them with no join and no copy."""
    import torch
    import torch.distributed as dist

    group = None if process_group is dist.group.WORLD else process_group
    if dist.get_world_size(group) == 1:
        return
    for r in sorted(set(owners.values())):
        mine = [p for k, p in params if owners.get(k) == r]
        if not mine:
            continue
        flat = torch.cat([p.detach().reshape(-1) for p in mine])
        src = r if group is None else dist.get_global_rank(group, r)
        dist.broadcast(flat, src=src, group=group)
        at = 0
        for p in mine:
            p.detach().copy_(flat[at : at + p.numel()].view_as(p))
            at += p.numel()


def data_parallel_hook(
    process_group: Any, bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB, zero: bool = False
) -> GradientBuckets:
    """The gradient hook of a data-parallel step over `process_group` (a torch.distributed group);
    `zero`: ZeRO-1 (see the module docstring)."""
    if not bucket_cap_mb > 0:
        raise AttributeValueError(
            f"bucket_cap_mb={bucket_cap_mb!r} must be > 0",
            rule="training.bucket_cap",
            hint="pass a bucket size in MiB (DDP's default is 25)",
        )
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise DistributedError(
            "process_group is given but torch.distributed is not initialized",
            rule="training.process_group",
            hint="call torch.distributed.init_process_group(...) first (torchrun sets the "
            "environment), or pass process_group=None for one process",
        )
    group = None if process_group is dist.group.WORLD else process_group
    return GradientBuckets(
        register_group(process_group),
        max(1, int(bucket_cap_mb * 2**20)),
        bool(zero),
        dist.get_rank(group),
        dist.get_world_size(group),
    )


def check_ranks_agree(what: str, inputs: Mapping[str, tuple[int | str, ...]], process_group: Any) -> None:
    """Every rank of `process_group` built the same step (`what`: its step graph's JSON, or with ZeRO-1,
    whose step graphs differ by rank, the imported forward's and the step's options) with the same input
    dims; else a DistributedError naming the ranks that differ from rank 0 (raised on every rank)."""
    import torch.distributed as dist

    digest = hashlib.sha256(what.encode()).hexdigest()
    mine = (digest, dict(inputs))
    group = None if process_group is dist.group.WORLD else process_group
    size = dist.get_world_size(group)
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, mine, group=group)
    first_digest, first_inputs = gathered[0]
    bad = [r for r, (d, _) in enumerate(gathered) if d != first_digest]
    if not bad:
        return
    rank = bad[0]
    diffs = [
        f"input '{name}' has dims {list(dims)} on rank {rank} and "
        f"{list(first_inputs[name]) if name in first_inputs else 'none'} on rank 0"
        for name, dims in gathered[rank][1].items()
        if first_inputs.get(name) != dims
    ]
    why = "; ".join(diffs) if diffs else "the graphs differ (ops, attributes, parameters or options)"
    raise DistributedError(
        f"the step graph of rank {rank} differs from rank 0's ({why}); ranks that differ: {bad}",
        rule="training.ranks_differ",
        hint="build every rank's step from the same model and options, with shards of one size "
        "(drop the last uneven batch, as DistributedSampler(drop_last=True) does)",
    )


def _numel(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n
