"""Probe issue 38's conv_dgrad GPU case: config picked, first vs second execute, autograph on/off."""
import json, os, sys
import numpy as np
import torch
sys.path.insert(0, os.getcwd())
import opgraph as og

DOC = {"format": "opgraph.graph", "version": 1, "name": "fuzz_conv", "io_data_type": "HALF",
  "intermediate_data_type": "FLOAT", "compute_data_type": "FLOAT", "tensors": [
  {"uid": 1, "name": "in1", "dim": [1, 4, 1, 3], "stride": [0, 1, 1, 4], "data_type": "HALF", "is_virtual": False, "is_pass_by_value": False},
  {"uid": 2, "name": "in2", "dim": [4, 8, 1, 3], "stride": [24, 3, 3, 1], "data_type": "HALF", "is_virtual": False, "is_pass_by_value": False},
  {"uid": 3, "name": "dgrad3::DX", "dim": [1, 8, 1, 5], "stride": [1, 1, 1, 8], "data_type": "FLOAT", "is_virtual": True, "is_pass_by_value": False},
  {"uid": 4, "name": "out5", "dim": [1, 8, 1, 5], "stride": [8, 1, 1, 8], "data_type": "HALF", "is_virtual": False, "is_pass_by_value": False}],
  "ops": [{"op": "conv_dgrad", "name": "dgrad3", "compute_data_type": "FLOAT", "attrs": {"pre_padding": [0, 1], "post_padding": [0, 1], "stride": [1, 1], "dilation": [1, 2], "convolution_mode": "CROSS_CORRELATION"}, "inputs": {"loss": 1, "filter": 2}, "outputs": {"DX": 3}},
  {"op": "pointwise", "name": "pw4", "compute_data_type": "FLOAT", "attrs": {"mode": "MUL", "axis": None}, "inputs": {"input0": 3, "input1": {"const": -1.0}}, "outputs": {"output": 4}}]}

def data(seed=0):
    g = torch.Generator().manual_seed(seed)
    dy = torch.randint(-3, 4, (1, 3, 1, 4), generator=g).half()  # storage; view with strides below
    w = torch.randint(-3, 4, (4 * 8 * 3,), generator=g).half()
    return dy, w

def run(engines, autograph, label, heur=None):
    g = og.Graph.from_json(json.dumps(DOC))
    kw = {} if engines is None else {"engines": engines}
    try:
        plan = g.build(device="cuda", **kw)
    except Exception as e:
        print(label, "BUILD FAILED", type(e).__name__, e); return
    plan.auto_graph = autograph
    dy_s, w_s = data()
    dy = torch.as_strided(dy_s.cuda().flatten(), (1, 4, 1, 3), (0, 1, 1, 4))
    w = w_s.cuda().view(4, 8, 1, 3)
    out = torch.empty(1 * 8 * 1 * 5, device="cuda", dtype=torch.half)
    outv = torch.as_strided(out, (1, 8, 1, 5), (8, 1, 1, 8))
    ref_plan = og.Graph.from_json(json.dumps(DOC)).build(device="cpu", engines=["reference"])
    R = np.empty(40, np.float16); Rv = np.lib.stride_tricks.as_strided(R, (1, 8, 1, 5), (16, 2, 2, 16))
    ref_plan.execute({1: np.lib.stride_tricks.as_strided(dy_s.numpy().flatten(), (1, 4, 1, 3), (0, 2, 2, 8)), 2: w_s.numpy().reshape(4, 8, 1, 3), 4: Rv})
    res = []
    for i in range(3):
        out.fill_(float("nan"))
        plan.execute({1: dy, 2: w, 4: outv})
        torch.cuda.synchronize()
        got = outv.float().cpu().numpy()
        res.append(float(np.nanmax(np.abs(got - Rv.astype(np.float32)))) if np.isfinite(got).all() else float("nan"))
    print(label, "errors per execute:", res)
    if label.startswith("default"):
        print(plan.describe())
        for s in range(len(plan.steps) if hasattr(plan, "steps") else 0):
            try:
                print(plan.source(s))
            except Exception as e:
                print("source", s, e)
    if max(r if r == r else 1e9 for r in res) > 0:
        print("   ref:", Rv.ravel().tolist()); print("   got:", outv.float().cpu().numpy().ravel().tolist())

for ag in (True, False):
    run(None, ag, f"default autograph={ag}")
    run(["triton"], ag, f"triton autograph={ag}")
    run(["triton", "torch"], ag, f"triton+torch autograph={ag}")
    run(["torch"], ag, f"torch autograph={ag}")

# the same graph with dy materialised (no stride 0)
DOC["tensors"][0]["stride"] = [12, 1, 1, 4]
print("--- dy materialised")
for ag in (True, False):
    run(["triton"], ag, f"triton(materialised) autograph={ag}")
from opgraph import HeurMode
g = og.Graph.from_json(json.dumps(DOC))
for pc in g.engine_configs(heur_mode=[HeurMode.A, HeurMode.B], device="cuda", engines=["triton"]):
    print(pc)
