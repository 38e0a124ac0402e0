"""Execution-plan candidates, as cuDNN's frontend lists them, over opgraph's pieces and engine configs.

cuDNN ranks whole-graph plans; opgraph cuts a graph into pieces and ranks configs per piece. A
candidate here is one config per piece: candidate k takes each piece's k-th ranked config (its last
when it has fewer), so candidate 0 is what `Graph.build` picks. Engines are numbered as in
`plan.default_engines` for the device ("engine i" of cuDNN's `create_execution_plan(i, knobs)`), and
the knob KERNEL_CFG = j picks each piece's j-th config of that engine. Shared by `opgraph.cudnn`
(plan-index functions) and `opgraph.backend` (engine heuristics, engine configs, execution plans).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..build.compile import compile_steps
from ..build.filters import OPTIONS as FILTER_OPTIONS
from ..build.filters import ConfigFilter
from ..build.heuristics import rank_configs
from ..build.partition import Cut, partition
from ..build.planner import Step, default_engines, sessions
from ..build.sibling_merge import refine
from ..core.config import BehaviorNote, EngineConfig, HeurMode, NumericalNote, as_modes
from ..core.device import Device
from ..core.errors import UnsupportedGraphError
from ..core.ir import FinalGraph
from ..core.piece import Piece
from ..engines import get_engine
from ..engines.base import Engine
from ..runtime.plan import ExecutionPlan

# notes a plan has only when every piece's config has them (capabilities); the others when any has
_ALL_PIECES = frozenset(
    {BehaviorNote.CUDA_GRAPH_CAPTURABLE, BehaviorNote.SUPPORTS_CUDA_GRAPH_NATIVE_API, BehaviorNote.DEVICE_SCALARS}
)


@dataclass(frozen=True)
class Candidate:
    """One execution-plan candidate: a config per piece, and where it came from."""

    configs: tuple[EngineConfig, ...]
    engine: int = -1  # the engine index when made by engine and knobs, else -1
    kernel_cfg: int = 0

    @property
    def name(self) -> str:
        return " | ".join(
            c.engine + (f"[{' '.join(f'{k}={v}' for k, v in c.knobs)}]" if c.knobs else "") for c in self.configs
        )

    @property
    def behavior_notes(self) -> frozenset[BehaviorNote]:
        sets = [c.behavior_notes for c in self.configs]
        anywhere = frozenset().union(*sets) - _ALL_PIECES
        everywhere = frozenset.intersection(*sets) & _ALL_PIECES if sets else frozenset()
        return anywhere | everywhere

    @property
    def numerical_notes(self) -> frozenset[NumericalNote]:
        return frozenset().union(*(c.numerical_notes for c in self.configs))


class Planner:
    """The pieces of a graph on a device and the engine configs that run them."""

    def __init__(
        self,
        graph: FinalGraph,
        device: Device,
        engines: Sequence[str] | None = None,
        filters: Mapping[str, Any] | None = None,
    ) -> None:
        self.graph = graph
        self.device = device
        names = list(engines) if engines is not None else default_engines(device)
        self.engines: list[Engine] = [e for e in map(get_engine, names) if e.available(device).ok]
        if not self.engines:
            raise UnsupportedGraphError(
                f"none of the engines {names} can run on {device}",
                rule="engine.unavailable",
                hint="build for another device, or allow the reference engine on the CPU",
            )
        self.filters = ConfigFilter.from_options(dict(filters or {}))
        self.pieces: list[Piece]
        self.cuts: list[Cut]
        with sessions(self.engines):
            pieces, cuts = partition(graph, self.engines, device)
            # (the pieces Graph.build plans with its default heuristic mode)
            self.pieces, self.cuts = refine(pieces, cuts, self.engines, device, as_modes(None))

    # -- candidates ------------------------------------------------------------------------------
    def heuristic_candidates(self, modes: Any) -> list[Candidate]:
        """Candidates from the heuristic modes, best first; UnsupportedGraphError (with every
        engine's reason) when some piece has no config left."""
        ranked = []
        for piece in self.pieces:
            configs = rank_configs(piece, self.engines, self.device, as_modes(modes))
            kept, dropped = self.filters.keep(configs.configs)
            if not kept:
                reasons = (
                    "; ".join(
                        [
                            *(f"{n}: {why}" for n, why in configs.declined),
                            *(f"{c} filtered out: {why}" for c, why in dropped),
                        ]
                    )
                    or "no config in these modes"
                )
                raise UnsupportedGraphError(
                    f"no engine config for {piece.label()} ({reasons})",
                    op=piece.nodes[0].label(),
                    rule="engine.no_config",
                    hint="add heur_mode.FALLBACK, or relax deselect_engines / the note and workspace filters",
                )
            ranked.append(kept)
        out: list[Candidate] = []
        for k in range(max(len(r) for r in ranked)):
            cand = Candidate(tuple(r[min(k, len(r) - 1)] for r in ranked))
            if cand not in out:
                out.append(cand)
        return out

    def engine_configs(self, index: int) -> list[list[EngineConfig]]:
        """Per piece, the configs engine `index` offers (every mode), or UnsupportedGraphError."""
        if not 0 <= index < len(self.engines):
            raise UnsupportedGraphError(
                f"there is no engine {index} on {self.device} (engines: "
                f"{', '.join(f'{i}={e.name}' for i, e in enumerate(self.engines))})",
                rule="cudnn.engine_index",
                hint=f"pick an engine index in [0, {len(self.engines) - 1}] (get_engine_count())",
            )
        engine = self.engines[index]
        out = []
        for piece in self.pieces:
            verdict = engine.supports(piece, self.device)
            if not verdict.ok:
                raise UnsupportedGraphError(
                    f"engine {index} ({engine.name}) does not run {piece.label()}: {verdict.reason}",
                    op=(verdict.node or piece.nodes[0]).label(),
                    rule="engine.no_support",
                    hint="pick another engine, or let the heuristics choose (create_execution_plans)",
                )
            configs: list[EngineConfig] = []
            for mode in (HeurMode.A, HeurMode.B, HeurMode.FALLBACK):
                configs += [c for c in engine.configs(piece, self.device, mode) if c not in configs]
            kept, dropped = self.filters.keep(configs)
            if not kept:
                raise UnsupportedGraphError(
                    f"every config of engine {index} ({engine.name}) for {piece.label()} is filtered out "
                    f"({'; '.join(f'{c}: {why}' for c, why in dropped)})",
                    op=piece.nodes[0].label(),
                    rule="engine.no_config",
                    hint="relax the note, engine and workspace filters",
                )
            out.append(kept)
        return out

    def engine_candidate(self, index: int, kernel_cfg: int = 0) -> Candidate:
        per_piece = self.engine_configs(index)
        top = max(len(c) for c in per_piece) - 1
        if not 0 <= kernel_cfg <= top:
            raise UnsupportedGraphError(
                f"engine {index} ({self.engines[index].name}) has kernel configs 0..{top}, not {kernel_cfg}",
                rule="cudnn.knob_value",
                hint=f"pick KERNEL_CFG in [0, {top}] (get_knobs_for_engine)",
            )
        return Candidate(tuple(c[min(kernel_cfg, len(c) - 1)] for c in per_piece), index, kernel_cfg)

    def engine_index(self, config: EngineConfig) -> int:
        return next((i for i, e in enumerate(self.engines) if e.name == config.engine), -1)

    # -- building ----------------------------------------------------------------------------------
    def build(self, candidate: Candidate) -> ExecutionPlan:
        """Compile every piece with its config, its kernels too (in worker processes, as cuDNN's
        build_plan compiles): an ExecutionPlan (ExecutionError when a kernel does not compile, so
        build_plans goes on to the next candidate; UnsupportedGraphError when one needs more workspace
        than the filters allow)."""
        steps: list[Step] = []
        for piece, config in zip(self.pieces, candidate.configs):
            kernel = get_engine(config.engine).compile(piece, config, self.device)
            why = self.filters.rejects_kernel(kernel)
            if why is not None:
                raise UnsupportedGraphError(
                    f"{config} for {piece.label()}: {why}",
                    op=piece.nodes[0].label(),
                    rule="engine.workspace_limit",
                    hint="raise deselect_workspace_greater_than, or pick another plan",
                )
            steps.append(Step(len(steps), piece, config, kernel))
        steps, _ = compile_steps(steps, self.device, "parallel")  # (a kernel that fails: ExecutionError)
        return ExecutionPlan(self.graph, self.device, tuple(steps), tuple(self.cuts))


__all__ = ["FILTER_OPTIONS", "Candidate", "Planner"]
