"""The engine interface every backend implements (the config/notes vocabulary is opgraph.core.config).

An engine answers four questions about a piece of graph: can you run it (and if not, why), which
configs would you use (knobs + notes, ranked by a heuristic mode), and give me a kernel for this
config. A kernel runs the piece over buffers keyed by UID.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ..core.config import BehaviorNote, EngineConfig, HeurMode, NumericalNote, Support

if TYPE_CHECKING:
    from ..core.device import Device
    from ..core.piece import Piece

__all__ = ["BehaviorNote", "Engine", "EngineConfig", "HeurMode", "Kernel", "NumericalNote", "Support"]


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

    def drop_cached_buffers(self) -> None:  # noqa: B027  (optional hook: most kernels keep nothing)
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
