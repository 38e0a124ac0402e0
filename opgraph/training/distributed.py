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
from ..graph.builder import Graph
from ..ops.collective import register_group
from .step_graph import ParamSlot

DEFAULT_BUCKET_CAP_MB = 25.0


@dataclass(frozen=True)
class GradientBuckets:
    """A gradient hook averaging every gradient over process group `group` (a key of
    opgraph.ops.collective.register_group) in buckets of at most `cap_bytes` (at least one gradient
    each), filled in the order the backward makes the gradients, one type per bucket."""

    group: str
    cap_bytes: int

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


def data_parallel_hook(process_group: Any, bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB) -> GradientBuckets:
    """The gradient hook of a data-parallel step over `process_group` (a torch.distributed group)."""
    if not bucket_cap_mb > 0:
        raise AttributeValueError(f"bucket_cap_mb={bucket_cap_mb!r} must be > 0", rule="training.bucket_cap",
                                  hint="pass a bucket size in MiB (DDP's default is 25)")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise DistributedError("process_group is given but torch.distributed is not initialized",
                               rule="training.process_group",
                               hint="call torch.distributed.init_process_group(...) first (torchrun sets the "
                                    "environment), or pass process_group=None for one process")
    return GradientBuckets(register_group(process_group), max(1, int(bucket_cap_mb * 2**20)))


def check_ranks_agree(graph: Graph, inputs: Mapping[str, tuple[int, ...]], process_group: Any) -> None:
    """Every rank of `process_group` built the same step graph with the same input dims; else a
    DistributedError naming the ranks that differ from rank 0 (raised on every rank)."""
    import torch.distributed as dist

    digest = hashlib.sha256(graph.to_json(indent=None).encode()).hexdigest()
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
    diffs = [f"input '{name}' has dims {list(dims)} on rank {rank} and "
             f"{list(first_inputs[name]) if name in first_inputs else 'none'} on rank 0"
             for name, dims in gathered[rank][1].items() if first_inputs.get(name) != dims]
    why = "; ".join(diffs) if diffs else "the graphs differ (ops, attributes, parameters or options)"
    raise DistributedError(f"the step graph of rank {rank} differs from rank 0's ({why}); ranks that differ: "
                           f"{bad}", rule="training.ranks_differ",
                           hint="build every rank's step from the same model and options, with shards of one size "
                                "(drop the last uneven batch, as DistributedSampler(drop_last=True) does)")


def _numel(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n
