"""GPU diagnosis: is a genstats sum mismatch in the reduction, or in Y itself? (run on the GPU machine)"""

import sys

import numpy as np

sys.path.insert(0, ".")
import opgraph as og  # noqa: E402
from opgraph.core.torch_interop import pack_to_device, torch_to_numpy  # noqa: E402
from tests.engines.test_triton_conv import sbr_conv_genstats  # noqa: E402

g = sbr_conv_genstats(n=32, c=64, k=64, hw=56)
plan = g.build(device="cuda")
f = g.final
y_uid, s_uid = f.tensor("Y").uid, f.tensor("genstats::sum").uid
for seed in range(6):
    pack = og.testing.random_pack(f, np.random.default_rng(seed))
    want = og.testing.reference_outputs(f, pack)
    dev = pack_to_device(pack, "cuda")
    plan.execute(dev)
    y = torch_to_numpy(dev[y_uid]).astype(np.float64)
    s = torch_to_numpy(dev[s_uid]).astype(np.float64).ravel()
    yw = want[y_uid].astype(np.float64)
    sw = want[s_uid].astype(np.float64).ravel()
    print(
        f"seed {seed}: |sum - want| max {np.abs(s - sw).max():.3g}; |sum(Y_got) - sum| max "
        f"{np.abs(y.sum((0, 2, 3)) - s).max():.3g}; |sum(Y_got) - want| max {np.abs(y.sum((0, 2, 3)) - sw).max():.3g};"
        f" Y max err {np.abs(y - yw).max():.3g}, Y mean err {(y - yw).mean():.3g}, nonzero Y errs {(y != yw).mean():.3f}"
    )
