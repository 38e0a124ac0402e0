"""Issue 38: a generated conv_dgrad on an H200 (compiled) returned -0.0 where the reference gives -24.0,
for DY expanded over the batch (strides [0, 1, 1, 4]: 4 filters, W 3 -> 5) and dilation [1, 2], times
the literal -1, built with the default heuristic and executed repeatedly (later executes replay the
plan's CUDA graph); right under the interpreter, whose kernel source is the same. LLVM folded
`acc * -1.0` into a sign-bit xor of the wgmma accumulator, which ptxas miscompiles (fixed in
engines/triton/expr.py: a product by a literal -1 is `_og_neg`; tests/engines/test_triton_conv_bwd.py
checks the PTX on the CPU). Here, on the GPU: the default build over several executes, and every
candidate config launched directly with each num_stages from 1 to 4, against the reference."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import opgraph as og
from opgraph.core.config import HeurMode
from opgraph.core.piece import make_piece
from opgraph.engines import get_engine
from opgraph.testing import compare, reference_outputs

from ..helpers import requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]

GRAPH = {
    "format": "opgraph.graph",
    "version": 1,
    "name": "fuzz_conv",
    "io_data_type": "HALF",
    "intermediate_data_type": "FLOAT",
    "compute_data_type": "FLOAT",
    "tensors": [
        {
            "uid": 1,
            "name": "in1",
            "dim": [1, 4, 1, 3],
            "stride": [0, 1, 1, 4],
            "data_type": "HALF",
            "is_virtual": False,
            "is_pass_by_value": False,
        },
        {
            "uid": 2,
            "name": "in2",
            "dim": [4, 8, 1, 3],
            "stride": [24, 3, 3, 1],
            "data_type": "HALF",
            "is_virtual": False,
            "is_pass_by_value": False,
        },
        {
            "uid": 3,
            "name": "dgrad3::DX",
            "dim": [1, 8, 1, 5],
            "stride": [1, 1, 1, 8],
            "data_type": "FLOAT",
            "is_virtual": True,
            "is_pass_by_value": False,
        },
        {
            "uid": 4,
            "name": "out5",
            "dim": [1, 8, 1, 5],
            "stride": [8, 1, 1, 8],
            "data_type": "HALF",
            "is_virtual": False,
            "is_pass_by_value": False,
        },
    ],
    "ops": [
        {
            "op": "conv_dgrad",
            "name": "dgrad3",
            "compute_data_type": "FLOAT",
            "attrs": {
                "pre_padding": [0, 1],
                "post_padding": [0, 1],
                "stride": [1, 1],
                "dilation": [1, 2],
                "convolution_mode": "CROSS_CORRELATION",
            },
            "inputs": {"loss": 1, "filter": 2},
            "outputs": {"DX": 3},
        },
        {
            "op": "pointwise",
            "name": "pw4",
            "compute_data_type": "FLOAT",
            "attrs": {"mode": "MUL", "axis": None},
            "inputs": {"input0": 3, "input1": {"const": -1.0}},
            "outputs": {"output": 4},
        },
    ],
}


def _inputs(seed: int) -> dict[int, np.ndarray]:
    """Small integers (sums exact in fp16, as the fuzzer's -24.0), DY as 12 values read through
    strides [0, 1, 1, 4] (an expanded view: one batch in memory)."""
    rng = np.random.default_rng(seed)
    dy_mem = rng.integers(-4, 5, size=12).astype(np.float16)
    dy = np.lib.stride_tricks.as_strided(dy_mem, (1, 4, 1, 3), (0, 2, 2, 8))
    w = rng.integers(-3, 4, size=(4, 8, 1, 3)).astype(np.float16)
    return {1: dy, 2: w}


def _device_pack(pack: dict[int, np.ndarray]) -> dict[int, object]:
    import torch

    dy_mem = torch.from_numpy(np.ascontiguousarray(np.lib.stride_tricks.as_strided(pack[1], (12,), (2,)))).cuda()
    return {1: dy_mem.as_strided((1, 4, 1, 3), (0, 1, 1, 4)), 2: torch.from_numpy(pack[2]).cuda()}


def _out():
    import torch

    return torch.full((1, 5, 1, 8), float("nan"), dtype=torch.float16, device="cuda").permute(0, 3, 2, 1)


def _check(final, got, want, what: str) -> None:
    m = compare(final.tensors[4], got.cpu().numpy(), want[4])
    assert m is None, f"{what}: {m}"


@pytest.mark.parametrize("seed", range(4))
def test_the_issues_dgrad_built_by_default_is_right_on_every_execute(seed):
    import torch

    g = og.Graph.from_json(json.dumps(GRAPH))
    plan = g.build(device="cuda")
    final = plan.graph
    pack = _inputs(seed)
    want = reference_outputs(final, pack)
    dev = _device_pack(pack)
    for i in range(4):  # the first execute launches; later ones replay the plan's CUDA graph
        out = _out()
        plan.execute({**dev, 4: out})
        torch.cuda.synchronize()
        _check(final, out, want, f"execute {i + 1} of {plan.describe()}")


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_every_dgrad_config_and_stage_count_is_right(stages):
    """Every candidate config of the piece, with num_stages from 1 to 4 (its main loop runs 3
    iterations), launched directly (no CUDA graph), three times each."""
    import torch

    g = og.Graph.from_json(json.dumps(GRAPH))
    final = g.final
    piece = make_piece(final, 0, final.nodes)
    from opgraph.core.device import resolve_device

    device = resolve_device("cuda")
    engine = get_engine("triton")
    pack = _inputs(0)
    want = reference_outputs(final, pack)
    dev = _device_pack(pack)
    failed = []
    for config in engine.configs(piece, device, HeurMode.B):
        knobs = tuple((k, stages if k == "num_stages" else v) for k, v in config.knobs)
        kernel = engine.compile(piece, dataclasses.replace(config, knobs=knobs), device)
        for i in range(3):
            out = _out()
            kernel.run({**dev, 4: out})
            torch.cuda.synchronize()
            m = compare(final.tensors[4], out.cpu().numpy(), want[4])
            if m is not None:
                failed.append(f"{dict(knobs)} run {i + 1}: {m}")
    assert not failed, "\n".join(failed)
