"""Heuristic modes and ranking of engine configs per piece.

    INSTANT   rules only, the first config each engine proposes
    A         rules and the cost model (bytes and math against the device's rates)
    B         like A; engines may refine with short probes
    FALLBACK  the broadest configs, which always work (reference on the CPU, op-by-op on the GPU)

Engines are ranked in the build's order of preference, except where an engine's rule
(`Engine.rank_first`) says its configs win on a piece (cuDNN's on convolutions); FALLBACK keeps the order.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from .engines.base import EngineConfig, Support
from .errors import AttributeValueError

if TYPE_CHECKING:
    from .device import Device
    from .engines.base import Engine
    from .partition import Piece


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
    items = [heur_mode] if isinstance(heur_mode, (HeurMode, str)) else list(heur_mode)
    modes = []
    for m in items:
        if isinstance(m, str) and m.strip().upper() in HeurMode.__members__:
            m = HeurMode[m.strip().upper()]
        if not isinstance(m, HeurMode):
            raise AttributeValueError(
                f"heur_mode {m!r} is not a heuristic mode", rule="heur_mode.unknown",
                hint=f"pass opgraph.HeurMode values ({', '.join(HeurMode.__members__)}) or a list of them",
            )
        modes.append(m)
    return tuple(modes)


@dataclass(frozen=True)
class PieceConfigs:
    """The ranked configs for one piece, and the engines that declined it with their reasons."""

    piece: Piece
    configs: tuple[EngineConfig, ...]
    declined: tuple[tuple[str, str], ...]

    def __str__(self) -> str:
        lines = [f"{self.piece.label()}:"]
        lines += [f"  {i}. {c}" for i, c in enumerate(self.configs)]
        lines += [f"  - {name} declined: {why}" for name, why in self.declined]
        return "\n".join(lines)


def rank_configs(
    piece: Piece, engines: Sequence[Engine], device: Device, modes: Sequence[HeurMode]
) -> PieceConfigs:
    configs: list[EngineConfig] = []
    declined: list[tuple[str, str]] = []
    for engine in engines:
        verdict: Support = engine.supports(piece, device)
        if not verdict.ok:
            declined.append((engine.name, verdict.reason))
    supporting = [e for e in engines if e.name not in {n for n, _ in declined}]
    if any(m is not HeurMode.FALLBACK for m in modes):  # rules of INSTANT/A/B; FALLBACK keeps the order
        supporting.sort(key=lambda e: not e.rank_first(piece, device))
    for mode in modes:
        for engine in supporting:
            for cfg in engine.configs(piece, device, mode):
                if cfg not in configs:
                    configs.append(cfg)
    return PieceConfigs(piece, tuple(configs), tuple(declined))
