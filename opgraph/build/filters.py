"""Filtering engine configs by their notes, engine and workspace, as cuDNN's frontend does
(`deselect_numeric_notes`, `deselect_workspace_greater_than`, ...): build options that every
config of every piece must pass, in heuristic ranking and autotuning alike."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.config import BehaviorNote, EngineConfig, NumericalNote
from ..core.errors import AttributeValueError
from ..engines.base import Kernel

OPTIONS = (
    "select_numeric_notes",
    "deselect_numeric_notes",
    "select_behavior_notes",
    "deselect_behavior_notes",
    "deselect_engines",
    "deselect_workspace_greater_than",
)


def _notes(kind: type[enum.Enum], values: Any, option: str) -> frozenset:
    if values is None:
        return frozenset()
    if isinstance(values, (str, kind)):
        values = [values]
    out = set()
    for v in values:
        if isinstance(v, kind):
            out.add(v)
            continue
        name = str(v).strip()
        match = next((n for n in kind if name.upper() == n.name or name.lower() == n.value), None)
        if match is None:
            raise AttributeValueError(
                f"build option {option}: {v!r} is not a {kind.__name__}",
                rule="build.filter",
                hint=f"pass opgraph.{kind.__name__} values or their names: {', '.join(n.name for n in kind)}",
            )
        out.add(match)
    return frozenset(out)


@dataclass(frozen=True)
class ConfigFilter:
    """Which configs a build may use. `select_*`: a config must carry every one of these notes;
    `deselect_*`: it must carry none; `deselect_engines`: it runs no code of these engines (a
    library config runs torch and triton code too); `deselect_workspace_greater_than`: its own
    kernel's scratch at most this many bytes, as cuDNN counts an engine config's workspace (tensors
    that cross pieces live in the plan's workspace too, whatever the limit)."""

    select_numeric_notes: frozenset[NumericalNote] = frozenset()
    deselect_numeric_notes: frozenset[NumericalNote] = frozenset()
    select_behavior_notes: frozenset[BehaviorNote] = frozenset()
    deselect_behavior_notes: frozenset[BehaviorNote] = frozenset()
    deselect_engines: frozenset[str] = frozenset()
    deselect_workspace_greater_than: int | None = None

    @staticmethod
    def from_options(options: Mapping[str, Any]) -> ConfigFilter:
        limit = options.get("deselect_workspace_greater_than")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise AttributeValueError(
                f"build option deselect_workspace_greater_than={limit!r} is not a byte count",
                rule="build.filter",
                hint="pass a non-negative int (bytes), or None for no limit",
            )
        engines = options.get("deselect_engines") or ()
        engines = [engines] if isinstance(engines, str) else list(engines)
        from ..engines import engine_names

        unknown = [e for e in engines if e not in engine_names()]
        if unknown:
            raise AttributeValueError(
                f"build option deselect_engines names no engine: {', '.join(map(repr, unknown))}",
                rule="build.filter",
                hint=f"engines are: {', '.join(engine_names())}",
            )
        return ConfigFilter(
            _notes(NumericalNote, options.get("select_numeric_notes"), "select_numeric_notes"),
            _notes(NumericalNote, options.get("deselect_numeric_notes"), "deselect_numeric_notes"),
            _notes(BehaviorNote, options.get("select_behavior_notes"), "select_behavior_notes"),
            _notes(BehaviorNote, options.get("deselect_behavior_notes"), "deselect_behavior_notes"),
            frozenset(engines),
            limit,
        )

    def __bool__(self) -> bool:
        return self != ConfigFilter()

    def rejects(self, config: EngineConfig) -> str | None:
        """Why `config` is filtered out (None: it passes, its workspace unknown until compiled)."""
        if self.deselect_engines:
            from ..engines import get_engine

            used = get_engine(config.engine).engines_used(config) & self.deselect_engines
            if used:
                return f"engine {', '.join(sorted(used))} deselected"
        missing = (self.select_numeric_notes - config.numerical_notes) | (
            self.select_behavior_notes - config.behavior_notes
        )
        if missing:
            return "lacks selected note(s) " + ", ".join(sorted(n.value for n in missing))
        present = (self.deselect_numeric_notes & config.numerical_notes) | (
            self.deselect_behavior_notes & config.behavior_notes
        )
        if present:
            return "has deselected note(s) " + ", ".join(sorted(n.value for n in present))
        return None

    def rejects_kernel(self, kernel: Kernel) -> str | None:
        limit = self.deselect_workspace_greater_than
        if limit is not None and kernel.scratch_bytes > limit:
            return f"needs {kernel.scratch_bytes} bytes of workspace, above the limit of {limit}"
        return None

    def keep(self, configs: Iterable[EngineConfig]) -> tuple[list[EngineConfig], list[tuple[EngineConfig, str]]]:
        """(configs that pass, (config, reason) for those that do not)."""
        kept, dropped = [], []
        for c in configs:
            why = self.rejects(c)
            if why is None:
                kept.append(c)
            else:
                dropped.append((c, why))
        return kept, dropped

    def key(self) -> str:
        """A stable description, part of the tuning cache's key (a filtered build tunes apart)."""
        if not self:
            return ""
        parts = [f"{name}={sorted(getattr(n, 'value', n) for n in getattr(self, name))}" for name in OPTIONS[:5]]
        return ";".join(parts) + f";ws<={self.deselect_workspace_greater_than}"


__all__ = ["ConfigFilter", "OPTIONS"]
