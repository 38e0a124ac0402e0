"""cuDNN frontend's conveniences over pygraph: the `cudnn.Graph` context manager, `cudnn.graph(handle)`,
`cudnn.jit` and `cudnn.graph_cache`.

    with cudnn.Graph(io_data_type=cudnn.data_type.HALF) as g:
        y = g.conv_fprop(image=x, weight=w, padding=[1, 1], name="conv")   # buffers become tensors
        y.set_output(True)
    out = g({"conv::image": x, "conv::weight": w})["conv::Y"]             # built on exit; outputs allocated

Tensors are found by their canonical name ("node::argument" for inputs, "node::argument::i" for the
tensors of a tuple argument such as sdpa's dropout; for outputs cuDNN's name, e.g. "bias::OUT_0",
"ln::MEAN", "sdpa::O", as well as "node::index"), their tensor, their name or their UID.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..core.errors import GraphError, VariantPackError
from ..core.tensor import Tensor
from . import enums
from .errors import translated
from .pygraph import pygraph


def _is_buffer(obj: Any) -> bool:
    return isinstance(obj, np.ndarray) or hasattr(obj, "__dlpack__") or hasattr(obj, "__cuda_array_interface__")


def _allocate(t: Tensor, device: Any) -> Any:
    """An empty buffer for an output on the plan's device."""
    dim, stride, data_type = t.known_dim(), t.known_stride(), t.known_data_type()
    try:
        import torch
    except ImportError:
        from ..core.tensor import storage_extent, strided_view

        return strided_view(np.empty(storage_extent(dim, stride), data_type.numpy), dim, stride)
    dev = "cpu" if not device.is_cuda else f"cuda:{device.index}"
    return torch.empty_strided(dim, stride, dtype=data_type.to_torch(), device=dev)


class Graph:
    """cuDNN's wrapper graph: build inside `with`, compiled on exit, called like a function after."""

    def __init__(
        self,
        *,
        handle: Any = None,
        inputs: list | None = None,
        outputs: list | None = None,
        heuristics: list | None = None,
        workspace_alloc: bool = True,
        **kwargs: Any,
    ) -> None:
        self._kwargs = kwargs
        self._handle = handle
        self._graph: pygraph | None = None
        self._by_buffer: dict[int, Tensor] = {}
        self._inputs: OrderedDict[str, Tensor] = OrderedDict()
        self._outputs: OrderedDict[str, Tensor] = OrderedDict()
        self._counts: dict[str, int] = {}
        self._io = (list(inputs or []), list(outputs or []))
        self._tuples: tuple[list[Tensor], list[Tensor]] | None = None
        self._heuristics = list(heuristics or [enums.heur_mode.A, enums.heur_mode.FALLBACK])
        self._workspace_alloc = workspace_alloc

    def __enter__(self) -> Graph:
        if self._graph is not None:
            raise GraphError(
                "the graph was already created", rule="cudnn.wrapper_state", hint="make a new cudnn.Graph()"
            )
        self._graph = pygraph(handle=self._handle, **self._kwargs)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self._graph = None
            return
        self._build()

    @translated
    def _build(self) -> None:
        g = self._require()
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans(self._heuristics)
        g.check_support()
        g.build_plans()
        if any(self._io):
            self.set_io_tuples(*self._io)

    def _require(self) -> pygraph:
        if self._graph is None:
            raise GraphError(
                "the graph is not created",
                rule="cudnn.wrapper_state",
                hint="build it inside `with cudnn.Graph(...) as g:`",
            )
        return self._graph

    def _tensor(self, value: Any) -> Any:
        if _is_buffer(value):
            if id(value) not in self._by_buffer:
                self._by_buffer[id(value)] = self._require().tensor_like(value)
            return self._by_buffer[id(value)]
        return value

    def _tensors_in(self, value: Any) -> Any:
        if isinstance(value, tuple):
            return tuple(self._tensor(v) for v in value)
        return self._tensor(value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        g = self._require()
        attr = getattr(g, name)
        if name in ("tensor", "tensor_like", "get_workspace_size", "serialize", "query_tensor_attributes_of_uid"):
            return attr
        if not callable(attr) or name not in dir(g) or name in _FLOW:
            raise AttributeError(f"cudnn.Graph does not forward '{name}'; the graph is built on leaving `with`")

        def node(*args: Any, **kwargs: Any) -> Any:
            count = self._counts.get(name, 0)
            self._counts[name] = count + 1
            node_name = kwargs.setdefault("name", f"{name}.{count}")
            args = tuple(self._tensors_in(a) for a in args)
            kwargs = {k: self._tensors_in(v) for k, v in kwargs.items()}
            for key, value in itertools.chain(enumerate(args), kwargs.items()):
                if isinstance(value, Tensor):
                    self._inputs[f"{node_name}::{key}"] = value
                elif isinstance(value, tuple):  # (sdpa's dropout tuple: node::dropout::1, ...)
                    for j, item in enumerate(value):
                        if isinstance(item, Tensor):
                            self._inputs[f"{node_name}::{key}::{j}"] = item
            result = attr(*args, **kwargs)
            outs = result if isinstance(result, (list, tuple)) else [result]
            for i, t in enumerate(outs):
                if isinstance(t, Tensor):
                    self._outputs[f"{node_name}::{i}"] = t
                    cudnn_name = _cudnn_output_name(g, t)
                    if cudnn_name is not None:
                        self._outputs[cudnn_name] = t
            return result

        return node

    # -- running -----------------------------------------------------------------------------------
    def _find(self, key: Any, table: dict[str, Tensor]) -> Tensor:
        if isinstance(key, Tensor):
            return key
        if isinstance(key, str):
            if key in table:
                return table[key]
            hit = next((t for t in table.values() if t.name == key), None)
        elif isinstance(key, int):
            hit = next((t for t in table.values() if t.uid == key), None)
        else:
            hit = self._by_buffer.get(id(key))
        if hit is None:
            raise VariantPackError(
                f"{key!r} is not a tensor of this graph",
                rule="cudnn.wrapper_key",
                hint=f"use one of: {', '.join(table)}",
            )
        return hit

    @translated
    def set_io_tuples(self, inputs: list, outputs: list) -> None:
        """The order of positional arguments and results of `graph(*inputs)`."""
        self._tuples = ([self._find(k, self._inputs) for k in inputs], [self._find(k, self._outputs) for k in outputs])

    @translated
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        g = self._require()
        plan = g._selected()
        workspace = kwargs.pop("workspace", None)  # (opgraph plans own their workspace unless given one)
        if len(args) == 1 and isinstance(args[0], dict):
            given = args[0]
            pack: dict[Any, Any] = {}
            for table, is_out in ((self._inputs, False), (self._outputs, True)):
                for key, t in table.items():
                    if t.is_virtual or t in pack:
                        continue
                    value = next((given[k] for k in (key, t, t.name, t.uid) if _has(given, k)), None)
                    if value is None:
                        if not is_out:
                            raise VariantPackError(
                                f"input {key} ({t.label()}) is not given",
                                tensor=t,
                                rule="pack.missing",
                                hint="add it to the dict",
                            )
                        # under every name of the output: cuDNN's ("conv2d::Y") and the positional one ("conv2d::0")
                        value = _allocate(t, plan.device)
                        given.update({k: value for k, v in self._outputs.items() if v is t})
                    pack[t] = value
            g.execute(pack, workspace, **kwargs)
            return given
        if self._tuples is None:
            raise GraphError(
                "positional calls need set_io_tuples(inputs, outputs) first",
                rule="cudnn.wrapper_io",
                hint="call graph.set_io_tuples([...], [...]) or pass a dict",
            )
        ins, outs = self._tuples
        if len(args) != len(ins):
            raise VariantPackError(
                f"{len(args)} arguments for {len(ins)} inputs",
                rule="pack.missing",
                hint="pass one buffer per input of set_io_tuples",
            )
        results = [_allocate(t, plan.device) for t in outs]
        g.execute({**dict(zip(ins, args)), **dict(zip(outs, results))}, workspace, **kwargs)
        return results[0] if len(results) == 1 else results


# cuDNN's names of op outputs where they are not opgraph's role names in upper case ("node::Y")
_CUDNN_OUTPUTS: dict[str, dict[str, str]] = {
    "pointwise": {"output": "OUT_0"},
    "rmsnorm_backward": {"dscale": "Dscale", "dbias": "Dbias"},
    "resample": {"index": "Index"},
    "sdpa": {"o": "O", "stats": "Stats"},
    "sdpa_backward": {"dQ": "dQ", "dK": "dK", "dV": "dV"},
    "genstats": {"sum": "_sum_output", "sq_sum": "_sq_sum_output"},
}


def _cudnn_output_name(g: pygraph, t: Tensor) -> str | None:
    """The name cuDNN frontend gives output `t` of the op that made it ("bias::OUT_0", "ln::MEAN")."""
    for rec in reversed(g._records):
        for role, out in zip(rec.op.output_roles(), rec.outputs):
            if out is t:
                name = _CUDNN_OUTPUTS.get(rec.op.kind, {}).get(role)
                if name is None:
                    name = "Y" if role == "output" else role.upper()
                return f"{rec.name}{name}" if name.startswith("_") else f"{rec.name}::{name}"
    return None


def _has(d: dict, key: Any) -> bool:
    try:
        return key in d
    except TypeError:
        return False


_FLOW = frozenset(
    {
        "build",
        "build_operation_graph",
        "build_plan_at_index",
        "build_plans",
        "check_support",
        "create_execution_plan",
        "create_execution_plans",
        "validate",
        "execute",
        "execute_plan_at_index",
    }
)


@contextlib.contextmanager
def graph(
    handle: Any = None,
    name: str = "cudnn_graph",
    io_data_type: Any = enums.data_type.HALF,
    intermediate_data_type: Any = enums.data_type.FLOAT,
    compute_data_type: Any = enums.data_type.FLOAT,
    **graph_kwargs: Any,
) -> Iterator[tuple[pygraph, list]]:
    """Yields (pygraph, []) as cuDNN's `cudnn.graph(handle)` does."""
    yield (
        pygraph(
            name=name,
            io_data_type=io_data_type,
            intermediate_data_type=intermediate_data_type,
            compute_data_type=compute_data_type,
            handle=handle,
            **graph_kwargs,
        ),
        [],
    )


def jit(heur_modes: Any = enums.heur_mode.A, **_: Any) -> Callable:
    """Decorate a function returning (graph, tensors): it returns (built graph, their UIDs)."""
    modes = heur_modes if isinstance(heur_modes, (list, tuple)) else [heur_modes]

    def decorator(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> tuple[pygraph, list[int]]:
            g, tensors = fn(*args, **kwargs)
            if g.get_execution_plan_count() <= 0:
                g.build(list(modes))
            return g, [t.get_uid() for t in tensors]

        return wrapper

    return decorator


def graph_cache(key_fn: Callable, maxsize: int = 256) -> Callable:
    """Memoize a graph-building function on key_fn(*args, **kwargs) (oldest evicted past maxsize)."""

    def decorator(fn: Callable) -> Callable:
        cache: OrderedDict[Any, Any] = OrderedDict()

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = key_fn(*args, **kwargs)
            if key in cache:
                return cache[key]
            result = fn(*args, **kwargs)
            if len(cache) >= maxsize:
                cache.popitem(last=False)
            cache[key] = result
            return result

        return wrapper

    return decorator


__all__ = ["Graph", "graph", "graph_cache", "jit"]
