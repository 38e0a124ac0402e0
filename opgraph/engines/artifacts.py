"""Compiled code that plan files carry: Triton kernels' cubins with their metadata, cuDNN's serialized
execution plans. An engine looks its artifacts up here by (kind, key) before compiling; a plan file's
artifacts are checked (hash, types) when the plan loads (opgraph.runtime.plan_io) and held by that
plan (a `Scope`): lookups see them only while that plan loads, binds or saves, in that thread.

An artifact is data, never code that Python runs: a cubin is loaded by the CUDA driver, a serialized
cuDNN plan by cuDNN. Each carries its SHA-256, checked on load.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import contextvars
import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..core.errors import SerializationError

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Artifact:
    kind: str  # "triton" | "cudnn"
    key: str  # the engine's lookup key (a hash of what defines the compiled code)
    data: bytes
    meta: dict[str, Any] = field(default_factory=dict)  # JSON-able
    sha256: str = ""

    def __post_init__(self) -> None:
        if not self.sha256:
            object.__setattr__(self, "sha256", hashlib.sha256(self.data).hexdigest())

    def to_doc(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "key": self.key,
            "sha256": self.sha256,
            "meta": self.meta,
            "data": base64.b64encode(self.data).decode("ascii"),
        }

    @classmethod
    def from_doc(cls, doc: Any, where: str) -> Artifact:
        def bad(what: str) -> SerializationError:
            return SerializationError(
                f"{where}: {what}",
                rule="plan.artifact",
                hint="the file is damaged: save the plan again (or load it with "
                "on_mismatch='recompile' after removing its artifacts)",
            )

        if not isinstance(doc, dict):
            raise bad("expected an object")
        kind, key, digest, meta, data = (doc.get(k) for k in ("kind", "key", "sha256", "meta", "data"))
        if not (
            isinstance(kind, str)
            and isinstance(key, str)
            and isinstance(digest, str)
            and isinstance(meta, dict)
            and isinstance(data, str)
        ):
            raise bad("kind, key, sha256 and data must be strings and meta an object")
        try:
            raw = base64.b64decode(data.encode("ascii"), validate=True)
        except (binascii.Error, ValueError, UnicodeEncodeError):
            raise bad("data is not base64") from None
        if hashlib.sha256(raw).hexdigest() != digest:
            raise bad(f"the {kind} artifact's bytes do not match their SHA-256")
        return cls(kind, key, raw, meta, digest)


class Scope:
    """The artifacts one loaded plan carries, visible to the engines' lookups (`get`, `decoded`) only
    inside `with scope.visible():` and only in that thread: a plan file never supplies code to
    anything but the plan that carries it (nothing from a file is registered process-wide).
    `used` names the artifacts some lookup asked for; the loader keeps only those."""

    def __init__(self, items: Iterable[Artifact] = ()) -> None:
        self._items = {(a.kind, a.key): a for a in items}
        self._decoded: dict[tuple[str, str], Any] = {}
        self.used: set[tuple[str, str]] = set()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Artifact]:
        return iter(self._items.values())

    @contextlib.contextmanager
    def visible(self) -> Iterator[Scope]:
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    def only_used(self) -> Scope:
        """The artifacts lookups asked for (with what they decoded), the others dropped."""
        kept = Scope(a for k, a in self._items.items() if k in self.used)
        kept._decoded = {k: v for k, v in self._decoded.items() if k in self.used}
        kept.used = set(self.used)
        return kept

    def get(self, kind: str, key: str) -> Artifact | None:
        found = self._items.get((kind, key))
        if found is not None:
            self.used.add((kind, key))
        return found

    def decoded(self, kind: str, key: str, decode: Callable[[Artifact], T | None]) -> T | None:
        """`decode(artifact)` (an engine's check and conversion), made once per scope."""
        if (kind, key) in self._decoded:
            return self._decoded[(kind, key)]
        art = self.get(kind, key)
        value = decode(art) if art is not None else None
        if art is not None:
            self._decoded[(kind, key)] = value
        return value


_CURRENT: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("opgraph_artifacts", default=None)


def get(kind: str, key: str) -> Artifact | None:
    """The artifact (kind, key) of the plan being loaded or bound in this thread, if it carries one."""
    scope = _CURRENT.get()
    return scope.get(kind, key) if scope is not None else None


def decoded(kind: str, key: str, decode: Callable[[Artifact], T | None]) -> T | None:
    """`decode` of the artifact (kind, key) of the plan being loaded or bound in this thread (made once
    per plan), or None when it carries none."""
    scope = _CURRENT.get()
    return scope.decoded(kind, key, decode) if scope is not None else None
