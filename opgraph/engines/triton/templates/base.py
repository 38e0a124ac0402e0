"""What a kernel template is: it recognises pieces it can run, proposes knob settings, and
generates source plus the launches (kernel name, grid, arguments) that run the piece."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from ....device import Device
from ....partition import Piece
from ...base import Support
from ..expr import HELPERS


@dataclass(frozen=True)
class Arg:
    """A runtime kernel argument: a bound buffer (`buf`, uid), a pass-by-value scalar (`scalar`,
    uid) or a typed slice of the step's scratch memory (`scratch`, byte offset, dtype name)."""

    kind: str
    uid: int = -1
    offset: int = 0
    dtype: str = "float32"


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[int, ...]
    args: tuple[Arg, ...]
    meta: tuple[tuple[str, Any], ...] = ()  # constexprs and num_warps / num_stages


@dataclass(frozen=True)
class Generated:
    source: str
    launches: tuple[Launch, ...]
    scratch_bytes: int = 0
    notes: frozenset[str] = field(default_factory=frozenset)


class Template(ABC):
    name: str
    priority: int = 0  # higher is tried first

    @abstractmethod
    def match(self, piece: Piece, device: Device) -> Support: ...

    @abstractmethod
    def candidates(self, piece: Piece, device: Device) -> list[dict[str, Any]]:
        """Knob settings, the heuristic's choice first."""

    @abstractmethod
    def generate(self, piece: Piece, knobs: dict[str, Any], device: Device) -> Generated: ...


def module_source(*functions: str) -> str:
    return "\n".join(["import triton", "import triton.language as tl", HELPERS, *functions])


def pow2_at_least(n: int, lo: int = 1) -> int:
    return max(lo, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


def indent(lines: list[str], n: int = 4) -> str:
    return "\n".join(" " * n + line for line in lines)
