"""The workload registry: every benchmark workload is a `WorkloadSpec` registered under a unique id
in a group (the unit a command runs: `python -m bench.run --suite GROUP`).

    from bench.core.registry import workload

    @workload("attention.sdpa_fwd.bf16", group="attention", title="SDPA forward B8 H16 S2048 D64 bf16")
    def sdpa_forward(ctx):          # ctx: bench.ctx.Ctx (device, scale, helpers)
        ...
        return Case(outputs=..., reference=..., impls=[...], floor=Floor(...))

Selecting: "all", a half of the suite by kind ("kernels": kernel and host workloads; "models": whole
networks and training steps), a group name, a workload id, or a glob over ids ("conv.*.bf16").
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

KINDS = ("kernel", "network", "training", "host")
# The suite in two halves (~3,400 and ~4,500 worker-seconds at 3 repeats by costs.json), each a table that
# fits one session's device time on four GPUs where the whole suite (~7,200) does not (bench/README.md).
HALVES = {"kernels": ("kernel", "host"), "models": ("network", "training")}


@dataclass(frozen=True)
class WorkloadSpec:
    id: str
    group: str
    title: str
    make: Callable[[Any], Any] = field(compare=False)
    kind: str = "kernel"
    quick: bool = True  # part of --quick (smoke tests)
    needs: frozenset[str] = frozenset()  # "cuda", "cudnn_frontend", "torchvision": reported skipped where unmet
    minutes: float = 0.5  # rough minutes of one repeat on an H100 with warm caches (planning only)
    timed: bool = True  # False: a correctness check (set up and checked, never timed; first repeat only)

    def __post_init__(self) -> None:
        if not self.id or any(c.isspace() for c in self.id):
            raise ValueError(f"workload id {self.id!r}: a non-empty name without spaces")
        if self.kind not in KINDS:
            raise ValueError(f"workload {self.id}: kind {self.kind!r} is not one of {KINDS}")
        if not self.group or self.group == "all":
            raise ValueError(f"workload {self.id}: group {self.group!r} (not empty, not 'all')")


class Registry:
    def __init__(self) -> None:
        self._specs: dict[str, WorkloadSpec] = {}

    def register(self, spec: WorkloadSpec) -> WorkloadSpec:
        if spec.id in self._specs:
            raise ValueError(f"workload {spec.id} is registered twice")
        self._specs[spec.id] = spec
        return spec

    def workload(
        self,
        id: str,
        *,
        group: str,
        title: str,
        kind: str = "kernel",
        quick: bool = True,
        needs: Iterable[str] = (),
        minutes: float = 0.5,
        timed: bool = True,
    ) -> Callable[[Callable], Callable]:
        """Decorator: register `make(ctx) -> Case` as a workload; returns the function unchanged."""

        def deco(make: Callable) -> Callable:
            self.register(WorkloadSpec(id, group, title, make, kind, quick, frozenset(needs), minutes, timed))
            return make

        return deco

    def get(self, id: str) -> WorkloadSpec:
        return self._specs[id]

    def specs(self) -> list[WorkloadSpec]:
        return list(self._specs.values())

    def groups(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for s in self._specs.values():
            out.setdefault(s.group, []).append(s.id)
        return out

    def select(self, names: Sequence[str], *, quick: bool = False) -> list[WorkloadSpec]:
        """The workloads named (groups, families of groups: "attention" for "attention-fwd", ...; ids or
        globs over ids; "all"; a half, HALVES), in registration order, each once. `quick` keeps those
        marked for smoke tests."""
        groups = self.groups()
        chosen: set[str] = set()
        for name in names or ["all"]:
            if name == "all":
                hit = list(self._specs)
            elif name in HALVES:
                hit = [i for i, s in self._specs.items() if s.kind in HALVES[name]]
            elif name in groups:
                hit = groups[name]
            elif any(g.startswith(f"{name}-") for g in groups):
                hit = [i for g, ids in groups.items() if g.startswith(f"{name}-") for i in ids]
            elif name in self._specs:
                hit = [name]
            else:
                hit = fnmatch.filter(self._specs, name)
            if not hit:
                raise KeyError(
                    f"no workload or group {name!r}; groups: {', '.join(groups)} "
                    "(`python -m bench.run --list` lists the workloads)"
                )
            chosen.update(hit)
        return [s for s in self._specs.values() if s.id in chosen and (s.quick or not quick)]


REGISTRY = Registry()
workload = REGISTRY.workload
