"""Collectives in torch: torch.distributed.all_reduce of a bucket of gradients (opgraph.ops.collective).

Inside a piece with other ops (and on the CPU) the mappings run in order on the current stream: the
bucket is joined, reduced in place (gloo or NCCL, whichever the group is) and cut back.

On CUDA a lone collective is a kernel of its own (the engine keeps collectives out of other pieces):
`all_reduce` joins the bucket into its buffer on the compute stream (so that the gradients' memory is
free for the rest of the backward at once), then reduces it on a communication stream, one per device,
that waited for the compute stream, and records an event; `all_reduce_wait` makes the compute stream
wait for that event and cuts the bucket back. Between the two, the backward's other kernels run while
NCCL reduces. A CUDA graph captures it all (the fork and join of the communication stream by events
is what stream capture records; NCCL's collectives are capturable).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any

from ...core.config import EngineConfig
from ...core.piece import Piece
from ...core.types import Buffer, Stream
from ...ops.collective import COLLECTIVE_KINDS, AllReduce, AllReduceWait, reduce_in_place
from ..base import Kernel
from .common import Call, as_torch, implements

KINDS = COLLECTIVE_KINDS

_streams: dict[int, Any] = {}  # device index -> its communication stream
_pending: dict[int, Any] = {}  # a reduced bucket's address -> the event its reduction recorded
_lock = threading.Lock()


def has_collective(piece: Piece) -> bool:
    return not piece.kind_set.isdisjoint(KINDS)  # (kind_set grows with the piece: no pass over its nodes)


@implements("all_reduce")
def all_reduce(call: Call) -> list[Any]:
    import torch

    op = call.node.op_as(AllReduce)
    flat = torch.cat([call.tensor(r).reshape(-1) for r in op.input_roles()])
    reduce_in_place(flat, op.group, op.average, call.node.label())
    return [flat]


@implements("all_reduce_wait")
def all_reduce_wait(call: Call) -> list[Any]:
    op = call.node.op_as(AllReduceWait)
    flat = call.tensor("bucket")
    out, at = [], 0
    for s in op.shapes:
        n = math.prod(s)
        out.append(flat[at : at + n].reshape(s))
        at += n
    return out


def comm_stream(device: Any) -> Any:
    """The communication stream of a CUDA device (made once)."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        if index not in _streams:
            _streams[index] = torch.cuda.Stream(device=index)
        return _streams[index]


class CollectiveKernel(Kernel):
    """A lone collective on CUDA: the reduction on the communication stream (see the module docstring)."""

    def __init__(self, piece: Piece, config: EngineConfig, device: Any, stream_context: Any) -> None:
        super().__init__(piece, config)
        (self.node,) = piece.nodes
        self.device = device
        self._stream_context = stream_context

    def run(self, buffers: Mapping[int, Buffer], stream: Stream = None, scratch: Buffer = None) -> None:
        import torch

        tensors = self.piece.graph.tensors
        with self._stream_context(stream):
            node = self.node
            bucket_uid = node.output_uids()[0] if node.kind == "all_reduce" else node.input_uids()[0]
            bucket = as_torch(buffers[bucket_uid], tensors[bucket_uid], self.device)
            compute = torch.cuda.current_stream(self.device)
            if node.kind == "all_reduce":
                op = node.op_as(AllReduce)
                torch.cat(
                    [as_torch(buffers[u], tensors[u], self.device).reshape(-1) for u in node.input_uids()], out=bucket
                )
                comm = comm_stream(self.device)
                comm.wait_stream(compute)
                with torch.cuda.stream(comm):
                    reduce_in_place(bucket, op.group, op.average, node.label())
                done = torch.cuda.Event()
                done.record(comm)
                with _lock:
                    _pending[bucket.data_ptr()] = done
                return
            with _lock:
                done = _pending.pop(bucket.data_ptr(), None)
            if done is not None:
                compute.wait_event(done)
            wait = node.op_as(AllReduceWait)
            at = 0
            for uid, shape in zip(node.outputs, wait.shapes):
                n = math.prod(shape)
                if uid is not None:
                    dst = as_torch(buffers[uid], tensors[uid], self.device)
                    dst.copy_(bucket[at : at + n].reshape(shape))
                at += n


def lone_collective(piece: Piece) -> bool:
    return len(piece.nodes) == 1 and piece.nodes[0].kind in KINDS


def check_alone(piece: Piece) -> str | None:
    """Why the torch engine does not run `piece` as one kernel: a collective with other ops (it runs
    alone, so that its reduction may overlap them)."""
    if has_collective(piece) and len(piece.nodes) > 1:
        return "a collective runs as a kernel of its own (its reduction overlaps the kernels around it)"
    return None


__all__ = ["CollectiveKernel", "check_alone", "comm_stream", "lone_collective"]
