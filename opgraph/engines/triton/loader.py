"""Turning generated source into launchable Triton kernels.

Triton reads a kernel's source from its file, so generated code is written to a cache folder
(named by the hash of the source) and imported from there. On the CPU the kernel functions are
wrapped by Triton's interpreter, on CUDA by `triton.jit`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from ...core.cache import kernel_dir, note_kernel_written

_MODULES: dict[tuple[str, bool], ModuleType] = {}
_LOADED: set[Path] = set()  # files this process imported: never pruned under it


def cache_dir() -> Path:
    """Where generated sources are written (opgraph.cache: size cap, `opgraph cache info|clear`)."""
    return kernel_dir()


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:20]


def load_module(source: str, *, interpret: bool) -> ModuleType:
    """Import generated source; every top-level function named `kernel*` becomes a Triton kernel
    and every `_og_*` function a Triton device function."""
    digest = source_hash(source)
    key = (digest, interpret)
    if key in _MODULES:
        return _MODULES[key]
    folder = cache_dir()
    path = folder / f"og_{digest}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
        _LOADED.add(path)
        note_kernel_written(folder, _LOADED)
    else:
        _LOADED.add(path)
        os.utime(path)  # recently used: the cache's pruning keeps it
    name = f"opgraph_generated_{digest}_{'interp' if interpret else 'jit'}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    for attr in list(vars(module)):
        if attr.startswith("kernel") and callable(getattr(module, attr)):
            setattr(module, attr, _wrap(getattr(module, attr), interpret))
        elif attr.startswith("_og_") and callable(getattr(module, attr)) and not interpret:
            # Helpers stay plain functions for the interpreter, which runs them as Python; a custom op's
            # function that its module already made a JITFunction is imported as it is.
            import triton
            from triton.runtime.jit import JITFunction

            if not isinstance(getattr(module, attr), JITFunction):
                setattr(module, attr, triton.jit(getattr(module, attr)))
    _MODULES[key] = module
    return module


def _wrap(fn: Any, interpret: bool) -> Any:
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(fn)
    import triton

    return triton.jit(fn)
