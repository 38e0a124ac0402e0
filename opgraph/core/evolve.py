"""A frozen dataclass instance with some fields changed, made without dataclasses.replace's field walk and
__init__: the host paths that copy many small records per new shape of a dynamic plan (its static graph's
tensor descriptors, its kernels' launches and arguments) use it."""

from __future__ import annotations

from typing import Any, TypeVar

D = TypeVar("D")
_SET = object.__setattr__


def evolve(obj: D, **changes: Any) -> D:
    """`obj` with `changes`, as dataclasses.replace makes it but without its field walk and __init__ (about
    4.5 µs each: a dynamic plan copies thousands at each new shape). Only for dataclasses without
    __post_init__ or slots. The fields are set one by one rather than through the instance's `__dict__`,
    which would make each copy a dict object of its own: a dict holding expressions stays tracked by the
    garbage collector, and every shape's copies would count toward its full passes."""
    fields = type(obj).__dataclass_fields__  # type: ignore[attr-defined]
    assert changes.keys() <= fields.keys(), f"not fields of {type(obj).__name__}: {changes.keys()}"
    new = object.__new__(type(obj))
    for name in fields:
        _SET(new, name, changes[name] if name in changes else getattr(obj, name))
    return new


__all__ = ["evolve"]
