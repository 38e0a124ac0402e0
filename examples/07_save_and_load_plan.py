"""Build (and tune) once, save the plan, load it in another process: no partitioning, heuristics or
tuning on load; the file is versioned JSON with nothing executable in it."""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import opgraph as og
from opgraph.tools.samples import conv_bias_relu

device = "cuda" if og.core.device.cuda_usable() else "cpu"
engines = None if device == "cuda" else ["reference"]
g = conv_bias_relu(n=2, c=8, k=8, hw=8)
t = time.perf_counter()
plan = g.build(device=device, engines=engines, autotune=device == "cuda")
print(f"built in {(time.perf_counter() - t) * 1e3:.0f} ms: {plan!r}")
path = Path(tempfile.mkdtemp()) / "conv_bias_relu.ogplan"
plan.save(path)
print(f"saved {path.stat().st_size} bytes to {path}")

code = f"""
import time, numpy as np, opgraph as og
t = time.perf_counter()
plan = og.load_plan({str(path)!r})
print(f"loaded in {{(time.perf_counter() - t) * 1e3:.0f}} ms:", repr(plan))
bad = og.testing.check_plan(plan, np.random.default_rng(3))
print("the loaded plan matches the reference engine" if not bad else f"MISMATCH: {{bad}}")
"""
print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
