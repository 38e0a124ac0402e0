"""Running fuzz cases: every engine set against the reference, with poisoned outputs, guard bytes,
untouched inputs, repeated executes, plan files (intact and damaged), and shrinking of failures.

A `Failure` says which engine set, what went wrong (`kind`) and the detail; `run_case` returns the
failures of one case (empty: it passed) and counts what it ran in a `Stats`.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import opgraph as og
from opgraph.core.config import NumericalNote
from opgraph.core.errors import GraphError, SerializationError
from opgraph.core.ir import FinalGraph, Node

from . import oracle
from .damage import damaged_plans
from .gen import Case

DT = og.DataType


@dataclass
class Failure:
    seed: int
    engines: str
    kind: str  # mismatch, untyped-build, untyped-execute, typed-execute, guard, input-changed, repeat, plan-file...
    detail: str

    def __str__(self) -> str:
        return f"seed {self.seed} [{self.engines}] {self.kind}: {self.detail}"


@dataclass
class Stats:
    graphs: int = 0
    runs: int = 0  # plan executions compared with the reference
    declined: Counter = field(default_factory=Counter)  # typed build refusals by rule
    failures: list[Failure] = field(default_factory=list)
    untyped: Counter = field(default_factory=Counter)  # untyped exceptions by class
    families: Counter = field(default_factory=Counter)
    steps: Counter = field(default_factory=Counter)  # plan steps run, by engine[:template]
    damaged: int = 0

    def merge(self, other: Stats) -> None:
        self.graphs += other.graphs
        self.runs += other.runs
        self.declined.update(other.declined)
        self.failures += other.failures
        self.untyped.update(other.untyped)
        self.families.update(other.families)
        self.steps.update(other.steps)
        self.damaged += other.damaged


@dataclass(frozen=True)
class EngineSet:
    name: str
    engines: tuple[str, ...] | None  # None: the build's default for the device
    options: tuple[tuple[str, Any], ...] = ()


# the CI test's settings (tests/fuzz/test_fuzz.py): replays use them too, so that a case draws the same
# values, repeats and plan-file damage as when it failed
# (16: an element that is pure rounding noise keeps its sign through all of them with odds 2**-15; 6
# left a batchnorm_backward dx of a constant gradient, -1e-16 in the reference, under a sqrt unflipped:
# fuzz seed 20261125503308)
NUDGES = 16
# what order-sensitive elements become in the sensitivity runs, one value per run: an answer the spec
# allows there (NaN, either infinity, a finite number) must show up as a difference downstream
WILD = (np.nan, 0.0, np.inf, -np.inf, 1.0, -1.0, np.nan)
CI_SETTINGS = {"repeat": 0.5, "plan_files": 0.25, "damage": 0.25}
CPU_SETS = (
    EngineSet("triton+torch", ("triton", "torch")),
    EngineSet("torch", ("torch",)),
    EngineSet("reference", ("reference",)),
)
GPU_SETS = (
    EngineSet("default", None),
    EngineSet("triton+torch", ("triton", "torch")),
    EngineSet("torch", ("torch",)),
    EngineSet("ieee", None, (("deselect_numeric_notes", ("DOWN_CONVERT_INPUTS",)),)),
)


def graph_of(case: Case) -> og.Graph:
    return og.Graph.from_json(json.dumps(case.graph))


def _inputs(final: FinalGraph, case: Case, rng: np.random.Generator) -> dict[int, Any]:
    """float64 values (or Python numbers for pass-by-value tensors) of every bound input, and of
    in-place tensors."""
    values: dict[int, Any] = {}
    inplace = {u for n in final.nodes for u in n.output_uids() if u in n.input_uids()}
    for uid in (*final.inputs, *inplace):
        desc = final.tensors[uid]
        if desc.is_pass_by_value:
            values[uid] = case.scalars.get(str(uid), float(rng.uniform(0.1, 1.0)))
        else:  # the values the buffer will hold
            raw = oracle.input_values(desc, case.profiles.get(str(uid), "normal"), rng)
            # read back through the layout: elements sharing memory (stride 0) hold one value
            values[uid] = oracle.make_buffer(desc, raw, "cpu").host().astype(np.float64)
    return values


def _held(value: Any, desc: Any) -> float:
    from opgraph.runtime.bindings import _scalar

    return float(_scalar(value, desc))


def _delta_for(plan: Any) -> Any:
    """Per node: the relative error of the precision the plan's step computes it in."""
    coarse = {}
    for step in plan.steps:
        notes = step.config.numerical_notes
        for n in step.piece.nodes:
            if NumericalNote.DOWN_CONVERT_INPUTS in notes and n.kind in (
                "matmul",
                "conv_fprop",
                "conv_dgrad",
                "conv_wgrad",
            ):
                coarse[n.name] = 2.0**-10
            elif NumericalNote.ROUNDED_INTERMEDIATE in notes or NumericalNote.REDUCED_PRECISION_REDUCTION in notes:
                coarse[n.name] = 2.0**-10

    # (by name: a dynamic plan's steps at a shape hold that shape's copies of the graph's nodes)
    def delta(node: Node) -> float:
        return coarse.get(node.name) or oracle.node_delta(node, plan.graph.tensors)

    return delta


def _loosest(final: FinalGraph) -> dict[int, Any]:
    """Per output: the least precise floating type on an inexact path to it (its rounding errors reach
    the output), or None."""
    loose: dict[int, Any] = {}
    inexact: dict[int, bool] = {}
    order = [DT.FP8_E5M2, DT.FP8_E4M3, DT.BFLOAT16, DT.HALF, DT.FLOAT, DT.DOUBLE]

    def worse(a, b):
        if a is None:
            return b
        if b is None:
            return a
        return a if order.index(a) < order.index(b) else b

    for node in final.nodes:
        up, dirty = None, not oracle.exact_node(node, final.tensors)
        for u in node.input_uids():
            up = worse(up, loose.get(u))
            dirty = dirty or inexact.get(u, False)
        for u in node.output_uids():
            t = final.tensors[u].data_type
            mine = t if t.is_floating and dirty else None
            loose[u] = worse(up, mine) if dirty else up
            inexact[u] = dirty
    return {u: loose.get(u) for u in final.outputs}


@dataclass
class Expect:
    """What a plan over `graph` must compute on `values`: the reference results, the loosest type on
    the way to each output, and (per plan precision) the sensitivity spread."""

    graph: FinalGraph
    values: dict[int, Any]
    want: dict[int, np.ndarray]
    loosest: dict[int, Any]
    held: dict[int, Any]

    @staticmethod
    def of(graph: FinalGraph, case: Case, rng: np.random.Generator) -> Expect:
        values = _inputs(graph, case, rng)
        # pass-by-value numbers as the plan holds them (rounded to their type): the reference semantics
        held = {u: (_held(v, graph.tensors[u]) if graph.tensors[u].is_pass_by_value else v) for u, v in values.items()}
        return Expect(graph, values, oracle.evaluate(graph, held, None), _loosest(graph), held)

    def spread(self, plan: Any, rng: np.random.Generator) -> dict[int, np.ndarray]:
        delta = _delta_for(plan)
        spread = {u: np.zeros(self.graph.tensors[u].dim) for u in self.graph.outputs}
        # nudged several times (a value that is pure rounding noise changes sign in about half of
        # them: log or rsqrt of it then gives NaN, and the spread says anything goes), then in float32.
        # Computed only for an output outside its type's own tolerance.
        base = {**{u: np.asarray(v, dtype=np.float64) for u, v in self.held.items()}, **self.want}
        for i in range(NUDGES + 1):
            nudged = oracle.evaluate(
                self.graph,
                self.held,
                rng if i < NUDGES else None,
                delta,
                low=i == NUDGES,
                wild=WILD[i % len(WILD)],
                base=base,
            )
            for u in self.graph.outputs:
                w, n = self.want[u].astype(np.float64), nudged[u].astype(np.float64)
                with np.errstate(invalid="ignore"):
                    diff = np.abs(n - w)
                # NaN on one side only (rsqrt of a result whose sign a last bit decides): anything goes
                diff = np.where(np.isnan(diff), np.where(np.isnan(w) & np.isnan(n), 0.0, np.inf), diff)
                spread[u] = np.maximum(spread[u], diff)
        return spread


class _CompileFailures(logging.Handler):
    """Collects the build's "failed to compile, trying the next config" records while active."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []
        self.logger = logging.getLogger("opgraph.build")

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "failed to compile" in text:
            self.messages.append(text.strip()[:400])

    def __enter__(self) -> _CompileFailures:
        self.level = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level)


class Lazy:
    """A value computed on first call, once."""

    def __init__(self, make: Any) -> None:
        self.make, self.value, self.done = make, None, False

    def __call__(self) -> Any:
        if not self.done:
            self.value, self.done = self.make(), True
        return self.value


def nondeterministic(steps: Any) -> bool:
    """Whether a step of the plan may compute different bits from run to run."""
    return any(NumericalNote.NONDETERMINISTIC in s.config.numerical_notes for s in steps)


def changed(first: Any, second: Any, outputs: Any) -> int | None:
    """The first output whose bits differ between two runs' results (None: every one the same)."""
    return next((u for u in outputs if not oracle.same_bits(first.got[u], second.got[u])), None)


class Runner:
    def __init__(
        self,
        device: str = "cpu",
        sets: Sequence[EngineSet] | None = None,
        *,
        repeat: float = 1.0,
        plan_files: float = 0.3,
        damage: float = 0.2,
    ) -> None:
        self.device = device
        self.sets = tuple(sets) if sets is not None else (CPU_SETS if device == "cpu" else GPU_SETS)
        self.repeat = repeat  # share of plans executed a second time on the same pack
        self.plan_files = plan_files  # ... saved and loaded back
        self.damage = damage  # ... of those, loaded damaged

    def run(self, case: Case) -> Stats:
        """Run one case on every engine set; the failures and counts."""
        stats = Stats(graphs=1)
        stats.families.update(case.families)
        rng = np.random.default_rng(case.seed)
        try:
            g = graph_of(case)
            final = g.final
        except Exception as err:  # noqa: BLE001 - a generated graph must round-trip through JSON
            stats.failures.append(Failure(case.seed, "-", "graph-json", _what(err)))
            return stats
        expect = Expect.of(final, case, rng)
        for es in self.sets:
            self._run_set(case, g, es, expect, rng, stats)
        return stats

    def _build(self, g: og.Graph, es: EngineSet, case: Case) -> Any:
        opts = dict(es.options)
        if case.by_reference:
            opts["by_reference"] = True
        return g.build(device=self.device, engines=None if es.engines is None else list(es.engines), **opts)

    def built(self, g: og.Graph, es: EngineSet, case: Case, stats: Stats, fail: Any) -> Any:
        """The plan of `g` with the engine set, or None: a typed refusal counted, an untyped one failed.
        A generated kernel that does not compile is a failure even where the build fell back."""
        try:
            with _CompileFailures() as compile_failures:
                plan = self._build(g, es, case)
        except GraphError as err:
            stats.declined[err.rule or type(err).__name__] += 1
            return None
        except Exception as err:  # noqa: BLE001
            stats.untyped[type(err).__name__] += 1
            fail("untyped-build", _what(err))
            return None
        for message in compile_failures.messages:
            fail("compile", message)
        return plan

    def _run_set(self, case: Case, g: og.Graph, es: EngineSet, expect: Expect, rng, stats: Stats) -> None:
        def fail(kind: str, detail: str) -> None:
            stats.failures.append(Failure(case.seed, es.name, kind, detail))

        plan = self.built(g, es, case, stats, fail)
        if plan is None:
            return
        spread = Lazy(lambda: expect.spread(plan, rng))
        first = self._execute(plan, expect, spread, stats, fail)
        if first is None:
            return
        stats.runs += 1
        stats.steps.update(
            s.config.engine + (f":{s.config.knob('template')}" if s.config.knob("template") else "") for s in plan.steps
        )
        nondet = nondeterministic(plan.steps)
        outputs = expect.graph.outputs
        # the same plan on the same pack again (on CUDA, the fast binder's path): the same bits
        second = self._execute(plan, expect, spread, stats, fail, again=first) if rng.random() < self.repeat else None
        if second is not None and not nondet:
            bad = changed(first, second, outputs)
            if bad is not None:
                fail("repeat", f"a second execute changed {expect.graph.tensors[bad].label()}")
        if rng.random() >= self.plan_files:
            return
        try:
            data = plan.to_bytes()
            loaded = og.ExecutionPlan.from_bytes(data)
        except Exception as err:  # noqa: BLE001
            if not isinstance(err, GraphError):
                stats.untyped[type(err).__name__] += 1
            return fail("plan-file", f"save/load of an intact plan: {_what(err)}")
        third = self._execute(loaded, expect, spread, stats, fail, note="loaded plan: ")
        if third is not None and not nondet:
            bad = changed(first, third, outputs)
            if bad is not None:
                fail("plan-file", f"the loaded plan computes {expect.graph.tensors[bad].label()} differently")
        if rng.random() < self.damage:
            for what, blob in damaged_plans(data, rng, count=3):
                stats.damaged += 1
                self._damaged(what, blob, case, rng, stats, fail)

    def _damaged(self, what: str, blob: bytes, case: Case, rng, stats: Stats, fail) -> None:
        """A damaged plan file loads as a SerializationError, or as a plan that runs correctly."""
        try:
            loaded = og.ExecutionPlan.from_bytes(blob)
        except SerializationError:
            return
        except Exception as err:  # noqa: BLE001
            stats.untyped[type(err).__name__] += 1
            return fail("damaged-plan", f"{what}: {_what(err)}")
        if any(t.nbytes > 1 << 24 for t in loaded.graph.tensors.values()):
            return  # a valid plan over huge (damaged) dims or strides: nothing to run it on
        expect = Expect.of(loaded.graph, Case(case.seed, {}), rng)
        self._execute(
            loaded, expect, Lazy(lambda: expect.spread(loaded, rng)), stats, fail, note=f"damaged plan ({what}): "
        )

    def _execute(self, plan: Any, expect: Expect, spread, stats: Stats, fail, again: Any = None, note: str = ""):
        """Fresh buffers (inputs with guards, poisoned outputs), execute, check everything; the
        results, or None after a failure."""
        from types import SimpleNamespace

        final, values = expect.graph, expect.values
        inplace = {u for n in final.nodes for u in n.output_uids() if u in n.input_uids()}
        bufs = {}
        for uid in (*final.inputs, *final.outputs):
            desc = final.tensors[uid]
            if not desc.is_pass_by_value:
                src = values.get(uid) if (uid in final.inputs or uid in inplace) else None
                if again is not None and uid in again.bufs:  # the same buffers, refilled
                    bufs[uid] = again.bufs[uid]
                    oracle.refill(bufs[uid], src)
                else:
                    bufs[uid] = oracle.make_buffer(desc, src, self.device)
        pack = (
            again.pack
            if again is not None
            else {
                uid: (values[uid] if final.tensors[uid].is_pass_by_value else bufs[uid].view)
                for uid in (*final.inputs, *final.outputs)
            }
        )
        before = {uid: b.base_bytes() for uid, b in bufs.items()}
        try:
            plan.execute(pack)
            if self.device != "cpu":
                import torch

                torch.cuda.synchronize()
        except GraphError as err:
            fail("typed-execute", f"{note}{_what(err)}")
            return None
        except Exception as err:  # noqa: BLE001
            stats.untyped[type(err).__name__] += 1
            fail("untyped-execute", f"{note}{_what(err)}")
            return None
        got = {}
        for uid, b in bufs.items():
            after = b.base_bytes()
            free = ~np.repeat(b.owned, b.desc.data_type.itemsize)
            if uid in final.outputs or uid in inplace:
                if not np.array_equal(after[free], before[uid][free]):
                    fail("guard", f"{note}bytes outside {b.desc.label()} (guards or gaps) were written")
                    return None
            elif not np.array_equal(after, before[uid]):
                fail("input-changed", f"{note}input {b.desc.label()} was written")
                return None
            if uid in final.outputs:
                got[uid] = b.host().copy()
        for uid in final.outputs:
            desc, loose = final.tensors[uid], expect.loosest.get(uid)
            m = oracle.compare(desc, got[uid], expect.want[uid], 0.0, loose)
            if m is not None:  # outside the type's tolerance: is the output that sensitive here?
                m = oracle.compare(desc, got[uid], expect.want[uid], spread()[uid], loose)
            if m is not None:
                fail("mismatch", f"{note}{m}")
                return None
        return SimpleNamespace(got=got, bufs=bufs, pack=pack)


def _what(err: BaseException) -> str:
    tb = traceback.extract_tb(err.__traceback__)
    where = f" at {tb[-1].filename.split('/')[-1]}:{tb[-1].lineno}" if tb else ""
    return f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}{where}"


def run_many(
    seeds: Any,
    runner: Runner,
    deadline: float | None = None,
    make: Any = None,
    *,
    clock: Any = time.monotonic,
    wall_deadline: float | None = None,
) -> Stats:
    """Run the cases of `seeds` until `deadline` (by `clock`) or `wall_deadline` (time.monotonic());
    stats over those that ran."""
    from .families import make_case

    make = make or make_case
    total = Stats()
    for seed in seeds:
        if (deadline is not None and clock() > deadline) or (
            wall_deadline is not None and time.monotonic() > wall_deadline
        ):
            break
        try:
            case = make(seed)
        except Exception as err:  # noqa: BLE001
            total.failures.append(Failure(seed, "-", "generator", _what(err)))
            continue
        total.merge(runner.run(case))
    return total
