"""Variant packs: the buffers a plan runs on, keyed by Tensor handle, TensorDesc, UID or name.

Everything is checked before anything runs (unknown, missing or doubly bound tensors; dims,
strides, type and device of every buffer; outputs overlapping other buffers or read-only), so a
bad pack raises a VariantPackError naming the tensor and no buffer is written.
"""

from __future__ import annotations

import math
import numbers
import weakref
from typing import Any, Mapping

import numpy as np

from .buffers import BufferInfo, buffer_info, tensor_from_pointer
from .device import Device
from .errors import GraphError, VariantPackError
from .ir import FinalGraph, Node
from .rounding import round_to
from .tensor import Tensor, TensorDesc, storage_extent


def resolve_key(graph: FinalGraph, key: Any) -> int:
    if isinstance(key, Tensor):
        uid = graph.handle_uid(key)
        if uid is None:
            raise VariantPackError(
                "the tensor handle is not part of the graph this plan was built from", tensor=key,
                rule="pack.unknown",
                hint="bind the tensors of the graph the plan was built from (or use UIDs)",
            )
        return uid
    if isinstance(key, TensorDesc):
        key = key.uid
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        if int(key) not in graph.tensors:
            raise VariantPackError(
                f"UID {int(key)} is not a tensor of this graph", rule="pack.unknown",
                hint=f"known UIDs: {sorted(graph.tensors)}",
            )
        return int(key)
    if isinstance(key, str):
        matches = [t.uid for t in graph.tensors.values() if t.name == key]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            names = sorted(t.name for t in graph.tensors.values() if not t.is_virtual and t.name)
            raise VariantPackError(
                f"no tensor is named {key!r}", rule="pack.unknown", hint=f"known names: {names}"
            )
        raise VariantPackError(
            f"{len(matches)} tensors are named {key!r} (UIDs {matches})", rule="pack.ambiguous_name",
            hint="bind them by UID or by tensor handle",
        )
    raise VariantPackError(
        f"a variant pack key must be a Tensor, a UID or a name, got {type(key).__name__}", rule="pack.key",
        hint="use the tensor handles the builders returned, their .uid, or their names",
    )


def _scalar(value: Any, desc: TensorDesc) -> float | int | bool:
    """The host value of a pass-by-value tensor, as a value of its declared type."""
    if isinstance(value, (numbers.Real, np.bool_)):
        v = value.item() if isinstance(value, np.generic) else value
    else:
        try:
            info = buffer_info(value)
        except GraphError:
            info = None
        if info is None or info.device != "cpu" or int(np.prod(info.shape)) != 1:
            raise VariantPackError(
                f"a pass-by-value tensor takes a host number, got {type(value).__name__}", tensor=desc,
                rule="pack.pass_by_value", hint="bind a Python number, a 0-d array or a 1-element CPU tensor",
            )
        v = np.asarray(info.obj).reshape(()).item()
    # the tensor holds a value of its type, as a 1-element buffer of that type would
    dt = desc.data_type
    if dt.is_integer and isinstance(v, int):
        info_ = np.iinfo(dt.numpy)
        return min(max(int(v), int(info_.min)), int(info_.max))
    try:
        f = float(v)
    except OverflowError:
        f = math.inf if v > 0 else -math.inf
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
    v = _scalar(value, desc)
    for node, role in uses:
        problem = node.op.check_scalar(role, float(v))
        if problem is not None:
            message, rule, hint = problem
            raise VariantPackError(f"{message} (given at run time as '{role}' of {node.label()})", op=node.label(),
                                   tensor=desc, rule=rule, hint=hint)
    return v


def _check_buffer(info: BufferInfo, desc: TensorDesc, device: Device) -> None:
    want_device = "cpu" if not device.is_cuda else f"cuda:{device.index}"
    if info.device != want_device:
        raise VariantPackError(
            f"the buffer is on {info.device} but the plan runs on {want_device}", tensor=desc,
            rule="pack.device", hint=f"move the buffer to {want_device}, or build the plan for {info.device}",
        )
    if info.data_type is not desc.data_type:
        raise VariantPackError(
            f"the buffer holds {info.data_type.name} but the tensor is {desc.data_type.name}", tensor=desc,
            rule="pack.dtype", hint=f"bind a {desc.data_type.name} buffer (or change the tensor's data_type)",
        )
    if desc.numel == 1 and int(np.prod(info.shape)) == 1:
        return  # a scalar binds whatever its rank
    if tuple(info.shape) != desc.dim:
        raise VariantPackError(
            f"the buffer has shape {list(info.shape)} but the tensor has dims {list(desc.dim)}", tensor=desc,
            rule="pack.shape", hint=f"bind a buffer of shape {list(desc.dim)} (reshape or view it)",
        )
    for axis, (d, want, got) in enumerate(zip(desc.dim, desc.stride, info.strides)):
        if d > 1 and want != got:
            raise VariantPackError(
                f"the buffer has strides {list(info.strides)} but the tensor has strides {list(desc.stride)} "
                f"(axis {axis} differs)", tensor=desc, rule="pack.strides",
                hint="bind a buffer with the declared layout (e.g. .contiguous(memory_format=torch."
                "channels_last) for NHWC), or declare the tensor with the buffer's strides",
            )


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
    return True


def arrays_overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays share an element (True when NumPy cannot decide within its budget)."""
    try:
        return bool(np.shares_memory(a, b, max_work=10**6))
    except np.exceptions.TooHardError:
        return True


def bind(graph: FinalGraph, device: Device, pack: Mapping[Any, Any]) -> dict[int, Any]:
    """Check a variant pack against the graph; return {uid: array or device tensor or number}."""
    if not isinstance(pack, Mapping):
        raise VariantPackError(
            f"a variant pack is a dict, got {type(pack).__name__}", rule="pack.type",
            hint="pass {tensor_or_uid_or_name: buffer, ...}",
        )
    values: dict[int, Any] = {}
    for key, value in pack.items():
        uid = resolve_key(graph, key)
        desc = graph.tensors[uid]
        if desc.is_virtual:
            raise VariantPackError(
                "the tensor is virtual (internal to the graph) and cannot be bound", tensor=desc,
                rule="pack.virtual", hint="mark it with .set_output(True) before building to read it",
            )
        if uid in values:
            raise VariantPackError("the tensor is bound twice (under two keys)", tensor=desc,
                                   rule="pack.duplicate", hint="bind each tensor once")
        values[uid] = value
    required = (*graph.inputs, *graph.outputs)
    missing = [graph.tensors[u] for u in required if u not in values]
    if missing:
        names = ", ".join(f"'{t.name}' (uid {t.uid})" for t in missing)
        raise VariantPackError(
            f"the variant pack lacks {len(missing)} tensor(s): {names}", tensor=missing[0], rule="pack.missing",
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
                raise VariantPackError(f"a raw device pointer must be a positive address, got {value}",
                                       tensor=desc, rule="pack.pointer", hint="pass tensor.data_ptr()")
            value = tensor_from_pointer(int(value), desc.dim, desc.stride, desc.data_type, device.index)
        try:
            info = buffer_info(value)
        except GraphError as err:  # not a buffer, or one of a type opgraph does not know: name the tensor
            raise VariantPackError(err.detail, tensor=desc, rule=err.rule if isinstance(err, VariantPackError)
                                   else "pack.dtype", hint=err.hint) from None
        except Exception as err:  # noqa: BLE001 - an object that claims to be a buffer but cannot be read as one
            raise VariantPackError(
                f"the {type(value).__name__} cannot be read as a buffer: {type(err).__name__}: {str(err)[:200]}",
                tensor=desc, rule="pack.type",
                hint="bind a dense NumPy array or PyTorch tensor (or a DLPack / __cuda_array_interface__ object)",
            ) from None
        _check_buffer(info, desc, device)
        if uid in graph.outputs and isinstance(info.obj, np.ndarray) and not info.obj.flags.writeable:
            raise VariantPackError("the output buffer is read-only", tensor=desc, rule="pack.readonly",
                                   hint="bind a writeable array")
        infos[uid] = info
        out[uid] = info.obj if device.is_cuda or desc.numel != 1 else info.obj.reshape(desc.dim)
    for o in graph.outputs:
        for uid, info in infos.items():
            if uid != o and _overlap(infos[o], info):
                raise VariantPackError(
                    f"the output buffer overlaps the buffer of {graph.tensors[uid].label()}",
                    tensor=graph.tensors[o], rule="pack.overlap",
                    hint="give every output its own memory (in-place updates reuse the input's UID)",
                )
    return out


class FastBinder:
    """The common case of a CUDA plan executed again and again: a pack of torch tensors (and numbers)
    under keys seen before. It checks dims, strides, type and device of every buffer and the overlap of
    outputs with a few comparisons per tensor, and answers None for anything unusual, which then goes
    through `bind` (whose errors are the detailed ones)."""

    def __init__(self, graph: FinalGraph, device: Device) -> None:
        import torch

        self.graph = graph
        self.device_index = device.index
        self.tensor_type = torch.Tensor
        self.keys: dict[Any, int] = {}
        self._last: tuple | None = None
        self.required = len(graph.inputs) + len(graph.outputs)
        self.outputs = tuple(graph.outputs)
        self.pass_by_value = {u for u in graph.inputs if graph.tensors[u].is_pass_by_value}
        uses = scalar_uses(graph)
        # the full binder's conversion (rounding to the declared type, run-time checks), per scalar
        self.scalars = {u: (graph.tensors[u], uses.get(u, ())) for u in self.pass_by_value}
        self.expect: dict[int, tuple] = {}
        for uid in (*graph.inputs, *graph.outputs):
            t = graph.tensors[uid]
            if t.is_pass_by_value:
                continue
            loose = tuple(d == 1 for d in t.dim)
            self.expect[uid] = (torch.Size(t.dim), t.stride, loose, t.data_type.to_torch(), t.nbytes)

    def learn(self, pack: Mapping[Any, Any]) -> None:
        """Remember how the keys of a pack that `bind` accepted resolve."""
        for key in pack:
            try:
                hash(key)
            except TypeError:
                continue
            if len(self.keys) < 4096:
                self.keys[key] = resolve_key(self.graph, key)

    def bind_one(self, uid: int, value: Any) -> bool:
        """Whether one torch tensor fits tensor `uid` (dims, strides, type, device)."""
        expect = self.expect.get(uid)
        if expect is None or type(value) is not self.tensor_type:
            return False
        shape, stride, loose, dtype, _ = expect
        if value.shape != shape or value.dtype is not dtype or not value.is_cuda or value.device.index != self.device_index:
            return False
        got = value.stride()
        return got == stride or all(g == s for g, s, l in zip(got, stride, loose) if not l)

    def bind(self, pack: Mapping[Any, Any]) -> dict[int, Any] | None:
        # the same pack again (same dict, same tensor objects at the same addresses): already checked
        last = self._last
        if last is not None and last[0] is pack and len(pack) == len(last[1]):
            values, ptrs, out = last[1], last[2], last[3]
            i = 0
            for value in pack.values():
                if value is not values[i] or (ptrs[i] is not None and value.data_ptr() != ptrs[i]):
                    break
                i += 1
            else:
                return dict(out)
        out = self._bind(pack)
        if out is not None:
            values = list(pack.values())
            self._last = (pack, values, [v.data_ptr() if type(v) is self.tensor_type else None for v in values],
                          dict(out))
        return out

    def _bind(self, pack: Mapping[Any, Any]) -> dict[int, Any] | None:
        keys = self.keys
        out: dict[int, Any] = {}
        try:
            for key, value in pack.items():
                uid = keys[key]
                if uid in out:
                    return None
                out[uid] = value
        except (KeyError, TypeError, AttributeError):
            return None
        if len(out) != self.required:
            return None
        spans = []
        for uid, value in out.items():
            if uid in self.pass_by_value:
                if type(value) not in (int, float):
                    return None
                desc, scalar_uses_ = self.scalars[uid]
                out[uid] = held_scalar(value, desc, scalar_uses_)
                continue
            expect = self.expect.get(uid)
            if expect is None or type(value) is not self.tensor_type:
                return None
            shape, stride, loose, dtype, nbytes = expect
            if value.shape != shape or value.dtype is not dtype or not value.is_cuda \
                    or value.device.index != self.device_index:
                return None
            got = value.stride()
            if got != stride and any(g != s for g, s, l in zip(got, stride, loose) if not l):
                return None
            ptr = value.data_ptr()
            spans.append((ptr, ptr + nbytes, uid))
        for uid in self.outputs:
            value = out[uid]
            lo = value.data_ptr()
            hi = lo + self.expect[uid][4]
            for a, b, other in spans:
                if other != uid and a < hi and lo < b:
                    return None  # let `bind` decide (and explain) the overlap
        return out
