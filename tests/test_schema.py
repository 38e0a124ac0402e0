"""The graph file schema (issue 20: the JSON format was undocumented and stricter than the API)."""

from __future__ import annotations

import json

import pytest

import opgraph as og
from opgraph.graph.schema import SCHEMA_PATH, graph_schema, schema_errors, schema_text

jsonschema = pytest.importorskip("jsonschema")


def test_the_committed_schema_is_the_registrys():
    assert SCHEMA_PATH.read_text() == schema_text(), "stale: run python -m opgraph.graph.schema --write"
    jsonschema.Draft202012Validator.check_schema(graph_schema())


def _sample_files():
    from opgraph.tools.samples import batchnorm_relu, conv_bias_relu

    g = og.Graph("mixed", io_data_type=og.DataType.HALF)
    x = g.tensor(dim=[4, 8, 16], name="x")
    w = g.tensor(dim=[1, 16, 16], stride=[256, 1, 16], name="w")
    h = g.layernorm("INFERENCE", g.matmul(x, w), g.tensor(dim=[1, 1, 16], name="s"), epsilon=1e-5)[0]
    y = g.relu(g.slice(h, [slice(None), slice(0, 4)]), upper_clip=6.0)
    g.reduction(y, mode="MAX").set_dim([4, 1, 1]).set_output(True)
    return [conv_bias_relu(n=1, c=4, k=4, hw=4), batchnorm_relu(n=1, c=4, hw=4), g]


@pytest.mark.parametrize("index", range(3))
def test_files_written_by_to_json_fit_the_schema(index):
    g = _sample_files()[index]
    assert schema_errors(json.loads(g.to_json())) == []


def test_every_problem_is_reported_with_its_place():
    doc = json.loads(_sample_files()[2].to_json())
    doc["tensors"][0]["strides"] = [1, 1, 1]
    doc["ops"][0]["inputs"]["C"] = 3
    doc["ops"][-1]["attrs"]["mode"] = "max"
    errors = schema_errors(doc)
    assert len(errors) == 3, errors
    assert any(e.startswith("graph.tensors[0]: unknown key 'strides' (did you mean 'stride'") for e in errors)
    assert any(e.startswith("graph.ops[0].inputs") and "'C'" in e for e in errors)
    assert any("'max'" in e and "did you mean 'MAX'" in e for e in errors)


def test_loading_says_did_you_mean_for_names_and_keys():
    doc = json.loads(_sample_files()[0].to_json())
    doc["ops"][0]["op"] = "conv_forward"
    with pytest.raises(og.SerializationError, match="did you mean .*'conv_fprop'"):
        og.Graph.from_json(json.dumps(doc))
    doc = json.loads(_sample_files()[0].to_json())
    doc["tensors"][0]["strides"] = doc["tensors"][0].pop("stride")
    with pytest.raises(og.SerializationError, match="unknown key 'strides' .did you mean 'stride'"):
        og.Graph.from_json(json.dumps(doc))
    doc = json.loads(_sample_files()[0].to_json())
    doc["ops"][-1]["attrs"]["mode"] = "RELU"
    with pytest.raises(og.SerializationError, match="did you mean 'RELU_FWD'"):
        og.Graph.from_json(json.dumps(doc))


def test_keys_the_api_defaults_are_optional_in_files():
    doc = json.loads(_sample_files()[0].to_json())
    for key in ("io_data_type", "intermediate_data_type", "compute_data_type", "name"):
        doc.pop(key)
    for t in doc["tensors"]:
        if t["is_virtual"]:
            for key in ("dim", "stride", "data_type", "is_virtual"):
                t.pop(key)
            t["is_virtual"] = True
    for o in doc["ops"]:
        o.pop("compute_data_type")
        o.pop("name")
    assert schema_errors(doc) == []
    g = og.Graph.from_json(json.dumps(doc))
    assert g.final.io_data_type is og.DataType.HALF and len(g.final.nodes) == 3
    assert g.final.tensor("Y").layout == "nhwc"


def test_python_api_names_suggest_close_builders():
    g = og.Graph()
    with pytest.raises(AttributeError, match="did you mean .*'conv_fprop'"):
        g.conv_fwd  # noqa: B018
    x = g.tensor(dim=[2, 3])
    with pytest.raises(og.AttributeValueError, match="did you mean 'GELU_FWD'"):
        g.pointwise(x, mode="GELU")


# -- plan files ----------------------------------------------------------------------------------------


def test_the_committed_plan_schema_is_current():
    from opgraph.runtime.plan_schema import SCHEMA_PATH as PLAN_SCHEMA, plan_schema, schema_text as plan_text

    assert PLAN_SCHEMA.read_text() == plan_text(), "stale: run python -m opgraph.runtime.plan_schema --write"
    assert PLAN_SCHEMA.parent == SCHEMA_PATH.parent  # beside the graph schema
    jsonschema.Draft202012Validator.check_schema(plan_schema())


@pytest.mark.parametrize("index", range(3))
def test_plan_files_written_by_save_fit_the_plan_schema_graph_included(index):
    from opgraph.runtime.plan_schema import plan_schema_errors

    plan = _sample_files()[index].build(device="cpu")
    doc = json.loads(plan.to_bytes().split(b"\n", 1)[1])
    assert plan_schema_errors(doc) == []
    doc["graph"]["tensors"][0]["strides"] = [1]
    assert any(e.startswith("plan.graph.tensors[0]: unknown key 'strides'") for e in plan_schema_errors(doc))
    assert plan_schema_errors(doc, graph=False) == []  # what loading checks: the graph loader does the rest
