"""Custom ops opgraph itself emits, registered when the op families are imported so that graphs and
plan files naming them load in any process that imports opgraph (pooling's backward ops live in
pooling_backward.py):

    slice_backward(dy; in_dim, bounds) -> dx   dy scattered into zeros of dims in_dim at `bounds`
                                                ("start:stop:step" per axis, comma-separated); the
                                                gradient of slice (autodiff/rules_layout.py)
    stop_gradient(x) -> x                       x itself, through which opgraph.grad passes no
                                                gradient (its rule: autodiff/rules_builtin_custom.py;
                                                training.losses uses it)
"""

from __future__ import annotations

import builtins

import numpy as np

from .custom import CUSTOM_OPS, register_custom_op

SLICE_BACKWARD = "slice_backward"
STOP_GRADIENT = "stop_gradient"


def ints(text: str) -> tuple[int, ...]:
    """"2,3,4" -> (2, 3, 4) (custom-op parameters are plain values); as_text's inverse."""
    return tuple(int(v) for v in text.split(",")) if text else ()


def as_text(values) -> str:
    """(2, 3, 4) -> "2,3,4"."""
    return ",".join(str(int(v)) for v in values)


def _bounds(text: str) -> tuple[builtins.slice, ...]:
    return tuple(builtins.slice(*(int(v) for v in item.split(":"))) for item in text.split(","))


def _slice_backward_ref(dy: np.ndarray, *, in_dim: str, bounds: str) -> np.ndarray:
    dx = np.zeros(ints(in_dim))
    dx[_bounds(bounds)] = dy
    return dx


def _slice_backward_torch(dy, *, in_dim: str, bounds: str):
    import torch

    dx = torch.zeros(ints(in_dim), dtype=dy.dtype, device=dy.device)
    dx[_bounds(bounds)] = dy
    return dx


class _TritonByName:
    """A Triton function named by module and name, imported only by the generated kernels that call
    it (so that registering the op imports no GPU library)."""

    def __init__(self, module: str, name: str) -> None:
        self.__module__ = module
        self.__qualname__ = name


def ensure_registered() -> None:
    """Register the ops (again, if a test emptied the registry)."""
    if SLICE_BACKWARD not in CUSTOM_OPS:
        register_custom_op(SLICE_BACKWARD, num_inputs=1, reference=_slice_backward_ref,
                           infer=lambda dy, in_dim, bounds: [ints(in_dim)], torch=_slice_backward_torch)
    if STOP_GRADIENT not in CUSTOM_OPS:
        register_custom_op(STOP_GRADIENT, num_inputs=1, reference=lambda x: x, torch=lambda x: x,
                           triton=_TritonByName("opgraph.engines.triton.functions", "identity"), pointwise=True)


ensure_registered()
