"""conv + bias + relu with an explicit engine choice: list the ranked configs, pick one, pin its knobs.

On a machine without a GPU the Triton kernels run in Triton's interpreter (slowly, but the very same
generated code)."""

import numpy as np

import opgraph as og
from opgraph.tools.samples import conv_bias_relu

g = conv_bias_relu(n=1, c=8, k=8, hw=6)
device = "cuda" if og.core.device.cuda_usable() else "cpu"

for piece in g.engine_configs(
    heur_mode=[og.HeurMode.A, og.HeurMode.B, og.HeurMode.FALLBACK],
    device=device,
    engines=["triton", "reference"] if device == "cpu" else None,
):
    print(piece)  # ranked configs per piece, with knobs, notes and estimates; engines that declined say why

plan = g.build(device=device, engines=["triton"], heur_mode=og.HeurMode.B)
step = plan.steps[0]
print("\nchosen:", step.config)
print("knob BLOCK_M =", step.config.knob("BLOCK_M"))
print("generated kernel (first lines):\n" + "\n".join(plan.source(0).splitlines()[-25:-10]))

bad = og.testing.check_plan(plan, np.random.default_rng(0))
print("matches the reference engine" if not bad else f"MISMATCH: {bad}")
