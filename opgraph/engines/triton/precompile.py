"""Compiling a generated kernel at build time on the GPU (Triton otherwise compiles on the first
launch): a kernel that does not compile is then an ExecutionError of the build, which gives way to
the next config, instead of an untyped error in the middle of an execute whose earlier steps have
already written their outputs.

Compiling uses Triton's `warmup` with the argument types (no buffers, no launch). If `warmup` itself
does not work with this Triton (a probe kernel fails too), kernels compile on first launch as before.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from ...errors import ExecutionError
from .templates.base import Launch

log = logging.getLogger("opgraph.build")
_WARMUP_WORKS: bool | None = None


def _probe() -> bool:
    """Whether `warmup` compiles a trivial kernel here."""
    global _WARMUP_WORKS
    if _WARMUP_WORKS is None:
        try:
            import torch

            from .loader import load_module

            module = load_module("import triton\nimport triton.language as tl\n\n"
                                 "def kernel(p):\n    tl.store(p, tl.load(p) + 1.0)\n", interpret=False)
            module.kernel.warmup(torch.float32, grid=(1,))
            _WARMUP_WORKS = True
        except Exception as err:  # noqa: BLE001 - another Triton's API: fall back to compiling on first launch
            log.info("Triton's warmup does not work here (%s: %s); kernels compile on first launch",
                     type(err).__name__, err)
            _WARMUP_WORKS = False
    return _WARMUP_WORKS


def _mock_args(launch: Launch, types: Any) -> list[Any]:
    import torch

    args: list[Any] = []
    for a in launch.args:
        if a.kind == "buf":
            args.append(types[a.uid].to_torch())
        elif a.kind == "scalar":
            args.append(1.0)
        elif a.kind == "scratch":
            args.append(getattr(torch, a.dtype))
        else:  # the by-reference address table
            args.append(torch.int64)
    return args


def precompile(launches: Sequence[Launch], launchers: Sequence[Any], types: Any, label: str,
               device_index: int) -> None:
    """Compile every launch's kernel for 16-byte-aligned buffers of the piece's types; raise
    ExecutionError (naming `label`, the piece) where one does not compile."""
    if _WARMUP_WORKS is False:
        return
    import torch

    for launch, launcher in zip(launches, launchers):
        try:
            with torch.cuda.device(device_index):
                launcher.fn.warmup(*_mock_args(launch, types), grid=launcher.grid, **launcher.meta)
        except Exception as err:  # noqa: BLE001 - Triton's compile errors have many types
            if not _probe():
                return
            text = str(err).strip().splitlines()
            raise ExecutionError(
                f"the generated kernel '{launch.kernel}' does not compile: {type(err).__name__}: "
                f"{text[-1][:300] if text else ''}", op=label, rule="triton.compile",
                hint="the build tries the next config; if none compiles, allow another engine (e.g. 'torch') "
                     "and report the graph",
            ) from None
