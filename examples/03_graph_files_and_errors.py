"""Graphs as JSON files, and what a bad graph or a bad variant pack says."""

import json
import tempfile

import numpy as np

import opgraph as og

g = og.Graph("saved", io_data_type=og.DataType.FLOAT)
x = g.tensor(dim=[4, 3], name="x")
g.tanh(g.scale(x, 2.0)).set_output(True).set_name("y")
text = g.to_json()
print(text[:200], "...")
g2 = og.Graph.from_json(text)
print("round trip keeps the graph:", g2.key() == g.key())
path = tempfile.mktemp(suffix=".json")
with open(path, "w") as f:
    f.write(text)
print(f"try: opgraph check {path}   and   opgraph run {path}")

# A broken file: the second op reads a tensor nobody produces.
doc = json.loads(text)
doc["ops"][1]["inputs"]["input0"] = 999
try:
    og.Graph.from_json(json.dumps(doc))
except og.GraphError as err:
    print(f"\n{type(err).__name__}: {err}")

# A graph error: shapes that do not broadcast.
h = og.Graph("bad")
a, b = h.tensor(dim=[2, 3], name="a"), h.tensor(dim=[2, 4], name="b")
h.add(a, b, name="sum").set_output(True)
try:
    h.validate()
except og.GraphError as err:
    print(f"\n{type(err).__name__}: {err}")

# A variant-pack error: wrong dtype; nothing is written.
plan = g.build(device="cpu")
out = np.full((4, 3), np.nan, np.float32)
try:
    plan.execute({"x": np.zeros((4, 3), np.float64), "y": out})
except og.GraphError as err:
    print(f"\n{type(err).__name__}: {err}")
print("output untouched:", bool(np.isnan(out).all()))
