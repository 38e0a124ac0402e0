"""bench.check's error measure, on the CPU: relative L2 error, absolute RMS for an exactly-zero reference."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from bench import check  # noqa: E402


def test_relative_error_against_float64():
    g = torch.Generator().manual_seed(0)
    want = torch.randn(1000, dtype=torch.float64, generator=g)
    got = (want * (1 + 1e-3)).to(torch.float16)
    assert check.relerr(got, want) == pytest.approx(1e-3, rel=0.3)
    assert math.isnan(check.relerr(torch.full((1000,), float("inf")), want))


def test_a_reference_that_is_rounding_noise_is_compared_absolutely():
    """A batchnorm bias's gradient that cancels to ~1e-17 in float64: got - want by its RMS, so a wrong
    value of the scale of real gradients (1e-3) stands out instead of dividing by the noise."""
    g = torch.Generator().manual_seed(1)
    want = torch.randn(64, dtype=torch.float64, generator=g) * 1e-17
    assert check.zero_reference(want) and not check.zero_reference(want * 1e6)
    noise = torch.randn(64, dtype=torch.float64, generator=g) * 1e-6
    err = check.relerr((want + noise).to(torch.float32), want)
    assert err == pytest.approx(float(noise.norm()) / 8, rel=1e-3)
    assert check.relerr(want + 1e-3, want) > 100 * err
