"""A graph no single kernel can run: opgraph cuts it into pieces instead of refusing it, and says why
each pair of neighbouring pieces was not fused. allow_partition=False gives cuDNN's behaviour."""

import numpy as np

import opgraph as og

g = og.Graph("softmax_then_conv", io_data_type=og.DataType.FLOAT)
x = g.tensor(dim=[2, 4, 6, 6], name="x")
w = g.tensor(dim=[4, 4, 3, 3], name="w")
e = g.exp(x)
s = g.reduction(e, og.ReductionMode.ADD).set_dim([2, 1, 6, 6])  # a channel softmax...
p = g.div(e, s)
y = g.conv_fprop(p, w, padding=1)  # ...feeding a convolution
g.relu(y).set_output(True).set_name("y")

device = "cuda" if og.core.device.cuda_usable() else "cpu"
plan = g.build(device=device, engines=["triton", "reference"] if device == "cpu" else None)
print(plan.describe())  # the pieces, their engines, the workspace tensors, and "not fused: ..." lines
bad = og.testing.check_plan(plan, np.random.default_rng(2))
print("matches the reference engine" if not bad else f"MISMATCH: {bad}")

try:
    g.build(device=device, engines=["triton"], allow_partition=False)
except og.UnsupportedGraphError as err:
    print("\nstrict build:", err)
