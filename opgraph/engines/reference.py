"""The reference engine: NumPy, float64 arithmetic, every op, on the CPU.

Each op's `reference` method is its definition; this engine only moves data: it reads inputs as
float64, calls the ops in order, rounds every output to its declared type (virtual tensors
included: an intermediate declared fp16 is rounded to fp16 here as on the GPU) and writes the
piece's outputs into their buffers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..core.config import BehaviorNote, EngineConfig, HeurMode, NumericalNote, Support
from ..core.device import Device
from ..core.errors import ExecutionError
from ..core.ir import Const, Node
from ..core.piece import Piece
from ..core.rounding import round_to, to_f64
from ..core.tensor import TensorDesc
from . import register_engine
from .base import Engine, Kernel

CONFIG = EngineConfig(
    "reference",
    numerical_notes=frozenset({NumericalNote.FP64_ACCUMULATION}),
    behavior_notes=frozenset({BehaviorNote.HOST_EXECUTION, BehaviorNote.DEVICE_SCALARS}),
    why="the executable specification; runs any op on the CPU",
)


def load(value: Any, desc: TensorDesc) -> np.ndarray:
    """A bound buffer (array or pass-by-value number) as float64 in logical dims."""
    if isinstance(value, np.ndarray):
        arr = to_f64(value)
        return arr.reshape(desc.dim) if arr.shape != desc.dim else arr
    return np.full(desc.dim, float(value), dtype=np.float64)


def memory_budget() -> int:
    """The most bytes one float64 tensor may take here: OPGRAPH_REFERENCE_MAX_GB, else this machine's
    physical memory."""
    text = os.environ.get("OPGRAPH_REFERENCE_MAX_GB", "").strip()
    try:
        if text:
            return int(float(text) * 2**30)
    except (ValueError, OverflowError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 64 * 2**30


def too_big(node: Node, tensors: Mapping[int, TensorDesc]) -> str | None:
    """Why the reference engine cannot run `node` here, or None: it computes on float64 arrays of every
    tensor's logical dims, so an input expanded by stride-0 axes is materialised whole."""
    budget = memory_budget()
    for uid in (*node.input_uids(), *node.output_uids()):
        desc = tensors[uid]
        size = math.prod(desc.dim) * 8
        if size > budget:
            return (f"{desc.label()} has {math.prod(desc.dim):,} logical elements ({list(desc.dim)}): the reference "
                    f"engine computes on float64 arrays of logical dims, {size / 2**30:,.0f} GiB, more than the "
                    f"{budget / 2**30:,.0f} GiB this machine allows it")
    return None


def run_node(node: Node, tensors: Mapping[int, TensorDesc], read) -> list[np.ndarray | None]:
    """Evaluate one node; `read(uid)` gives an input as float64. Returns outputs rounded to type.
    A node whose tensors would not fit in memory as float64 arrays is refused before anything is
    allocated (ExecutionError, rule reference.memory)."""
    why = too_big(node, tensors)
    if why is not None:
        raise ExecutionError(why, op=node.label(), rule="reference.memory",
                             hint="run it on another engine (a GPU's), or with smaller dims; OPGRAPH_REFERENCE_MAX_GB "
                             "raises the limit where the machine has the memory")
    ins: list[np.ndarray | None] = []
    for v in node.inputs:
        if v is None:
            ins.append(None)
        elif isinstance(v, Const):
            ins.append(np.asarray(float(v.value), dtype=np.float64))
        else:
            ins.append(read(v))
    outs = [None if u is None else tensors[u] for u in node.outputs]
    results = node.op.reference(ins, outs)
    return [None if d is None or r is None else round_to(r, d.data_type) for d, r in zip(outs, results)]


class ReferenceKernel(Kernel):
    def run(self, buffers: Mapping[int, Any], stream: Any = None, scratch: Any = None) -> None:
        piece = self.piece
        env: dict[int, np.ndarray] = {}

        def read(uid: int) -> np.ndarray:
            if uid in env:
                return to_f64(env[uid])
            return load(buffers[uid], piece.tensor(uid))

        results: dict[int, np.ndarray] = {}
        for node in piece.nodes:
            for uid, value in zip(node.outputs, run_node(node, piece.graph.tensors, read)):
                if uid is not None and value is not None:
                    env[uid] = value
                    if uid in piece.outputs:
                        results[uid] = value
        # Outputs are written only once every op ran, so an in-place update reads its old value.
        for uid, value in results.items():
            buffers[uid][...] = value


class ReferenceEngine(Engine):
    name = "reference"

    def available(self, device: Device) -> Support:
        if device.is_cuda:
            return Support.no("the reference engine runs on the CPU only")
        return Support.yes()

    def supports(self, piece: Piece, device: Device) -> Support:
        tensors = piece.graph.tensors
        why = piece.fold("reference.too_big", lambda found, node: found or too_big(node, tensors), None)
        return Support.no(why) if why is not None else self.available(device)

    def configs(self, piece: Piece, device: Device, mode: HeurMode) -> list[EngineConfig]:
        return [CONFIG]

    def compile(self, piece: Piece, config: EngineConfig, device: Device) -> Kernel:
        return ReferenceKernel(piece, config)

    def inplace_safe(self, config: EngineConfig) -> bool:
        return True  # outputs are written once every op of the piece ran


register_engine(ReferenceEngine())
