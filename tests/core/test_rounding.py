"""Conversions to integer types have PyTorch's semantics on every engine (issue 38): float -> integer
truncates toward zero, as `x.to(torch.long)` and C do (every engine rounded half to even before, so an
imported T5 got its relative-position buckets wrong); where PyTorch leaves it undefined the reference
defines it (opgraph/core/rounding.py): saturation to the type's bounds, infinities included, and
NaN -> 0; booleans are x != 0. Checked on the engines this machine runs: the reference, torch and the
generated kernels (Triton's interpreter on a CPU, compiled on a GPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import opgraph as og
from opgraph.core.rounding import round_to

from ..helpers import interpreter_available

D = og.DataType
ISSUE = [-2.7, -0.5, 0.5, 2.7, 3.5, -3.5, 1.99]
SPECIAL = np.array(
    [
        *ISSUE,
        0.0,
        -0.0,
        0.49999997,
        -0.49999997,
        0.9999999,
        -0.9999999,
        1.0,
        -1.0,
        1.5,
        2.5,
        -1.5,
        -2.5,
        126.9,
        127.0,
        127.5,
        127.99,
        128.0,
        -128.0,
        -128.5,
        -129.0,
        254.9,
        255.5,
        256.0,
        -1e-30,
        1e-45,
        3e9,
        -3e9,
        2.0**31 - 128,
        2.0**31,
        -(2.0**31),
        -(2.0**31) - 256,
        1e10,
        -1e10,
        2.0**53 + 2,
        2.0**62,
        2.0**63,
        -(2.0**63),
        1e20,
        -1e20,
        3.3e38,
        np.inf,
        -np.inf,
        np.nan,
    ]
)
INTS = [D.INT8, D.UINT8, D.INT32, D.INT64]


def _defined(values: np.ndarray, dt: D) -> np.ndarray:
    """The definition, element by element in Python (independent of NumPy's vector casts)."""
    if dt is D.BOOLEAN:
        return np.array([v != 0 for v in values])
    info = np.iinfo(dt.numpy)
    out = []
    for v in values.astype(np.float64).tolist():
        if math.isnan(v):
            out.append(0)
        elif math.isinf(v):
            out.append(int(info.max) if v > 0 else int(info.min))
        else:  # Python's int() of a float truncates toward zero, exactly
            out.append(min(max(int(v), int(info.min)), int(info.max)))
    return np.array(out, dtype=object)


@pytest.mark.parametrize("dt", INTS + [D.BOOLEAN], ids=lambda d: d.name)
def test_the_reference_rounding_is_the_definition(dt):
    got = round_to(SPECIAL, dt)
    assert got.dtype == dt.numpy
    assert [int(v) for v in got] == [int(v) for v in _defined(SPECIAL, dt)]


def test_the_issues_values_truncate_as_pytorch_does():
    torch = pytest.importorskip("torch")
    x = np.array(ISSUE)
    want = torch.tensor(ISSUE, dtype=torch.float64).to(torch.long).tolist()
    assert want == [-2, 0, 0, 2, 3, -3, 1]
    for dt in INTS:
        got = round_to(x, dt).tolist()
        assert got == [max(w, 0) if dt is D.UINT8 else w for w in want], dt


@pytest.mark.parametrize("src", [D.FLOAT, D.DOUBLE])
def test_pytorch_agrees_where_it_is_defined(src):
    """In range (and for booleans everywhere), the definition is PyTorch's own conversion."""
    torch = pytest.importorskip("torch")
    values = SPECIAL.astype(src.numpy)
    t = torch.from_numpy(values)
    for dt in INTS + [D.BOOLEAN]:
        mine = round_to(values.astype(np.float64), dt)
        if dt is D.BOOLEAN:
            assert mine.tolist() == t.to(torch.bool).tolist()
            continue
        info = np.iinfo(dt.numpy)
        inside = np.isfinite(values) & (values > float(info.min) - 1) & (values < float(info.max) + 1)
        if dt is D.INT64:
            inside &= np.abs(values) < 2.0**63
        theirs = t[torch.from_numpy(inside)].to(dt.to_torch()).tolist()
        assert mine[inside].tolist() == theirs, dt


def _engines() -> list[str]:
    engines = ["reference"]
    try:
        import torch  # noqa: F401

        engines.append("torch")
    except ImportError:
        pass
    if interpreter_available():
        engines.append("triton")
    return engines


@pytest.mark.parametrize("engine", _engines())
@pytest.mark.parametrize("src", [D.FLOAT, D.DOUBLE, D.HALF])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_every_engine_casts_special_values_as_defined(engine, src):
    """x (float) -> every integer type and bool, as an output and as an intermediate read back (a
    kernel storing it and one converting in registers)."""
    values = SPECIAL.astype(src.numpy)
    n = values.size
    g = og.Graph("casts", io_data_type=src, compute_data_type=D.DOUBLE if src is D.DOUBLE else D.FLOAT)
    x = g.tensor(dim=[n], name="x")
    outs = {}
    for dt in INTS + [D.BOOLEAN]:
        outs[dt] = g.identity(x).set_output(True).set_name(f"to_{dt.name}").set_data_type(dt)
    # an intermediate integer read back as a float: the conversion inside one kernel
    mid = g.identity(x).set_data_type(D.INT32)
    back = g.add(mid, 0.0).set_output(True).set_name("back").set_data_type(D.DOUBLE)
    plan = g.build(device="cpu", engines=[engine])
    bufs = {dt: np.full(n, 99, dtype=dt.numpy) for dt in outs}
    back_buf = np.full(n, np.nan)
    plan.execute({x: values, back: back_buf, **{outs[dt]: bufs[dt] for dt in outs}})
    as_f64 = values.astype(np.float64)
    for dt, buf in bufs.items():
        want = _defined(as_f64, dt)
        bad = [(float(v), int(b), int(w)) for v, b, w in zip(as_f64, buf, want) if int(b) != int(w)]
        assert not bad, f"{engine} {src.name} -> {dt.name}: (value, got, want) {bad[:6]}"
    want_back = np.array([float(v) for v in _defined(as_f64, D.INT32)])
    np.testing.assert_array_equal(back_buf, want_back)


@pytest.mark.parametrize("engine", _engines())
def test_an_integer_pass_by_value_scalar_given_a_float_truncates(engine):
    g = og.Graph("scalar", io_data_type=D.INT32)
    x = g.tensor(dim=[4], name="x")
    s = g.tensor(dim=[1], name="s", is_pass_by_value=True)
    y = g.add(x, s).set_output(True).set_name("y")
    plan = g.build(device="cpu", engines=[engine])
    out = np.zeros(4, np.int32)
    plan.execute({x: np.arange(4, dtype=np.int32), s: -2.7, y: out})
    assert out.tolist() == [-2, -1, 0, 1]
