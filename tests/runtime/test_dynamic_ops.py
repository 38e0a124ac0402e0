"""The execution matrix of dynamic plans on the torch engine and on generated kernels (Triton's
interpreter): every op family of tests/ops/test_dynamic_inference.py built once with dynamic dims and
run at a 1-sized shape, primes and the range's end against the reference engine at each shape
(random inputs, poisoned outputs)."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.testing import compare, random_pack, reference_outputs
from tests.helpers import interpreter_available
from tests.ops.test_dynamic_inference import FAMILIES, N, T, build

pytest.importorskip("torch")
SHAPES = [{"n": 1, "t": 1}, {"n": 3, "t": 13}, {"n": 9, "t": 5}]


@pytest.mark.parametrize(
    "engine",
    [
        "torch",
        pytest.param(
            "triton", marks=pytest.mark.skipif(not interpreter_available(), reason="needs Triton's interpreter")
        ),
    ],
)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_build_matches_the_reference_at_every_shape(family, engine):
    g = build(FAMILIES[family], N, T)
    plan = g.build(device="cpu", engines=[engine, "reference"])
    rng = np.random.default_rng(7)
    for env in SHAPES:
        static = g.final.at(env)
        pack = random_pack(static, rng)
        want = reference_outputs(static, pack)
        plan.execute(pack)
        bad = [m for u in static.outputs if (m := compare(static.tensors[u], pack[u], want[u])) is not None]
        assert not bad, f"{env}: " + "\n".join(map(str, bad)) + "\n" + plan.at(env).describe()
    built = plan.stats["shape_plans"]
    plan.execute(random_pack(g.final.at(SHAPES[1]), rng))
    assert plan.stats["shape_plans"] == built  # a shape seen before: nothing built, nothing compiled
