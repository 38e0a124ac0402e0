"""Engines by name. An engine module registers itself; `get_engine` finds it.

reference  NumPy, float64 accumulation, any op on the CPU: the executable specification
triton     generated Triton kernels (compiled on CUDA, interpreted on the CPU)
torch      every op, one by one, through PyTorch (cuDNN and cuBLAS for convolutions and matmuls)
library    a convolution or matmul through PyTorch's library call, its prologue and epilogue
           as generated Triton kernels around it
cudnn      a piece lowered to one cuDNN frontend graph (nvidia-cudnn-frontend, optional)
"""

from __future__ import annotations

import importlib

from ..core.config import BehaviorNote, EngineConfig, NumericalNote, Support
from ..core.errors import UnsupportedGraphError
from ..core.registry import Registry
from .base import Engine, Kernel

ENGINES: Registry[str, Engine] = Registry(
    "engine", same=type
)  # (a fresh instance of the same engine class is the same engine)
# Engines that live in modules of their own, loaded on first use so that the core imports no
# GPU library.
_LAZY = {
    "reference": ".reference",
    "triton": ".triton",
    "torch": ".torch_engine",
    "library": ".library",
    "cudnn": ".cudnn_frontend",
}


def register_engine(engine: Engine, *, replace: bool = False) -> Engine:
    """Make `engine` known by its name (a RegistrationError if another engine has that name)."""
    return ENGINES.register(engine.name, engine, replace=replace)


def get_engine(name: str) -> Engine:
    if name not in ENGINES and name in _LAZY:
        importlib.import_module(_LAZY[name], __name__)
    if name not in ENGINES:
        known = ", ".join(sorted(set(ENGINES) | set(_LAZY)))
        raise UnsupportedGraphError(
            f"there is no engine named {name!r}", rule="engine.unknown", hint=f"pick from: {known}"
        )
    return ENGINES[name]


def engine_names() -> list[str]:
    return sorted(set(ENGINES) | set(_LAZY))


__all__ = [
    "BehaviorNote",
    "Engine",
    "EngineConfig",
    "Kernel",
    "NumericalNote",
    "Support",
    "ENGINES",
    "register_engine",
    "get_engine",
    "engine_names",
]
