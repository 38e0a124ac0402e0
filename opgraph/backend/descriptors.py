"""Descriptors and the four calls that make them: `create_descriptor`, `set_attribute`, `get_attribute`,
`finalize` (and `destroy_descriptor`), as cudnnBackend* has them, with opgraph's validation.

Every refusal is a `BackendError` (an opgraph GraphError) that names the descriptor, the attribute,
the rule broken and what to set, and carries the cudnnStatus_t cuDNN would return (`err.status`).
Successful calls return CUDNN_STATUS_SUCCESS, so `assert set_attribute(...) == CUDNN_STATUS_SUCCESS`
ports as written. What finalize does per descriptor type is registered in FINALIZERS (tensors and op
attribute descriptors in descriptor_checks.py, operation graphs in lowering.py; heuristics, engines,
configs and plans in plans.py).
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.errors import GraphError
from ..cudnn.handles import Handle
from .names import VALUE_ENUMS, AttributeName, AttributeType, DescriptorType, Status
from .schema import SCHEMA, Attr

T = AttributeType
_serial = itertools.count(1)


class BackendError(GraphError):
    """A backend call refused. `status`: the cudnnStatus_t; `descriptor`, `attribute`: what is at fault."""

    def __init__(
        self,
        message: str,
        *,
        descriptor: Any = None,
        attribute: Any = None,
        status: Any = Status.CUDNN_STATUS_BAD_PARAM,
        rule: str = "",
        hint: str = "",
        tensor: Any = None,
    ) -> None:
        self.status = status
        self.descriptor = descriptor.label() if isinstance(descriptor, Descriptor) else (descriptor or "")
        self.attribute = getattr(attribute, "name", attribute) or ""
        where = f"{self.attribute}: " if self.attribute else ""
        super().__init__(f"{where}{message} ({status.name})", op=self.descriptor, tensor=tensor, rule=rule, hint=hint)


class Descriptor:
    """A backend descriptor: its type, the attributes set so far and, once finalized, what opgraph made
    of it (`state`)."""

    __slots__ = ("__weakref__", "attrs", "destroyed", "finalized", "serial", "state", "type")

    def __init__(self, kind: DescriptorType) -> None:
        self.type = kind
        self.attrs: dict[AttributeName, tuple[AttributeType, list[Any]]] = {}
        self.finalized = False
        self.destroyed = False
        self.serial = next(_serial)
        self.state: Any = None

    def label(self) -> str:
        text = f"{self.type.name} #{self.serial}"
        uid = self.attrs.get(AttributeName.CUDNN_ATTR_TENSOR_UNIQUE_ID)
        return text + (f" (uid {uid[1][0]})" if uid else "")

    def has(self, name: AttributeName) -> bool:
        return name in self.attrs

    def value(self, name: AttributeName, default: Any = None) -> Any:
        """The single value of an attribute (or `default` when not set)."""
        return self.attrs[name][1][0] if name in self.attrs else default

    def values(self, name: AttributeName) -> list[Any]:
        return list(self.attrs[name][1]) if name in self.attrs else []

    def kind_of(self, name: AttributeName) -> AttributeType | None:
        return self.attrs[name][0] if name in self.attrs else None

    def __repr__(self) -> str:
        state = "destroyed" if self.destroyed else "finalized" if self.finalized else "open"
        return f"<{self.label()} {state}>"


def create_descriptor(kind: DescriptorType) -> Descriptor:
    """cudnnBackendCreateDescriptor: an empty descriptor of a type opgraph implements."""
    if not isinstance(kind, DescriptorType):
        raise BackendError(
            f"{kind!r} is not a cudnnBackendDescriptorType_t",
            rule="backend.descriptor_type",
            hint="pass a DescriptorType member, e.g. CUDNN_BACKEND_TENSOR_DESCRIPTOR",
        )
    if kind not in SCHEMA:
        raise BackendError(
            f"{kind.name} is not implemented by opgraph",
            status=Status.CUDNN_STATUS_NOT_SUPPORTED,
            rule="backend.descriptor_type",
            hint="implemented: " + ", ".join(k.name for k in SCHEMA),
        )
    return Descriptor(kind)


def _usable(desc: Any, what: str = "descriptor") -> Descriptor:
    if not isinstance(desc, Descriptor):
        raise BackendError(
            f"expected a backend descriptor as {what}, got {type(desc).__name__}",
            status=Status.CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
            rule="backend.descriptor",
            hint="pass what create_descriptor returned",
        )
    if desc.destroyed:
        raise BackendError(
            "the descriptor was destroyed",
            descriptor=desc,
            rule="backend.destroyed",
            hint="create a new one; destroy descriptors only after their last use",
        )
    return desc


def _spec(desc: Descriptor, name: Any) -> Attr:
    if not isinstance(name, AttributeName):
        raise BackendError(
            f"{name!r} is not a cudnnBackendAttributeName_t",
            descriptor=desc,
            rule="backend.attribute_name",
            hint="pass an AttributeName member (CUDNN_ATTR_...)",
        )
    spec = SCHEMA[desc.type].get(name)
    if spec is None:
        known = ", ".join(a.name for a in SCHEMA[desc.type])
        raise BackendError(
            f"{desc.type.name} has no attribute {name.name}",
            descriptor=desc,
            attribute=name,
            rule="backend.attribute_name",
            hint=f"its attributes are: {known}",
        )
    return spec


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_buffer(v: Any) -> bool:
    return (
        isinstance(v, np.ndarray)
        or hasattr(v, "data_ptr")
        or hasattr(v, "__dlpack__")
        or hasattr(v, "__cuda_array_interface__")
    )


def _check_value(desc: Descriptor, name: AttributeName, spec: Attr, kind: AttributeType, v: Any) -> Any:
    def bad(what: str, hint: str, status: Any = Status.CUDNN_STATUS_BAD_PARAM) -> BackendError:
        return BackendError(
            f"{what} (got {v!r})",
            descriptor=desc,
            attribute=name,
            status=status,
            rule="backend.attribute_value",
            hint=hint,
        )

    if kind in (T.CUDNN_TYPE_INT64, T.CUDNN_TYPE_INT32):
        if not _is_int(v):
            raise bad(f"{kind.name} values are ints", "pass Python ints")
        return int(v)
    if kind in (T.CUDNN_TYPE_FLOAT, T.CUDNN_TYPE_DOUBLE):
        if not isinstance(v, numbers.Real) or isinstance(v, (bool, np.bool_)):
            raise bad(f"{kind.name} values are real numbers", "pass a Python float")
        return float(v)
    if kind is T.CUDNN_TYPE_BOOLEAN:
        if not isinstance(v, (bool, np.bool_)):
            raise bad("CUDNN_TYPE_BOOLEAN values are bools", "pass True or False")
        return bool(v)
    if kind in VALUE_ENUMS:
        enum_cls = VALUE_ENUMS[kind]
        if not isinstance(v, enum_cls):
            raise bad(
                f"{kind.name} values are {enum_cls.__name__} members",
                f"pass one of {', '.join(m.name for m in list(enum_cls)[:6])}, ...",
            )
        return v
    if kind is T.CUDNN_TYPE_BACKEND_DESCRIPTOR:
        if not isinstance(v, Descriptor) or v.destroyed:
            raise bad(
                "CUDNN_TYPE_BACKEND_DESCRIPTOR values are live descriptors",
                "pass descriptors from create_descriptor",
                Status.CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
            )
        if spec.points_at and v.type not in spec.points_at:
            raise bad(
                f"{name.name} takes a {' or '.join(k.name for k in spec.points_at)}, not a {v.type.name}",
                f"set a {spec.points_at[0].name}",
            )
        if not v.finalized:
            raise BackendError(
                f"{v.label()} is not finalized",
                descriptor=desc,
                attribute=name,
                status=Status.CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
                rule="backend.not_finalized",
                hint=f"call finalize() on {v.label()} before setting it as {name.name}",
            )
        return v
    if kind is T.CUDNN_TYPE_VOID_PTR:
        if _is_int(v):
            if int(v) < 0:
                raise bad("a pointer is a non-negative address", "pass tensor.data_ptr()")
            return int(v)
        if v is None or _is_buffer(v):
            return v
        raise bad(
            "CUDNN_TYPE_VOID_PTR values are addresses (ints) or buffers (arrays, tensors)",
            "pass tensor.data_ptr(), or on the CPU the array itself",
        )
    if kind is T.CUDNN_TYPE_HANDLE:
        if not isinstance(v, Handle):
            raise bad("CUDNN_TYPE_HANDLE takes a handle", "pass opgraph.backend.create_handle()")
        return v.check()
    if kind is T.CUDNN_TYPE_CHAR:
        if isinstance(v, (bytes, bytearray)):
            return bytes(v).decode()
        if isinstance(v, str):
            return v
        raise bad("CUDNN_TYPE_CHAR values are strings", "pass the text as a str")
    raise bad(
        f"{kind.name} is not an attribute type opgraph reads",
        "use the types the attribute takes",
        Status.CUDNN_STATUS_NOT_SUPPORTED,
    )


def set_attribute(desc: Descriptor, name: AttributeName, kind: AttributeType, values: Any) -> Any:
    """cudnnBackendSetAttribute: `values` is one value or a sequence (the element count is its length)."""
    desc = _usable(desc)
    spec = _spec(desc, name)
    if desc.finalized:
        raise BackendError(
            "the descriptor is finalized: its attributes are fixed",
            descriptor=desc,
            attribute=name,
            rule="backend.finalized",
            hint="create a new descriptor to describe something else",
        )
    if not spec.settable:
        raise BackendError(
            f"{name.name} is computed by finalize, not set",
            descriptor=desc,
            attribute=name,
            rule="backend.read_only",
            hint="read it with get_attribute after finalize",
        )
    if kind not in spec.types:
        raise BackendError(
            f"{name.name} does not take {getattr(kind, 'name', kind)}",
            descriptor=desc,
            attribute=name,
            status=Status.CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE,
            rule="backend.attribute_type",
            hint=f"set it as {' or '.join(t.name for t in spec.types)}",
        )
    if isinstance(values, (list, tuple)):
        items = list(values)
    elif isinstance(values, np.ndarray) and kind is not T.CUDNN_TYPE_VOID_PTR:
        items = values.reshape(-1).tolist()
    else:
        items = [values]
    if kind is T.CUDNN_TYPE_CHAR and len(items) > 1 and all(isinstance(c, str) and len(c) == 1 for c in items):
        items = ["".join(items)]
    if not spec.many and len(items) != 1:
        raise BackendError(
            f"{name.name} takes one value, got {len(items)}",
            descriptor=desc,
            attribute=name,
            rule="backend.element_count",
            hint="pass a single value",
        )
    if spec.many and not items and spec.required:
        raise BackendError(
            f"{name.name} needs at least one value",
            descriptor=desc,
            attribute=name,
            rule="backend.element_count",
            hint="pass a non-empty list",
        )
    desc.attrs[name] = (kind, [_check_value(desc, name, spec, kind, v) for v in items])
    return Status.CUDNN_STATUS_SUCCESS


GETTERS: dict[DescriptorType, Callable[[Descriptor, AttributeName], list[Any] | None]] = {}


def get_attribute(
    desc: Descriptor,
    name: AttributeName,
    kind: AttributeType,
    requested_count: int | None = None,
    into: Sequence[Descriptor] | None = None,
) -> list[Any]:
    """cudnnBackendGetAttribute: the attribute's values (at most `requested_count`). Descriptor-valued
    results (heuristic results, knob infos) come back as finalized descriptors, or are copied into
    the descriptors of `into` (the C way: created by the caller)."""
    desc = _usable(desc)
    spec = _spec(desc, name)
    if kind not in spec.types:
        raise BackendError(
            f"{name.name} is not {getattr(kind, 'name', kind)}",
            descriptor=desc,
            attribute=name,
            status=Status.CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE,
            rule="backend.attribute_type",
            hint=f"read it as {' or '.join(t.name for t in spec.types)}",
        )
    derived = GETTERS.get(desc.type, lambda d, n: None)(desc, name) if desc.finalized else None
    if derived is None:
        if name not in desc.attrs and not spec.settable:  # (attributes the backend filled in are stored)
            raise BackendError(
                f"{name.name} is known once the descriptor is finalized",
                descriptor=desc,
                attribute=name,
                status=Status.CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
                rule="backend.not_finalized",
                hint="call finalize() first",
            )
        if name not in desc.attrs:
            raise BackendError(
                f"{name.name} is not set",
                descriptor=desc,
                attribute=name,
                rule="backend.not_set",
                hint=f"set it with set_attribute(desc, {name.name}, ...)",
            )
        derived = desc.values(name)
        if kind in (T.CUDNN_TYPE_FLOAT, T.CUDNN_TYPE_DOUBLE):
            derived = [float(v) if isinstance(v, numbers.Real) else v for v in derived]
    if requested_count is not None:
        derived = derived[: max(int(requested_count), 0)]
    if into is not None:
        for target, source in zip(into, derived):
            _usable(target, "an `into` descriptor")
            if not isinstance(source, Descriptor) or target.type is not source.type:
                raise BackendError(
                    f"{target.label()} cannot receive a {getattr(source, 'type', source)}",
                    descriptor=desc,
                    attribute=name,
                    rule="backend.into",
                    hint="create the receiving descriptors with the result's type",
                )
            target.attrs, target.state, target.finalized = dict(source.attrs), source.state, source.finalized
        return list(into[: len(derived)])
    return derived


FINALIZERS: dict[DescriptorType, Callable[[Descriptor], Any]] = {}


def require(desc: Descriptor) -> None:
    """Every required attribute of the descriptor's type is set."""
    for name, spec in SCHEMA[desc.type].items():
        if spec.required and name not in desc.attrs:
            example = spec.types[0].name
            raise BackendError(
                f"{name.name} is not set",
                descriptor=desc,
                attribute=name,
                rule="backend.required",
                hint=f"set_attribute(desc, {name.name}, {example}, ...) before finalize",
            )


def finalize(desc: Descriptor) -> Any:
    """cudnnBackendFinalize: check the descriptor (opgraph's validation for operation graphs) and make
    what it describes."""
    desc = _usable(desc)
    if desc.finalized:
        raise BackendError(
            "the descriptor is already finalized",
            descriptor=desc,
            rule="backend.finalized",
            hint="finalize a descriptor once",
        )
    require(desc)
    desc.state = FINALIZERS.get(desc.type, lambda d: None)(desc)
    desc.finalized = True
    return Status.CUDNN_STATUS_SUCCESS


def destroy_descriptor(desc: Descriptor) -> Any:
    """cudnnBackendDestroyDescriptor."""
    _usable(desc).destroyed = True
    desc.state = None
    return Status.CUDNN_STATUS_SUCCESS


__all__ = [
    "FINALIZERS",
    "GETTERS",
    "BackendError",
    "Descriptor",
    "create_descriptor",
    "destroy_descriptor",
    "finalize",
    "get_attribute",
    "require",
    "set_attribute",
]
