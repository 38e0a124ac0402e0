"""Op attributes as JSON values and back: the codec graph files, plan files and piece signatures share.
Decoding follows each op dataclass's type hints, so a file can only produce attributes the op declares."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import fields
from typing import Any

from .errors import GraphError, SerializationError
from .op import OPS, Op
from .suggest import did_you_mean
from .symbolic import Dim, Expr, free_symbols, parse


def _encode(value: Any) -> Any:
    if isinstance(value, (Expr, Dim)):  # a dynamic size (a slice's stop): its text and its dims
        dims = sorted(free_symbols(value), key=lambda d: d.name)
        return {"expr": str(value), "dims": [d.to_json() for d in dims]}
    if isinstance(value, enum.Enum):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a structured attribute
        return {f.name: _encode(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    return value


def attr_fields(op: Op | type[Op]) -> tuple[dataclasses.Field, ...]:
    """The attributes an op is made of: its dataclass fields that its constructor takes (a field fixed by
    the class, `init=False`, is part of what the kind means, not of the op's attributes)."""
    return tuple(f for f in fields(op) if f.init)


def encode_attrs(op: Op) -> dict[str, Any]:
    return {f.name: _encode(getattr(op, f.name)) for f in attr_fields(op)}


def _decode(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arm in args:
            if arm is type(None):
                continue
            try:
                return _decode(value, arm, where)
            except SerializationError as err:
                errors.append(err.detail)
        raise SerializationError(f"{where}: {value!r} fits none of {hint}", rule="json.attr_type")
    if origin is tuple:
        if not isinstance(value, list):
            raise SerializationError(f"{where}: expected a list, got {value!r}", rule="json.attr_type")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise SerializationError(f"{where}: expected {len(args)} items, got {value!r}", rule="json.attr_type")
        return tuple(_decode(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        if isinstance(value, str) and value in hint.__members__:
            return hint[value]
        raise SerializationError(
            f"{where}: {value!r} is not a {hint.__name__}{did_you_mean(str(value), hint.__members__)}",
            rule="json.attr_enum",
            hint=f"one of {list(hint.__members__)}",
        )
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise SerializationError(f"{where}: expected an object, got {value!r}", rule="json.attr_type")
        hints = typing.get_type_hints(hint)
        names = {f.name for f in fields(hint)}
        if set(value) - names:
            raise SerializationError(f"{where}: unknown field(s) {sorted(set(value) - names)}", rule="json.attr_type")
        try:
            return hint(**{k: _decode(v, hints[k], f"{where}.{k}") for k, v in value.items()})
        except TypeError as err:
            raise SerializationError(f"{where}: {err}", rule="json.attr_type") from None
    return _decode_scalar(value, hint, where)


def _decode_scalar(value: Any, hint: Any, where: str) -> Any:
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SerializationError(f"{where}: expected a number, got {value!r}", rule="json.attr_type")
        return float(value)
    if hint is int and isinstance(value, dict) and set(value) == {"expr", "dims"}:
        return _decode_size(value, where)
    if hint in (int, bool, str):
        if type(value) is not hint:
            raise SerializationError(f"{where}: expected {hint.__name__}, got {value!r}", rule="json.attr_type")
        return value
    raise SerializationError(f"{where}: cannot decode attributes of type {hint}", rule="json.attr_type")


def _decode_size(value: dict[str, Any], where: str) -> Any:
    """A dynamic size attribute: its expression text over the dims it names."""
    dims = value["dims"]
    if not isinstance(dims, list) or not isinstance(value["expr"], str):
        raise SerializationError(f"{where}: a dynamic size needs 'expr' text and a 'dims' list", rule="json.attr_type")
    symbols = {d.name: d for d in (Dim.from_json(doc) for doc in dims)}
    return parse(value["expr"], symbols)


def decode_op(kind: str, attrs: Any, where: str) -> Op:
    cls = OPS.get(kind)
    if cls is None:
        raise SerializationError(
            f"{where}: unknown op kind {kind!r}{did_you_mean(kind, OPS)}",
            rule="json.op_kind",
            hint=f"known kinds: {sorted(OPS)} (a custom op is kind 'custom', registered before loading: "
            "`opgraph check --import MODULE`)",
        )
    if not isinstance(attrs, dict):
        raise SerializationError(f"{where}: 'attrs' must be an object", rule="json.attrs")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in attr_fields(cls)}
    unknown = set(attrs) - names
    if unknown:
        first = sorted(unknown)[0]
        raise SerializationError(
            f"{where}: unknown attribute(s) {sorted(unknown)} for {kind}{did_you_mean(first, names)}",
            rule="json.attrs",
            hint=f"{kind} takes {sorted(names)}",
        )
    try:
        values = {k: _decode(v, hints[k], f"{where}.attrs.{k}") for k, v in attrs.items()}
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise SerializationError(f"{where}: {err}", rule="json.attrs") from None
    except SerializationError:
        raise
    except GraphError as err:  # an attribute's own check (a score modifier's index): say where it is
        raise type(err)(
            f"{where}.attrs: {err.detail}", op=err.op, tensor=err.tensor, rule=err.rule, hint=err.hint
        ) from None
