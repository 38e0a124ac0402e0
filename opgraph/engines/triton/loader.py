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

_MODULES: dict[tuple[str, bool, bool], ModuleType] = {}


def cache_dir() -> Path:
    root = os.environ.get("OPGRAPH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "opgraph"
    )
    path = Path(root) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:20]


def load_module(source: str, *, interpret: bool, fast_casts: bool = True) -> ModuleType:
    """Import generated source; every top-level function named `kernel*` becomes a Triton kernel
    and every `_og_*` function a Triton device function. Interpreted, the cast helpers are replaced
    by their one-step NumPy equivalents (interp.py) unless `fast_casts` is False."""
    digest = source_hash(source)
    key = (digest, interpret, fast_casts)
    if key in _MODULES:
        return _MODULES[key]
    path = cache_dir() / f"og_{digest}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    name = f"opgraph_generated_{digest}_{'interp' if interpret else 'jit'}{'' if fast_casts else '_slow'}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if interpret and fast_casts:
        from .interp import FAST

        for attr, fn in FAST.items():
            if hasattr(module, attr):
                setattr(module, attr, fn)
    for attr in list(vars(module)):
        if attr.startswith("kernel") and callable(getattr(module, attr)):
            setattr(module, attr, _wrap(getattr(module, attr), interpret))
        elif attr.startswith("_og_") and callable(getattr(module, attr)) and not interpret:
            # Helpers stay plain functions for the interpreter, which runs them as Python.
            import triton

            setattr(module, attr, triton.jit(getattr(module, attr)))
    _MODULES[key] = module
    return module


def _wrap(fn: Any, interpret: bool) -> Any:
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(fn)
    import triton

    return triton.jit(fn)
