"""The plan's workspace: one byte buffer holding the tensors that cross pieces (each materialised
once) and the steps' scratch (split-reduction partials, per-channel coefficients): one region as large
as the largest step's, which every step uses in turn (a step's scratch lives only while its launches
run, and a plan's steps run one after another on one stream). A dynamic plan's bucket kernels lay their
partials out for the bucket's largest shape (split-K's for a Llama projection at 4,096 rows: 64-128 MiB),
which summed over the steps would have reserved that much per projection at every shape.

On the CPU it is a NumPy uint8 array, on CUDA a torch uint8 tensor; the user may pass one (checked
for type, device, size and overlap with the bound buffers) or let the plan allocate and keep it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.device import Device
from ..core.errors import GraphError, VariantPackError
from ..core.ir import FinalGraph
from ..core.tensor import storage_extent, strided_view
from .buffers import buffer_info

ALIGN = 256  # bytes; every slot starts on this boundary (TMA and vector loads like 16+)


def align_up(n: int, alignment: int = ALIGN) -> int:
    """`n` rounded up to a multiple of `alignment` (every workspace and scratch slot starts aligned)."""
    return -(-n // alignment) * alignment


@dataclass(frozen=True)
class WorkspaceLayout:
    tensors: Mapping[int, tuple[int, int]]  # uid -> (offset, bytes)
    scratch: Mapping[int, tuple[int, int]]  # step index -> (offset, bytes)
    size: int


def plan_layout(
    graph: FinalGraph, pieces_outputs: Sequence[Sequence[int]], scratch_bytes: Sequence[int]
) -> WorkspaceLayout:
    tensors: dict[int, tuple[int, int]] = {}
    scratch: dict[int, tuple[int, int]] = {}
    offset = 0
    for outputs in pieces_outputs:
        for uid in outputs:
            t = graph.tensors[uid]
            if t.is_virtual and uid not in tensors:
                tensors[uid] = (offset, t.nbytes)
                offset += align_up(t.nbytes)
    for step, nbytes in enumerate(scratch_bytes):
        if nbytes:
            scratch[step] = (offset, nbytes)
    return WorkspaceLayout(tensors, scratch, offset + max((align_up(n) for n in scratch_bytes), default=0))


def allocate(size: int, device: Device) -> Any:
    if device.is_cuda:
        import torch

        return torch.empty(max(size, 1), dtype=torch.uint8, device=device.torch_name)
    return np.empty(max(size, 1), dtype=np.uint8)


def check(workspace: Any, size: int, device: Device, graph: FinalGraph, bound: Mapping[int, Any]) -> Any:
    """The user's workspace, validated (type, device, size, contiguity, overlap with bound buffers)."""
    want = (
        "a 1-D uint8 torch tensor on " + device.torch_name if device.is_cuda else "a contiguous 1-D uint8 NumPy array"
    )
    try:
        info = buffer_info(workspace)
    except GraphError:  # not a buffer, or of a type opgraph does not know (complex): the rule below says why
        info = None
    ok = (
        info is not None
        and info.data_type.name == "UINT8"
        and len(info.shape) == 1
        and (info.strides in ((1,), ()) or info.shape[0] <= 1)
        and info.device == device.torch_name
    )
    if isinstance(workspace, np.ndarray):
        ok = ok and workspace.flags.c_contiguous and workspace.flags.writeable and not device.is_cuda
    if not ok:
        raise VariantPackError(
            f"the workspace must be {want}",
            rule="pack.workspace",
            hint="pass a buffer of plan.workspace_size bytes on the plan's device, or None to let the plan "
            "allocate one",
        )
    assert info is not None
    if info.shape[0] < size:
        raise VariantPackError(
            f"the workspace has {info.shape[0]} bytes but the plan needs {size}",
            rule="pack.workspace_size",
            hint="allocate plan.workspace_size bytes",
        )
    lo, hi = info.ptr, info.ptr + size
    for uid, buf in bound.items():
        if isinstance(buf, (int, float, bool)):
            continue
        b = buffer_info(buf)
        b_lo = b.ptr
        b_hi = b.ptr + storage_extent(b.shape, b.strides) * b.data_type.itemsize
        if b_lo < hi and lo < b_hi:
            raise VariantPackError(
                "the workspace overlaps the buffer bound to this tensor",
                tensor=graph.tensors[uid],
                rule="pack.workspace_overlap",
                hint="give the workspace memory of its own",
            )
    return info.obj if device.is_cuda else workspace


def tensor_views(base: Any, layout: WorkspaceLayout, graph: FinalGraph) -> dict[int, Any]:
    views = {}
    for uid, (offset, nbytes) in layout.tensors.items():
        t = graph.tensors[uid]
        chunk = base[offset : offset + nbytes]
        if isinstance(chunk, np.ndarray):
            views[uid] = strided_view(chunk.view(t.data_type.numpy), t.dim, t.stride)
        else:
            views[uid] = chunk.view(t.data_type.to_torch()).as_strided(t.dim, t.stride)
    return views


def scratch_view(base: Any, layout: WorkspaceLayout, step: int) -> Any:
    slot = layout.scratch.get(step)
    return None if slot is None else base[slot[0] : slot[0] + slot[1]]
