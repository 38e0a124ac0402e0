"""The reference engine: NumPy, float64 arithmetic, every op, on the CPU.

Each op's `reference` method is its definition; this engine only moves data: it reads inputs as
float64, calls the ops in order, rounds every output to its declared type (virtual tensors
included: an intermediate declared fp16 is rounded to fp16 here as on the GPU) and writes the
piece's outputs into their buffers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..core.config import BehaviorNote, EngineConfig, HeurMode, NumericalNote, Support
from ..core.device import Device
from ..core.piece import Piece
from ..core.rounding import to_f64
from . import register_engine
from .base import Engine, Kernel
from .shared.evaluate import load, load_integers, run_node, too_big

CONFIG = EngineConfig(
    "reference",
    numerical_notes=frozenset({NumericalNote.FP64_ACCUMULATION}),
    behavior_notes=frozenset({BehaviorNote.HOST_EXECUTION, BehaviorNote.DEVICE_SCALARS}),
    why="the executable specification; runs any op on the CPU",
)


class ReferenceKernel(Kernel):
    def run(self, buffers: Mapping[int, Any], stream: Any = None, scratch: Any = None) -> None:
        piece = self.piece
        env: dict[int, np.ndarray] = {}

        def read(uid: int) -> np.ndarray:
            if uid in env:
                return to_f64(env[uid])
            return load(buffers[uid], piece.tensor(uid))

        def read_integers(uid: int) -> np.ndarray:  # (env holds values rounded to their types: exact)
            return np.asarray(env[uid]) if uid in env else load_integers(buffers[uid], piece.tensor(uid))

        results: dict[int, np.ndarray] = {}
        for node in piece.nodes:
            for uid, value in zip(node.outputs, run_node(node, piece.graph.tensors, read, read_integers)):
                if uid is not None and value is not None:
                    env[uid] = value
                    if uid in piece.outputs:
                        results[uid] = value
        # Outputs are written only once every op ran, so an in-place update reads its old value.
        for uid, value in results.items():
            buffers[uid][...] = value


class ReferenceEngine(Engine):
    name = "reference"
    writes_after_compute = True
    sizes_at_run_time = True  # NumPy's, from the arrays; one config for every piece

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
