"""The cyclic garbage collector held off while a plan is built.

A build (partition, configs, kernel sources, a dynamic plan's plan of a new shape) makes hundreds of
thousands of short-lived objects that reference counting frees; a collection that falls in the middle
promotes the live ones to older generations, and enough promoted objects trigger a full pass over the
process's whole heap (bench/results/constants.md#gc-during-builds). The collector is the interpreter's:
while one thread builds, other threads' collections wait too; it is turned back on when the last build
running ends, unless it was off when the first began.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.Lock()
_DEPTH = 0  # blocks running paused, in every thread
_WAS = False  # whether the collector was on when the first of them began


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run the block with the cyclic garbage collector off, then back as it was when the first of the
    blocks running at once (in any thread) began."""
    global _DEPTH, _WAS
    with _LOCK:
        if _DEPTH == 0:
            _WAS = gc.isenabled()
            gc.disable()
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0 and _WAS:
                gc.enable()


__all__ = ["gc_paused"]
