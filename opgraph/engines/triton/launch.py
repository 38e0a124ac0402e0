"""Launching generated kernels with little host time.

The first launch of each kernel goes through Triton's normal path (`kernel[grid](...)`: argument
binding, specialisation, compilation or cache lookup), which costs ~20 µs of Python. It returns the
compiled kernel, which later launches call directly (`CompiledKernel.run`, ~5 µs), as long as
nothing that Triton specialised on changed: our kernels bake dims and strides in, so what can change
is the 16-byte alignment of each pointer (part of the key below) and the scalar values (passed as
they are). Any failure of the direct path (another Triton version) turns it off for that kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def alignment_key(args: Sequence[Any]) -> tuple:
    return tuple(a.data_ptr() % 16 == 0 if hasattr(a, "data_ptr") else type(a) for a in args)


def _stream_getter(device_index: int) -> Any:
    """A fast function returning the current CUDA stream's raw handle (a private PyTorch call that
    Inductor uses too; the public API as a fallback)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return lambda: raw(device_index)
    return lambda: torch.cuda.current_stream(device_index).cuda_stream


def grid3(grid: tuple[int, ...]) -> tuple[int, int, int]:
    """A launch grid of one to three dims as CUDA takes it: three, the missing ones 1."""
    return (*grid, *(1,) * (3 - len(grid)))  # type: ignore[return-value]


class Launcher:
    def __init__(
        self, fn: Any, grid: tuple[int, ...], meta: dict[str, Any], direct: bool, device_index: int = 0
    ) -> None:
        self.fn = fn
        self.grid = grid3(grid)
        self.meta = meta
        self.direct = direct
        self.device_index = device_index
        self.compiled: dict[tuple, Any] = {}
        self.names: list[str] = list(getattr(fn, "arg_names", []))
        self.tail: list[Any] | None = None  # constexpr values after the runtime arguments
        self.current_stream: Any = None

    def __call__(self, args: list[Any], stream: Any) -> None:
        if self.direct:
            ck = self.compiled.get(alignment_key(args))
            if ck is not None:
                try:
                    self._run(ck, args, stream)
                    return
                except Exception:  # noqa: BLE001 - another Triton's launcher: use the normal path from now on
                    self.direct = False
        ck = self.fn[self.grid](*args, **self.meta)
        if self.direct and ck is not None and hasattr(ck, "run"):
            self.compiled[alignment_key(args)] = ck

    def _run(self, ck: Any, args: list[Any], stream: Any) -> None:
        if stream is None:
            if self.current_stream is None:
                self.current_stream = _stream_getter(self.device_index)
            handle = self.current_stream()
        else:
            handle = stream if isinstance(stream, int) else stream.cuda_stream
        if self.tail is None:
            self.tail = [self.meta[n] for n in self.names[len(args) :]]
        gx, gy, gz = self.grid
        ck.run(gx, gy, gz, handle, ck.function, ck.packed_metadata, None, None, None, *args, *self.tail)
