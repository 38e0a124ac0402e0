"""What a kernel template is: it recognises pieces it can run, proposes knob settings, and
generates source plus the launches (kernel name, grid, arguments) that run the piece."""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ....core.config import NumericalNote, Support
from ....core.device import Device
from ....core.piece import Piece
from ....core.tensor import TensorDesc
from ..expr import HELPERS, custom_imports


class ArgKind(str, enum.Enum):
    """What fills a kernel argument at launch."""

    BUF = "buf"  # a bound buffer's address (uid)
    SCALAR = "scalar"  # a pass-by-value scalar's value (uid)
    SCRATCH = "scratch"  # a typed slice of the step's scratch memory (byte offset, dtype name)
    TABLE = "table"  # the plan's address table of by-reference tensors


@dataclass(frozen=True)
class Arg:
    """A runtime kernel argument (see ArgKind)."""

    kind: ArgKind
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
    # the op kinds a piece must hold for the template to apply (empty: any); explanations of why a
    # piece was not fused list the reasons of templates that apply first
    main_kinds: tuple[str, ...] = ()

    @abstractmethod
    def match(self, piece: Piece, device: Device) -> Support: ...

    @abstractmethod
    def candidates(self, piece: Piece, device: Device) -> list[dict[str, Any]]:
        """Knob settings, the heuristic's choice first."""

    @abstractmethod
    def generate(self, piece: Piece, knobs: dict[str, Any], device: Device) -> Generated: ...

    # -- declared defaults (a template overrides what it knows better) -------------------------------
    def notes(self, piece: Piece, knobs: Mapping[str, Any], device: Device) -> frozenset[NumericalNote]:
        """The numerical notes of a config (tensor cores, TF32, split reductions): none by default."""
        return frozenset()

    def estimate(self, piece: Piece, knobs: Mapping[str, Any], device: Device) -> float | None:
        """Estimated µs of a config; None: the engine's generic bytes-and-math estimate."""
        return None


class Params:
    """The runtime parameters of one generated kernel and the launch arguments that fill them, in
    first-use order."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.args: list[Arg] = []

    def _add(self, name: str, arg: Arg) -> str:
        if name not in self.names:
            self.names.append(name)
            self.args.append(arg)
        return name

    def buf(self, uid: int) -> str:
        return self._add(f"p{uid}", Arg(ArgKind.BUF, uid))

    def scalar(self, uid: int) -> str:
        return self._add(f"s{uid}", Arg(ArgKind.SCALAR, uid))

    def scratch(self, name: str, offset: int, dtype: str = "float32") -> str:
        return self._add(name, Arg(ArgKind.SCRATCH, offset=offset, dtype=dtype))

    def signature(self, name: str, constexprs: Sequence[str] = ()) -> str:
        return f"def {name}({', '.join([*self.names, *(f'{c}: tl.constexpr' for c in constexprs)])}):"

    def source(self, name: str, constexprs: Sequence[str], body: list[str]) -> str:
        return f"{self.signature(name, constexprs)}\n{indent(body)}\n"


def external_params(piece: Piece, uids: Sequence[int]) -> tuple[list[str], list[Arg]]:
    """Kernel parameters and launch arguments of tensors `uids`: s{uid} for a pass-by-value scalar,
    p{uid} for a buffer."""
    params, args = [], []
    for u in uids:
        if piece.tensor(u).is_pass_by_value:
            params.append(f"s{u}")
            args.append(Arg(ArgKind.SCALAR, u))
        else:
            params.append(f"p{u}")
            args.append(Arg(ArgKind.BUF, u))
    return params, args


INT32_LIMIT = 2**31 - 1


def extent(desc: TensorDesc) -> int:
    """One past the largest element offset of `desc` (its strides' reach)."""
    return 1 + sum((d - 1) * s for d, s in zip(desc.dim, desc.stride))


def offsets_need_int64(descs: Iterable[TensorDesc], lanes: int | None = None) -> bool:
    """Whether offsets into `descs` can pass int32; with `lanes`, a flat index walking a tensor's
    elements that many lanes at a time (its last program runs up to numel + lanes) counts too."""
    return any(extent(t) > INT32_LIMIT or (lanes is not None and t.numel + lanes > INT32_LIMIT) for t in descs)


def program_id(axis: int = 0, big: bool = False) -> str:
    """The program's index along grid axis `axis`, widened to int64 where offsets need it."""
    return f"tl.program_id({axis}).to(tl.int64)" if big else f"tl.program_id({axis})"


def unique(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`configs` without repeats, in order (the first of equal knob settings kept)."""
    seen, out = set(), []
    for c in configs:
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def module_source(*functions: str) -> str:
    """A generated module: imports (and those of the custom ops' Triton functions it calls), the
    helpers, the kernels."""
    return "\n".join(["import triton", "import triton.language as tl", "from triton.language.extra import libdevice",
                      *custom_imports("\n".join(functions)), HELPERS, *functions])


def verdict(analysis: object) -> Support:
    """A template's match from its analysis of a piece: the Support it returned where it declines, else yes."""
    return analysis if isinstance(analysis, Support) else Support.yes()


def pow2_at_least(n: int, lo: int = 1) -> int:
    return max(lo, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


def indent(lines: list[str], n: int = 4) -> str:
    return "\n".join(" " * n + line for line in lines)
