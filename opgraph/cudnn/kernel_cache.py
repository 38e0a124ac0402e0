"""`cudnn.create_kernel_cache()`: the object cuDNN programs pass as `pygraph(kernel_cache=...)`.

opgraph keeps what a kernel cache is for elsewhere: generated kernels are compiled once per source and
kept on disk across processes, and a built plan holds its kernels. This object is accepted where cuDNN
takes a kernel cache and holds nothing; `serialize` returns a small JSON document and `deserialize`
accepts one, once per cache (a second call raises, as cuDNN's does). Its other meaning in cuDNN, one
set of kernels for many shapes of a dynamic-shape graph, is the dynamic-shapes work (issue 42).
"""

from __future__ import annotations

import json
from typing import Any

from ..core.errors import AttributeValueError, SerializationError
from .errors import translated

_FORMAT = "opgraph.kernel_cache"


class KernelCache:
    """A kernel cache (see the module docstring)."""

    def __init__(self) -> None:
        self._deserialized = False

    @translated
    def serialize(self) -> str:
        return json.dumps({"format": _FORMAT, "version": 1, "kernels": []})

    @translated
    def deserialize(self, data: Any) -> None:
        if self._deserialized:
            raise AttributeValueError(
                "this kernel cache was already deserialized into",
                rule="cudnn.kernel_cache",
                hint="deserialize into a new cache (cudnn.create_kernel_cache())",
            )
        try:
            doc = json.loads(data if isinstance(data, (str, bytes, bytearray)) else bytes(data))
        except (TypeError, ValueError) as err:
            raise SerializationError(
                f"not a kernel cache: {err}",
                rule="cudnn.kernel_cache",
                hint="pass what KernelCache.serialize() returned",
            ) from None
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            raise SerializationError(
                "not an opgraph kernel cache document",
                rule="cudnn.kernel_cache",
                hint="pass what KernelCache.serialize() returned",
            )
        self._deserialized = True

    def __repr__(self) -> str:
        return "cudnn.kernel_cache (opgraph: compiled kernels are cached per source on disk)"


def create_kernel_cache() -> KernelCache:
    return KernelCache()


__all__ = ["KernelCache", "create_kernel_cache"]
