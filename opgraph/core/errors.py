"""The exception family. Every error names the op, the tensor, the rule it broke and what to do next.

GraphError                      anything wrong with a graph or its use
  ShapeError                    dims/strides/rank/broadcasting/geometry
  DataTypeError                 an unsupported or inconsistent data type
  AttributeValueError           an op attribute out of range or of the wrong kind
    BuildOptionError            an unknown build option, or one of the wrong kind (also a TypeError)
  DataflowError                 cycles, double producers, dangling tensors, in-place writes
  DuplicateUIDError             two tensors with one UID
  SerializationError            a graph or plan file that cannot be read
    StateDictError              a checkpoint (state dict) that does not fit what loads it (also a ValueError)
  UnsupportedGraphError         no allowed engine runs a piece (names each engine's reason)
  VariantPackError              a variant pack that does not fit the plan
  ExecutionError                a failure while running a plan
  DistributedError              ranks of a process group that disagree (graphs, shapes), naming the rank
  InternalError                 a broken invariant of opgraph itself (a bug to report)
  RegistrationError             a name registered twice (an op kind, builder, engine, rule, custom op...)
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def printable(text: str, keep: str = "") -> str:
    """`text` with every character that cannot be shown (controls, lone surrogates, other
    non-printables, except those in `keep`) escaped as repr() escapes it: names from files print."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in keep else repr(ch)[1:-1] for ch in text)


def describe_tensor(tensor: Any) -> str:
    """`'name' (uid N)` for a tensor descriptor or handle; strings pass through."""
    if tensor is None:
        return ""
    if isinstance(tensor, str):
        return tensor
    name = printable(getattr(tensor, "name", "") or "<unnamed>")
    uid = getattr(tensor, "uid", None)
    return f"tensor '{name}' (uid {uid})" if uid is not None else f"tensor '{name}'"


def describe_op(op: Any) -> str:
    if op is None:
        return ""
    if isinstance(op, str):
        return op
    label = getattr(op, "label", None)
    return label() if callable(label) else str(op)


class GraphError(Exception):
    """Base of every opgraph error.

    Attributes: `op` and `tensor` (labels of what is at fault, may be empty), `rule` (a stable id such
    as ``conv.channels``), `hint` (what to do about it) and `detail` (the message proper).
    """

    def __init__(
        self,
        message: str,
        *,
        op: Any = None,
        tensor: Any = None,
        rule: str = "",
        hint: str = "",
    ) -> None:
        self.detail = message
        self.op = describe_op(op)
        self.tensor = describe_tensor(tensor)
        self.rule = rule
        self.hint = hint
        super().__init__(printable(self._format(), keep="\n"))

    def _format(self) -> str:
        where = ": ".join(part for part in (self.op, self.tensor) if part)
        text = f"{where}: {self.detail}" if where else self.detail
        if self.rule:
            text += f" [rule {self.rule}]"
        if self.hint:
            text += f"\n  What to do: {self.hint}"
        return text


class ShapeError(GraphError):
    pass


class DataTypeError(GraphError):
    pass


class AttributeValueError(GraphError):
    pass


class BuildOptionError(AttributeValueError, TypeError):
    """An unknown `Graph.build` keyword or a build option of the wrong kind; a TypeError too, as
    Python's own unknown-keyword error is."""


class DataflowError(GraphError):
    pass


class DuplicateUIDError(GraphError):
    pass


class SerializationError(GraphError):
    pass


class StateDictError(SerializationError, ValueError):
    """A state dict that does not fit what loads it (a training step's checkpoint): a missing or unknown
    key, a tensor of the wrong shape, another optimizer's state. A ValueError too, as torch.optim's are."""


class UnsupportedGraphError(GraphError):
    pass


class VariantPackError(GraphError):
    pass


class ExecutionError(GraphError):
    pass


class DistributedError(GraphError):
    """The ranks of a process group disagree (their step graphs or shapes differ): names the rank(s)."""


class RegistrationError(GraphError):
    """A name registered twice with different things (core.registry.Registry)."""


class InternalError(GraphError):
    """A broken invariant of opgraph's own logic: a bug to report, never a problem of the user's graph."""


def expect(value: T | None, what: str) -> T:
    """`value`, which opgraph's own logic guarantees is there (`what` names it); InternalError if it
    is None. For the places a type checker cannot see the guarantee."""
    if value is None:
        raise InternalError(
            f"{what} is missing",
            rule="internal.invariant",
            hint="this is an opgraph bug: please report it with the graph that triggered it",
        )
    return value
