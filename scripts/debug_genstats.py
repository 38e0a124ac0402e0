"""GPU diagnosis: SBR->conv->genstats sums at full size, by variant (run on the GPU machine)."""
import sys

import numpy as np

sys.path.insert(0, ".")
import opgraph as og  # noqa: E402
from tests.engines.test_triton_conv import sbr_conv_genstats  # noqa: E402

for seed in range(6):
    for inter, store_y, hw in [(og.DataType.HALF, True, 56)]:
        if True:
            g = sbr_conv_genstats(n=32, c=64, k=64, hw=hw, intermediate=inter, store_y=store_y)
            plan = g.build(device="cuda")
            bad = og.testing.check_plan(plan, np.random.default_rng(seed), rtol=1e-2, atol=1e-1)
            knobs = dict(plan.steps[0].config.knobs)
            print(f"store_y={store_y} inter={inter.name} hw={hw} steps={len(plan.steps)} knobs={knobs}")
            for m in bad:
                print("   ", m)
