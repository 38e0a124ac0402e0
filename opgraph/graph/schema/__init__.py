"""The JSON Schema of graph files (`graph.schema.json` beside this module), made from the op registry.

The committed file is what editors and other tools read; `graph_schema()` rebuilds it from the
registered op classes (their attributes, types and roles), and a test keeps the two equal. After
adding or changing an op, rewrite it with:

    python -m opgraph.graph.schema --write

`schema_errors(doc)` lists every place a parsed graph document breaks the schema (all at once, each
with its JSON path), which `opgraph check` prints before the semantic checks of loading.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).with_name("graph.schema.json")
SCHEMA_ID = "https://opgraph.dev/schema/graph.schema.json"


def _attr_schema(hint: Any) -> dict[str, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        arms = [_attr_schema(a) for a in args if a is not type(None)]
        if type(None) in args:
            arms.append({"type": "null"})
        return arms[0] if len(arms) == 1 else {"anyOf": arms}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _attr_schema(args[0])}
        return {
            "type": "array",
            "prefixItems": [_attr_schema(a) for a in args],
            "minItems": len(args),
            "maxItems": len(args),
        }
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": list(hint.__members__)}
    simple = {int: "integer", float: "number", bool: "boolean", str: "string"}
    if hint in simple:
        return {"type": simple[hint]}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a structured attribute (a score modifier)
        hints = typing.get_type_hints(hint)
        fields = dataclasses.fields(hint)
        required = [
            f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        return {
            "type": "object",
            "properties": {f.name: _attr_schema(hints[f.name]) for f in fields},
            "required": required,
            "additionalProperties": False,
        }
    raise TypeError(f"no schema for attribute type {hint}")


def _roles_schema(roles: list[str] | None, required: list[str], value: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": "object", "additionalProperties": value}
    if roles is not None:
        doc["propertyNames"] = {"enum": roles}
    if required:
        doc["required"] = required
    return doc


def _op_rule(kind: str, cls: Any) -> dict[str, Any]:
    """`if op == kind then {attrs, inputs, outputs as the class says}`."""
    from ...core.op import Op

    hints = typing.get_type_hints(cls)
    own = [f for f in dataclasses.fields(cls) if f.init]  # (init=False fields are fixed by the kind)
    attrs = {f.name: _attr_schema(hints[f.name]) for f in own}
    needed = [f.name for f in own if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    attr_doc: dict[str, Any] = {"type": "object", "properties": attrs, "additionalProperties": False}
    if needed:
        attr_doc["required"] = needed
    then: dict[str, Any] = {"properties": {"attrs": attr_doc}}
    if needed:
        then["required"] = ["attrs"]
    fixed_inputs = cls.input_roles is Op.input_roles
    fixed_outputs = cls.output_roles is Op.output_roles
    ins = list(cls.INPUTS) if fixed_inputs else _dynamic_inputs(kind)
    required_ins = [r for r in cls.INPUTS if r not in cls.OPTIONAL_INPUTS] if fixed_inputs else []
    then["properties"]["inputs"] = _roles_schema(ins, required_ins, {"$ref": "#/$defs/operand"})
    outs = list(cls.OUTPUTS) if fixed_outputs else None
    then["properties"]["outputs"] = _roles_schema(outs, [], {"$ref": "#/$defs/uid"})
    return {"if": {"properties": {"op": {"const": kind}}, "required": ["op"]}, "then": then}


def _dynamic_inputs(kind: str) -> list[str] | None:
    """Input roles of ops whose roles depend on attributes: every role any attribute value allows
    (pointwise: the operands and every mode's parameters); None where any name may appear."""
    if kind == "pointwise":
        from ...ops.pointwise import MODES, OPERAND_ROLES

        params = sorted({p for info in MODES.values() for p, _ in info.params})
        return [*OPERAND_ROLES, *params]
    return None


def _pointwise_modes() -> list[dict[str, Any]]:
    """Per pointwise mode: the operands it needs and the parameters it takes."""
    from ...ops.pointwise import MODES, OPERAND_ROLES

    rules = []
    for mode, info in MODES.items():
        roles = [*OPERAND_ROLES[: info.arity], *(p for p, _ in info.params)]
        rules.append(
            {
                "if": {
                    "properties": {
                        "op": {"const": "pointwise"},
                        "attrs": {"properties": {"mode": {"const": mode.name}}, "required": ["mode"]},
                    },
                    "required": ["op", "attrs"],
                },
                "then": {
                    "properties": {
                        "inputs": {"propertyNames": {"enum": roles}, "required": list(OPERAND_ROLES[: info.arity])}
                    }
                },
            }
        )
    return rules


def _data_type_names() -> list[str]:
    from ...core.dtypes import _ALIASES, DataType

    names = [*DataType.__members__, *(d.value for d in DataType), *_ALIASES]
    return list(dict.fromkeys(names))


def graph_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a graph file, from the registered ops."""
    from ...core.op import OPS
    from ..serialize import FORMAT, GRAPH_KEYS, OP_KEYS, TENSOR_KEYS, VERSIONS

    dtype = {"$ref": "#/$defs/data_type"}
    tensor_props = {
        "uid": {"$ref": "#/$defs/uid"},
        "name": {"type": "string"},
        "dim": {
            "type": "array",
            "items": {"anyOf": [{"type": "integer", "minimum": 1}, {"$ref": "#/$defs/size"}]},
            "description": "logical dims (N, C, spatial... for images; batch..., M, K for matmul); "
            "may be left out on a virtual tensor, whose dims are inferred",
        },
        "stride": {
            "type": "array",
            "items": {"anyOf": [{"type": "integer", "minimum": 0}, {"$ref": "#/$defs/size"}]},
            "description": "elements between neighbours along each dim; default packed row-major",
        },
        "data_type": {
            **dtype,
            "description": "default: the graph's io_data_type (intermediate_data_type for virtual tensors)",
        },
        "is_virtual": {
            "type": "boolean",
            "default": False,
            "description": "an intermediate no buffer holds (inside a kernel or the plan's workspace)",
        },
        "is_pass_by_value": {
            "type": "boolean",
            "default": False,
            "description": "a host scalar given at execute as a Python number",
        },
        "is_by_reference": {
            "type": "boolean",
            "default": False,
            "description": "read through the plan's address table (CUDA-graph re-pointing)",
        },
    }
    op_props = {
        "op": {"enum": sorted(OPS), "description": "the op kind (a custom op is 'custom', with attrs.op_name)"},
        "name": {"type": "string"},
        "compute_data_type": {**dtype, "description": "default: the graph's compute_data_type"},
        "attrs": {"type": "object", "description": "the op's attributes, as the builder's keyword arguments"},
        "inputs": {
            "type": "object",
            "description": 'role -> tensor UID, or {"const": number} for a literal (or {"const": {"scale", "num", "den"}}: a ratio of dynamic sizes)',
        },
        "outputs": {"type": "object", "description": "role -> tensor UID; left-out roles are not computed"},
    }
    assert list(tensor_props) == list(TENSOR_KEYS) and list(op_props) == list(OP_KEYS)
    graph_props = {
        "format": {"const": FORMAT},
        "version": {"enum": list(VERSIONS), "description": "1; 2 for a graph with dynamic dims"},
        "name": {"type": "string"},
        "io_data_type": {**dtype, "default": "HALF"},
        "intermediate_data_type": {**dtype, "default": "FLOAT"},
        "compute_data_type": {**dtype, "default": "FLOAT"},
        "dims": {
            "type": "array",
            "items": {"$ref": "#/$defs/dim"},
            "description": "the dynamic dims the sizes name (version 2)",
        },
        "tensors": {"type": "array", "items": {"$ref": "#/$defs/tensor"}},
        "ops": {"type": "array", "items": {"$ref": "#/$defs/op"}},
    }
    assert list(graph_props) == list(GRAPH_KEYS)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "opgraph graph file",
        "description": "An operation graph: tensors by UID and ops reading and writing them. Written by "
        "Graph.to_json, read by Graph.from_json and `opgraph check/run/explain`. Generated "
        "from opgraph's op registry by `python -m opgraph.graph.schema --write`.",
        "type": "object",
        "properties": graph_props,
        "required": ["format", "version", "tensors", "ops"],
        "additionalProperties": False,
        "$defs": {
            "uid": {"type": "integer", "description": "a tensor's unique id (int64)"},
            "dim": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "min": {"type": "integer", "minimum": 1},
                    "max": {"type": "integer", "minimum": 1},
                },
                "required": ["name", "min", "max"],
                "additionalProperties": False,
                "description": "a dynamic dim: any int of min..max",
            },
            "size": {
                "type": "string",
                "description": "a dynamic size: an expression of dims' names, ints and + - * // % (e.g. '64*seq')",
            },
            "data_type": {"enum": _data_type_names()},
            "operand": {
                "anyOf": [
                    {"$ref": "#/$defs/uid"},
                    {
                        "type": "object",
                        "properties": {
                            "const": {"anyOf": [{"type": ["number", "boolean"]}, {"$ref": "#/$defs/size_value"}]}
                        },
                        "required": ["const"],
                        "additionalProperties": False,
                    },
                ]
            },
            "size_value": {
                "type": "object",
                "properties": {
                    "scale": {"type": "number"},
                    "num": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/size"}]},
                    "den": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/size"}]},
                },
                "required": ["scale", "num", "den"],
                "additionalProperties": False,
                "description": "a literal that is a ratio of dynamic sizes, scale * num / den (a mean's 1/count)",
            },
            "tensor": {
                "type": "object",
                "properties": tensor_props,
                "required": ["uid"],
                "additionalProperties": False,
            },
            "op": {
                "type": "object",
                "properties": op_props,
                "required": ["op", "inputs", "outputs"],
                "additionalProperties": False,
                "allOf": [*(_op_rule(k, OPS[k]) for k in sorted(OPS)), *_pointwise_modes()],
            },
        },
    }


def schema_text() -> str:
    return json.dumps(graph_schema(), indent=1) + "\n"


@lru_cache(maxsize=1)
def _validator() -> Any:
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    return jsonschema.Draft202012Validator(schema)


def schema_errors(doc: Any, limit: int = 20) -> list[str]:
    """Every place `doc` (a parsed graph file) breaks the schema, as 'graph.path: message', in the
    file's order; empty when it fits."""
    return format_errors(_validator(), doc, "graph", limit)


def format_errors(validator: Any, doc: Any, root: str, limit: int = 20) -> list[str]:
    """Every place `doc` breaks `validator`'s schema, as '<root>.path: message' (each message at most
    300 characters), in the document's order."""
    found = []
    for err in sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path]):
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        message = _message(err)
        found.append(f"{root}{path}: {message if len(message) <= 300 else message[:297] + '...'}")
    return list(dict.fromkeys(found))[:limit]


def _message(err: Any) -> str:
    """jsonschema's message, with long lists of allowed names replaced by the close ones."""
    from ...core.suggest import did_you_mean

    if err.validator == "enum" and isinstance(err.instance, str):
        return f"{err.instance!r} is not one of the {len(err.validator_value)} known names" + (
            did_you_mean(err.instance, err.validator_value) or f": {', '.join(map(str, err.validator_value[:12]))}..."
        )
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        known = list(err.schema.get("properties", {}))
        extra = [k for k in err.instance if k not in known]
        if extra:
            return f"unknown key {extra[0]!r}{did_you_mean(extra[0], known)}; the keys here are {known}"
    if err.validator == "propertyNames" and isinstance(err.instance, str):
        names = err.validator_value.get("enum", [])
        return f"no role {err.instance!r} here{did_you_mean(err.instance, names)}; the roles are {names}"
    return str(err.message)


__all__ = ["graph_schema", "format_errors", "schema_errors", "schema_text", "SCHEMA_ID", "SCHEMA_PATH"]
