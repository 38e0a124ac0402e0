"""One conv + bias + relu, three ways to run it, and cuDNN-style filters to choose among them.

    triton   one generated kernel: conv, bias and relu fused
    library  the conv through PyTorch (cuDNN on a GPU), bias + relu as one generated kernel after it;
             "native" precision rounds the conv's fp32 output to fp16 first (noted)
    torch    every op through PyTorch, one by one

Build options filter the configs as cuDNN's frontend does (deselect_engines, select/deselect notes,
deselect_workspace_greater_than); a filter that leaves nothing says what it removed. On a machine
without a GPU the Triton parts run in Triton's interpreter (nothing to set)."""

import numpy as np

import opgraph as og
from opgraph.tools.samples import conv_bias_relu

device = "cuda" if og.core.device.cuda_usable() else "cpu"
if not og.engines.get_engine("triton").available(og.core.device.resolve_device(device)).ok:
    print("Triton cannot run here (pip install '.[triton,torch]'); nothing to show")
    raise SystemExit(0)
ENGINES = ["triton", "library", "torch"]
rng = np.random.default_rng(0)


def run(title, **options):
    g = conv_bias_relu(n=1, c=8, k=8, hw=6)
    plan = g.build(device=device, engines=ENGINES, **options)
    bad = og.testing.check_plan(plan, rng)
    print(f"== {title}\n{plan.describe()}\n" + ("matches the reference engine" if not bad else f"MISMATCH: {bad}"))
    return plan


for piece in conv_bias_relu(n=1, c=8, k=8, hw=6).engine_configs(
    heur_mode=[og.HeurMode.B], device=device, engines=ENGINES
):
    print(piece)  # every config of every engine: knobs, numerical and behaviour notes

run("default: the fused Triton kernel first")
plan = run(
    "deselect_engines=['triton']: the library config runs Triton kernels too, so torch is left",
    deselect_engines=["triton"],
)
assert plan.steps[0].config.engine == "torch"
plan = run(
    "the library engine, native precision (the conv in fp16, as eager PyTorch)",
    heur_mode=[og.HeurMode.B],
    select_numeric_notes=["rounded_intermediate"],
)
assert plan.steps[0].config.engine == "library" and plan.steps[0].config.knob("precision") == "native"
print("\nits parts:", [(role, sub.kinds) for role, sub, _ in plan.steps[0].kernel.parts])

try:
    conv_bias_relu(n=1, c=8, k=8, hw=6).build(device=device, engines=["library"], deselect_workspace_greater_than=0)
except og.UnsupportedGraphError as err:
    print("\na filter that leaves nothing:\n" + str(err))
