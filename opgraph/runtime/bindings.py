"""Variant packs: the buffers a plan runs on, keyed by Tensor handle, TensorDesc, UID or name.

Everything is checked before anything runs (unknown, missing or doubly bound tensors; dims,
strides, type and device of every buffer; outputs overlapping other buffers or read-only), so a
bad pack raises a VariantPackError naming the tensor and no buffer is written. The one overlap
allowed is an output bound to the very buffer of an input that the plan's in-place rule accepts
(opgraph.aliasing).
"""

from __future__ import annotations

import math
import numbers
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..core.device import Device
from ..core.errors import GraphError, VariantPackError
from ..core.ir import FinalGraph, Node
from ..core.rounding import round_to
from ..core.tensor import Tensor, TensorDesc, channels_last_order, layout_name, packed_strides, storage_extent
from ..memory.buffers import BufferInfo, address_of, buffer_info, tensor_from_pointer
from .aliasing import InplaceRule


def resolve_key(graph: FinalGraph, key: Any) -> int:
    if isinstance(key, Tensor):
        uid = graph.handle_uid(key)
        if uid is None:
            raise VariantPackError(
                "the tensor handle is not part of the graph this plan was built from",
                tensor=key,
                rule="pack.unknown",
                hint="bind the tensors of the graph the plan was built from (or use UIDs)",
            )
        return uid
    if isinstance(key, TensorDesc):
        key = key.uid
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        if int(key) not in graph.tensors:
            raise VariantPackError(
                f"UID {int(key)} is not a tensor of this graph",
                rule="pack.unknown",
                hint=f"known UIDs: {sorted(graph.tensors)}",
            )
        return int(key)
    if isinstance(key, str):
        matches = [t.uid for t in graph.tensors.values() if t.name == key]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            names = sorted(t.name for t in graph.tensors.values() if not t.is_virtual and t.name)
            raise VariantPackError(f"no tensor is named {key!r}", rule="pack.unknown", hint=f"known names: {names}")
        raise VariantPackError(
            f"{len(matches)} tensors are named {key!r} (UIDs {matches})",
            rule="pack.ambiguous_name",
            hint="bind them by UID or by tensor handle",
        )
    raise VariantPackError(
        f"a variant pack key must be a Tensor, a UID or a name, got {type(key).__name__}",
        rule="pack.key",
        hint="use the tensor handles the builders returned, their .uid, or their names",
    )


def _host_number(value: Any, desc: TensorDesc) -> Any:
    """The number a pass-by-value tensor is given: a Python number, a NumPy scalar or a 1-element host
    buffer (its element as a Python number)."""
    if isinstance(value, (numbers.Real, np.bool_)):
        return value.item() if isinstance(value, np.generic) else value
    try:
        info = buffer_info(value)
    except GraphError:
        info = None
    if info is None or info.device != "cpu" or int(np.prod(info.shape)) != 1:
        raise VariantPackError(
            f"a pass-by-value tensor takes a host number, got {type(value).__name__}",
            tensor=desc,
            rule="pack.pass_by_value",
            hint="bind a Python number, a 0-d array or a 1-element CPU tensor",
        )
    return np.asarray(info.obj).reshape(()).item()


def _exact_integer(value: Any, desc: TensorDesc, reader: str) -> int:
    """The host value of a pass-by-value tensor that `reader` reads as an exact integer (a Philox seed):
    an int within the tensor's type; a float (which holds integers exactly only below 2**53), a bool or
    a value the type cannot hold is refused rather than rounded or clamped."""
    v = _host_number(value, desc)
    dt = desc.data_type
    if isinstance(v, bool) or not isinstance(v, int):
        raise VariantPackError(
            f"{reader} takes an integer, got {type(v).__name__} {v!r}",
            tensor=desc,
            rule="pack.pass_by_value",
            hint=f"bind a Python int (or an integer NumPy scalar or 1-element CPU tensor) as this {dt.name} "
            "pass-by-value tensor",
        )
    if dt.is_integer:
        lo, hi = (int(x) for x in (np.iinfo(dt.numpy).min, np.iinfo(dt.numpy).max))
        if not lo <= v <= hi:
            raise VariantPackError(
                f"{v} does not fit this {dt.name} pass-by-value tensor ({reader}; range {lo}..{hi})",
                tensor=desc,
                rule="pack.pass_by_value",
                hint=f"bind a value within {dt.name}'s range"
                + ("" if dt.itemsize >= 8 else " (or declare the tensor INT64)"),
            )
    return v


def _scalar(value: Any, desc: TensorDesc) -> float | int | bool:
    """The host value of a pass-by-value tensor, as a value of its declared type."""
    v = _host_number(value, desc)
    # the tensor holds a value of its type, as a 1-element buffer of that type would
    dt = desc.data_type
    if dt.is_integer and isinstance(v, int):
        info_ = np.iinfo(dt.numpy)
        return min(max(int(v), int(info_.min)), int(info_.max))
    try:
        f = float(v)
    except OverflowError:
        f = -math.inf if v < 0 else math.inf  # (numbers.Real declares only < and <=)
    return round_to(np.asarray(f), dt).item()


_CHECKS: dict[int, dict[int, tuple[tuple[Node, str], ...]]] = {}


def scalar_uses(graph: FinalGraph) -> dict[int, tuple[tuple[Node, str], ...]]:
    """Per pass-by-value tensor, the (node, scalar role) pairs that read it (memoized per graph)."""
    key = id(graph)
    got = _CHECKS.get(key)
    if got is None:
        uses: dict[int, list[tuple[Node, str]]] = {}
        for n in graph.nodes:
            scalar_roles = n.op.scalar_inputs()
            for role, v in zip(n.op.input_roles(), n.inputs):
                if isinstance(v, int) and role in scalar_roles and graph.tensors[v].is_pass_by_value:
                    uses.setdefault(v, []).append((n, role))
        got = {u: tuple(v) for u, v in uses.items()}
        _CHECKS[key] = got
        weakref.finalize(graph, _CHECKS.pop, key, None)
    return got


def held_scalar(value: Any, desc: TensorDesc, uses: tuple[tuple[Node, str], ...] = ()) -> float | int | bool:
    """The value a pass-by-value tensor holds for `value` (rounded to its type, as a 1-element buffer of
    that type would hold it), checked by the ops that read it as they check a literal. Both binders,
    on every execute."""
    exact = [f"'{role}' of {node.label()}" for node, role in uses if role in node.op.integer_inputs()]
    v = _exact_integer(value, desc, exact[0]) if exact else _scalar(value, desc)
    for node, role in uses:
        problem = node.op.check_scalar(role, v if role in node.op.integer_inputs() else float(v))
        if problem is not None:
            message, rule, hint = problem
            raise VariantPackError(
                f"{message} (given at run time as '{role}' of {node.label()})",
                op=node.label(),
                tensor=desc,
                rule=rule,
                hint=hint,
            )
    return v


def check_buffer(info: BufferInfo, desc: TensorDesc, device: Device) -> None:
    """A VariantPackError unless the buffer fits the tensor: device, type, dims, strides."""
    want_device = device.torch_name
    if info.device != want_device:
        raise VariantPackError(
            f"the buffer is on {info.device} but the plan runs on {want_device}",
            tensor=desc,
            rule="pack.device",
            hint=f"move the buffer to {want_device}, or build the plan for {info.device}",
        )
    if info.data_type is not desc.data_type:
        raise VariantPackError(
            f"the buffer holds {info.data_type.name} but the tensor is {desc.data_type.name}",
            tensor=desc,
            rule="pack.dtype",
            hint=f"bind a {desc.data_type.name} buffer (or change the tensor's data_type)",
        )
    if desc.numel == 1 and int(np.prod(info.shape)) == 1:
        return  # a scalar binds whatever its rank
    if tuple(info.shape) != desc.dim:
        raise VariantPackError(
            f"the buffer has shape {list(info.shape)} but the tensor has dims {list(desc.dim)}",
            tensor=desc,
            rule="pack.shape",
            hint=_shape_hint(list(info.shape), desc),
        )
    for axis, (d, want, got) in enumerate(zip(desc.dim, desc.stride, info.strides)):
        if d > 1 and want != got:
            declared, given = desc.layout, layout_name(desc.dim, info.strides, desc.is_image)
            raise VariantPackError(
                f"the buffer's layout is {given} (strides {list(info.strides)}) but the tensor is declared "
                f"{declared} (strides {list(desc.stride)}; axis {axis} differs)",
                tensor=desc,
                rule="pack.strides",
                hint=f"declare the tensor with the buffer's strides (stride={list(info.strides)}), or pass a copy "
                f"in the declared layout: {_copy_in(desc)}",
            )


def _shape_hint(shape: list[int], desc: TensorDesc) -> str:
    if math.prod(shape) == desc.numel:
        return f"bind a buffer of shape {list(desc.dim)} (reshape or view it)"
    return (
        f"a plan runs the dims it was built for: build a plan for dims {shape} (declare the tensor with "
        f"them), or bind a buffer of shape {list(desc.dim)}"
    )


def _copy_in(desc: TensorDesc) -> str:
    """The call that copies a buffer into the tensor's declared layout."""
    rank = len(desc.dim)
    if desc.stride == packed_strides(desc.dim):
        return "buffer.contiguous()"
    if rank in (4, 5) and desc.stride == packed_strides(desc.dim, channels_last_order(rank)):
        return f"buffer.contiguous(memory_format=torch.{'channels_last' if rank == 4 else 'channels_last_3d'})"
    return f"torch.empty_strided({list(desc.dim)}, {list(desc.stride)}).copy_(buffer)"


_check_buffer = check_buffer  # the former name


def _span(info: BufferInfo) -> tuple[int, int]:
    itemsize = info.data_type.itemsize
    lo = info.ptr + sum(min(0, s) * (d - 1) for d, s in zip(info.shape, info.strides)) * itemsize
    return lo, lo + storage_extent(info.shape, [abs(s) for s in info.strides]) * itemsize


def _overlap(a: BufferInfo, b: BufferInfo) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    if a1 <= b0 or b1 <= a0:
        return False
    if isinstance(a.obj, np.ndarray) and isinstance(b.obj, np.ndarray):
        return arrays_overlap(a.obj, b.obj)
    return _views_overlap(a, b)


def _views_overlap(a: BufferInfo, b: BufferInfo) -> bool:
    """Whether two device views of one layout (same shape, strides and type; e.g. q[..., :16] and
    q[..., 16:32]) share an element: their address difference must be sum(k_i * stride_i) with
    |k_i| < dim_i. Where each stride exceeds the reach of the smaller ones, at most two k are possible
    per axis; otherwise (interleaved strides, other layouts) True: overlapping unless proven apart."""
    if a.shape != b.shape or a.strides != b.strides or a.data_type is not b.data_type:
        return True
    size = a.data_type.itemsize
    if (a.ptr - b.ptr) % size:
        return True
    axes = sorted(((s, d) for s, d in zip(a.strides, a.shape) if d > 1 and s != 0), reverse=True)
    reach = [0] * (len(axes) + 1)  # reach[j]: the largest |sum k_i s_i| over the axes after j
    for j in range(len(axes) - 1, -1, -1):
        reach[j] = reach[j + 1] + (axes[j][1] - 1) * axes[j][0]
        if j + 1 < len(axes) and axes[j][0] <= reach[j + 1]:
            return True

    def reachable(diff: int, j: int) -> bool:
        if j == len(axes):
            return diff == 0
        s, d = axes[j]
        return any(
            abs(k) < d and abs(diff - k * s) <= reach[j + 1] and reachable(diff - k * s, j + 1)
            for k in {diff // s, diff // s + 1}
        )

    return reachable((a.ptr - b.ptr) // size, 0)


def _overlapping_output(
    graph: FinalGraph, infos: Mapping[int, BufferInfo], inplace: InplaceRule | None = None
) -> tuple[int, int] | None:
    """(output, other) for the first output buffer that shares memory with another bound buffer, in
    the graph's output order, other than an in-place update `inplace` allows (the very buffer of an
    input the output updates element by element); None when none does. A sweep over the buffers'
    address spans: only buffers whose spans intersect are compared (a pack of hundreds of buffers costs
    no pairwise pass)."""
    spans = {u: _span(i) for u, i in infos.items()}
    rank = {u: k for k, u in enumerate(graph.outputs)}
    found: list[tuple[int, int, int]] = []
    active: list[int] = []
    for u in sorted(infos, key=lambda v: spans[v][0]):
        lo = spans[u][0]
        active = [v for v in active if spans[v][1] > lo]
        for v in active:
            if (u in rank or v in rank) and _overlap(infos[u], infos[v]):
                for o, other in ((u, v), (v, u)):
                    if o not in rank:
                        continue
                    if inplace is not None and (other, o) in inplace.allowed and _same_buffer(infos[o], infos[other]):
                        continue  # an in-place update through the pack
                    found.append((rank[o], o, other))
        active.append(u)
    if not found:
        return None
    _, o, other = min(found)
    return o, other


def arrays_overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays share an element (True when NumPy cannot decide within its budget)."""
    try:
        # NumPy 2's stubs allow only -1 and 0 here (older ones: any int); the function takes any positive
        # budget (its docs), so the ignore is for the stubs of some NumPy versions only
        return bool(np.shares_memory(a, b, max_work=10**6))  # type: ignore[arg-type, unused-ignore]
    except np.exceptions.TooHardError:
        return True


def bind(
    graph: FinalGraph, device: Device, pack: Mapping[Any, Any], inplace: InplaceRule | None = None
) -> dict[int, Any]:
    """Check a variant pack against the graph; return {uid: array or device tensor or number}. An output
    may be bound to the very buffer of an input where `inplace` (the plan's rule) allows that pair."""
    if not isinstance(pack, Mapping):
        raise VariantPackError(
            f"a variant pack is a dict, got {type(pack).__name__}",
            rule="pack.type",
            hint="pass {tensor_or_uid_or_name: buffer, ...} binding every input and output of the graph",
        )
    values: dict[int, Any] = {}
    for key, value in pack.items():
        uid = resolve_key(graph, key)
        desc = graph.tensors[uid]
        if desc.is_virtual:
            raise VariantPackError(
                "the tensor is virtual (internal to the graph) and cannot be bound",
                tensor=desc,
                rule="pack.virtual",
                hint="mark it with .set_output(True) before building to read it",
            )
        if uid in values:
            raise VariantPackError(
                "the tensor is bound twice (under two keys)",
                tensor=desc,
                rule="pack.duplicate",
                hint="bind each tensor once",
            )
        values[uid] = value
    required = (*graph.inputs, *graph.outputs)
    missing = [graph.tensors[u] for u in required if u not in values]
    if missing:
        names = ", ".join(f"'{t.name}' (uid {t.uid})" for t in missing)
        raise VariantPackError(
            f"the variant pack lacks {len(missing)} tensor(s): {names}",
            tensor=missing[0],
            rule="pack.missing",
            hint="bind every non-virtual input and output of the graph",
        )
    out: dict[int, Any] = {}
    infos: dict[int, BufferInfo] = {}
    uses = scalar_uses(graph)
    for uid, value in values.items():
        desc = graph.tensors[uid]
        if desc.is_pass_by_value:
            out[uid] = held_scalar(value, desc, uses.get(uid, ()))
            continue
        if device.is_cuda and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            if int(value) <= 0:
                raise VariantPackError(
                    f"a raw device pointer must be a positive address, got {value}",
                    tensor=desc,
                    rule="pack.pointer",
                    hint="pass tensor.data_ptr()",
                )
            value = tensor_from_pointer(int(value), desc.dim, desc.stride, desc.data_type, device.index)
        try:
            info = buffer_info(value)
        except GraphError as err:  # not a buffer, or one of a type opgraph does not know: name the tensor
            raise VariantPackError(
                err.detail,
                tensor=desc,
                rule=err.rule if isinstance(err, VariantPackError) else "pack.dtype",
                hint=err.hint,
            ) from None
        except Exception as err:  # noqa: BLE001 - an object that claims to be a buffer but cannot be read as one
            raise VariantPackError(
                f"the {type(value).__name__} cannot be read as a buffer: {type(err).__name__}: {str(err)[:200]}",
                tensor=desc,
                rule="pack.type",
                hint="bind a dense NumPy array or PyTorch tensor (or a DLPack / __cuda_array_interface__ object)",
            ) from None
        check_buffer(info, desc, device)
        if uid in graph.outputs and isinstance(info.obj, np.ndarray) and not info.obj.flags.writeable:
            raise VariantPackError(
                "the output buffer is read-only", tensor=desc, rule="pack.readonly", hint="bind a writeable array"
            )
        infos[uid] = info
        out[uid] = info.obj if device.is_cuda or desc.numel != 1 else info.obj.reshape(desc.dim)
    clash = _overlapping_output(graph, infos, inplace)
    if clash is not None:
        o, uid = clash
        same = _same_buffer(infos[o], infos[uid])
        why = inplace.reason(uid, o) if same and inplace is not None else ""
        raise VariantPackError(
            f"the output buffer overlaps the buffer of {graph.tensors[uid].label()}"
            + (f": it is that very buffer, but {why}" if why else ""),
            tensor=graph.tensors[o],
            rule="pack.overlap",
            hint="give every output its own memory (in-place updates reuse the input's UID, or bind an "
            "output to the buffer of an input it updates element by element)",
        )
    return out


def _same_buffer(a: BufferInfo, b: BufferInfo) -> bool:
    return (
        a.ptr == b.ptr
        and a.data_type is b.data_type
        and a.shape == b.shape
        and all(s == t for d, s, t in zip(a.shape, a.strides, b.strides) if d > 1)
    )


class PackBinder:
    """A plan's variant packs, bound: the current value of every bound tensor (`values`: buffers, and
    pass-by-value scalars rounded to their declared type), their addresses read once each
    (`pointers`), and a `version` that changes whenever any of them does.

    `bind(pack)` takes the cheapest path the pack allows. The same dict again, holding the same objects
    at the same addresses (and equal scalars), is one identity check and one `data_ptr()` per tensor.
    A CUDA pack of torch tensors (and numbers) under keys seen before is checked with a few comparisons
    per tensor (dims, strides, type, device, outputs against every other buffer). Anything else goes
    through `bind` (the detailed errors). Every path gives a scalar the same value: the number rounded
    to its tensor's declared type, as a 1-element buffer of that type would hold it."""

    def __init__(self, graph: FinalGraph, device: Device, inplace: InplaceRule | None = None) -> None:
        self.graph = graph
        self.device = device
        self.inplace = inplace  # outputs that may be bound to the very buffer of an input (runtime.aliasing)
        self._allowed = inplace.allowed if inplace is not None else frozenset()
        self.keys: dict[Any, int] = {}
        self.values: dict[int, Any] = {}
        self.pointers: dict[int, int] = {}
        self.version = 0
        self._pack: Any = _UNBOUND
        self._items: list[tuple[Any, int | None]] = []
        self._rounded: dict[int, tuple[Any, Any]] = {}  # uid -> (raw value, rounded value)
        self.outputs = tuple(graph.outputs)
        self.output_set = frozenset(graph.outputs)
        self.pass_by_value = {u for u in graph.inputs if graph.tensors[u].is_pass_by_value}
        self.required = len(graph.inputs) + len(graph.outputs)
        uses = scalar_uses(graph)
        # the full binder's conversion (rounding to the declared type, run-time checks), per scalar
        self.scalars = {u: (graph.tensors[u], uses.get(u, ())) for u in self.pass_by_value}
        self.expect: dict[int, tuple] = {}
        # the types the fast paths take as they are: torch tensors and parameters (a module's weights, as
        # torch.compile passes them to the backend's plans), not other subclasses of Tensor
        self.tensor_types: frozenset[type] = frozenset()
        if device.is_cuda:
            import torch

            self.tensor_types = frozenset({torch.Tensor, torch.nn.Parameter})
            for uid in (*graph.inputs, *graph.outputs):
                t = graph.tensors[uid]
                if not t.is_pass_by_value:
                    loose = tuple(d == 1 for d in t.dim)
                    self.expect[uid] = (torch.Size(t.dim), t.stride, loose, t.data_type.to_torch(), t.nbytes)

    # -- the paths --------------------------------------------------------------------------------
    def bind(self, pack: Mapping[Any, Any]) -> bool:
        """Bind `pack`; True when any value or address changed (a VariantPackError if it does not fit)."""
        if pack is self._pack and len(pack) == len(self._items):
            items = self._items
            i = 0
            for value in pack.values():
                last, ptr = items[i]
                if ptr is None:  # a Python number
                    if type(value) is not type(last) or value != last:
                        break
                elif ptr < 0 or value is not last or value.data_ptr() != ptr:
                    break
                i += 1
            else:
                return False
        found = self._fast(pack) if self.tensor_types else None
        if found is None:
            values = bind(self.graph, self.device, pack, self.inplace)
            pointers = {u: address_of(v) for u, v in values.items() if u not in self.pass_by_value}
            self._learn(pack)
        else:
            values, pointers = found
        for uid in self.pass_by_value:  # rounded and checked here, memoized per value (both paths)
            if uid in values:
                values[uid] = self._round(uid, values[uid])
        changed = (
            pointers != self.pointers
            or values.keys() != self.values.keys()
            or any(values[u] != self.values[u] for u in self.pass_by_value if u in values)
        )
        self.values, self.pointers = values, pointers
        if changed:
            self.version += 1
        self._pack = pack
        items = []
        for uid, value in zip(self._uids(pack), pack.values()):
            if uid in self.pass_by_value:
                items.append((value, None if type(value) in (int, float, bool) else -1))
            elif type(value) in self.tensor_types:
                items.append((value, pointers[uid]))
            else:
                items.append((value, -1))  # not a torch tensor: the next call binds it again
        self._items = items
        return changed

    def _uids(self, pack: Mapping[Any, Any]) -> list[int]:
        keys = self.keys
        return [keys[k] if hashable(k) and k in keys else resolve_key(self.graph, k) for k in pack]

    def _round(self, uid: int, raw: Any) -> Any:
        last = self._rounded.get(uid)
        if last is not None and type(last[0]) is type(raw) and last[0] == raw:
            return last[1]
        rounded = held_scalar(raw, *self.scalars[uid])
        self._rounded[uid] = (raw, rounded)
        return rounded

    def _learn(self, pack: Mapping[Any, Any]) -> None:
        """Remember how the keys of a pack that `bind` accepted resolve."""
        for key in pack:
            if hashable(key) and len(self.keys) < 4096:
                self.keys[key] = resolve_key(self.graph, key)

    def uid_of(self, key: Any) -> int:
        """The UID a variant-pack key names (a Tensor handle, TensorDesc, UID or name)."""
        uid = self.keys.get(key) if hashable(key) else None
        return uid if uid is not None else resolve_key(self.graph, key)

    def check_one(self, uid: int, value: Any) -> None:
        """Check one buffer for tensor `uid` as a variant-pack entry is checked (VariantPackError)."""
        if not self.fits(uid, value):
            check_buffer(buffer_info(value), self.graph.tensors[uid], self.device)

    def fits(self, uid: int, value: Any) -> bool:
        """Whether one torch tensor fits tensor `uid` (dims, strides, type, device)."""
        expect = self.expect.get(uid)
        if expect is None or type(value) not in self.tensor_types:
            return False
        shape, stride, loose, dtype, _ = expect
        if (
            value.shape != shape
            or value.dtype is not dtype
            or not value.is_cuda
            or value.device.index != self.device.index
        ):
            return False
        got = value.stride()
        return got == stride or all(g == s for g, s, l in zip(got, stride, loose) if not l)

    def _fast(self, pack: Mapping[Any, Any]) -> tuple[dict[int, Any], dict[int, int]] | None:
        keys = self.keys
        out: dict[int, Any] = {}
        try:
            for key, value in pack.items():
                uid = keys[key]
                if uid in out:
                    return None
                out[uid] = value
        except (KeyError, TypeError, AttributeError):  # AttributeError: not a mapping (`bind` says so)
            return None
        if len(out) != self.required:
            return None
        pointers: dict[int, int] = {}
        spans = []
        index = self.device.index
        for uid, value in out.items():
            if uid in self.pass_by_value:
                if type(value) not in (int, float):
                    return None
                continue  # rounded and checked by bind (_round)
            expect = self.expect.get(uid)
            if expect is None or type(value) not in self.tensor_types:
                return None
            shape, stride, loose, dtype, nbytes = expect
            if value.shape != shape or value.dtype is not dtype or not value.is_cuda or value.device.index != index:
                return None
            got = value.stride()
            if got != stride and any(g != s for g, s, l in zip(got, stride, loose) if not l):
                return None
            ptr = value.data_ptr()
            pointers[uid] = ptr
            spans.append((ptr, ptr + nbytes, uid))
        if self._overlap(spans):
            return None  # let `bind` decide (and explain) the overlap
        return out, pointers

    def _overlap(self, spans: list[tuple[int, int, int]]) -> bool:
        """Whether an output's bytes meet another buffer's other than as an in-place pair allows
        (same start): one sweep over the spans sorted by address, not every output against every
        buffer (a backward plan binds hundreds)."""
        outputs, allowed = self.output_set, self._allowed
        spans.sort()
        active: list[tuple[int, int, int]] = []  # (end, start, uid) of spans still open
        for lo, hi, uid in spans:
            active = [s for s in active if s[0] > lo]
            for b, a, other in active:
                if not (a < hi and lo < b):
                    continue
                same = a == lo
                if uid in outputs and not (same and (other, uid) in allowed):
                    return True
                if other in outputs and not (same and (uid, other) in allowed):
                    return True
            active.append((hi, lo, uid))
        return False


_UNBOUND = object()  # a fresh binder's last pack: no pack is it


def hashable(key: Any) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True
