"""cuDNN's exception types in name, opgraph's messages in content.

cuDNN frontend raises `cudnn.cudnnGraphNotSupportedError` when no engine runs a graph and
RuntimeError for everything else; programs catch those. The shim raises opgraph's typed errors
(op, tensor UID, rule, what to do) as classes that are both: `cudnnGraphNotSupportedError` is an
`opgraph.UnsupportedGraphError` and a RuntimeError, and every other opgraph error comes out as a
subclass of its own class and RuntimeError (`except opgraph.ShapeError` and `except RuntimeError`
both catch a bad conv)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from ..core.errors import GraphError, UnsupportedGraphError


class cudnnGraphNotSupportedError(UnsupportedGraphError, RuntimeError):
    """No engine (config) runs the graph, or none is left after the filters."""


_AS_RUNTIME: dict[type[GraphError], type[GraphError]] = {UnsupportedGraphError: cudnnGraphNotSupportedError}


def _runtime_class(cls: type[GraphError]) -> type[GraphError]:
    if issubclass(cls, RuntimeError):
        return cls
    if cls not in _AS_RUNTIME:
        extra = cudnnGraphNotSupportedError if issubclass(cls, UnsupportedGraphError) else RuntimeError
        _AS_RUNTIME[cls] = type(cls.__name__, (cls, extra), {"__module__": __name__, "__doc__": cls.__doc__})
    return _AS_RUNTIME[cls]


def as_cudnn_error(err: GraphError) -> GraphError:
    """The same error (message, op, tensor, rule, hint) as a class that is also a RuntimeError
    (cudnnGraphNotSupportedError for UnsupportedGraphError)."""
    cls = _runtime_class(type(err))
    if type(err) is cls:
        return err
    new = cls.__new__(cls)
    new.__dict__.update(err.__dict__)
    new.args = err.args
    return new


P = ParamSpec("P")
R = TypeVar("R")


def translated(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a shim entry point: opgraph errors leave it as their cuDNN-catchable classes."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except GraphError as err:
            converted = as_cudnn_error(err)
            if converted is err:
                raise
            raise converted.with_traceback(err.__traceback__) from None

    return wrapper


__all__ = ["as_cudnn_error", "cudnnGraphNotSupportedError", "translated"]
