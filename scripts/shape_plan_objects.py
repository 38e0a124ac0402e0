#!/usr/bin/env python3
"""What a new shape costs a dynamic plan on the host (issue 42): the objects the garbage collector tracks
per new shape (they promote to the old generation, whose full collections were the serving loop's
~0.5-0.8 s spikes on an H200) and the time of a request at a new shape, by type.

The serving benchmark's Llama (bench/serving.py, the dry run's tiny config, `--layers` of them) imported
with dynamic batch and sequence, run on the CPU at `--shapes` new shapes after a first request; the
generated kernels run under Triton's interpreter (`--engines triton`, the GPU's engine: its per-shape
objects are the GPU's, the time is not) or another engine:

    TRITON_INTERPRET=1 python3 scripts/shape_plan_objects.py [--layers 2] [--shapes 8] [--engines triton]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _by_type() -> Counter:
    return Counter(f"{type(o).__qualname__} ({type(o).__module__})" for o in gc.get_objects())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--shapes", type=int, default=8)
    p.add_argument("--engines", default="triton")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()

    import torch
    from torch.export import Dim

    import opgraph as og
    from bench.serving import _config, _ids, _model

    cfg = _config(True) | {"layers": args.layers, "seq": (17, 120)}
    module = _model(cfg, "cpu", torch.float32)
    example = _ids(-1, (2, 18), cfg["vocab"], "cpu")
    dims = {0: Dim("batch", min=1, max=cfg["batch"]), 1: Dim("seq", min=17, max=120)}
    imported = og.from_torch(module, (example,), dynamic_shapes=(dims,))
    engines = args.engines.split(",")

    def call(shape: tuple[int, int], i: int) -> None:
        imported.run(_ids(i, shape, cfg["vocab"], "cpu"), reuse_outputs=True, engines=engines)

    shapes = [(b, s) for s in range(17, 120, 5) for b in range(1, cfg["batch"] + 1)]
    call(shapes[0], 0)
    gc.collect()
    before, count = _by_type(), len(gc.get_objects())
    start = time.perf_counter()
    for i, shape in enumerate(shapes[1 : 1 + args.shapes]):
        call(shape, i + 1)
    seconds = time.perf_counter() - start
    gc.collect()
    n = min(args.shapes, len(shapes) - 1)
    print(
        f"{args.layers} layers, engines {engines}: {(len(gc.get_objects()) - count) / n:.0f} tracked objects and "
        f"{seconds / n * 1e3:.1f} ms a new shape ({n} shapes)"
    )
    for name, k in (_by_type() - before).most_common(args.top):
        print(f"{k / n:9.1f}  {name}")


if __name__ == "__main__":
    main()
