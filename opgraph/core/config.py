"""The config vocabulary every layer shares, in cuDNN's words: heuristic modes, numerical and behaviour
notes, an engine's verdict on a piece (`Support`) and one way to run a piece (`EngineConfig`)."""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import AttributeValueError

if TYPE_CHECKING:
    from .ir import Node


class HeurMode(enum.Enum):
    INSTANT = "instant"
    A = "a"
    B = "b"
    FALLBACK = "fallback"

    def __repr__(self) -> str:
        return f"HeurMode.{self.name}"


DEFAULT_MODES = (HeurMode.A, HeurMode.FALLBACK)


def as_modes(heur_mode: HeurMode | str | Sequence[HeurMode | str] | None) -> tuple[HeurMode, ...]:
    if heur_mode is None:
        return DEFAULT_MODES
    # one mode (a HeurMode, a name, or anything else, refused below) or a list of them
    items: list[object] = (
        list(heur_mode)
        if isinstance(heur_mode, Iterable) and not isinstance(heur_mode, (HeurMode, str, bytes))
        else [heur_mode]
    )
    modes = []
    for m in items:
        if isinstance(m, str) and m.strip().upper() in HeurMode.__members__:
            m = HeurMode[m.strip().upper()]
        if not isinstance(m, HeurMode):
            raise AttributeValueError(
                f"heur_mode {m!r} is not a heuristic mode",
                rule="heur_mode.unknown",
                hint=f"pass opgraph.HeurMode values ({', '.join(HeurMode.__members__)}) or a list of them",
            )
        modes.append(m)
    return tuple(modes)


class NumericalNote(enum.Enum):
    TENSOR_CORE = "tensor_core"
    DOWN_CONVERT_INPUTS = "down_convert_inputs"  # e.g. fp32 operands computed as tf32
    REDUCED_PRECISION_REDUCTION = "reduced_precision_reduction"
    NONDETERMINISTIC = "nondeterministic"  # atomics or split reductions in varying order
    FP64_ACCUMULATION = "fp64_accumulation"
    # a wider intermediate (an fp32 conv output) stored in the operands' 16-bit type between kernels
    ROUNDED_INTERMEDIATE = "rounded_intermediate"
    # a 16-bit intermediate the graph declares (a matmul's product before its cast to fp32) kept in fp32:
    # the rounding the graph asks for skipped, the result closer to the exact one (cuDNN has no such note)
    WIDENED_INTERMEDIATE = "widened_intermediate"


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

    @functools.cached_property
    def _knob_map(self) -> dict[str, Any]:  # (not a field: equality, hashing and files see `knobs`)
        return dict(self.knobs)

    def knob(self, name: str, default: Any = None) -> Any:
        return self._knob_map.get(name, default)

    def __str__(self) -> str:
        knobs = " ".join(f"{k}={v}" for k, v in self.knobs)
        notes = sorted(n.value for n in (*self.numerical_notes, *self.behavior_notes))
        est = f" ~{self.estimate_us:.1f}us est." if self.estimate_us is not None else ""
        if self.measured_us is not None:
            est += f" {self.measured_us:.1f}us measured"
        text = self.engine + (f"[{knobs}]" if knobs else "") + est
        return text + (f" ({', '.join(notes)})" if notes else "")
