"""Tile variants of a dynamic plan's bucket: the tile of a step chosen again at each shape, among a few
configs compiled once for the bucket.

A bucket's generated GEMM runs one kernel at every shape of the bucket, its tile weighed over the whole
bucket (templates/matmul.py, MatmulMatch._weighed), where the large shapes dominate. At the bucket's
small shapes another tile can be much faster: the serving Llama's projections at 3 x 20 tokens ran the
bucket's 128 x 128 tiles (chosen for up to 16 x 256 tokens) at 1.5-1.8x the time of the static plan's
64 x 32 ones. So a step of a bucket carries up to MAX_VARIANTS other configs (`offer`): at each of the
POINTS of the bucket's range (log-spaced from its smallest shape toward its middle), the engine's best
config there whose one kernel serves the whole bucket (Engine.configs_at) with the bucket config's
numerical notes, where its estimate beats the bucket's config there by GAIN. The variants' kernels are
compiled with the bucket's first shape (bucket_plan.schedule_at), so no later shape compiles anything;
each shape runs the config of least estimate (Engine.estimator: a few integer operations per config)
among the bucket's and its variants, the bucket's own unless another beats it by GAIN there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core.config import EngineConfig
from ..core.symbolic import log_point
from ..engines import get_engine

if TYPE_CHECKING:
    from ..core.device import Device
    from ..core.piece import Piece
    from .filters import ConfigFilter

# another config runs a shape where its estimate is at most this fraction of the bucket config's (0.9: near
# its latency floor the cost model compresses small tiles' gains: the Llama's key/value projections at 3 x 20
# tokens, 64 x 16 tiles estimated 0.89 of the bucket's 128 x 32, ran 0.84 of its time on an H200)
GAIN = 0.9
MAX_VARIANTS = 2  # configs a step of a bucket carries beside its own
POINTS = (0.0, 0.25)  # where in each dynamic dim's range (log-spaced, 0: the bucket's bottom) variants are sought

Estimator = Callable[[Mapping[str, int]], "float | None"]

__all__ = ["GAIN", "MAX_VARIANTS", "POINTS", "TileChoice", "offer"]


@dataclass(frozen=True)
class TileChoice:
    """A bucket step's configs (its own first, then its variants) and their estimators."""

    configs: tuple[EngineConfig, ...]
    estimators: tuple[Estimator, ...]
    # the last shapes' answers (a model's identical layers share one choice: build/shared.py)
    _chosen: dict[tuple[tuple[str, int], ...], EngineConfig | None] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def variants(self) -> tuple[EngineConfig, ...]:
        return self.configs[1:]

    def at(self, env: Mapping[str, int]) -> EngineConfig | None:
        """The variant to run at the bucket's shape `env`: the one of least estimate there, where that is
        at most GAIN of the bucket config's; None: the bucket's own."""
        key = tuple(env.items())
        try:
            return self._chosen[key]
        except KeyError:
            pass
        if len(self._chosen) >= 64:
            self._chosen.clear()
        chosen = self._chosen[key] = self._least(env)
        return chosen

    def _least(self, env: Mapping[str, int]) -> EngineConfig | None:
        own = self.estimators[0](env)
        if own is None:
            return None
        best, best_us = None, GAIN * own
        for config, estimator in zip(self.variants, self.estimators[1:]):
            us = estimator(env)
            if us is not None and us <= best_us:
                best, best_us = config, us
        return best

    def without(self, config: EngineConfig) -> TileChoice | None:
        """This choice less one variant (its kernel failed to compile); None where none is left."""
        kept = [(c, e) for c, e in zip(self.configs, self.estimators) if c is not config]
        if len(kept) < 2:
            return None
        return TileChoice(tuple(c for c, _ in kept), tuple(e for _, e in kept))


def offer(piece: Piece, config: EngineConfig, device: Device, filters: ConfigFilter | None = None) -> TileChoice | None:
    """The configs the bucket's step of `piece` (at the bucket's hint) carries beside its `config`; None
    where it carries none (no estimate, no varying dim, or no config beats the bucket's by GAIN)."""
    origin = piece.graph.origin
    if origin is None:
        return None
    ranges = {name: (lo, hi) for name, lo, hi in origin.bucket.ranges if lo != hi}
    if not ranges:
        return None
    engine = get_engine(config.engine)
    own = engine.estimator(piece, config, device)
    if own is None:
        return None
    variants: list[EngineConfig] = []
    for t in POINTS:
        env = {**origin.env, **log_point(ranges, t)}
        bar = own(env)
        if bar is None:
            continue
        for candidate in engine.configs_at(piece, device, env):
            if candidate.numerical_notes != config.numerical_notes:
                continue
            if filters is not None and filters.rejects(candidate) is not None:
                continue
            if candidate.knobs == config.knobs or candidate.estimate_us is None:
                break  # (the bucket's config is the best there, or the engine has no estimate)
            if candidate.estimate_us <= GAIN * bar and all(v.knobs != candidate.knobs for v in variants):
                variants.append(candidate)
            break
        if len(variants) == MAX_VARIANTS:
            break
    estimators = [own]
    for variant in variants:
        estimator = engine.estimator(piece, variant, device)
        if estimator is None:
            return None
        estimators.append(estimator)
    if not variants:
        return None
    return TileChoice((config, *variants), tuple(estimators))
