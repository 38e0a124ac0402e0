"""Kernel signatures and a step's private scratch buffers."""

from __future__ import annotations

from ....memory.workspace import align_up
from ..templates.base import Params

# a kernel's parameters and the launch arguments that fill them (templates/base.py)
Signature = Params


class Scratch:
    """Offsets of a step's private scratch buffers (partials), each aligned for vector loads."""

    def __init__(self) -> None:
        self.size = 0

    def alloc(self, nbytes: int) -> int:
        offset = self.size
        self.size += align_up(max(nbytes, 4))
        return offset
