"""The state of one import (`Importer`: the graph under construction, values of FX nodes, the
report) and the vocabulary translators share: `Value` (a node's translated value), `Args` (a node's
arguments by schema name), `Untranslatable`, `og_dims`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.errors import UnsupportedGraphError, expect
from ..core.tensor import Tensor
from ..graph.builder import Graph
from .torch_runtime import DerivedSpec, ImportReport, Mutation, RandomSpec, Source
from .torch_symbolic import to_shape, to_symint


def dynamic_refusal(node: Any, what: str, sizes: Any = None) -> UnsupportedGraphError:
    """The typed error of a node the importer cannot express at dynamic sizes."""
    shown = "" if sizes is None else f" (sizes {_sizes_text(sizes)})"
    return UnsupportedGraphError(
        f"node '{node.name}' ({node.target}) {what}{shown}, which the importer cannot express over the "
        f"dynamic dims{node_location(node)}",
        op=node.name,
        rule="import.dynamic_op",
        hint="export the dim it depends on as static (leave it out of dynamic_shapes, or import a "
        "plan per size), or compute that value outside the module and pass it as an input",
    )


def _sizes_text(sizes: Any) -> str:
    if isinstance(sizes, (list, tuple)):
        return "[" + ", ".join(_sizes_text(s) for s in sizes) + "]"
    return str(sizes)


class Untranslatable(Exception):
    """Raised by a translator for arguments it does not cover; the node becomes a custom op."""


@dataclass
class Value:
    """A traced tensor: its torch shape and dtype, and either the graph tensor holding it (`tensor`),
    a bound input not declared yet (`source` + `example`, the example tensor with the source's
    views applied), or an uninitialised allocation (`uninit`, from aten.empty)."""

    shape: tuple[int, ...]
    dtype: Any
    tensor: Tensor | None = None
    source: Source | None = None
    example: Any = None
    uninit: bool = False

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def dims(self) -> tuple[int, ...]:
        return og_dims(self.shape)

    @property
    def is_bound(self) -> bool:
        """A parameter, buffer, constant or random input whose views can be taken at bind time."""
        return self.source is not None


def og_dims(shape: Any) -> tuple[int, ...]:
    """opgraph dims of a torch shape: a 0-d tensor is held as [1]. A symbolic size (an import with
    dynamic shapes) is an opgraph `Expr` of the import's dims (torch_symbolic)."""
    return tuple(to_symint(d) for d in shape) or (1,)  # type: ignore[misc]


def symbolic(values: Any) -> bool:
    """Whether a size or any size of a sequence is symbolic (an `Expr`)."""
    from ..core.symbolic import Expr

    if isinstance(values, (list, tuple)):
        return any(symbolic(v) for v in values)
    return isinstance(values, Expr)


def node_meta(node: Any) -> Any:
    return node.meta.get("val") if hasattr(node, "meta") else None


def node_sizes(node: Any) -> Any:
    """The sizes of a node's traced tensor (opgraph SymInts), None where it is no tensor."""
    meta = node_meta(node)
    if hasattr(meta, "shape"):
        return to_shape(meta.shape)
    if isinstance(meta, (list, tuple)):
        return [to_shape(m.shape) if hasattr(m, "shape") else None for m in meta]
    return None


def node_location(node: Any) -> str:
    """Where a traced node comes from, for errors: " (in module 'model.layers.0.self_attn'
    (LlamaAttention), at modeling_llama.py:249: `q, k = apply_rotary_pos_emb(q, k, cos, sin)`)", from
    torch.export's node meta (the innermost module, the innermost source frame outside torch); "" when
    the node has neither."""
    meta = getattr(node, "meta", None) or {}
    parts = []
    stack = meta.get("nn_module_stack") or {}
    if stack:
        path, kind = list(stack.values())[-1]
        path = str(path).removeprefix("L['self'].").removeprefix("L__self__.") or "the top module"
        parts.append(f"in module '{path}' ({str(getattr(kind, '__name__', kind)).rpartition('.')[2]})")
    frame = _source_frame(meta.get("stack_trace") or "")
    if frame:
        parts.append(f"at {frame}")
    return f" ({', '.join(parts)})" if parts else ""


def _source_frame(trace: str) -> str:
    """'file.py:123: `code`' of the innermost frame of a stack trace that is not PyTorch's own."""
    import re

    frames = re.findall(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)', trace)
    if not frames:
        return ""
    import os

    import torch

    own = os.path.dirname(torch.__file__)
    chosen = next((f for f in reversed(frames) if not f[0].startswith(own)), frames[-1])
    return f"{os.path.basename(chosen[0])}:{chosen[1]}: `{chosen[2].strip()}`"


def is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


class Importer:
    """Translation state: the graph, the value of every traced node, and the bound inputs."""

    def __init__(self, module: Any, program: Any, name: str, wide: Any, options: dict[str, Any]) -> None:
        import torch

        self.torch = torch
        self.options = options
        self.module = module
        self.program = program
        # composite internals (a softmax's exp, a hardswish's relu6) are computed at least in fp32, in
        # fp64 for fp64 models; each traced node's own result gets PyTorch's dtype
        self.g = Graph(name, io_data_type=wide, intermediate_data_type=wide, compute_data_type=wide)
        self.env: dict[Any, Any] = {}
        self.report = ImportReport()
        self.constants: dict[str, Any] = {}
        self.randoms: dict[str, RandomSpec] = {}
        self.derived: dict[str, DerivedSpec] = {}
        self.bound: list[tuple[Tensor, Source]] = []
        self.mutations: list[Mutation] = []
        self._declared: dict[Source, Tensor] = {}
        self._names: dict[str, int] = {}
        self.prepared: dict[Any, Any] = {}  # node -> what its PREPARE hook computed
        self.used: dict[Any, set[int]] = {}  # multi-output node -> the getitem indices read
        self.node: Any = None  # the node being translated
        # exact widening casts (a bf16 activation to fp32), id(cast output) -> (the narrow value, the cast's
        # node): each node reading one after its first reader gets a cast of its own (`tensor`), so that no
        # piece stores the wide copy for another to read (RMSNorm's fp32 residual stream after a Llama
        # projection: 32 MB written and read a norm where the bf16 one is 16 MB). Off where the import's
        # gradients are opgraph's (a train-mode module): each cast's gradient would be rounded apart.
        # (the cast output is kept in the entry and compared: an id alone could name a tensor made after a
        # rolled-back translation freed the cast, and read another value's narrow source)
        self.widened: dict[int, tuple[Value, Any, Tensor]] = {}
        self._readers: dict[int, tuple[Any, int]] = {}  # id(cast output) -> (its first reader, record count)
        self._recasts: dict[tuple[int, int], tuple[Tensor, int]] = {}  # (id(cast output), id(reader)) -> cast
        self.allow_tf32 = True  # whether plans may compute fp32 products with TF32 (from_torch sets it)

    # -- values -------------------------------------------------------------------------------------
    def tensor(self, v: Value) -> Tensor:
        """The graph tensor of a value, declaring a bound input on first use (looked up, not cached on
        the value, so that a rolled-back translation leaves no stale handle behind)."""
        if v.tensor is not None:
            entry = self.widened.get(id(v.tensor))
            return self._recast(v) if entry is not None and entry[2] is v.tensor else v.tensor
        if v.uninit:
            zeros = self.torch.zeros(v.shape, dtype=v.dtype)
            self.note(f"{self.node.name}: reads an uninitialised tensor (aten.empty); bound as zeros")
            v.source, v.example = self.constant(zeros, "uninit"), zeros
            v.uninit = False
        if v.source is None:
            raise UnsupportedGraphError(
                f"node '{self.node.name}' reads a value the importer has not translated",
                rule="import.internal",
                hint="report this as an importer bug",
            )
        source = v.source
        if source not in self._declared:
            ex = v.example
            stride = tuple(int(s) for s in ex.stride()) or (1,)
            t = self.g.tensor(dim=v.dims, stride=stride, data_type=v.dtype, name=self._unique(self._name(source)))
            self._declared[source] = t
            self.bound.append((t, source))
        return self._declared[source]

    def _recast(self, v: Value) -> Tensor:
        """The widening cast `v` for the node being translated: the cast itself for its first reader (and
        the cast's own node), a new cast of the narrow value for each later reader."""
        assert v.tensor is not None
        key = id(v.tensor)
        narrow, made_by, _ = self.widened[key]
        first = self._readers.setdefault(key, (self.node, len(self.g._records)))[0]
        if self.node is made_by or self.node is first:
            return v.tensor
        found = self._recasts.get((key, id(self.node)))
        if found is None:
            cast = self.g.identity(self.tensor(narrow), name=self.op_name("recast")).set_data_type(v.dtype)
            found = self._recasts[(key, id(self.node))] = (cast, len(self.g._records))
        return found[0]

    def checkpoint(self) -> tuple[int, int, int, int]:
        return len(self.g._records), len(self.g._tensors), len(self.bound), len(self.mutations)

    def rollback(self, mark: tuple[int, int, int, int]) -> None:
        """Forget the ops, tensors and bound inputs made since `mark` (a translator gave up)."""
        records, tensors, bound, mutations = mark
        for t in self.g._tensors[tensors:]:  # (their ids may be reused by tensors made later)
            self.widened.pop(id(t), None)
        del self.g._records[records:]
        del self.g._tensors[tensors:]
        for _t, source in self.bound[bound:]:
            self._declared.pop(source, None)
        del self.bound[bound:]
        del self.mutations[mutations:]
        self._readers = {k: v for k, v in self._readers.items() if v[1] < records}
        self._recasts = {k: v for k, v in self._recasts.items() if v[1] < records}
        self.g._invalidate()

    def _name(self, source: Source) -> str:
        if source.kind in ("parameter", "buffer"):
            return source.key
        if source.kind == "derived":
            return source.key.removeprefix("derived:")
        return f"{source.kind}:{source.key}"

    def _unique(self, name: str) -> str:
        n = self._names.get(name, 0)
        self._names[name] = n + 1
        return name if n == 0 else f"{name}#{n}"

    def constant(self, value: Any, hint: str) -> Source:
        """A constant graph input holding `value` (a CPU torch tensor)."""
        key = self._unique(f"{hint}")
        self.constants[key] = value.detach().cpu()
        return Source("constant", key)

    def constant_value(self, value: Any, hint: str) -> Value:
        source = self.constant(value, hint)
        return Value(tuple(value.shape), value.dtype, source=source, example=self.constants[source.key])

    def random_value(self, dist: str, shape: tuple[int, ...], dtype: Any, p: float = 0.5) -> Value:
        key = self._unique(f"{self.node.name}")
        self.randoms[key] = RandomSpec(dist, tuple(shape), dtype, float(p))
        example = self.torch.empty(shape, dtype=dtype)
        return Value(tuple(shape), dtype, source=Source("random", key), example=example)

    def derived_value(self, fn: Any, inputs: list[Value], name: str) -> Value:
        """A bound input computed at bind time as fn(*inputs) from bound values (see DerivedSpec)."""
        key = self._unique(f"derived:{name}")
        self.derived[key] = DerivedSpec(fn, tuple(expect(v.source, "a derived value's bound input") for v in inputs))
        with self.torch.no_grad():
            example = fn(*[v.example for v in inputs])
        return Value(tuple(example.shape), example.dtype, source=Source("derived", key), example=example)

    def view(self, v: Value, op: Any, *args: Any) -> Value | None:
        """For a bound value, the same input seen through aten view op `op(*args)` (applied at bind
        time, zero-copy); None for other values (the caller emits a graph op)."""
        if v.source is None or symbolic(args):  # (not bound; a bound view's sizes are static)
            return None
        try:
            example = op(v.example, *args)
        except RuntimeError:
            if op is not self.torch.ops.aten.view.default:
                return None
            example = v.example.reshape(*args)  # not a view of these strides: Source.apply reshapes too
        return Value(tuple(example.shape), example.dtype, source=v.source.view(op, *args), example=example)

    def reshaped(self, v: Value, shape: tuple[int, ...]) -> Tensor:
        """The value's tensor with torch shape `shape` (same elements): a bind-time view for bound
        values, a reshape op otherwise, nothing when the opgraph dims already match."""
        shape = to_shape(shape)
        if og_dims(shape) == v.dims:
            return self.tensor(v)
        viewed = self.view(v, self.torch.ops.aten.view.default, list(shape))
        if viewed is not None:
            return self.tensor(viewed)
        return self.reshape(self.tensor(v), og_dims(shape), name=self.op_name("reshape"))

    def reshape(self, t: Tensor, dims: Any, name: str) -> Tensor:
        """A reshape op to `dims` (dynamic dims given as the output's dims: the op proves the element
        counts equal)."""
        dims = list(dims)
        if symbolic(dims):
            return self.g.reshape(t, name=name).set_dim(dims)
        return self.g.reshape(t, dims, name=name)

    def at_rank(self, v: Any, rank: int) -> Any:
        """A pointwise operand for an output of `rank`: numbers stay numbers, 1-element tensors
        broadcast as they are, others get leading 1s (torch aligns shapes on the right)."""
        if not isinstance(v, Value):
            return v
        if v.rank >= rank or v.dims == (1,):
            return self.tensor(v)
        return self.reshaped(v, (1,) * (rank - v.rank) + v.shape)

    def reduction(self, t: Tensor, mode: Any, dims: Any, name: str) -> Tensor:
        """A reduction to opgraph dims `dims`, in the graph's intermediate type (not FLOAT, the
        reduction's own default, which would round fp64 models)."""
        out = self.g.reduction(t, mode, name=name)
        return out.set_dim(list(dims)).set_data_type(self.g.intermediate_data_type)

    def op_name(self, what: str = "") -> str:
        base = self.node.name if self.node is not None else "op"
        return self._unique(f"{base}.{what}" if what else base)

    def note(self, text: str) -> None:
        if text not in self.report.notes:
            self.report.notes.append(text)

    def result(self, tensor: Tensor, meta: Any) -> Value:
        """Wrap a new graph tensor as the value of a traced tensor (its dtype set to PyTorch's)."""
        tensor.set_data_type(meta.dtype)
        return Value(to_shape(meta.shape), meta.dtype, tensor=tensor)


class Args(dict):
    """A node's arguments by schema name (defaults filled in), FX nodes replaced by their values."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None
