"""Batchnorm in training mode inside the graph: statistics, saved mean / inv_variance, running-stat
update and a following relu, with momentum as a pass-by-value scalar given at execute."""

import numpy as np

import opgraph as og
from opgraph.tools.samples import batchnorm_relu

g = batchnorm_relu(n=4, c=8, hw=6, data_type=og.DataType.FLOAT)
print(g)
plan = g.build(device="cpu")
f = g.final
rng = np.random.default_rng(1)
pack = og.testing.random_pack(f, rng)
pack[f.tensor("running_var").uid][...] = 1.0
pack[f.tensor("momentum").uid] = 0.1
plan.execute(pack)

x = pack[f.tensor("X").uid].astype(np.float64)
mean = x.mean(axis=(0, 2, 3))
print("saved mean       ", np.round(pack[f.tensor("mean").uid].ravel(), 4))
print("numpy mean       ", np.round(mean, 4))
var_biased = x.var(axis=(0, 2, 3))
print("inv_variance     ", np.round(pack[f.tensor("inv_variance").uid].ravel(), 4), "= 1/sqrt(biased var + eps)")
print("numpy            ", np.round(1 / np.sqrt(var_biased + 1e-5), 4))
n = x.size / x.shape[1]
print(
    "next running var ", np.round(pack[f.tensor("next_running_var").uid].ravel(), 4), "= 0.9 * 1 + 0.1 * unbiased var"
)
print("numpy            ", np.round(0.9 + 0.1 * var_biased * n / (n - 1), 4))
