"""Heuristic modes and ranking of engine configs per piece.

    INSTANT   rules only, the first config each engine proposes
    A         rules and the cost model (bytes and math against the device's rates)
    B         like A; engines may refine with short probes
    FALLBACK  the broadest configs, which always work (reference on the CPU, op-by-op on the GPU)

Engines are ranked in the build's order of preference, except where the ranking policy
(opgraph.build.policy) puts an engine's configs first on a piece (cuDNN's on convolutions); FALLBACK keeps
the order. Within the generated attention forward's configs, the GQA packing rule (build/gqa_pack.py)
and the split-KV estimate (build/split_kv.py) put the config a decode step needs first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.config import EngineConfig, HeurMode, Support
from . import split_kv
from .partition import engine_supports
from .policy import POLICY, Policy
from .shared import shared

if TYPE_CHECKING:
    from ..core.device import Device
    from ..core.piece import Piece
    from ..engines.base import Engine


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
    piece: Piece, engines: Sequence[Engine], device: Device, modes: Sequence[HeurMode], policy: Policy = POLICY
) -> PieceConfigs:
    """The piece's configs in the order the build tries them, and the engines that decline it. Within a
    planning, a piece identical to one ranked before (a model's repeated layer) gets that ranking
    (build/shared.py), its engines' refusals asked again so that they name this piece's ops."""
    terms = (tuple(e.name for e in engines), device, tuple(modes), id(policy))
    ranked, first = shared("rank_configs", piece, terms, lambda: _rank(piece, engines, device, modes, policy))
    if first is piece:
        return ranked
    by_name = {e.name: e for e in engines}
    declined = tuple((name, engine_supports(by_name[name], piece, device).reason) for name, _ in ranked.declined)
    return PieceConfigs(piece, ranked.configs, declined)


def _rank(
    piece: Piece, engines: Sequence[Engine], device: Device, modes: Sequence[HeurMode], policy: Policy
) -> PieceConfigs:
    configs: list[EngineConfig] = []
    declined: list[tuple[str, str]] = []
    for engine in engines:
        verdict: Support = engine_supports(engine, piece, device)  # (the partitioner's in-place rule too)
        if not verdict.ok:
            declined.append((engine.name, verdict.reason))
    supporting = [e for e in engines if e.name not in {n for n, _ in declined}]
    ruled = supporting
    if any(m is not HeurMode.FALLBACK for m in modes):
        ruled = policy.order(piece, supporting, device)
    for mode in modes:
        # the rules order INSTANT/A/B; FALLBACK keeps the build's order, also after other modes
        for engine in supporting if mode is HeurMode.FALLBACK else ruled:
            for cfg in engine.configs(piece, device, mode):
                if cfg not in configs:
                    configs.append(cfg)
    if any(m is not HeurMode.FALLBACK for m in modes):
        configs = split_kv.order(piece, configs, device)
    return PieceConfigs(piece, tuple(configs), tuple(declined))
