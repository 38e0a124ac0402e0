"""The cyclic garbage collector held off while a plan is built.

A build (partition, configs, kernel sources, a dynamic plan's plan of a new shape) makes hundreds of
thousands of short-lived objects that reference counting frees; a collection that falls in the middle
promotes the live ones to older generations, and enough promoted objects trigger a full pass over the
process's whole heap (bench/results/constants.md#gc-during-builds). The collector is the interpreter's:
while one thread builds, other threads' collections wait too; it is turned back on after, unless it
was off before.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run the block with the cyclic garbage collector off, then back as it was."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


__all__ = ["gc_paused"]
