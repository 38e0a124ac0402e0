"""Plans of graphs with dynamic dims (opgraph.Dim): one build for the whole range, executed at any
shape inside it (design steps 4-7 of docs/design/dynamic-shapes.md: per-shape plans, kernels per
bucket).

At build, the plan at the range's maximum is built (so a graph an engine cannot run is refused up
front, and its kernels are compiled), and the graph is checked to be solvable: every dynamic dim
must be read off some bound buffer's size alone. Per execute, the *shape key* is the sizes the pack's
buffers have on the axes that give a dim (a few tuple reads); a new key is solved once
(opgraph.core.symbolic_solve: typed errors naming the tensor, the axis, the dim and its range), and
the static graph at that shape (`FinalGraph.at`) is planned with the build's options and kept in an
LRU of `shape_plans` plans. A key seen before costs a dict lookup; the plan then binds and runs the
pack as a static plan does. Called without a workspace, every shape's plan runs in one workspace per
thread, allocated at its first execute for the range's maximum (`workspace_size`) and grown only for a
shape that needs more (`stats["workspace_grown"]`, logged; the smaller one kept for the CUDA graphs
captured on it, for the plan's life): never one per shape, never one per call (`profile` and
`profile_steps`, diagnostics, run each shape's plan in its own).

The range is cut into buckets at build (opgraph.build.buckets: `build(buckets=, max_buckets=)`). Each
bucket is planned once, at its first use (opgraph.build.bucket_plan.plan_bucket: partition, configs
and tuning at the bucket's hint shape, nothing compiled there), and each shape's static plan is that
plan carried to the shape (`schedule_at` on `FinalGraph.in_bucket(shape, bucket)`): the same pieces
and configs; a generated kernel that takes its sizes at run time (engines/triton/sizes.py) is
re-pointed, its grids and size arguments evaluated at the shape (one source and one compiled binary
for every shape of the bucket); kernels that bake sizes in (the templates not converted yet) are
generated at the shape with the bucket's config, counted in `stats["shape_kernels"]` and logged at
`OPGRAPH_LOG=info` with the shape that caused them, as is each bucket's first use. The workspace
layout and the binding are the shape's. `stats` counts buckets planned, per-shape plans, steps whose
config was chosen again at a shape (`rechosen`), steps whose split-KV a shape decided anew
(`resplits`), shapes planned anew (`replans`), steps of a shape whose engine built their kernel
again rather than re-pointing the bucket's (`shape_builds`: a cuDNN plan, a kernel with its sizes
compiled in), steps running a tile variant of their bucket (`retiles`: build/tile_variants.py) and
workspace growths (`workspace_grown`).

The shared workspace makes a thread's executes of different shapes share scratch, as a static plan's
executes share its workspace: a thread that runs shapes on several streams at once (or replays CUDA
graphs of two shapes concurrently) orders them itself, or passes each its own workspace.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..build.bucket_plan import BucketSchedule, plan_bucket, schedule_at
from ..build.buckets import Buckets, choose
from ..build.options import BuildOptions
from ..core.errors import GraphError, UnsupportedGraphError, VariantPackError, printable
from ..core.gc_pause import gc_paused
from ..core.ir import FinalGraph
from ..core.symbolic import Dim, Expr, evaluate
from ..core.symbolic_solve import Observed, solve
from ..core.tensor import format_dims
from ..memory import workspace as wsp
from .bindings import resolve_key
from .plan import ExecutionPlan

if TYPE_CHECKING:
    from .bound import BoundPlan

log = logging.getLogger("opgraph.dynamic")


@dataclass(frozen=True)
class Extraction:
    """An axis of a bound tensor whose size gives a dynamic dim (the dim alone, or linear in one)."""

    uid: int
    axis: int
    rank: int


def extraction_list(graph: FinalGraph) -> tuple[Extraction, ...]:
    """The axes a shape key reads: of every bound tensor, each axis whose declared size is a dynamic
    dim alone or linear in one (`seq`, `2*seq`, `seq + 1`)."""
    found = []
    for uid in (*graph.inputs, *graph.outputs):
        t = graph.tensors[uid]
        for axis, d in enumerate(t.dim):
            if isinstance(d, Expr) and _linear_in_one(d):
                found.append(Extraction(uid, axis, len(t.dim)))
    return tuple(found)


def _linear_in_one(e: Expr) -> bool:
    symbols = {a for mono, _ in e.terms for a in mono}
    return len(symbols) == 1 and isinstance(next(iter(symbols)), Dim) and all(len(m) <= 1 for m, _ in e.terms)


def _shape(value: Any) -> tuple[int, ...]:
    shape = getattr(value, "shape", None)
    if shape is None:
        from ..memory.buffers import buffer_info

        shape = buffer_info(value).shape
    return tuple(shape)


class DynamicPlan(ExecutionPlan):
    """A plan for every shape of a graph's dynamic dims (see the module docstring). `execute`,
    `bind`, `profile`, `profile_steps` and `populate_cuda_graph` take a pack of any shape in the
    ranges; `at(shape)` is the static plan of one shape (a dict of dim values), `for_pack(pack)` the
    one of a pack's. What depends on one plan's state (its address table, plan files) is refused
    with a typed error that says so."""

    def __init__(
        self,
        graph: FinalGraph,
        options: BuildOptions,  # noqa: D107 - (no ExecutionPlan state)
    ) -> None:
        self.graph = graph
        self.options = options
        self.symbols: Mapping[str, Dim] = graph.symbols
        self.shape_plans = options.shape_plans  # (an attribute: may be changed on the plan)
        self._extract = extraction_list(graph)
        self._bound = tuple(dict.fromkeys(e.uid for e in self._extract))  # the tensors a shape key reads
        self._plans: OrderedDict[tuple[int, ...], ExecutionPlan] = OrderedDict()
        self._keys: dict[tuple[int, ...], tuple[int, ...]] = {}  # shape key -> the dims' values
        self._names: dict[Any, int] = {}  # a pack key (handle, UID, name) -> its UID
        self._lock = threading.RLock()
        # buckets planned (partition and configs, once each: opgraph.build.bucket_plan); per-shape plans
        # made from them; their steps whose config was chosen again at a shape, and shapes planned anew
        # (a piece no engine ran there); per-shape plans dropped; distinct kernel sources; new ones met
        # after the build (each compiled or loaded), those of a bucket already used (kernels generated
        # per shape); steps of a shape whose kernel its engine built again rather than re-pointed (a
        # cuDNN plan, a kernel with its sizes compiled in); binaries the per-shape builds compiled (CUDA)
        self.stats = {
            "bucket_plans": 0,
            "shape_plans": 0,
            "rechosen": 0,
            "resplits": 0,
            "retiles": 0,
            "replans": 0,
            "evictions": 0,
            "kernels": 0,
            "runtime_compiles": 0,
            "shape_kernels": 0,
            "shape_builds": 0,
            "compiled": 0,
            "workspace_grown": 0,
        }
        self._workspaces = threading.local()  # .buffer, .size, .retired: this thread's shared workspace
        self._check_solvable()
        self.buckets: Buckets = choose(graph, options.buckets, options.max_buckets)
        self._sources: dict[int, set[str]] = {}  # bucket index -> its kernels' source digests
        self._configs: dict[int, set[tuple[int, str, Any]]] = {}  # bucket -> (step, engine, knobs) compiled
        self._every: set[str] = set()  # every bucket's digests
        self._digests: dict[tuple[int, Any], tuple[str, str]] = {}  # (id(source), knobs) -> (source, digest)
        self._first: dict[int, str] = {}  # bucket index -> the shape that used it first
        self._planned: dict[int, int] = {}  # bucket index -> shapes planned in it
        self._bucket_plans: dict[int, BucketSchedule] = {}  # bucket index -> its plan (made at its first use)
        self._built = False
        self.max_shape = {name: d.max for name, d in self.symbols.items()}
        start = time.perf_counter()
        self.max_plan = self.at(self.max_shape)  # built now: what no engine can run is refused here
        self.build_stats = {"max_shape_build_s": time.perf_counter() - start}
        self._built = True
        self.device = self.max_plan.device
        self.cuts = self.max_plan.cuts
        self.steps = self.max_plan.steps  # (those of the range's maximum, as is the workspace size)
        self.workspace_size = self.max_plan.workspace_size
        self.auto_graph = self.max_plan.auto_graph

    def _check_solvable(self) -> None:
        """Every dim must be readable off the bound buffers alone (refused here, not at the first
        execute): solved symbolically at the range's maximum."""
        values = {n: d.max for n, d in self.symbols.items()}
        observed = [
            Observed(d, evaluate(d, values), f"dim {axis} of {self.graph.tensors[u].label()}")
            for u in (*self.graph.inputs, *self.graph.outputs)
            for axis, d in enumerate(self.graph.tensors[u].dim)
        ]
        from ..core.errors import ShapeError

        try:
            solve(observed, error=ShapeError)
        except ShapeError as err:
            raise ShapeError(
                f"the graph's dynamic dims cannot be read off its bound tensors: {err.detail}",
                rule="plan.dim_unknown",
                hint="give some input or output a dim that is the dynamic "
                "dim alone (or linear in it), e.g. dims [batch, seq, 64] rather than only [batch*seq, 64]",
            ) from None

    # -- shapes ------------------------------------------------------------------------------------
    def _uid(self, key: Any) -> int:
        """The UID a pack key names (memoized per key: handles, UIDs and names repeat every call)."""
        try:
            return self._names[key]
        except KeyError:
            uid = resolve_key(self.graph, key)
            if len(self._names) < 4096:
                self._names[key] = uid
            return uid
        except TypeError:  # an unhashable key: resolve_key names what is wrong
            return resolve_key(self.graph, key)

    def shape_of(self, variant_pack: Mapping[Any, Any]) -> dict[str, int]:
        """The dims' values that the pack's buffers give (each checked against its range)."""
        return dict(zip(self.symbols, self._values(variant_pack)[1]))

    def _values(self, pack: Mapping[Any, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        uid_of = self._uid
        by_uid = {uid_of(k): v for k, v in pack.items()}
        shapes: dict[int, tuple[int, ...]] = {}
        for uid in self._bound:
            value = by_uid.get(uid)
            if value is None:
                raise VariantPackError(
                    "the tensor is not bound: its dims give the plan's shape",
                    tensor=self.graph.tensors[uid],
                    rule="pack.missing",
                    hint="bind every input and output of the graph",
                )
            shape = getattr(value, "shape", None)
            shapes[uid] = tuple(shape) if shape is not None else _shape(value)
        key = tuple([s[e.axis] if len(s := shapes[e.uid]) == e.rank else -1 for e in self._extract])
        values = self._keys.get(key)
        if values is None:
            values = self._solve(by_uid, key)
        return key, values

    def _solve(self, by_uid: Mapping[int, Any], key: tuple[int, ...]) -> tuple[int, ...]:
        observed = []
        for uid in dict.fromkeys(e.uid for e in self._extract):
            t = self.graph.tensors[uid]
            shape = _shape(by_uid[uid])
            if len(shape) != len(t.dim):
                raise VariantPackError(
                    f"the buffer has {len(shape)} dims {list(shape)}, the tensor {len(t.dim)} {format_dims(t.dim)}",
                    tensor=t,
                    rule="pack.rank",
                    hint="bind a buffer of the tensor's rank, its dynamic dims in their ranges",
                )
            observed += [
                Observed(d, shape[axis], f"dim {axis} of {t.label()}")
                for axis, d in enumerate(t.dim)
                if isinstance(d, Expr)
            ]
        env = solve(observed)
        values = self.graph.shape_key(env)
        with self._lock:
            self._keys[key] = values
            if len(self._keys) > 64 * self.shape_plans:
                self._keys.pop(next(iter(self._keys)))
        return values

    def at(self, shape: Mapping[str, int]) -> ExecutionPlan:
        """The static plan of one shape (built with the build's options at its first use, then kept
        among the last `shape_plans` used)."""
        return self._plan(self.graph.shape_key(shape))

    def _plan(self, values: tuple[int, ...]) -> ExecutionPlan:
        plan = self._plans.get(values)
        if plan is not None:
            if next(reversed(self._plans)) != values:
                with self._lock:
                    if values in self._plans:
                        self._plans.move_to_end(values)
            return plan
        with self._lock:
            plan = self._plans.get(values)
            if plan is None:
                with gc_paused():
                    plan = self._build(values)
        return plan

    def _build(self, values: tuple[int, ...]) -> ExecutionPlan:
        shape = dict(zip(self.symbols, values))
        bucket = self.buckets.of(values)
        name = printable(self.graph.name)
        start = time.perf_counter()
        planned = self._bucket_plans.get(bucket.index)
        if planned is None:
            self._first[bucket.index] = _shape_text(shape)
            log.info(
                "plan '%s' bucket %d (%s) first used at %s", name, bucket.index, bucket.describe(), _shape_text(shape)
            )
            planned = self._bucket_plans[bucket.index] = plan_bucket(self.graph, bucket, self.options)
            self.stats["bucket_plans"] += 1
            log.info(
                "plan '%s' bucket %d planned at its hint in %.1f ms (%d step(s))",
                name,
                bucket.index,
                1e3 * (time.perf_counter() - start),
                len(planned.schedule.steps),
            )
        schedule = schedule_at(planned, self.graph.in_bucket(shape, bucket), self.options)
        self.stats["rechosen"] += schedule.stats.get("rechosen", 0)
        self.stats["shape_builds"] += schedule.stats.get("rebuilt", 0)
        resplit = set(schedule.stats.get("resplit", ()))
        self.stats["resplits"] += len(resplit)
        retiled = set(schedule.stats.get("retiled", ()))
        self.stats["retiles"] += len(retiled)
        self.stats["replans"] += int(bool(schedule.stats.get("replanned")))
        plan = ExecutionPlan.from_schedule(schedule)
        self.stats["shape_plans"] += 1
        self._planned[bucket.index] = self._planned.get(bucket.index, 0) + 1
        compiled = _compiled(plan)
        if self._built:
            self.stats["compiled"] += compiled
        log.info(
            "plan '%s': built the plan for %s (bucket %d) in %.1f ms (%d step(s), %d kernel(s) compiled)",
            name,
            _shape_text(shape),
            bucket.index,
            1e3 * (time.perf_counter() - start),
            len(plan.steps),
            compiled,
        )
        self._note_variants(schedule.stats.get("variant_kernels", ()), shape, bucket.index)
        self._note_kernels(plan, shape, bucket.index, resplit, retiled)
        self._plans[values] = plan
        while len(self._plans) > self.shape_plans:
            dropped, _ = self._plans.popitem(last=False)
            self.stats["evictions"] += 1
            log.info(
                "plan '%s': dropped the plan for %s (keeps %d shapes)",
                printable(self.graph.name),
                _shape_text(dict(zip(self.symbols, dropped))),
                self.shape_plans,
            )
        return plan

    def _note_variants(self, kernels: Sequence[Any], shape: Mapping[str, int], bucket: int) -> None:
        """Count the tile variants' kernels compiled with a bucket's first shape (build/tile_variants.py)
        as the bucket's, so that the shape that first runs one compiles nothing new."""
        for kernel in kernels:
            source = kernel.source()
            if source is not None and self._first_met(bucket, source, kernel.config.knobs):
                log.info(
                    "plan '%s' step %d: new kernel for %s (bucket %d, a tile variant compiled with the bucket)",
                    printable(self.graph.name),
                    kernel.piece.index,
                    _shape_text(shape),
                    bucket,
                )

    def _note_kernels(
        self, plan: ExecutionPlan, shape: Mapping[str, int], bucket: int, resplit: set[int], retiled: set[int]
    ) -> None:
        """Count the plan's kernel sources new to the plan (and to its bucket), logging each one met at
        run time with the shape that caused it. A new source of a step and config the bucket compiled
        before is a kernel per shape (its sizes compiled in); `resplit`: the steps running another split
        than the bucket's (split_kv.at_shape: a kernel of the bucket too, compiled once for it);
        `retiled`: those running a tile variant (build/tile_variants.py: compiled with the bucket)."""
        configs = self._configs.setdefault(bucket, set())
        for i, step in enumerate(plan.steps):
            source = plan.source(i)
            if source is None:
                continue
            key = (i, step.config.engine, step.config.knobs)
            known = key in configs
            configs.add(key)
            if not self._first_met(bucket, source, step.config.knobs):
                continue
            if known:
                self.stats["shape_kernels"] += 1
                why = ", a kernel per shape: its sizes are compiled in"
            elif i in resplit:
                why = f", its split-KV at this shape: SPLIT={step.config.knob('SPLIT') or 0}"
            elif i in retiled:
                why = ", its tile variant at this shape"
            else:
                why = ""
            log.info(
                "plan '%s' step %d (%s): new kernel for %s (bucket %d%s)",
                printable(self.graph.name),
                i,
                step.config.engine + (f" {t}" if (t := step.config.knob("template")) else ""),
                _shape_text(shape),
                bucket,
                why,
            )

    def _first_met(self, bucket: int, source: str, knobs: Any) -> bool:
        """Record a kernel (its source and knobs) met in `bucket`, counting it where it is new to the plan;
        whether it is new after the build (a run-time compile, counted too)."""
        seen = self._sources.setdefault(bucket, set())
        digest = self._digest(source, knobs)
        if digest in seen:
            return False
        seen.add(digest)
        if digest in self._every:
            return False  # another bucket's kernel: compiled already
        self._every.add(digest)
        self.stats["kernels"] += 1
        if not self._built:
            return False
        self.stats["runtime_compiles"] += 1
        return True

    def _digest(self, source: str, knobs: Any) -> str:
        """A binary's identity: its source and its config's knobs (constexprs and launch options). A bucket
        kernel re-pointed at a shape shares its source object with the bucket's: hashed once (memoized by
        the object, which the memo keeps alive)."""
        key = (id(source), knobs)
        hit = self._digests.get(key)
        if hit is None:
            if len(self._digests) >= 1024:  # (kernels generated per shape: new sources at every shape)
                self._digests.clear()
            hit = self._digests[key] = (source, hashlib.sha256(f"{source}\n{knobs!r}".encode()).hexdigest()[:16])
        return hit[1]

    def for_pack(self, variant_pack: Mapping[Any, Any]) -> ExecutionPlan:
        """The static plan of the pack's shape."""
        return self._plan(self._values(variant_pack)[1])

    # -- running -----------------------------------------------------------------------------------
    def execute(self, variant_pack: Mapping[Any, Any], workspace: Any = None, stream: Any = None) -> None:
        """Run the plan at the shape of the pack's buffers (any shape within the dims' ranges); a
        workspace given must hold the `workspace_size_at` of that shape (None: the thread's own, shared
        by every shape)."""
        plan, ws = self._plan_and_workspace(variant_pack, workspace)
        plan.execute(variant_pack, ws, stream)

    def bind(self, variant_pack: Mapping[Any, Any], workspace: Any = None) -> BoundPlan:
        plan, ws = self._plan_and_workspace(variant_pack, workspace)
        return plan.bind(variant_pack, ws)

    def _plan_and_workspace(self, variant_pack: Mapping[Any, Any], workspace: Any) -> tuple[ExecutionPlan, Any]:
        """The static plan of the pack's shape, and the workspace it runs in: the caller's, else the
        thread's shared one."""
        plan = self.for_pack(variant_pack)
        return plan, self._workspace(plan) if workspace is None else workspace

    def _workspace(self, plan: ExecutionPlan) -> Any:
        """This thread's workspace for the plans of every shape: made at the range's maximum size at the
        first use, replaced by a larger one only for a plan that needs more (a bucket whose configs take
        more scratch than the maximum's); the replaced one lives on with the plan, since CUDA graphs
        captured on it read it."""
        need = plan.workspace_size
        if not need:
            return None
        local = self._workspaces
        buffer = getattr(local, "buffer", None)
        if buffer is not None and local.size >= need:
            return buffer
        size = max(need, self.workspace_size)
        if buffer is not None:
            local.retired.append(buffer)
            with self._lock:
                self.stats["workspace_grown"] += 1
            log.info(
                "plan '%s': the workspace grew from %d to %d bytes for %s",
                printable(self.graph.name),
                local.size,
                size,
                _shape_text(dict(zip(self.symbols, self._shape_of_plan(plan)))),
            )
        else:
            local.retired = []
        local.buffer, local.size = wsp.allocate(size, self.device), size
        return local.buffer

    def _shape_of_plan(self, plan: ExecutionPlan) -> tuple[int, ...]:
        with self._lock:
            return next((v for v, p in self._plans.items() if p is plan), ())

    def profile(self, variant_pack: Mapping[Any, Any], repeat: int = 20) -> list[tuple[str, int, float]]:
        return self.for_pack(variant_pack).profile(variant_pack, repeat)

    def profile_steps(self, variant_pack: Mapping[Any, Any], repeat: int = 10) -> list[Any]:
        return self.for_pack(variant_pack).profile_steps(variant_pack, repeat)

    def workspace_size_at(self, shape: Mapping[str, int]) -> int:
        return self.at(shape).workspace_size

    def _unsupported(self, what: str) -> GraphError:
        return UnsupportedGraphError(
            f"{what} of a plan with dynamic dims is not supported yet",
            rule="plan.dynamic",
            hint="use the static plan of one shape: plan.at({'batch': 4, ...}) (or plan.for_pack(pack))",
        )

    def to_bytes(self, embed_kernels: bool = True) -> bytes:
        raise self._unsupported("a plan file")

    def save(self, path: Any, embed_kernels: bool = True) -> None:
        raise self._unsupported("a plan file")

    def populate_cuda_graph(self, variant_pack: Mapping[Any, Any], workspace: Any = None) -> Any:
        plan, ws = self._plan_and_workspace(variant_pack, workspace)
        return plan.populate_cuda_graph(variant_pack, ws)

    def update_cuda_graph(self, graph: Any, variant_pack: Mapping[Any, Any], workspace: Any = None) -> Any:
        plan, ws = self._plan_and_workspace(variant_pack, workspace)
        return plan.update_cuda_graph(graph, variant_pack, ws)

    def set_address(self, tensor: Any, buffer: Any) -> None:
        raise self._unsupported("set_address")

    @property
    def address_table(self) -> Any:
        raise self._unsupported("the address table")

    def table_slot(self, tensor: Any) -> int:
        raise self._unsupported("the address table")

    def baked_addresses(self) -> Any:
        raise self._unsupported("baked_addresses")

    def local_state(self) -> Any:
        raise self._unsupported("the thread state")

    @property
    def workspace_layout(self) -> Mapping[int, tuple[int, int]]:
        return self.max_plan.workspace_layout

    def source(self, step: int) -> str | None:
        """The source of a step of the plan at the range's maximum."""
        return self.max_plan.source(step)

    # -- explaining --------------------------------------------------------------------------------
    def describe(self) -> str:
        """What the plan is for and what it holds now: that it is dynamic, its dims and their ranges,
        the per-shape plans cached (how many, of how many the LRU keeps, and their shapes, least
        recently used first), the counts of `stats`, then the plan at the range's maximum."""
        dims = ", ".join(f"{d.name} {d.min}..{d.max}" for d in self.symbols.values())
        with self._lock:
            shapes = [_shape_text(dict(zip(self.symbols, v))) for v in self._plans]
        built, dropped = self.stats["shape_plans"], self.stats["evictions"]
        lines = [
            f"dynamic plan for graph '{printable(self.graph.name)}': dims {dims}; a plan per shape (keeps {self.shape_plans})",
            f"  dynamic dims: {', '.join(d.describe() for d in self.symbols.values())}",
            *self._bucket_lines(),
            f"  per-shape plans: {len(shapes)} cached of at most {self.shape_plans} (least recently used "
            f"dropped first); built {built}, dropped {dropped}, {self.stats['shape_builds']} of their steps "
            f"built again rather than re-pointed (stats: shape_plans={built}, evictions={dropped}, "
            f"shape_builds={self.stats['shape_builds']})",
            "  shapes kept (least recently used first): " + ("; ".join(shapes) or "-"),
            f"  workspace: one per thread for every shape, {self.workspace_size} bytes (the range's maximum), "
            f"grown {self.stats['workspace_grown']} time(s) for a shape that needed more (stats: workspace_grown)",
            f"  at the range's maximum ({_shape_text(self.max_shape)}, built in "
            f"{1e3 * self.build_stats['max_shape_build_s']:.1f} ms):",
        ]
        lines += ["    " + line for line in self.max_plan.describe().splitlines()]
        return "\n".join(lines)

    def _bucket_lines(self) -> list[str]:
        st = self.stats
        lines = [
            f"  buckets: {len(self.buckets)} (build(buckets={self.options.buckets!r}, max_buckets="
            f"{self.options.max_buckets})); kernels {st['kernels']}, {st['runtime_compiles']} met after the "
            f"build, {st['shape_kernels']} of them per shape, {st['compiled']} compiled at run time "
            f"(stats: kernels, runtime_compiles, shape_kernels, compiled)"
        ]
        for b in self.buckets.buckets:
            first = self._first.get(b.index)
            if first is None:
                used = "not used yet (compiles at its first shape)"
            else:
                used = (
                    f"first used at {first}{' (at build)' if first == _shape_text(self.max_shape) else ''}; "
                    f"{self._planned.get(b.index, 0)} shape(s) planned, {len(self._sources.get(b.index, ()))} "
                    "kernel(s)"
                )
            lines.append(f"    bucket {b.index}: {b.describe()}: {used}")
        lines += [
            f"  planned once per bucket (partition and configs at its hint): {st['bucket_plans']} bucket(s) "
            f"planned; at later shapes {st['rechosen']} step(s) whose config was chosen again, {st['replans']} "
            "shape(s) planned anew (stats: bucket_plans, rechosen, replans)",
            f"  split-KV decided at each shape: {st['resplits']} step(s) of a shape's plan with another split than "
            "its bucket's (stats: resplits)",
            f"  tiles decided at each shape: {st['retiles']} step(s) of a shape's plan running a tile variant "
            "compiled with its bucket (stats: retiles)",
        ]
        return lines

    __str__ = describe

    def __repr__(self) -> str:
        dims = ", ".join(f"{d.name} {d.min}..{d.max}" for d in self.symbols.values())
        return f"<DynamicPlan '{self.graph.name}' ({dims}) on {self.device}: {len(self._plans)} shape plan(s)>"


def _compiled(plan: ExecutionPlan) -> int:
    """Binaries a plan's build compiled (its compile statistics' counts: tuning candidates and steps)."""
    found = (plan.build_stats.get(k) for k in ("precompile", "compile"))
    return sum(int(s.get("compiled", 0) or 0) for s in found if isinstance(s, Mapping))


def _shape_text(shape: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())
