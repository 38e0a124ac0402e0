"""engines.cost: device rates as a table per GPU family (the first family a device's name contains), a
conservative default for the others, and conv_fprop's fitted constants as a named table that its cost
model reads (a different fit gives different estimates)."""

from __future__ import annotations

import dataclasses

import pytest

from opgraph.core.device import CPU, Device
from opgraph.core.piece import make_piece
from opgraph.engines.cost import (
    DEFAULT_RATES,
    DEVICE_RATES,
    LAUNCH_US,
    RATES,
    device_rates,
    estimate_us,
    piece_bytes,
    piece_flops,
    rates,
)

from .test_triton_matmul import mm_graph

H100 = Device("cuda", 0, "NVIDIA H100 80GB HBM3", (9, 0), 132)
H200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
A100 = Device("cuda", 0, "NVIDIA A100-SXM4-80GB", (8, 0), 108)


def test_rates_by_family_and_a_default():
    assert device_rates(H100).family == "H100" and device_rates(H200).family == "H200"
    assert rates(H200) == (4.2e12, 7.0e14) and rates(H100) == (3.0e12, 7.0e14)
    assert device_rates(A100) is DEFAULT_RATES and rates(A100) == (1.5e12, 1.5e14)
    assert dict(RATES) == {r.family: rates(Device("cuda", 0, f"NVIDIA {r.family}")) for r in DEVICE_RATES}
    assert all(r.evidence.startswith("bench/results/constants.md#") for r in DEVICE_RATES)
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEVICE_RATES[0].copy_bytes_per_s = 1.0  # type: ignore[misc]


def test_estimate_is_the_slower_of_bytes_and_math_plus_a_launch():
    g, _, _, c = mm_graph((1, 4096, 4096), (1, 4096, 4096))
    c.set_output(True)
    g.validate()
    piece = make_piece(g.final, 0, list(g.final.nodes))
    bw, peak = rates(H100)
    want = max(piece_bytes(piece) / bw, piece_flops(piece) / peak) * 1e6 + LAUNCH_US
    assert estimate_us(piece, H100) == pytest.approx(want) and piece_flops(piece) == 2 * 4096**3
    assert estimate_us(piece, A100) > estimate_us(piece, H100)  # the default rates are lower
    assert estimate_us(piece, CPU) is None


def test_conv_cost_reads_its_fitted_constants():
    from opgraph.engines.triton.templates._conv_fit import HOPPER
    from opgraph.engines.triton.templates.conv_fprop import TEMPLATE, conv_cost
    from opgraph.tools.samples import conv_bias_relu

    final = conv_bias_relu(n=32, c=64, k=64, hw=56, r=3, padding=1).final
    piece = make_piece(final, 0, final.nodes)
    match = TEMPLATE.matched(piece, H100)
    knobs = match.candidates()[0]
    base = conv_cost(match, knobs)
    assert base == conv_cost(match, knobs, HOPPER) == match.estimate(knobs)
    assert conv_cost(match, knobs, dataclasses.replace(HOPPER, base_us=HOPPER.base_us + 5)) == pytest.approx(base + 5)
    slower_l2 = dataclasses.replace(HOPPER, sm_l2_bytes_per_us=HOPPER.sm_l2_bytes_per_us / 10)
    assert conv_cost(match, knobs, slower_l2) > base
    assert conv_cost(TEMPLATE.matched(piece, H200), knobs) <= base  # H200's DRAM is faster
