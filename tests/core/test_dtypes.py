"""DataType conversions (NumPy, ml_dtypes, PyTorch, names) and the rounding every engine agrees on."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import opgraph as og
from opgraph.core.dtypes import as_data_type
from opgraph.core.rounding import round_to

D = og.DataType
torch = pytest.importorskip("torch")

NUMPY = {
    D.FLOAT: np.float32,
    D.DOUBLE: np.float64,
    D.HALF: np.float16,
    D.BFLOAT16: ml_dtypes.bfloat16,
    D.INT8: np.int8,
    D.UINT8: np.uint8,
    D.INT32: np.int32,
    D.INT64: np.int64,
    D.BOOLEAN: np.bool_,
    D.FP8_E4M3: ml_dtypes.float8_e4m3fn,
    D.FP8_E5M2: ml_dtypes.float8_e5m2,
}
TORCH = {
    D.FLOAT: torch.float32,
    D.DOUBLE: torch.float64,
    D.HALF: torch.float16,
    D.BFLOAT16: torch.bfloat16,
    D.INT8: torch.int8,
    D.UINT8: torch.uint8,
    D.INT32: torch.int32,
    D.INT64: torch.int64,
    D.BOOLEAN: torch.bool,
    D.FP8_E4M3: torch.float8_e4m3fn,
    D.FP8_E5M2: torch.float8_e5m2,
}


def test_every_data_type_is_covered():
    assert set(D) == set(NUMPY) == set(TORCH)
    assert {d.name for d in D} == {
        "FLOAT",
        "DOUBLE",
        "HALF",
        "BFLOAT16",
        "INT8",
        "UINT8",
        "INT32",
        "INT64",
        "BOOLEAN",
        "FP8_E4M3",
        "FP8_E5M2",
    }


@pytest.mark.parametrize("dt", list(D), ids=lambda d: d.name)
def test_numpy_round_trip(dt):
    assert dt.numpy == np.dtype(NUMPY[dt])
    assert as_data_type(NUMPY[dt]) is dt  # the scalar type
    assert as_data_type(np.dtype(NUMPY[dt])) is dt  # the dtype object
    assert as_data_type(np.zeros(2, NUMPY[dt]).dtype) is dt
    assert dt.itemsize == np.dtype(NUMPY[dt]).itemsize


@pytest.mark.parametrize("dt", list(D), ids=lambda d: d.name)
def test_torch_round_trip(dt):
    assert dt.to_torch() is TORCH[dt]
    assert as_data_type(TORCH[dt]) is dt
    assert torch.empty(0, dtype=TORCH[dt]).element_size() == dt.itemsize


@pytest.mark.parametrize("dt", list(D), ids=lambda d: d.name)
def test_names(dt):
    assert as_data_type(dt) is dt
    assert as_data_type(dt.name) is dt
    assert as_data_type(dt.name.lower()) is dt
    assert as_data_type(f"  {dt.value} ") is dt
    assert repr(dt) == f"DataType.{dt.name}"


@pytest.mark.parametrize(
    "alias, dt",
    [
        ("float32", D.FLOAT),
        ("fp32", D.FLOAT),
        ("f32", D.FLOAT),
        ("float64", D.DOUBLE),
        ("fp64", D.DOUBLE),
        ("float16", D.HALF),
        ("fp16", D.HALF),
        ("f16", D.HALF),
        ("bf16", D.BFLOAT16),
        ("bool", D.BOOLEAN),
        ("float8_e4m3fn", D.FP8_E4M3),
        ("float8_e5m2", D.FP8_E5M2),
        ("Half", D.HALF),
        ("INT8", D.INT8),
    ],
)
def test_aliases(alias, dt):
    assert as_data_type(alias) is dt


def test_kinds():
    floats = {D.FLOAT, D.DOUBLE, D.HALF, D.BFLOAT16, D.FP8_E4M3, D.FP8_E5M2}
    ints = {D.INT8, D.UINT8, D.INT32, D.INT64}
    for dt in D:
        assert dt.is_floating == (dt in floats)
        assert dt.is_integer == (dt in ints)
    assert [D.FLOAT.short, D.HALF.short, D.BFLOAT16.short, D.INT8.short] == ["f32", "f16", "bf16", "i8"]


@pytest.mark.parametrize(
    "bad",
    [
        "nope",
        "f8",
        "",
        None,
        3,
        1.5,
        object(),
        np.complex64,
        np.dtype("U3"),
        torch.complex64,
        torch.float8_e4m3fnuz,
        [D.FLOAT],
    ],
    ids=lambda v: "object" if type(v) is object else repr(v)[:30],
)
def test_unknown_data_type(bad):
    with pytest.raises(og.DataTypeError) as ei:
        as_data_type(bad)
    assert "[rule dtype.unknown]" in str(ei.value)
    assert ei.value.rule == "dtype.unknown"
    assert "FLOAT" in ei.value.hint  # lists what is accepted


def test_data_types_accepted_everywhere():
    g = og.Graph(io_data_type=torch.float16, intermediate_data_type=np.float32, compute_data_type="float")
    assert (g.io_data_type, g.intermediate_data_type, g.compute_data_type) == (D.HALF, D.FLOAT, D.FLOAT)
    x = g.tensor(dim=[2], data_type=np.int8)
    assert x.data_type is D.INT8
    assert x.set_data_type(torch.bfloat16).data_type is D.BFLOAT16
    assert x.set_data_type(ml_dtypes.float8_e5m2).data_type is D.FP8_E5M2
    y = g.identity(x, compute_data_type=torch.float64)
    y.set_output(True)
    assert g.final.nodes[0].compute_data_type is D.DOUBLE
    with pytest.raises(og.DataTypeError, match="io_data_type"):
        og.Graph(io_data_type="float4")
    with pytest.raises(og.DataTypeError):
        x.set_data_type(None)


# -- rounding ----------------------------------------------------------------------------------------


def test_round_float_types_match_numpy_and_torch():
    rng = np.random.default_rng(0)
    v = rng.standard_normal(1000) * 10.0 ** rng.integers(-6, 6, 1000)
    for dt in (D.FLOAT, D.HALF, D.BFLOAT16, D.FP8_E4M3, D.FP8_E5M2, D.DOUBLE):
        got = round_to(v, dt)
        assert got.dtype == dt.numpy
        # engines compute in fp32 and round from there: torch's float32 -> dtype conversion
        want = torch.from_numpy(v.astype(np.float32) if dt is not D.DOUBLE else v).to(TORCH[dt])
        want = want.to(torch.float64).numpy()
        np.testing.assert_array_equal(got.astype(np.float64), want, err_msg=dt.name)


def test_round_float_specials():
    v = np.array([np.nan, np.inf, -np.inf, 1e6, -1e6, 65504.0, 65520.0, 1e-8])
    np.testing.assert_array_equal(
        round_to(v, D.HALF).astype(np.float64), [np.nan, np.inf, -np.inf, np.inf, -np.inf, 65504.0, np.inf, 1e-8 * 0]
    )
    # fp8 e4m3 has no infinity: overflow and inf saturate to +-448 (as PyTorch and the GPU's satfinite
    # conversion do); NaN stays NaN. e5m2 overflows to inf.
    np.testing.assert_array_equal(
        round_to(np.array([1e6, np.inf, -np.inf, 500.0, 448.0, np.nan]), D.FP8_E4M3).astype(np.float64),
        [448.0, 448.0, -448.0, 448.0, 448.0, np.nan],
    )
    np.testing.assert_array_equal(round_to(np.array([1e6, -np.inf]), D.FP8_E5M2).astype(np.float64), [np.inf, -np.inf])
    assert round_to(np.array(0.1), D.HALF) == np.float16(0.1)  # 0-d in, 0-d out


@pytest.mark.parametrize("dt", [D.INT8, D.UINT8, D.INT32, D.INT64], ids=lambda d: d.name)
def test_round_integers_saturate(dt):
    info = np.iinfo(dt.numpy)
    v = np.array(
        [
            np.nan,
            np.inf,
            -np.inf,
            1e30,
            -1e30,
            float(info.max) + 10.0,
            float(info.min) - 10.0,
            0.5,
            1.5,
            2.5,
            -0.5,
            -1.5,
            -2.5,
            3.7,
            -3.7,
            0.0,
            7.0,
        ]
    )
    got = round_to(v, dt)
    assert got.dtype == dt.numpy
    want = [
        0,
        info.max,
        info.min,
        info.max,
        info.min,
        info.max,
        info.min,
        0,
        1,
        2,
        0,
        -1,
        -2,
        3,
        -3,
        0,
        7,
    ]  # toward zero (as C, PyTorch); NaN -> 0
    want = [max(min(w, info.max), info.min) for w in want]
    assert got.tolist() == want


def test_round_int64_extremes_exact():
    got = round_to(np.array([2.0**62, -(2.0**63), 2.0**63, 9.3e18]), D.INT64)
    assert got.tolist() == [2**62, -(2**63), 2**63 - 1, 2**63 - 1]
    assert round_to(np.array(1e300), D.INT64) == 2**63 - 1  # 0-d


def test_round_boolean():
    v = np.array([0.0, -0.0, 1.0, -3.5, 1e-30, np.nan, np.inf])
    got = round_to(v, D.BOOLEAN)
    assert got.dtype == np.bool_
    assert got.tolist() == [False, False, True, True, True, True, True]
    assert round_to(np.array([True, False]), D.FLOAT).tolist() == [1.0, 0.0]
