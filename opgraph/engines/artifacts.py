"""Compiled code that plan files carry: Triton kernels' cubins with their metadata, cuDNN's serialized
execution plans. An engine looks its artifacts up here by (kind, key) before compiling; a plan file's
artifacts are checked (hash, types) and put here when the plan loads (opgraph.runtime.plan_io).

An artifact is data, never code that Python runs: a cubin is loaded by the CUDA driver, a serialized
cuDNN plan by cuDNN. Each carries its SHA-256, checked on load.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import SerializationError


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
        return {"kind": self.kind, "key": self.key, "sha256": self.sha256, "meta": self.meta,
                "data": base64.b64encode(self.data).decode("ascii")}

    @classmethod
    def from_doc(cls, doc: Any, where: str) -> Artifact:
        def bad(what: str) -> SerializationError:
            return SerializationError(f"{where}: {what}", rule="plan.artifact",
                                      hint="the file is damaged: save the plan again (or load it with "
                                           "on_mismatch='recompile' after removing its artifacts)")

        if not isinstance(doc, dict):
            raise bad("expected an object")
        kind, key, digest, meta, data = (doc.get(k) for k in ("kind", "key", "sha256", "meta", "data"))
        if not (isinstance(kind, str) and isinstance(key, str) and isinstance(digest, str)
                and isinstance(meta, dict) and isinstance(data, str)):
            raise bad("kind, key, sha256 and data must be strings and meta an object")
        try:
            raw = base64.b64decode(data.encode("ascii"), validate=True)
        except (binascii.Error, ValueError, UnicodeEncodeError):
            raise bad("data is not base64") from None
        if hashlib.sha256(raw).hexdigest() != digest:
            raise bad(f"the {kind} artifact's bytes do not match their SHA-256")
        return cls(kind, key, raw, meta, digest)


_STORE: dict[tuple[str, str], Artifact] = {}


def put(artifact: Artifact) -> None:
    _STORE[(artifact.kind, artifact.key)] = artifact


def get(kind: str, key: str) -> Artifact | None:
    return _STORE.get((kind, key))


def clear() -> None:
    _STORE.clear()
