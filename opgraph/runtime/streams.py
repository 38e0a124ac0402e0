"""The stream an execute runs on, interpreted once (per execute) and one way for every step.

`execute(pack, stream=...)` takes None (PyTorch's current stream on the plan's device), a raw
cudaStream_t as an int, a `torch.cuda.Stream` (ExternalStream included) of the plan's device, or any
object with the CUDA stream protocol's `__cuda_stream__()` (cuda.core, CuPy, ...). It becomes one raw
handle, which native launches take from the binding's stream slot, and, when it is not already
PyTorch's current stream, one torch stream object that the runtime makes current around the steps
that launch through PyTorch. Anything else is a VariantPackError before any step runs. A CPU plan
runs on no stream: it takes None only.
"""

from __future__ import annotations

import threading
from typing import Any

from ..core.device import Device
from ..core.errors import VariantPackError

_MAX_EXTERNAL = 16


class StreamResolver:
    def __init__(self, device: Device) -> None:
        self.device = device
        self._external: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.current: Any = None
        if device.is_cuda:
            import torch

            index = device.index
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Inductor calls: a fast read
            self.current = (
                (lambda: raw(index)) if raw is not None else (lambda: torch.cuda.current_stream(index).cuda_stream)
            )
            self._torch_stream_type = torch.cuda.Stream

    def __call__(self, stream: Any) -> tuple[int, Any]:
        """(raw handle, torch stream to make current or None when it already is)."""
        if not self.device.is_cuda:
            if stream is None:
                return 0, None
            raise VariantPackError(
                f"a CPU plan runs on no stream, got {type(stream).__name__}",
                rule="execute.stream",
                hint="pass stream=None (or build the plan for a GPU)",
            )
        current = self.current()
        if stream is None:
            return current, None
        handle = self.handle(stream)
        if handle == current:
            return handle, None
        if isinstance(stream, self._torch_stream_type):
            return handle, stream
        ext = self._external.get(handle)
        if ext is None:
            import torch

            ext = torch.cuda.ExternalStream(handle, device=self.device.torch_name)
            with self._lock:  # threads share a plan's resolver
                if len(self._external) >= _MAX_EXTERNAL:
                    self._external.pop(next(iter(self._external)), None)
                self._external[handle] = ext
        return handle, ext

    def handle(self, stream: Any) -> int:
        if type(stream) is int:
            if stream < 0:
                raise VariantPackError(
                    f"a raw stream handle must be >= 0, got {stream}",
                    rule="execute.stream",
                    hint="pass torch.cuda.Stream.cuda_stream, a stream object, or None",
                )
            return stream
        if isinstance(stream, self._torch_stream_type):
            index = stream.device.index if stream.device.index is not None else 0
            if stream.device.type != "cuda" or index != self.device.index:
                raise VariantPackError(
                    f"the stream is on {stream.device} but the plan runs on {self.device.torch_name}",
                    rule="execute.stream_device",
                    hint="pass a stream of the plan's device",
                )
            return int(stream.cuda_stream)
        protocol = getattr(stream, "__cuda_stream__", None)
        if callable(protocol):
            try:
                version, handle = protocol()
                return int(handle)
            except (TypeError, ValueError):
                pass
        raise VariantPackError(
            f"cannot run on a stream given as {type(stream).__name__}",
            rule="execute.stream",
            hint="pass None (the current stream), a torch.cuda.Stream, an object with __cuda_stream__, or a raw "
            "cudaStream_t as an int",
        )
