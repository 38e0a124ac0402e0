"""opgraph as a torch.compile backend: `torch.compile(model, backend="opgraph")`.

The backend is registered through PyTorch's entry-point group `torch_dynamo_backends` (pyproject.toml),
so the name works once opgraph is installed; `opgraph.torch_backend` is the same callable, for
`torch.compile(model, backend=opgraph.torch_backend)`.

How a model runs:
1. TorchDynamo captures FX graphs of the model's Python (a graph break, e.g. `print` or `.item()` in
   forward, splits them; PyTorch runs the Python in between).
2. AOTAutograd turns each into aten forward and backward graphs (an inference graph when no input
   needs a gradient), functionalized: batchnorm's running-stat updates and other input mutations are
   returned by the graph and applied by AOTAutograd. A few backward ops are decomposed first
   (`aot_ops.DECOMPOSED`); the rest have translations (`aot_ops`, `aot_attention`: the attention
   kernel PyTorch picked and its backward) or stay in PyTorch.
3. Each graph is translated by the importer `from_torch` uses and cut into partitions: what opgraph
   translates runs as opgraph plans, every other node stays in PyTorch (opgraph.frontends.
   dynamo_partition). Plans are built at compile time, once per graph and guard set (Dynamo caches
   the compiled graph against its guards).
4. Shapes: a graph of static shapes gets static plans, and a new input shape is a recompile
   (Dynamo's guards), reported on the `opgraph.dynamo` logger. A graph Dynamo made dynamic
   (`dynamic=True`, a second shape met under automatic dynamic shapes, `torch._dynamo.mark_dynamic`)
   is compiled once: each partition is one dynamic plan (opgraph.Dim dims: kernels per bucket, not per
   shape) over its shape symbols' ranges. `mark_dynamic(x, axis, min=, max=)` bounds a range; a range
   torch leaves open is taken to the next power of two at least twice the size met, and a partition
   that meets a larger size builds again over a doubled range (logged; `PlanModule.widened`).

Options, as `torch.compile(model, backend="opgraph", options={...})`:
    "cudagraphs": bool     replay each compiled graph as a CUDA graph (PyTorch's CUDA graph trees, as
                           mode="reduce-overhead" does; `mode="reduce-overhead"` turns it on too)
    "engines": [str]       the engines plans may use, in order (Graph.build's `engines`)
    "dynamic_plans": bool  dynamic plans for graphs Dynamo made dynamic (default True); False compiles
                           such a graph once per concrete input shape met, with static plans
    any other key          a build option passed to Graph.build (autotune, heur_mode, deselect_engines,
                           by_reference, ...); `mode="max-autotune"` sets autotune=True.

`reports()` lists what each compiled graph became (partitions, plan steps by engine, every fallback and
its reason); `explain(model, *inputs)` compiles a copy of the model, runs it forward and backward once
and returns the graph breaks and those reports.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import AttributeValueError
from .dynamo_partition import GraphReport, compile_graph, reserve

log = logging.getLogger("opgraph.dynamo")

_REPORTS: list[GraphReport] = []
_OWN_KEYS = ("cudagraphs", "engines", "dynamic_plans")


@dataclass(frozen=True)
class BackendOptions:
    """The backend's settings (see the module docstring): CUDA-graph replay, engines, build options."""

    cudagraphs: bool = False
    engines: tuple[str, ...] | None = None
    build: tuple[tuple[str, Any], ...] = ()
    dynamic_plans: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None = None, mode: str | None = None) -> BackendOptions:
        options = dict(options or {})
        modes = {
            None: {},
            "default": {},
            "reduce-overhead": {"cudagraphs": True},
            "max-autotune": {"cudagraphs": True, "autotune": True},
            "max-autotune-no-cudagraphs": {"autotune": True},
        }
        if mode not in modes:
            raise AttributeValueError(
                f"torch.compile mode={mode!r} is not one opgraph knows",
                rule="dynamo.mode",
                hint=f"use one of {[m for m in modes if m]}",
            )
        settings = {**modes[mode], **options}
        engines = settings.pop("engines", None)
        if isinstance(engines, str):
            engines = [engines]
        cudagraphs = bool(settings.pop("cudagraphs", False))
        dynamic_plans = bool(settings.pop("dynamic_plans", True))
        build = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in settings.items()))
        return cls(cudagraphs, None if engines is None else tuple(engines), build, dynamic_plans)


def reports() -> list[GraphReport]:
    """A report per graph the backend compiled in this process, oldest first."""
    return list(_REPORTS)


def clear_reports() -> None:
    _REPORTS.clear()


def torch_backend(
    gm: Any, example_inputs: Sequence[Any], *, mode: str | None = None, options: Mapping[str, Any] | None = None
) -> Any:
    """The torch.compile backend (Dynamo's backend signature: an FX GraphModule and its example
    inputs; `mode` and `options` as torch.compile passes them). Returns the compiled callable."""
    opts = BackendOptions.parse(options, mode)
    compile_id = _compile_id()
    if any(_symbolic(x) for x in example_inputs):
        if not opts.dynamic_plans:
            log.info(
                "opgraph: graph %s is dynamic; compiled once per input shape met (dynamic_plans=False)", compile_id
            )
            return _PerShape(gm, opts)
        log.info(
            "opgraph: graph %s is dynamic (input shapes %s); its partitions are dynamic plans",
            compile_id,
            [tuple(str(d) for d in x.shape) for x in example_inputs if hasattr(x, "shape")],
        )
    if compile_id is not None and compile_id.frame_compile_id:
        log.info(
            "opgraph: recompiling frame %s (compile %s) for input shapes %s",
            compile_id.frame_id,
            compile_id.frame_compile_id,
            [tuple(x.shape) for x in example_inputs if hasattr(x, "shape")],
        )
    return _aot(opts, len(example_inputs))(gm, example_inputs)


def _compile_id() -> Any:
    from torch._guards import CompileContext

    return CompileContext.current_compile_id()


def _symbolic(x: Any) -> bool:
    import torch

    if isinstance(x, torch.SymInt):
        return True
    return isinstance(x, torch.Tensor) and not all(isinstance(d, int) for d in x.shape)


def _aot(opts: BackendOptions, dynamo_inputs: int) -> Any:
    from torch._dynamo.backends.common import aot_autograd

    from .aot_ops import decompositions

    forward: Any = functools.partial(_compile, "forward", opts)
    backward: Any = functools.partial(_compile, "backward", opts)
    inference: Any = functools.partial(_compile, "inference", opts)
    if opts.cudagraphs:
        from .dynamo_cudagraphs import with_cudagraphs

        forward, backward, inference = with_cudagraphs(forward, backward, inference, dynamo_inputs)
    return aot_autograd(
        fw_compiler=forward,
        bw_compiler=backward,
        inference_compiler=inference,
        decompositions=decompositions(),
        keep_inference_input_mutations=False,
    )


def _compile(kind: str, opts: BackendOptions, gm: Any, example_inputs: Sequence[Any]) -> Any:
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        fused, report = compile_graph(
            gm,
            kind,
            len(_REPORTS),
            engines=opts.engines,
            build_options=dict(opts.build),
            user_outputs=_user_outputs(kind),
            dynamic=any(_symbolic(x) for x in example_inputs),
        )
    _REPORTS.append(report)
    log.info("opgraph: %s", report.summary())

    def run(args: list[Any]) -> Any:  # AOTAutograd's boxed calling convention: the callee empties the list
        values = list(args)  # (so the inputs it held can be freed early; PyTorch's CUDA graph trees check it)
        args.clear()
        return fused(*values)

    run._boxed_call = True  # type: ignore[attr-defined]
    run.reserve = lambda: reserve(fused)  # type: ignore[attr-defined]  # (dynamo_cudagraphs, before recording)
    return run


def _user_outputs(kind: str) -> range | None:
    """The positions of a training forward's results that its caller sees (mutated inputs, outputs,
    RNG offsets; the rest are saved for the backward), from AOTAutograd's metadata; None (all) for the
    other graphs, where the metadata is missing, or where the graph returns effect tokens."""
    from torch._guards import TracingContext

    meta = getattr(TracingContext.try_get(), "fw_metadata", None)
    count = getattr(meta, "num_forward", None)
    # (effect tokens come first among the results, uncounted: then all are the caller's)
    if kind != "forward" or not isinstance(count, int) or getattr(meta, "tokens", None):
        return None
    return range(count)


class _PerShape:
    """A graph Dynamo made dynamic, compiled (AOTAutograd + opgraph) once per concrete input shape."""

    def __init__(self, gm: Any, opts: BackendOptions) -> None:
        self.gm = gm
        self.opts = opts
        self.compiled: dict[tuple, Any] = {}

    def __call__(self, *args: Any) -> Any:
        import torch

        key = tuple(
            (tuple(a.shape), tuple(a.stride()), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args
        )
        fn = self.compiled.get(key)
        if fn is None:
            log.info(
                "opgraph: compiling a dynamic graph for input shapes %s (one plan per shape)",
                [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)],
            )
            fn = self.compiled[key] = _aot(self.opts, len(args))(copy.deepcopy(self.gm), list(args))
        return fn(*args)


# -- explain -------------------------------------------------------------------------------------------


@dataclass
class Explanation:
    """What `explain` found: Dynamo's graph breaks (reason and where) and, per compiled graph, what
    opgraph runs and what it left to PyTorch (`graphs`: GraphReport)."""

    graph_count: int = 0
    graph_breaks: list[str] = field(default_factory=list)
    graphs: list[GraphReport] = field(default_factory=list)

    @property
    def fallbacks(self) -> list[Any]:
        return [f for g in self.graphs for f in g.fallbacks]

    def summary(self) -> str:
        lines = [
            f"{self.graph_count} graph(s), {len(self.graph_breaks)} graph break(s), "
            f"{len(self.fallbacks)} node(s) left to PyTorch"
        ]
        lines += [f"graph break: {b}" for b in self.graph_breaks]
        lines += [g.summary() for g in self.graphs]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def explain(model: Any, *inputs: Any, backward: bool = True, **compile_kwargs: Any) -> Explanation:
    """Compile a deep copy of `model` with the opgraph backend (`compile_kwargs`: torch.compile's
    `mode`, `options`, `dynamic`), run it on `inputs` (and, with `backward`, the backward of the sum of
    its floating outputs) and say what happened: Dynamo's graph breaks, and for each graph the opgraph
    partitions and the nodes left to PyTorch with the reason. The model itself is not run or changed;
    Dynamo's caches are reset, as torch._dynamo.explain resets them (compiled models recompile on their
    next call)."""
    import torch

    twin = copy.deepcopy(model)
    breaks = torch._dynamo.explain(copy.deepcopy(model))(*inputs)
    first = len(_REPORTS)
    torch._dynamo.reset()
    compiled = torch.compile(twin, backend=torch_backend, **compile_kwargs)
    out = compiled(*inputs)
    if backward:
        leaves = [
            t
            for t in torch.utils._pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.requires_grad and t.dtype.is_floating_point
        ]
        if leaves:
            total = leaves[0].sum()
            for t in leaves[1:]:
                total = total + t.sum()
            total.backward()
    torch._dynamo.reset()
    reasons = [str(getattr(b, "reason", b)).strip().splitlines()[0] + _where(b) for b in breaks.break_reasons]
    return Explanation(breaks.graph_count, reasons, list(_REPORTS[first:]))


def _where(reason: Any) -> str:
    stack = getattr(reason, "user_stack", None) or []
    if not stack:
        return ""
    frame = stack[-1]
    return f" (at {frame.filename}:{frame.lineno})"
