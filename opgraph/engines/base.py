"""The engine interface every backend implements, and the config/notes vocabulary of cuDNN.

An engine answers four questions about a piece of graph: can you run it (and if not, why), which
configs would you use (knobs + notes, ranked by a heuristic mode), and give me a kernel for this
config. A kernel runs the piece over buffers keyed by UID.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

if TYPE_CHECKING:
    from ..device import Device
    from ..heuristics import HeurMode
    from ..ir import Node
    from ..partition import Piece


class NumericalNote(enum.Enum):
    TENSOR_CORE = "tensor_core"
    DOWN_CONVERT_INPUTS = "down_convert_inputs"  # e.g. fp32 operands computed as tf32
    REDUCED_PRECISION_REDUCTION = "reduced_precision_reduction"
    NONDETERMINISTIC = "nondeterministic"  # atomics or split reductions in varying order
    FP64_ACCUMULATION = "fp64_accumulation"
    # a wider intermediate (an fp32 conv output) stored in the operands' 16-bit type between kernels
    ROUNDED_INTERMEDIATE = "rounded_intermediate"


class BehaviorNote(enum.Enum):
    RUNTIME_COMPILATION = "runtime_compilation"
    # the kernels can be captured in a CUDA graph (no host synchronisation or host computation)
    CUDA_GRAPH_CAPTURABLE = "cuda_graph_capturable"
    # ... and re-pointed by update_cuda_graph without re-capture (addresses of by-reference tensors
    # read from the plan's address table)
    SUPPORTS_CUDA_GRAPH_NATIVE_API = "supports_cuda_graph_native_api"
    DEVICE_SCALARS = "device_scalars"  # reads 1-element tensors from memory at run time
    HOST_EXECUTION = "host_execution"  # computes on the CPU
    INTERPRETED = "interpreted"  # Triton kernels run by Triton's interpreter


@dataclass(frozen=True)
class Support:
    """Whether an engine runs a piece; `reason` says why not, `node` names the op at fault."""

    ok: bool
    reason: str = ""
    node: Node | None = field(default=None, compare=False)

    def __bool__(self) -> bool:
        return self.ok

    @staticmethod
    def yes() -> Support:
        return Support(True)

    @staticmethod
    def no(reason: str, node: Node | None = None) -> Support:
        return Support(False, reason, node)


@dataclass(frozen=True)
class EngineConfig:
    """One way to run a piece: the engine, its knob values and what to know about it."""

    engine: str
    knobs: tuple[tuple[str, Any], ...] = ()
    numerical_notes: frozenset[NumericalNote] = frozenset()
    behavior_notes: frozenset[BehaviorNote] = frozenset()
    estimate_us: float | None = None
    why: str = field(default="", compare=False)  # the heuristic's reason for this config's rank
    measured_us: float | None = field(default=None, compare=False)  # set by autotuning

    def knob(self, name: str, default: Any = None) -> Any:
        return dict(self.knobs).get(name, default)

    def __str__(self) -> str:
        knobs = " ".join(f"{k}={v}" for k, v in self.knobs)
        notes = sorted(n.value for n in (*self.numerical_notes, *self.behavior_notes))
        est = f" ~{self.estimate_us:.1f}us est." if self.estimate_us is not None else ""
        if self.measured_us is not None:
            est += f" {self.measured_us:.1f}us measured"
        text = self.engine + (f"[{knobs}]" if knobs else "") + est
        return text + (f" ({', '.join(notes)})" if notes else "")


class Kernel(ABC):
    """A compiled piece. `run` reads and writes buffers keyed by UID (arrays or device tensors;
    pass-by-value scalars as Python numbers)."""

    scratch_bytes: int = 0  # private workspace the kernel needs, provided by the plan as `scratch`

    def __init__(self, piece: Piece, config: EngineConfig) -> None:
        self.piece = piece
        self.config = config

    @abstractmethod
    def run(self, buffers: Mapping[int, Any], stream: Any = None, scratch: Any = None) -> None: ...

    def source(self) -> str | None:
        """Generated source code, for engines that generate it."""
        return None

    def drop_cached_buffers(self) -> None:
        """Forget anything kept from past runs' buffers (autotuning's timing buffers)."""


class Engine(ABC):
    name: ClassVar[str]
    # whether the engine's pieces run neighbouring ops fused (the library engine's generated
    # prologue/epilogue): the partitioner then lets its piece take an op a preferred engine runs alone
    fuses_neighbours: ClassVar[bool] = False

    @abstractmethod
    def available(self, device: Device) -> Support:
        """Whether this engine can run at all on `device` (libraries installed, right device kind)."""

    @abstractmethod
    def supports(self, piece: Piece, device: Device) -> Support:
        """Whether one kernel of this engine runs the whole piece."""

    @abstractmethod
    def configs(self, piece: Piece, device: Device, mode: HeurMode) -> list[EngineConfig]:
        """Configs for a supported piece, best first, as heuristic `mode` ranks them."""

    @abstractmethod
    def compile(self, piece: Piece, config: EngineConfig, device: Device) -> Kernel: ...

    def rank_first(self, piece: Piece, device: Device) -> bool:
        """A heuristic rule: whether this engine's configs for `piece` go before those of engines
        preferred to it (measured to win on pieces like it). The default: engine order decides."""
        return False

    def inplace_safe(self, config: EngineConfig) -> bool:
        """Whether a kernel of this config may write an output over the buffer of an input that it
        reads element for element (an in-place update through the variant pack, opgraph.aliasing):
        every element of that input is read once, by the program that then writes the output's
        element at the same index (or outputs are written only after everything was computed).
        The default, False, refuses such packs for the engine's steps."""
        return False

    def engines_used(self, config: EngineConfig) -> frozenset[str]:
        """Every engine whose code a config of this engine runs (itself, and the parts of a composite)."""
        return frozenset({self.name})
