"""Explain one fuzz case: the plan each engine set builds, and at each mismatching element the inputs
that reach it, the reference's value of every tensor there and what the plan wrote.

    python scripts/fuzz_explain.py SEED|FILE [--device cuda]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    from tests.fuzz import oracle
    from tests.fuzz import runner as R
    from tests.fuzz.replay import load

    case = load(args.what)
    final = R.graph_of(case).final
    rng = np.random.default_rng(case.seed)
    expect = R.Expect.of(final, case, rng)
    full = oracle.evaluate(final, expect.held, None)  # every tensor's reference value
    np.set_printoptions(precision=9, linewidth=150, threshold=60)
    print(final)
    print("profiles", case.profiles, "scalars", case.scalars)
    shown = []
    orig = R.Runner._execute

    def execute(self, plan, exp, *rest, **kw):
        result = orig(self, plan, exp, *rest, **kw)
        if result is None and plan not in shown:
            shown.append(plan)
            print("\n== a failing plan:\n" + plan.describe())
        return result

    R.Runner._execute = execute
    stats = R.Runner(args.device, plan_files=0.0, damage=0.0).run(case)
    for f in stats.failures:
        print("\nFAILURE", f)
        if " at [" not in f.detail:
            continue
        idx = tuple(int(i) for i in f.detail.split(" at [")[1].split("]")[0].split(","))
        for uid, value in sorted(full.items()):
            v = np.asarray(value)
            if v.ndim == len(idx) and all(i < d or d == 1 for i, d in zip(idx, v.shape)):
                at = tuple(min(i, d - 1) for i, d in zip(idx, v.shape))
                print(f"  ref %{uid} {final.tensors[uid].data_type.name} at {at}: {v[at]!r}")
        for uid, value in sorted(expect.values.items()):
            v = np.asarray(value)
            if v.ndim == len(idx):
                at = tuple(min(i, d - 1) for i, d in zip(idx, v.shape))
                print(f"  input %{uid} at {at}: {v[at]!r}")
    return 1 if stats.failures else 0


if __name__ == "__main__":
    sys.exit(main())
