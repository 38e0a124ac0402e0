"""Graph JSON: a versioned, self-describing schema, validated on load.

    {"format": "opgraph.graph", "version": 1, "name": ..., "io_data_type": "HALF", ...,
     "tensors": [{"uid": 1, "name": "X", "dim": [...], "stride": [...], "data_type": "HALF",
                  "is_virtual": false, "is_pass_by_value": false}, ...],
     "ops": [{"op": "pointwise", "name": "relu0", "compute_data_type": "FLOAT",
              "attrs": {"mode": "RELU_FWD", ...},
              "inputs": {"input0": 1, "lower_clip": {"const": 0.5}}, "outputs": {"output": 2}}, ...]}

Loading rebuilds a `Graph` through the same builders' machinery and validates it, so a file can
never produce a graph the API could not.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..core.attrs import decode_op, encode_attrs
from ..core.dtypes import as_data_type
from ..core.errors import GraphError, SerializationError
from ..core.ir import Const, FinalGraph
from ..core.limits import check_file_size, check_strings, preview
from ..core.suggest import did_you_mean
from ..core.symbolic import Dim
from ..core.symbolic import from_json as size_from_json
from ..core.symbolic import to_json as size_to_json
from ..core.symbolic_value import SizeValue
from ..core.tensor import Tensor
from ..ops.custom import upgrade_entry

FORMAT = "opgraph.graph"
VERSION = 1  # a static graph's files (unchanged, so their keys and caches stay)
DYNAMIC_VERSION = 2  # a graph with dynamic dims: "dims" and sizes that are expression texts
VERSIONS = (VERSION, DYNAMIC_VERSION)
MAX_DIMS = 64  # dynamic dims of one graph


def graph_to_dict(g: FinalGraph) -> dict[str, Any]:
    def operand(v: Any) -> Any:
        if isinstance(v, Const):
            return {"const": v.value.to_json() if isinstance(v.value, SizeValue) else v.value}
        return v

    dynamic = {"dims": [d.to_json() for d in g.symbols.values()]} if g.symbols else {}
    return {
        "format": FORMAT,
        "version": DYNAMIC_VERSION if dynamic else VERSION,
        "name": g.name,
        "io_data_type": g.io_data_type.name,
        "intermediate_data_type": g.intermediate_data_type.name,
        "compute_data_type": g.compute_data_type.name,
        **dynamic,
        "tensors": [
            {
                "uid": t.uid,
                "name": t.name,
                "dim": [size_to_json(d) for d in t.dim],
                "stride": [size_to_json(s) for s in t.stride],
                "data_type": t.data_type.name,
                "is_virtual": t.is_virtual,
                "is_pass_by_value": t.is_pass_by_value,
                **({"is_by_reference": True} if t.is_by_reference else {}),
            }
            for t in (g.tensors[u] for u in canonical_order(g))
        ],
        "ops": [
            {
                "op": n.kind,
                "name": n.name,
                "compute_data_type": n.compute_data_type.name,
                "attrs": encode_attrs(n.op),
                "inputs": {r: operand(v) for r, v in zip(n.op.input_roles(), n.inputs) if v is not None},
                "outputs": {r: u for r, u in zip(n.op.output_roles(), n.outputs) if u is not None},
            }
            for n in g.nodes
        ],
    }


def canonical_order(g: FinalGraph) -> list[int]:
    """The order tensors are written in: what the graph reads from outside (in-place updates included)
    as declared, then what its ops produce, op by op in execution order. A graph read back lists them
    so again (the order inference met them in depends on how the ops were added: not canonical)."""
    produced = {u: n for n in g.nodes for u in n.output_uids()}
    order = {u: None for u in g.tensors if u not in produced or u in produced[u].input_uids()}
    for n in g.nodes:
        order.update((u, None) for u in n.output_uids())
    order.update((u, None) for u in g.tensors)  # (every tensor is one of those: kept whatever happens)
    return list(order)


def graph_to_json(g: FinalGraph, indent: int | None = 2) -> str:
    return json.dumps(graph_to_dict(g), indent=indent)


def graph_key(g: FinalGraph) -> str:
    return hashlib.sha256(json.dumps(graph_to_dict(g), sort_keys=True).encode()).hexdigest()


def _field(obj: dict, key: str, kind: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    if key not in obj:
        if default is not ...:
            return default
        raise SerializationError(f"{where}: missing '{key}'", rule="json.missing_field")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        names = " or ".join(_JSON_NAMES.get(k, k.__name__) for k in kinds)
        raise SerializationError(f"{where}.{key}: expected {names}, got {value!r}", rule="json.field_type")
    return value


_JSON_NAMES = {list: "a list", dict: "an object", str: "a string", int: "an integer", bool: "true or false"}
# the keys each object of a graph file may have (schema/graph.schema.json says the same)
GRAPH_KEYS = (
    "format",
    "version",
    "name",
    "io_data_type",
    "intermediate_data_type",
    "compute_data_type",
    "dims",
    "tensors",
    "ops",
)
TENSOR_KEYS = ("uid", "name", "dim", "stride", "data_type", "is_virtual", "is_pass_by_value", "is_by_reference")
OP_KEYS = ("op", "name", "compute_data_type", "attrs", "inputs", "outputs")


def _known_keys(obj: dict, keys: tuple[str, ...], where: str) -> None:
    """A misspelt key would otherwise be ignored silently (and its default used)."""
    unknown = sorted(k for k in obj if k not in keys)
    if unknown:
        raise SerializationError(
            f"{where}: unknown key {preview(unknown[0], 80)}{did_you_mean(unknown[0], keys)}",
            rule="json.unknown_key",
            hint=f"the keys here are {list(keys)}",
        )


def graph_from_json(text: str | bytes) -> Any:
    """A validated Graph from graph JSON (a file's size and its strings are bounded: core/limits.py)."""
    if isinstance(text, (str, bytes, bytearray)):
        check_file_size(len(text), "graph file")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as err:  # bad syntax or encoding, huge numbers, deep nesting
        raise SerializationError(
            f"not valid JSON: {type(err).__name__}: {str(err)[:200]}", rule="json.syntax"
        ) from None
    except TypeError:
        raise SerializationError(
            f"a graph file is text or bytes, not {type(text).__name__}", rule="json.syntax"
        ) from None
    return graph_from_dict(doc)


def graph_from_dict(doc: Any) -> Any:
    """A validated Graph from a parsed graph document (see graph_from_json)."""
    from .builder import Graph

    check_strings(doc, "graph")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SerializationError(
            f"not an opgraph graph file (format is {doc.get('format') if isinstance(doc, dict) else None!r})",
            rule="json.format",
            hint=f'graph files have "format": "{FORMAT}"',
        )
    version = doc.get("version")
    if type(version) is not int or version not in VERSIONS:
        raise SerializationError(
            f"graph file version {version!r} is not supported (this opgraph reads versions {list(VERSIONS)})",
            rule="json.version",
            hint="re-export the graph with this opgraph version",
        )
    try:
        return _load(doc, Graph)
    except GraphError as err:
        if isinstance(err, SerializationError):
            raise
        raise type(err)(
            f"in the graph file: {err.detail}", op=err.op, tensor=err.tensor, rule=err.rule, hint=err.hint
        ) from None


def _dims(doc: dict) -> dict[str, Dim]:
    """The dynamic dims a file declares (version 2), by name."""
    entries = _field(doc, "dims", list, "graph", [])
    if bool(entries) != (doc.get("version") == DYNAMIC_VERSION):
        raise SerializationError(
            f"a graph file is version {DYNAMIC_VERSION} exactly when it declares dynamic dims "
            f"(this one is version {doc.get('version')} with {len(entries)})",
            rule="json.version",
            hint="write the graph with Graph.to_json",
        )
    if len(entries) > MAX_DIMS:
        raise SerializationError(f"{len(entries)} dynamic dims are beyond {MAX_DIMS}", rule="json.dims")
    symbols: dict[str, Dim] = {}
    for entry in entries:
        dim = Dim.from_json(entry)
        if dim.name in symbols:
            raise SerializationError(
                f"dims: '{dim.name}' is declared twice", rule="json.dims", hint="declare each dynamic dim once"
            )
        symbols[dim.name] = dim
    return symbols


def _load(doc: dict, graph_cls: Any) -> Any:
    _known_keys(doc, GRAPH_KEYS, "graph")
    # keys the Python API defaults are optional here too, with the same defaults
    g = graph_cls(
        name=_field(doc, "name", str, "graph", ""),
        io_data_type=as_data_type(_field(doc, "io_data_type", str, "graph", "HALF")),
        intermediate_data_type=as_data_type(_field(doc, "intermediate_data_type", str, "graph", "FLOAT")),
        compute_data_type=as_data_type(_field(doc, "compute_data_type", str, "graph", "FLOAT")),
    )
    symbols = _dims(doc)

    def sizes(t: dict, key: str, where: str) -> list[Any] | None:
        values = _field(t, key, list, where, None)  # (what is not a size is refused by g.tensor)
        if values is None or not symbols:
            return values
        return [size_from_json(v, symbols) if isinstance(v, str) else v for v in values]

    handles: dict[int, Tensor] = {}
    entries: dict[int, dict] = {}
    for i, t in enumerate(_field(doc, "tensors", list, "graph")):
        where = f"tensors[{i}]"
        if not isinstance(t, dict):
            raise SerializationError(f"{where}: expected an object", rule="json.tensor")
        _known_keys(t, TENSOR_KEYS, where)
        uid = _field(t, "uid", int, where)
        if uid in entries:
            raise SerializationError(f"{where}: UID {uid} listed twice", rule="json.duplicate_uid")
        entries[uid] = t
        dtype = _field(t, "data_type", str, where, None)
        handles[uid] = g.tensor(
            dim=sizes(t, "dim", where),
            stride=sizes(t, "stride", where),
            data_type=None if dtype is None else as_data_type(dtype),
            name=_field(t, "name", str, where, ""),
            uid=uid,
            is_virtual=_field(t, "is_virtual", bool, where, False),
            is_pass_by_value=_field(t, "is_pass_by_value", bool, where, False),
            is_by_reference=_field(t, "is_by_reference", bool, where, False),
        )
    for i, o in enumerate(_field(doc, "ops", list, "graph")):
        where = f"ops[{i}]"
        if not isinstance(o, dict):
            raise SerializationError(f"{where}: expected an object", rule="json.op")
        o = upgrade_entry(o, where)  # a built-in op that files once named as a custom op
        _known_keys(o, OP_KEYS, where)
        op = decode_op(_field(o, "op", str, where), _field(o, "attrs", dict, where, {}), where)
        ins = _field(o, "inputs", dict, where)
        outs = _field(o, "outputs", dict, where)
        for roles, given, what in ((op.input_roles(), ins, "input"), (op.output_roles(), outs, "output")):
            for role in given:
                if role not in roles:
                    raise SerializationError(
                        f"{where}: {op.kind} has no {what} role '{role}'{did_you_mean(role, roles)}",
                        rule="json.role",
                        hint=f"its {what} roles are {list(roles)}",
                    )

        def operand(role: str, ins: dict = ins, where: str = where) -> Any:
            v = ins.get(role)
            if v is None:
                return None
            if isinstance(v, dict) and set(v) == {"const"} and isinstance(v["const"], (int, float, bool)):
                return v["const"]
            if isinstance(v, dict) and set(v) == {"const"} and isinstance(v["const"], dict) and symbols:
                return SizeValue.from_json(v["const"], symbols)
            if isinstance(v, int) and not isinstance(v, bool) and v in handles:
                return handles[v]
            raise SerializationError(
                f"{where}.inputs.{role}: {v!r} is neither a listed UID nor a constant", rule="json.operand"
            )

        out_handles: list[Tensor | None] = []
        updated: dict[int, Any] = {}
        for role in op.output_roles():
            uid = outs.get(role)
            if uid is None:
                out_handles.append(None)
                continue
            if not isinstance(uid, int) or isinstance(uid, bool) or uid not in handles:
                raise SerializationError(f"{where}.outputs.{role}: {uid!r} is not a listed UID", rule="json.operand")
            if any(v == uid and type(v) is int for v in ins.values()):  # an in-place update: the
                # output is a second handle on the UID
                e = entries[uid]
                handles_out = g.tensor(
                    dim=sizes(e, "dim", where),
                    stride=sizes(e, "stride", where),
                    data_type=e.get("data_type"),
                    name=e.get("name", ""),
                    uid=uid,
                )
                out_handles.append(handles_out)
                updated[uid] = handles_out
            else:
                out_handles.append(handles[uid])
        cdt = _field(o, "compute_data_type", str, where, None)
        g._add_op(
            op,
            [operand(r) for r in op.input_roles()],
            name=_field(o, "name", str, where, ""),
            compute_data_type=None if cdt is None else as_data_type(cdt),
            out_handles=out_handles,
        )
        handles.update(updated)  # ops are listed in execution order: the ones after an update read its result
    return g.validate()
