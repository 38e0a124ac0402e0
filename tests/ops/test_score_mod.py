"""Score modifiers' references are range-checked when a modifier is made, so also when a graph file is
loaded (issue 38: negative indexes loaded, then raised an untyped IndexError or read a node or input
counted from the end)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import opgraph as og
from opgraph.ops.score_mod import Ref, ScoreMod, ScoreNode, Src, evaluate
from opgraph.ops.pointwise import PointwiseMode as M

D = og.DataType


def _graph_doc() -> dict:
    g = og.Graph("att", io_data_type=D.HALF)
    q, k, v = (g.tensor(dim=[1, 2, 8, 16], name=n) for n in "qkv")
    bias = g.tensor(dim=[1, 1, 1, 8], name="bias")
    o, _ = g.sdpa(q, k, v, score_mod=lambda s, x: s.add(s.tanh(x), bias), attn_scale=0.25, generate_stats=False)
    o.set_output(True)
    return json.loads(g.to_json())


def test_the_unedited_file_loads_and_runs(rng):
    g = og.Graph.from_json(json.dumps(_graph_doc()))
    assert not og.testing.check_plan(g.build(device="cpu", engines=["reference"]), rng)


@pytest.mark.parametrize(
    "where,index",
    [
        ("operand", -1),
        ("operand", 1),
        ("operand", 7),
        ("input", -1),
        ("input", 1),
        ("result", -1),
        ("result", 2),
        ("result", 10**30),
    ],
)
def test_references_out_of_range_are_refused_at_load(where, index):
    doc = copy.deepcopy(_graph_doc())
    mod = doc["ops"][0]["attrs"]["score_mod"]
    ref = {"operand": mod["nodes"][1]["operands"][0], "input": mod["nodes"][1]["operands"][1], "result": mod["result"]}[
        where
    ]
    ref["index"] = index
    with pytest.raises(og.AttributeValueError) as ei:
        og.Graph.from_json(json.dumps(doc))
    err = ei.value
    assert err.rule == "sdpa.score_mod_index" and "ops[0].attrs" in str(err) and "What to do" in str(err)


def test_references_are_checked_when_a_modifier_is_made():
    tanh = ScoreNode(M.TANH_FWD, (Ref(Src.SCORE),))
    ScoreMod((tanh,), Ref(Src.NODE, 0))  # fine
    with pytest.raises(og.AttributeValueError, match="integer >= 0"):
        Ref(Src.NODE, -1)
    with pytest.raises(og.AttributeValueError, match="node %0"):
        ScoreMod((ScoreNode(M.TANH_FWD, (Ref(Src.NODE, 0),)),), Ref(Src.NODE, 0))  # reads itself
    with pytest.raises(og.AttributeValueError, match="input 0, not one of its 0"):
        ScoreMod((ScoreNode(M.ADD, (Ref(Src.SCORE), Ref(Src.INPUT, 0))),), Ref(Src.NODE, 0))
    with pytest.raises(og.AttributeValueError, match="node %1"):
        ScoreMod((tanh,), Ref(Src.NODE, 1))
    mod = ScoreMod((tanh,), Ref(Src.NODE, 0))
    np.testing.assert_allclose(evaluate(mod, np.array([[0.5]]), []), np.tanh([[0.5]]))
