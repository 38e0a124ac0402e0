"""What the `opgraph` command reads and checks: graph files (validated against the JSON Schema,
every problem listed at once), plan files (recognised by their header), modules named by
`--import` (custom ops), and the run-and-compare of `opgraph run` and `opgraph demo`."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import GraphError, SerializationError
from ..core.limits import check_file_size, check_strings
from ..runtime.plan_io import PAYLOADS as PLAN_PAYLOADS


def import_modules(names: tuple[str, ...] | list[str]) -> None:
    """Import each module (a dotted name found from the current folder, or a path to a .py file),
    so that the custom ops it registers are known before a file is read."""
    for name in names:
        path = Path(name)
        try:
            if name.endswith(".py"):
                if not path.is_file():
                    raise GraphError(
                        f"--import {name}: no such file",
                        rule="cli.import",
                        hint="give a module name (my_ops) or the path of a .py file",
                    )
                # the folder goes on sys.path so that generated kernels can import the module's
                # Triton functions by its name
                sys.path.insert(0, str(path.resolve().parent))
                spec = importlib.util.spec_from_file_location(path.stem, path)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                sys.modules[path.stem] = module
                spec.loader.exec_module(module)
            else:
                if "" not in sys.path and str(Path.cwd()) not in sys.path:
                    sys.path.insert(0, str(Path.cwd()))
                importlib.import_module(name)
        except GraphError:
            raise
        except ImportError as err:
            raise GraphError(
                f"--import {name}: {err}",
                rule="cli.import",
                hint="run from the folder that holds the module, or give the path of its .py file",
            ) from None
        except Exception as err:  # noqa: BLE001 - the user's module failed: say where, without our traceback
            raise GraphError(
                f"--import {name}: the module raised {type(err).__name__}: {err}",
                rule="cli.import",
                hint="run `python -c 'import MODULE'` to see the traceback",
            ) from None


@dataclass(frozen=True)
class LoadedFile:
    """A graph file (`graph`) or a plan file (`plan_doc`: its parsed JSON, not compiled yet)."""

    path: str
    graph: Any = None
    plan_doc: dict[str, Any] | None = None

    @property
    def is_plan(self) -> bool:
        return self.plan_doc is not None


def load_file(path: str) -> LoadedFile:
    """Read a graph or plan file. A graph file is checked against the schema first, so that every
    structural problem is reported at once; then loading checks the graph's rules."""
    from ..graph.serialize import graph_from_dict
    from ..runtime.plan_io import MAGIC, MAGIC_1, plan_body

    try:
        check_file_size(Path(path).stat().st_size, "file")
        data = Path(path).read_bytes()
    except OSError as err:
        raise SerializationError(f"{path}: cannot be read ({err.strerror or err})", rule="cli.file") from None
    if data.startswith((MAGIC, MAGIC_1)):
        doc = _plan_doc(plan_body(data))
        _check_schema(doc.get("graph"), "the plan's graph")
        try:
            graph = graph_from_dict(doc.get("graph"))
        except GraphError as err:
            raise SerializationError(
                f"the plan's graph is invalid: {err.detail}", op=err.op, tensor=err.tensor, rule=err.rule, hint=err.hint
            ) from None
        return LoadedFile(path, graph, doc)
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise SerializationError(
            f"{path} is not valid JSON: {str(err)[:200]}",
            rule="json.syntax",
            hint="graph files are written by Graph.to_json; plan files by plan.save",
        ) from None
    check_strings(doc, "graph")  # before the schema, whose messages quote what they find
    _check_schema(doc, "the file")
    return LoadedFile(path, graph_from_dict(doc))


def _plan_doc(body: bytes) -> dict[str, Any]:
    from ..runtime.plan_io import PLAN_FORMAT, READS

    try:
        doc = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise SerializationError(
            f"the plan file is damaged (not valid JSON after its header): {str(err)[:200]}", rule="plan.syntax"
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
        raise SerializationError("not an opgraph plan file", rule="plan.format")
    check_strings(doc, "plan", PLAN_PAYLOADS)
    version = doc.get("version")
    if type(version) is not int or version not in READS:
        raise SerializationError(
            f"plan file version {version!r} is not supported (this opgraph reads {', '.join(map(str, READS))})",
            rule="plan.version",
            hint="build and save the plan again",
        )
    from ..runtime.plan_schema import check_plan_document

    check_plan_document(doc)  # as loading checks it: every structural problem at once
    return doc


def _check_schema(doc: Any, what: str) -> None:
    if not isinstance(doc, dict) or "format" not in doc:
        return  # graph_from_dict says what it should be
    try:
        from ..graph.schema import schema_errors
    except ImportError:  # pragma: no cover - jsonschema is a dependency; loading still checks
        return
    errors = [e if len(e) <= 300 else e[:300] + "..." for e in schema_errors(doc)]  # (they quote what they find)
    if errors:
        raise SerializationError(
            f"{what} breaks the graph file schema in {len(errors)} place(s):\n    " + "\n    ".join(errors),
            rule="json.schema",
            hint="the format: docs/graph-format.md; the schema: opgraph/graph/schema/graph.schema.json",
        )


def plan_summary(doc: dict[str, Any]) -> str:
    """The steps of a plan file as stored (engine, knobs, ops), without compiling anything (the document
    passed the plan schema in `_plan_doc`; its graph, the graph loader)."""
    from ..runtime.plan_io import _config

    graph, env, dev = doc["graph"], doc["environment"], doc["device"]
    graph_nodes = graph["ops"]
    where = "cpu" if dev["kind"] == "cpu" else f"cuda:{dev['index']} ({env.get('device')})"
    lines = [
        f"plan file for graph '{graph.get('name', '')}', built on {where} with "
        + ", ".join(f"{k} {v}" for k, v in env.items() if k in ("opgraph", "torch", "triton") and v)
    ]
    for i, step in enumerate(doc["steps"]):
        idx = step["nodes"]
        if not all(0 <= j < len(graph_nodes) for j in idx):
            raise SerializationError(
                f"plan.steps[{i}].nodes: indices past the graph's {len(graph_nodes)} ops",
                rule="plan.schema",
                hint="the file is damaged: save the plan again",
            )
        ops = ", ".join(f"{graph_nodes[j]['op']} '{graph_nodes[j].get('name', '')}'" for j in idx)
        lines.append(f"  step {i}: {_config(step['config'])}: {ops}")
    return "\n".join(lines)


def _fits_in_memory(graph: Any) -> None:
    """Refuse, before allocating, a graph whose buffers (and the reference's float64 copies of its
    outputs) would not fit in this machine's memory: `opgraph run` makes every one of them."""
    from ..core.tensor import storage_extent
    from ..engines.shared.evaluate import memory_budget

    need = 0
    for uid in (*graph.inputs, *graph.outputs):
        d = graph.tensors[uid]
        need += storage_extent(d.dim, d.stride) * d.data_type.itemsize
    need += sum(math.prod(graph.tensors[u].dim) * 8 * 2 for u in graph.outputs)
    budget = memory_budget()
    if need > budget:
        raise GraphError(
            f"running graph '{graph.name}' on random inputs needs {need / 2**30:,.1f} GiB of host memory "
            f"for its buffers and the reference's results, more than the {budget / 2**30:,.0f} GiB here",
            rule="cli.memory",
            hint="check the graph (`opgraph check`), or run it from Python on your own buffers (plan.execute)",
        )


@dataclass
class RunResult:
    plan: Any
    mismatches: list[Any]
    us: float
    max_err: float  # the largest |got - want| over the outputs
    scale: float  # the largest |want| over the outputs


def run_and_verify(plan: Any, *, seed: int, repeat: int) -> RunResult:
    """Run `plan` on random inputs (weights scaled as an initialised model has them), compare every
    output with the reference engine relative to the output's scale, and time it."""
    from ..core.timing import time_call
    from ..testing import compare, output_scale, reference_outputs, user_scaled_pack

    final = plan.graph
    _fits_in_memory(final)
    rng = np.random.default_rng(seed)
    pack = user_scaled_pack(final, rng)
    want = reference_outputs(final, pack)
    if plan.device.is_cuda:
        from ..core.torch_interop import pack_to_device, torch_to_numpy

        dev_pack = pack_to_device(pack, f"cuda:{plan.device.index}")
        plan.execute(dev_pack)
        got = {u: torch_to_numpy(dev_pack[u]) for u in final.outputs}
        run = lambda: plan.execute(dev_pack)  # noqa: E731
    else:
        plan.execute(pack)
        got = {u: pack[u] for u in final.outputs}
        run = lambda: plan.execute(pack)  # noqa: E731
    mismatches = [m for u in final.outputs if (m := compare(final.tensors[u], got[u], want[u], relative_to_scale=True))]
    with np.errstate(invalid="ignore"):
        errs = [
            np.nanmax(np.abs(np.asarray(got[u], np.float64) - np.asarray(want[u], np.float64)), initial=0.0)
            for u in final.outputs
        ]
    scale = max((output_scale(want[u]) for u in final.outputs), default=0.0)
    micros = time_call(run, cuda=plan.device.is_cuda, warmup=min(3, repeat), repeat=repeat)
    return RunResult(plan, mismatches, micros, float(max(errs, default=0.0)), scale)
