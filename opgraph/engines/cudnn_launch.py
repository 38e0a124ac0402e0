"""cuDNN steps at run time: launching a built cuDNN plan with a prebuilt variant pack, and keeping
built plans across processes (serialized execution plans).

Launching. The frontend's public execute inspects every buffer in Python on each call. A bound cuDNN
step instead owns the variant pack the backend reads: a contiguous `void*[]` of the operands' addresses
in ascending UID order (the order `_get_variant_pack_uids_sorted` reports), written once at bind and
per slot when a tensor moves, and launches with the lowered graph's `_execute_with_raw_ptrs` (one
foreign call, no dict, no lookup). Frontends without it get the UID -> address dict of
`_execute_plan_at_index`, built once and updated in place; failing that, the public execute.
`OPGRAPH_CUDNN_LAUNCH=raw|dict|execute` picks one (diagnostics). The handle's stream is set once per
execute for all steps sharing it (a binding prelude), not per step.

Keeping plans. A built plan is serialized (`graph.serialize()`, where the frontend and the engine
offer it) and kept under the opgraph cache (`cudnn/<key>.bin`) and in plan files; a later process
deserializes it instead of planning and building again (which for runtime-fusion engines means
compiling a kernel). The key hashes the piece, the config and the environment (device, cuDNN and
frontend versions), and a plan that fails to deserialize is simply built again.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..core.cache import cache_root, locked, write_atomic
from . import artifacts
from .base import Binding, Launcher

log = logging.getLogger("opgraph.cudnn")
ARTIFACT_KIND = "cudnn"
_STREAMS: dict[int, int] = {}  # handle id -> the stream last set on it


def launch_mode() -> str:
    mode = os.environ.get("OPGRAPH_CUDNN_LAUNCH", "raw")
    return mode if mode in ("raw", "dict", "execute") else "raw"


@functools.cache
def environment(device_index: int) -> dict[str, Any]:
    from importlib import metadata

    import torch

    try:
        fe = metadata.version("nvidia-cudnn-frontend")
    except metadata.PackageNotFoundError:
        fe = None
    import cudnn  # noqa: PLC0415

    props = torch.cuda.get_device_properties(device_index)
    return {
        "device": props.name,
        "capability": [props.major, props.minor],
        "cudnn": int(cudnn.backend_version()),
        "frontend": fe,
    }


def plan_key(signature: Any, knobs: Any, device_index: int) -> str:
    doc = {"piece": signature, "knobs": knobs, "env": environment(device_index), "uids": "canonical"}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _disk(key: str) -> Path:
    return cache_root() / "cudnn" / f"{key}.bin"


def stored(key: str) -> bytes | None:
    """A serialized plan for `key`: embedded in a loaded plan file, or in the disk cache."""
    art = artifacts.get(ARTIFACT_KIND, key)
    if art is not None:
        return art.data
    try:
        return _disk(key).read_bytes()
    except OSError:
        return None


def store(key: str, data: bytes) -> None:
    path = _disk(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)
    except OSError as err:  # a read-only cache: the plan is built again next time
        log.debug("cannot keep the cuDNN plan %s: %s", key, err)


def serialize(graph: Any) -> bytes | None:
    """The built plan's serialized form, or None where the frontend or the engine offers none."""
    try:
        try:
            data = graph.serialize(as_bytes=True)
        except TypeError:  # a frontend without as_bytes
            data = graph.serialize()
    except Exception as err:  # noqa: BLE001 - many engines cannot be serialized; that is fine
        log.debug("cuDNN plan not serializable: %s", err)
        return None
    if isinstance(data, (bytes, bytearray)):
        return bytes(data)
    if isinstance(data, list):
        return bytes(data)
    return None


def deserialize(handle: Any, data: bytes) -> Any:
    """A graph holding the deserialized, built plan (raises where cuDNN refuses it)."""
    import cudnn  # noqa: PLC0415

    graph = cudnn.pygraph(handle=handle)
    try:
        graph.deserialize(handle, data)
    except TypeError:
        graph.deserialize(handle, list(data))
    return graph


class Verdicts:
    """cuDNN's answers to "can you run this piece, and with which plans" ((reason or None, plan names)),
    kept on disk per environment: the partitioner asks about hundreds of candidate pieces, and each
    question costs a cuDNN graph build and a heuristics query."""

    def __init__(self) -> None:
        self._data: dict[str, Any] | None = None
        self._new = 0

    def _path(self) -> Path:
        return cache_root() / "cudnn" / "verdicts.json"

    def _load(self) -> dict[str, Any]:
        if self._data is None:
            try:
                data = json.loads(self._path().read_bytes())
                self._data = data if isinstance(data, dict) else {}
            except (OSError, ValueError):
                self._data = {}
            atexit.register(self.flush)
        return self._data

    def get(self, key: str) -> tuple[str | None, list[str]] | None:
        entry = self._load().get(key)
        if (
            isinstance(entry, list)
            and len(entry) == 2
            and (entry[0] is None or isinstance(entry[0], str))
            and isinstance(entry[1], list)
            and all(isinstance(n, str) for n in entry[1])
        ):
            return entry[0], list(entry[1])
        return None

    def put(self, key: str, verdict: tuple[str | None, list[str]]) -> None:
        self._load()[key] = [verdict[0], list(verdict[1])]
        self._new += 1
        if self._new >= 64:
            self.flush()

    def flush(self) -> None:
        if not self._new or self._data is None:
            return
        path = self._path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with locked(path):
                try:  # merge what other processes wrote meanwhile
                    disk = json.loads(path.read_bytes())
                    merged = {**(disk if isinstance(disk, dict) else {}), **self._data}
                except (OSError, ValueError):
                    merged = dict(self._data)
                write_atomic(path, json.dumps(merged).encode())
            self._new = 0
        except OSError as err:
            log.debug("cannot keep cuDNN verdicts: %s", err)


VERDICTS = Verdicts()


def verdict_key(signature: Any, device_index: int) -> str:
    doc = {"piece": signature, "env": environment(device_index)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:32]


def lowered_of(graph: Any) -> Any:
    return getattr(graph, "_lowered_graph", None) or graph


def raw_order(lowered: Any) -> list[int] | None:
    """The backend's operand order (ascending UIDs), or None where the frontend does not say."""
    try:
        if not hasattr(lowered, "_execute_with_raw_ptrs"):
            return None
        lowered._prepare_variant_pack_template()
        order = [int(u) for u in lowered._get_variant_pack_uids_sorted()]
        return order or None
    except Exception:  # noqa: BLE001 - an older frontend
        return None


def _set_stream(handle: Any, slot: Any) -> None:
    key = id(handle)
    if _STREAMS.get(key) != slot.handle:
        import cudnn  # noqa: PLC0415

        cudnn.set_stream(handle=handle, stream=slot.handle)
        _STREAMS[key] = slot.handle


class CudnnLauncher(Launcher):
    """One built cuDNN plan bound to a Binding: its variant pack prebuilt."""

    def __init__(self, kernel: Any, binding: Binding, scratch: Any) -> None:
        super().__init__()
        self.kernel, self.binding = kernel, binding
        self.handle = kernel.handle
        self.ws = int(scratch.data_ptr()) if scratch is not None and kernel.scratch_bytes else 0
        binding.preludes[("cudnn-stream", id(self.handle))] = (_set_stream, (self.handle, binding.stream))
        canon = kernel.canon  # piece UID -> the cuDNN graph's
        ours = {c: u for u, c in canon.items()}
        lowered = lowered_of(kernel.graph)
        mode = launch_mode()
        order = raw_order(lowered) if mode == "raw" else None
        if order is not None and not set(order) <= set(ours):
            order = None
        self.slots: dict[int, int] = {}
        if order is not None:
            self.array = (ctypes.c_void_p * len(order))()
            self.slots = {ours[c]: i for i, c in enumerate(order)}
            for u, i in self.slots.items():
                self.array[i] = self._address(u)
            self.calls = [
                (
                    lowered._execute_with_raw_ptrs,
                    (ctypes.addressof(self.array), len(order), self.ws, self.handle.backend_handle, kernel.cpp_index),
                )
            ]
            self.mode = "raw"
        elif mode in ("raw", "dict") and kernel.cpp_index >= 0 and hasattr(lowered, "_execute_plan_at_index"):
            self.pointers = {canon[u]: self._address(u) for u in (*kernel.uids, *kernel.extras)}
            self.calls = [
                (
                    lowered._execute_plan_at_index,
                    (self.pointers, self.ws, kernel.cpp_index, self.handle.backend_handle, None, None, None),
                )
            ]
            self.mode = "dict"
        elif mode in ("raw", "dict") and kernel.cpp_index < 0 and hasattr(lowered, "_execute"):
            self.pointers = {canon[u]: self._address(u) for u in (*kernel.uids, *kernel.extras)}
            self.calls = [(lowered._execute, (self.pointers, self.ws, self.handle.backend_handle, None, None, None))]
            self.mode = "dict"
        else:
            self.scratch = scratch
            self.calls = [(_execute, (kernel, binding, scratch))]  # (not a method: no reference cycle)
            self.mode = "execute"

    def _address(self, uid: int) -> int:
        if uid < 0:  # the padded form's lengths and ragged offsets (cudnn_padded): the kernel's own buffer
            return int(self.kernel.extras[uid].data_ptr())
        if uid in self.kernel.host_scalars:
            host = self.kernel.host_scalars[uid]
            host.fill_(float(self.binding.buffers[uid]))
            return int(host.data_ptr())
        base, offset = self.kernel.where.get(uid, (uid, 0))  # (an attention operand read through a view)
        return int(self.binding.pointers[base]) + offset

    def rebind(self, uids: Iterable[int]) -> bool:
        for uid in {k for u in uids for k in self.kernel.slots_in.get(u, (u,))}:
            if self.mode == "raw":
                slot = self.slots.get(uid)
                if slot is not None:
                    self.array[slot] = self._address(uid)
            elif self.mode == "dict" and self.kernel.canon.get(uid) in self.pointers:
                self.pointers[self.kernel.canon[uid]] = self._address(uid)
            elif uid in self.kernel.host_scalars:
                self._address(uid)
        return False


def _execute(kernel: Any, binding: Binding, scratch: Any) -> None:
    kernel.run(binding.buffers, binding.stream.handle, scratch)
