"""conv + bias + relu as one graph: declare, validate, print, build, execute, check.

Runs on the GPU when there is one (generated Triton kernels), else on the CPU reference engine.
"""

import numpy as np

import opgraph as og
from opgraph.tools.samples import nhwc

N, C, K, H = 2, 8, 16, 10
g = og.Graph("conv_bias_relu", io_data_type=og.DataType.HALF, compute_data_type=og.DataType.FLOAT)
x = g.tensor(dim=[N, C, H, H], stride=nhwc([N, C, H, H]), name="X")  # NHWC: the layout is the strides
w = g.tensor(dim=[K, C, 3, 3], stride=nhwc([K, C, 3, 3]), name="W")
b = g.tensor(dim=[1, K, 1, 1], name="B")
conv = g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1], name="conv")  # virtual
y = g.relu(g.bias(conv, b, name="bias"), name="relu").set_output(True).set_name("Y")
g.validate()
print(g)  # dims, strides and types of every tensor were inferred

plan = g.build()  # the best device; device="cpu" forces the reference engine
print(plan.describe())

rng = np.random.default_rng(0)
pack = og.testing.random_pack(g.final, rng)  # random inputs, NaN-poisoned outputs, right strides
want = og.testing.reference_outputs(g.final, pack)
if plan.device.is_cuda:
    from opgraph.core.torch_interop import pack_to_device, torch_to_numpy

    dev = pack_to_device(pack, "cuda")
    plan.execute(dev)
    got = torch_to_numpy(dev[y.uid])
else:
    plan.execute({x: pack[x.uid], w: pack[w.uid], "B": pack[b.uid], y.uid: pack[y.uid]})  # keys: handles, names, UIDs
    got = pack[y.uid]
bad = og.testing.compare(g.final.tensors[y.uid], got, want[y.uid])
print("Y matches the reference engine" if bad is None else f"MISMATCH: {bad}")
