"""Dynamic plans on the GPU: every op family of tests/ops/test_dynamic_inference.py built once on
CUDA (default engines) and run at several shapes against the reference engine (og.testing's
CUDA path: the pack copied to the device with its strides)."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.testing import compare, random_pack, reference_outputs
from tests.helpers import requires_cuda
from tests.ops.test_dynamic_inference import FAMILIES, N, T, build

pytestmark = [pytest.mark.gpu, requires_cuda]
SHAPES = [{"n": 1, "t": 1}, {"n": 3, "t": 13}, {"n": 9, "t": 5}, {"n": 2, "t": 7}]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_build_matches_the_reference_on_cuda(family):
    from opgraph.core.torch_interop import pack_to_device, torch_to_numpy

    g = build(FAMILIES[family], N, T)
    plan = g.build(device="cuda", deselect_numeric_notes=["DOWN_CONVERT_INPUTS"])  # fp32 as the reference: no TF32
    rng = np.random.default_rng(11)
    for env in SHAPES:
        static = g.final.at(env)
        pack = random_pack(static, rng)
        want = reference_outputs(static, pack)
        dev = pack_to_device(pack, plan.device.torch_name)
        plan.execute(dev)
        bad = [
            m for u in static.outputs if (m := compare(static.tensors[u], torch_to_numpy(dev[u]), want[u])) is not None
        ]
        assert not bad, f"{env}: " + "\n".join(map(str, bad)) + "\n" + plan.at(env).describe()
