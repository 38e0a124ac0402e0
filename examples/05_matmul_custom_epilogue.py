"""matmul with a custom epilogue fused into the GEMM kernel: bias, a clipped leaky relu, a scale read
from device memory at run time, a cast, and a second output (a mask)."""

import numpy as np

import opgraph as og

g = og.Graph("mm_epilogue", io_data_type=og.DataType.HALF)
a = g.tensor(dim=[1, 64, 32], name="A")
b = g.tensor(dim=[1, 32, 48], stride=[32 * 48, 1, 32], name="B")  # column-major B: any strides work
bias = g.tensor(dim=[1, 1, 48], name="bias")
scale = g.tensor(dim=[1], data_type=og.DataType.FLOAT, name="scale")  # a device scalar
c = g.matmul(a, b)
y = g.relu(g.bias(c, bias), negative_slope=0.1, upper_clip=4.0)
g.mul(y, scale).set_output(True).set_name("out")
g.cmp_gt(y, 1.0).set_output(True).set_name("mask")

device = "cuda" if og.core.device.cuda_usable() else "cpu"
plan = g.build(device=device, engines=["triton"])
print(plan.describe())
assert len(plan.steps) == 1, "the epilogue should fuse into the matmul kernel"
bad = og.testing.check_plan(plan, np.random.default_rng(1))
print("one fused kernel; matches the reference engine" if not bad else f"MISMATCH: {bad}")
