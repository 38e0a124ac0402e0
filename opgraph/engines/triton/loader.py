"""Turning generated source into launchable Triton kernels.

Triton reads a kernel's source from its file, so generated code is written to a cache folder
(named by the hash of the source; opgraph.core.cache keeps it under a size cap) and imported from
there. On the CPU the kernel functions are wrapped by Triton's interpreter, on CUDA by `triton.jit`
(compile_worker.exec_generated, shared with the compile workers).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
import weakref
from collections import OrderedDict
from pathlib import Path
from types import ModuleType

from ...core.cache import describe, fault, kernel_dir, note_kernel_written, private_dir, unwritable, write_atomic
from .compile_worker import exec_generated

# Generated modules live as long as a kernel holds them (TritonKernel.module), plus the RECENT last
# loaded (a plan built again soon after its predecessor was dropped loads nothing): plans built and
# dropped one after the other leave no module behind, and none is kept in sys.modules
_MODULES: weakref.WeakValueDictionary[tuple[str, bool, bool], ModuleType] = weakref.WeakValueDictionary()
_RECENT: OrderedDict[tuple[str, bool, bool], ModuleType] = OrderedDict()
RECENT = 32
_LOCK = threading.RLock()
_LOADED: set[Path] = set()  # files this process imported: never pruned under it


def cache_dir() -> Path:
    """Where generated sources are written (opgraph.core.cache: size cap, `opgraph cache info|clear`)."""
    return kernel_dir()


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:20]


def module_file(source: str) -> Path:
    """The generated source's file in the cache (written once; Triton reads kernels' source from it).
    A cache that cannot hold it (unwritable, a folder or other bytes in its place) gives this
    process's private folder instead, with one CacheWarning."""
    folder = cache_dir()
    path = folder / f"og_{source_hash(source)}.py"
    data = source.encode()
    try:
        same = path.read_bytes() == data
        if not same:
            fault(
                path,
                "held other bytes than its name's hash; written again",
                "nothing: it is repaired (if this recurs, look for what else writes into the cache)",
            )
    except FileNotFoundError:
        same = False
    except OSError as err:  # a folder, or no right to read it
        fault(path, f"cannot be read ({describe(err)}); this process uses a copy in a temporary folder", "remove it")
        return _private_file(path.name, data)
    if same:
        _LOADED.add(path)
        with contextlib.suppress(OSError):  # another user's file: used as it is
            os.utime(path)  # recently used: the cache's pruning keeps it
        return path
    try:
        write_atomic(path, data)
    except OSError as err:
        unwritable(err)
        return _private_file(path.name, data)
    _LOADED.add(path)
    note_kernel_written(folder, _LOADED)
    return path


def _private_file(name: str, data: bytes) -> Path:
    path = private_dir() / name
    if not path.exists():
        write_atomic(path, data)
    return path


def module_name(source: str, interpret: bool, fast_casts: bool = True) -> str:
    suffix = "" if fast_casts or not interpret else "_slow"
    return f"opgraph_generated_{source_hash(source)}_{'interp' if interpret else 'jit'}{suffix}"


def load_module(source: str, *, interpret: bool, fast_casts: bool = True) -> ModuleType:
    """Import generated source; every top-level function named `kernel*` becomes a Triton kernel
    and every `_og_*` function a Triton device function (compile_worker.exec_generated, which the
    compile workers share, so both sides hash the same kernels). Interpreted, the cast helpers are
    replaced by their one-step NumPy equivalents (interpreted_casts.py) unless `fast_casts` is False
    (then a helper that is an asm statement, such as bfloat16's cvt, cannot run)."""
    key = (source_hash(source), interpret, fast_casts or not interpret)
    with _LOCK:
        module = _MODULES.get(key)
        if module is None:
            module = _load(source, interpret, fast_casts)
            _MODULES[key] = module
        _RECENT[key] = module
        _RECENT.move_to_end(key)
        while len(_RECENT) > RECENT:
            _RECENT.popitem(last=False)
    return module


def _load(source: str, interpret: bool, fast_casts: bool) -> ModuleType:
    name = module_name(source, interpret, fast_casts)
    module = exec_generated(str(module_file(source)), name, jit=not interpret)
    if sys.modules.get(name) is module:  # needed while it executes only: the kernels hold their globals
        del sys.modules[name]
    if interpret and fast_casts:
        from .interpreted_casts import FAST

        for attr, fn in FAST.items():
            if hasattr(module, attr):
                setattr(module, attr, fn)
    return module


def loaded_modules() -> int:
    """Generated modules alive in this process (held by kernels, or among the RECENT last loaded)."""
    return len(_MODULES)
