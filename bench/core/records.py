"""Result records: what one process (one repeat) measured, as JSON-ready dataclasses.

Metrics (all optional; an implementation has those its modes allow):
    device_us   CUDA graph mode: device time per call, from a CUDA graph of many calls (or the
                profiler's kernel sum where the implementation cannot be captured: `methods` says)
    replay_us   CUDA graph mode: one captured call replayed back to back (host included)
    execute_us  execute mode: plain calls back to back, at most a few hundred between syncs
    latency_us  execute mode: one plain call on an idle device, wall clock until it is done
    host_us     host time per call (tiny shapes), at most a few hundred calls between syncs
    fresh_ms    a fresh process: wall ms from import to the first result (building or loading a plan)
    setup_s     build / compile / tune seconds before the first call (reported apart, never in a time)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from .floors import Ceilings, Floor

SCHEMA = 2
METRICS = ("device_us", "replay_us", "execute_us", "latency_us", "host_us", "fresh_ms", "setup_s")
OURS = ("opgraph", "opgraph tuned", "generated", "generated tuned")


@dataclass
class ImplResult:
    impl: str
    role: str  # "ours" or "peer"
    tuned: bool | None = None  # heuristic (False), tuned (True), not applicable (None)
    engine: str = ""
    status: str = "ok"  # ok | error | unavailable | skipped
    error: str = ""
    errors: dict[str, float | None] = field(default_factory=dict)  # execute-mode check, per output
    graph_errors: dict[str, float | None] = field(default_factory=dict)  # CUDA-graph-mode check
    metrics: dict[str, float] = field(default_factory=dict)
    methods: dict[str, str] = field(default_factory=dict)  # how a metric was measured, when not the usual way
    verdict: dict[str, Any] | None = None
    notes: str = ""

    def combined_errors(self) -> dict[str, float | None]:
        """Per output, the worse of the execute-mode and CUDA-graph-mode errors: None when a mode that
        ran did not produce it, NaN when either is non-finite."""
        out: dict[str, float | None] = {}
        for name in sorted({*self.errors, *self.graph_errors}):
            vals = [d[name] for d in (self.errors, self.graph_errors) if name in d]
            if any(v is None for v in vals):
                out[name] = None
            elif any(v != v for v in vals):
                out[name] = float("nan")
            else:
                out[name] = max(vals)
        return out


@dataclass
class WorkloadResult:
    id: str
    title: str
    group: str
    kind: str = "kernel"
    outputs: list[tuple[str, str]] = field(default_factory=list)  # (name, dtype)
    floor: Floor = field(default_factory=Floor)
    impls: list[ImplResult] = field(default_factory=list)
    tolerances: dict[str, dict[str, Any]] = field(default_factory=dict)  # output -> {value, basis}
    notes: str = ""
    error: str = ""
    elapsed_s: float = 0.0
    absolute: list[str] = field(default_factory=list)  # outputs zero in exact arithmetic: absolute errors
    timed: bool = True  # False: a correctness check (first repeat only, nothing timed)

    @property
    def finished(self) -> bool:
        """It ran to its end: no implementation was cut by a time limit (a resumed run keeps it)."""
        return not any(i.status == "skipped" and "time limit" in i.error for i in self.impls)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["floor"] = self.floor.to_dict()
        d["outputs"] = [list(o) for o in self.outputs]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkloadResult:
        return cls(
            d["id"],
            d["title"],
            d["group"],
            d.get("kind", "kernel"),
            [tuple(o) for o in d.get("outputs", [])],
            Floor.from_dict(d.get("floor")),
            [ImplResult(**i) for i in d.get("impls", [])],
            dict(d.get("tolerances", {})),
            d.get("notes", ""),
            d.get("error", ""),
            float(d.get("elapsed_s", 0.0)),
            list(d.get("absolute", [])),
            bool(d.get("timed", True)),
        )


@dataclass
class RunRecord:
    """One process's results (one repeat of a suite)."""

    meta: dict[str, Any]
    ceilings: Ceilings | None
    workloads: list[WorkloadResult] = field(default_factory=list)
    repeat: int = 0

    def to_json(self) -> str:
        return json.dumps(
            {
                "schema": SCHEMA,
                "repeat": self.repeat,
                "meta": self.meta,
                "ceilings": self.ceilings.to_dict() if self.ceilings else None,
                "workloads": [w.to_dict() for w in self.workloads],
            },
            indent=1,
            sort_keys=False,
            default=_json_default,
        )

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        d = json.loads(text)
        if d.get("schema") != SCHEMA:
            raise ValueError(f"results schema {d.get('schema')} is not {SCHEMA} (written by another bench version)")
        return cls(
            d["meta"],
            Ceilings.from_dict(d["ceilings"]) if d.get("ceilings") else None,
            [WorkloadResult.from_dict(w) for w in d["workloads"]],
            int(d.get("repeat", 0)),
        )


def _json_default(x: Any) -> Any:
    if isinstance(x, float):
        return None
    return str(x)
