"""Handles and streams, as cuDNN's frontend has them: `create_handle()`, `set_stream(handle=, stream=)`.

A handle here is the device plans run on (a CUDA GPU when one is usable, else the CPU and its
reference engine) and the stream they run on; nothing is allocated. `stream` is what cuDNN takes (a
raw cudaStream_t as an int, e.g. `torch.cuda.current_stream().cuda_stream`) or a torch.cuda.Stream.
"""

from __future__ import annotations

from typing import Any

from ..core.device import Device, resolve_device
from ..core.errors import GraphError
from .errors import translated


class Handle:
    """What `create_handle` returns; pass it as `handle=` to pygraph and execute."""

    __slots__ = ("destroyed", "device", "stream")

    def __init__(self, device: Device) -> None:
        self.device = device
        self.stream: Any = None
        self.destroyed = False

    def check(self) -> Handle:
        if self.destroyed:
            raise GraphError(
                "the handle was destroyed",
                rule="cudnn.handle_destroyed",
                hint="create a new handle with cudnn.create_handle()",
            )
        return self

    def __repr__(self) -> str:
        return f"<cudnn handle on {self.device}{' (destroyed)' if self.destroyed else ''}>"


@translated
def create_handle(device: Any = None) -> Handle:
    """A handle on `device` (opgraph extension; default: the GPU when usable, else the CPU)."""
    return Handle(resolve_device(device))


def _handle(handle: Any) -> Handle:
    if not isinstance(handle, Handle):
        raise GraphError(
            f"expected a handle from cudnn.create_handle(), got {type(handle).__name__}",
            rule="cudnn.handle",
            hint="create one with cudnn.create_handle()",
        )
    return handle.check()


@translated
def destroy_handle(handle: Handle) -> None:
    _handle(handle).destroyed = True


@translated
def set_stream(handle: Handle, stream: Any) -> None:
    """The stream CUDA plans executed with this handle run on (plans on the CPU run where they are)."""
    _handle(handle).stream = stream


@translated
def get_stream(handle: Handle) -> Any:
    return _handle(handle).stream


__all__ = ["Handle", "create_handle", "destroy_handle", "get_stream", "set_stream"]
