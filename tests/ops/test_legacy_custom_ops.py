"""Graph and plan files written when pooling's and slice's backward and stop_gradient were custom ops
(`{"op": "custom", "attrs": {"op_name": "slice_backward", "params": [["bounds", "1:5:1,..."], ...]}}`) load
as the typed ops they are now, and compute what they did (ops/custom.py, LEGACY_CUSTOM). The files in
data/ were written by opgraph at aee2b8b (data/make_legacy_custom_ops.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import opgraph as og
from opgraph.ops.custom import upgrade_entry

from .data.make_legacy_custom_ops import legacy_graph

DATA = Path(__file__).parent / "data"
TYPED = {"resample_avg_backward", "resample_max_backward", "slice_backward", "stop_gradient"}


def _results(graph, rng):
    plan = graph.build(device="cpu", engines=["reference"])
    pack = og.testing.random_pack(plan.graph, np.random.default_rng(7))
    for u in plan.graph.outputs:
        pack[u][...] = np.nan  # poisoned: every output must be written
    plan.execute(pack)
    return {plan.graph.tensors[u].name: pack[u] for u in plan.graph.outputs}


def test_a_graph_file_naming_the_old_custom_ops_loads_as_the_typed_ops(rng):
    text = (DATA / "legacy_custom_ops.graph.json").read_text()
    assert {o["attrs"].get("op_name") for o in json.loads(text)["ops"] if o["op"] == "custom"} == TYPED
    old = og.Graph.from_json(text)
    kinds = {n.kind for n in old.final.nodes}
    assert TYPED <= kinds and "custom" not in kinds
    fresh = legacy_graph()  # the same graph built by today's code (virtual tensors' names differ: "::dx")

    def ops(g):
        return [(o["op"], o["name"], o["attrs"]) for o in json.loads(g.to_json())["ops"]]

    assert ops(old) == ops(fresh)
    got, want = _results(old, rng), _results(fresh, rng)
    assert set(got) == set(want) and all(np.isfinite(v).all() for v in got.values())
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    x = next(v for k, v in got.items() if k.startswith("grad_"))
    assert np.abs(x).sum() > 0


def test_a_plan_file_holding_them_loads_and_runs(rng):
    plan = og.load_plan(DATA / "legacy_custom_ops.reference.ogplan", on_mismatch="recompile")
    assert TYPED <= {n.kind for n in plan.graph.nodes}
    pack = og.testing.random_pack(plan.graph, np.random.default_rng(7))
    plan.execute(pack)
    want = _results(legacy_graph(), rng)
    for u in plan.graph.outputs:
        np.testing.assert_array_equal(pack[u], want[plan.graph.tensors[u].name])


def test_g_custom_under_an_old_name_builds_the_typed_op(custom_ops_restored, rng):
    g = og.Graph("c", io_data_type=og.DataType.FLOAT)
    dy = g.tensor(dim=[2, 3], name="dy")
    dx = g.custom("slice_backward", dy, params={"bounds": "1:3:1,0:6:2", "in_dim": "4,6"}).set_output(True)
    assert g.final.nodes[0].kind == "slice_backward" and tuple(dx.dim or g.final.tensors[dx.uid].dim) == (4, 6)
    (pack,) = [og.testing.random_pack(g.final, rng)]
    g.build(device="cpu").execute(pack)
    want = np.zeros((4, 6))
    want[1:3, 0:6:2] = pack[dy.uid]
    np.testing.assert_array_equal(pack[dx.uid], want)
    # a custom op the user registers under such a name is theirs
    og.register_custom_op("slice_backward", num_inputs=1, reference=lambda d, **p: d, pointwise=True)
    mine = og.Graph("m", io_data_type=og.DataType.FLOAT)
    mine.custom("slice_backward", mine.tensor(dim=[2, 3], name="dy")).set_output(True)
    assert mine.final.nodes[0].kind == "custom"


@pytest.mark.parametrize(
    "op_name,params,match",
    [
        ("slice_backward", [["bounds", "1:3"], ["in_dim", "4"]], "start:stop:step"),
        (
            "resample_max_backward",
            [["window", "3,x"], ["stride", "2"], ["pre_padding", "0"], ["post_padding", "0"]],
            "comma-separated ints",
        ),
        (
            "resample_avg_backward",
            [
                ["window", "2"],
                ["stride", "2"],
                ["pre_padding", "0"],
                ["post_padding", "0"],
                ["in_dim", "1,1,4,4"],
                ["mode", "max"],
            ],
            "not an average pooling mode",
        ),
        ("slice_backward", "not pairs", "pairs"),
    ],
)
def test_bad_parameters_of_an_old_custom_op_are_a_serialization_error(op_name, params, match):
    entry = {
        "op": "custom",
        "name": "n",
        "attrs": {"op_name": op_name, "num_inputs": 1, "num_outputs": 1, "params": params},
        "inputs": {"input0": 1},
        "outputs": {"output0": 2},
    }
    with pytest.raises(og.SerializationError, match=match) as err:
        upgrade_entry(entry, "ops[3]")
    assert err.value.rule == "json.legacy_op" and "ops[3]" in str(err.value)


def test_roles_are_renamed_by_position():
    entry = {
        "op": "custom",
        "name": "dpool",
        "compute_data_type": "FLOAT",
        "attrs": {
            "op_name": "resample_max_backward",
            "num_inputs": 2,
            "num_outputs": 1,
            "params": [["post_padding", "1"], ["pre_padding", "1"], ["stride", "2,2"], ["window", "3,3"]],
        },
        "inputs": {"input0": 5, "input1": 1},
        "outputs": {"output0": 7},
    }
    up = upgrade_entry(entry)
    assert up == {
        "op": "resample_max_backward",
        "name": "dpool",
        "compute_data_type": "FLOAT",
        "attrs": {"window": [3, 3], "stride": [2, 2], "pre_padding": [1], "post_padding": [1]},
        "inputs": {"grad": 5, "input": 1},
        "outputs": {"dx": 7},
    }
    plain = {"op": "custom", "attrs": {"op_name": "swiglu"}, "inputs": {}, "outputs": {}}
    assert upgrade_entry(plain) is plain
