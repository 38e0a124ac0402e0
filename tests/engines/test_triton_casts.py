"""Conversions in generated kernels follow the reference engine's rounding (opgraph.rounding): integer
results truncated toward zero and saturated (inf, -inf, 1e10 and NaN included), integer arithmetic exact
(2**30 + 3), bfloat16 and fp8 rounded to nearest even through float32 with E4M3 saturating and E5M2
overflowing to inf, exact decoding, also in float64 kernels. The Triton versions of the cast helpers
(what the GPU runs) are checked here under the interpreter too, against their NumPy stand-ins, except the
asm statements (bfloat16's cvt: its definition in integer arithmetic here, the instruction against that
in test_triton_casts_gpu.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import opgraph as og
from opgraph.core.rounding import round_to

from ..helpers import requires_interpreter

pytestmark = [pytest.mark.interpreter, requires_interpreter, pytest.mark.filterwarnings("ignore::RuntimeWarning")]
D = og.DataType

SPECIAL = np.array(
    [
        0.0,
        -0.0,
        0.5,
        1.5,
        2.5,
        -2.5,
        -3.5,
        0.49999997,
        1e10,
        -1e10,
        np.inf,
        -np.inf,
        np.nan,
        2.0**31,
        -(2.0**31) - 1,
        2.0**63,
        -(2.0**63),
        1e20,
        127.5,
        128.5,
        -128.5,
        255.5,
        3.3e38,
        65504.0,
        65520.0,
        448.0,
        449.0,
        464.0,
        480.0,
        500.0,
        -1000.0,
        57344.0,
        61439.0,
        61440.0,
        1e5,
        1 + 2.0**-8,
        1 + 3 * 2.0**-9,
        1 + 2.0**-4,
        1 + 3 * 2.0**-5,
        2.0**-7,
        2.0**-9,
        3 * 2.0**-10,
        2.0**-16,
        3 * 2.0**-17,
        2.0**-140,
        1e-45,
        6e-8,
        1e-300,
        2.0**53 + 2,
    ]
)
TYPES = [D.INT8, D.UINT8, D.INT32, D.INT64, D.BOOLEAN, D.HALF, D.BFLOAT16, D.FP8_E4M3, D.FP8_E5M2, D.FLOAT]


def _same(got, want):
    g, w = np.asarray(got).astype(np.float64), np.asarray(want).astype(np.float64)
    return np.array_equal(g, w) or bool(np.all((g == w) | (np.isnan(g) & np.isnan(w))))


@pytest.mark.parametrize("src", [D.FLOAT, D.DOUBLE])
@pytest.mark.parametrize("dst", TYPES)
def test_cast_of_edge_values(src, dst):
    values = SPECIAL if src is D.DOUBLE else SPECIAL.astype(np.float32)
    n = values.size
    g = og.Graph(io_data_type=src, compute_data_type=D.DOUBLE if src is D.DOUBLE else D.FLOAT)
    x = g.tensor(dim=[n], name="x", data_type=src)
    y = g.identity(x).set_output(True).set_name("y").set_data_type(dst)
    plan = g.build(device="cpu", engines=["triton"])
    out = np.zeros(n, dtype=dst.numpy)
    plan.execute({x: values, y: out})
    want = round_to(values.astype(np.float64), dst)
    bad = [
        (float(v), float(np.asarray(o).astype(np.float64)), float(np.asarray(w).astype(np.float64)))
        for v, o, w in zip(values, out, want)
        if not _same(o, w)
    ]
    assert not bad, f"{src.name} -> {dst.name}: (value, got, want) {bad[:6]}"


def test_saturating_integer_casts_from_the_issue():
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=[4], name="x")
    a = g.identity(x).set_output(True).set_name("a").set_data_type(D.INT32)
    b = g.identity(x).set_output(True).set_name("b").set_data_type(D.INT64)
    plan = g.build(device="cpu", engines=["triton"])
    xs = np.array([1e10, np.inf, -np.inf, np.nan], np.float32)
    oa, ob = np.zeros(4, np.int32), np.zeros(4, np.int64)
    plan.execute({x: xs, a: oa, b: ob})
    assert oa.tolist() == [2**31 - 1, 2**31 - 1, -(2**31), 0]
    assert ob.tolist() == [10**10, 2**63 - 1, -(2**63), 0]


@pytest.mark.parametrize("dt", [D.INT32, D.INT64])
def test_integer_arithmetic_is_exact(dt):
    g = og.Graph(io_data_type=dt, intermediate_data_type=dt)
    x, y = g.tensor(dim=[3], name="x"), g.tensor(dim=[3], name="y")
    s = g.add(x, y).set_output(True).set_name("s")
    p = g.mul(g.sub(x, y), 3).set_output(True).set_name("p")
    plan = g.build(device="cpu", engines=["triton"])
    big = 2**30 if dt is D.INT32 else 2**50
    xs, ys = np.array([big, -big, 7], dt.numpy), np.array([3, -5, 2**20], dt.numpy)
    os_, op = np.zeros(3, dt.numpy), np.zeros(3, dt.numpy)
    plan.execute({x: xs, y: ys, s: os_, p: op})
    want_s = round_to(xs.astype(np.float64) + ys, dt)
    want_p = round_to((xs.astype(np.float64) - ys) * 3, dt)
    assert os_.tolist() == want_s.tolist() and os_[0] == big + 3
    assert op.tolist() == want_p.tolist()


@pytest.mark.parametrize("dt", [D.BFLOAT16, D.FP8_E4M3, D.FP8_E5M2])
def test_narrow_float_intermediates_in_a_float64_kernel(dt, rng):
    """bf16/fp8 values read into a float64 kernel (Triton's interpreter once read bf16 as 0 there)."""
    g = og.Graph(io_data_type=D.DOUBLE, intermediate_data_type=D.DOUBLE, compute_data_type=D.DOUBLE)
    x = g.tensor(dim=[16], name="x", data_type=dt)
    w = g.tensor(dim=[16], name="w")
    t = g.mul(x, w).set_data_type(dt)  # rounded to dt in the middle of a float64 kernel
    y = g.add(t, x).set_output(True).set_name("y")
    plan = g.build(device="cpu", engines=["triton"])
    xs = round_to(rng.uniform(-3, 3, 16), dt)
    ws = rng.uniform(-3, 3, 16)
    out = np.zeros(16)
    plan.execute({x: xs, w: ws, y: out})
    want = round_to(round_to(xs.astype(np.float64) * ws, dt).astype(np.float64) + xs.astype(np.float64), D.DOUBLE)
    np.testing.assert_array_equal(out, want)


# -- the Triton versions of the helpers (the GPU's), run by the interpreter ----------------------------


def _helper_module(body: str):
    from opgraph.engines.triton.loader import load_module
    from opgraph.engines.triton.templates.base import module_source

    return load_module(module_source(body), interpret=True, fast_casts=False)


@pytest.mark.parametrize("dt", [D.BFLOAT16, D.FP8_E4M3, D.FP8_E5M2])
@pytest.mark.parametrize("src", [np.float32, np.float64])
def test_triton_encoders_round_like_the_reference(dt, src):
    import torch

    name = {D.BFLOAT16: "_og_to_bf16_bits", D.FP8_E4M3: "_og_to_e4m3_bits", D.FP8_E5M2: "_og_to_e5m2"}[dt]
    n = 64
    mod = _helper_module(f"def kernel(p, q):\n    i = tl.arange(0, {n})\n    tl.store(q + i, {name}(tl.load(p + i)))\n")
    rng = np.random.default_rng(3)
    values = np.concatenate([SPECIAL, rng.uniform(-600, 600, n)])[:n].astype(src)
    q = torch.zeros(n, dtype=dt.to_torch())
    mod.kernel[(1,)](torch.from_numpy(values), q)
    got = q.view(torch.int16 if dt is D.BFLOAT16 else torch.uint8).numpy()
    want = round_to(values.astype(np.float32).astype(np.float64), dt).view(got.dtype)
    nan = np.isnan(values)
    assert np.array_equal(got[~nan], want[~nan]), [
        (float(v), int(a), int(b)) for v, a, b in zip(values[~nan], got[~nan], want[~nan]) if a != b
    ][:6]
    decoded = q.view(torch.int16 if dt is D.BFLOAT16 else torch.uint8).numpy().view(dt.numpy).astype(np.float64)
    assert np.isnan(decoded[nan]).all()


@pytest.mark.parametrize("dt", [D.BFLOAT16, D.FP8_E4M3, D.FP8_E5M2])
def test_triton_decoders_are_exact(dt):
    import torch

    name = {D.BFLOAT16: "_og_from_bf16", D.FP8_E4M3: "_og_from_e4m3", D.FP8_E5M2: "_og_from_e5m2"}[dt]
    bits = (
        np.arange(256, dtype=np.uint8)
        if dt is not D.BFLOAT16
        else np.concatenate([np.arange(0, 65536, 257), [0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x8001]]).astype(np.uint16)
    )
    n = 1 << int(np.ceil(np.log2(bits.size)))
    bits = np.resize(bits, n)
    mod = _helper_module(f"def kernel(p, q):\n    i = tl.arange(0, {n})\n    tl.store(q + i, {name}(tl.load(p + i)))\n")
    carrier = torch.from_numpy(bits.view(np.int16) if dt is D.BFLOAT16 else bits)
    out = torch.zeros(n, dtype=torch.float32)
    mod.kernel[(1,)](carrier.view(dt.to_torch()), out)
    want = bits.view(dt.numpy).astype(np.float32)
    assert _same(out.numpy(), want)


@pytest.mark.parametrize("dt", [D.INT8, D.UINT8, D.INT32, D.INT64])
@pytest.mark.parametrize("src", [np.float32, np.float64])
def test_triton_integer_rounding(dt, src):
    import torch

    from opgraph.engines.triton.casts import to_storage

    compute = "tl.float64" if src is np.float64 else "tl.float32"
    n = 64
    mod = _helper_module(
        f"def kernel(p, q):\n    i = tl.arange(0, {n})\n"
        f"    tl.store(q + i, {to_storage('tl.load(p + i)', dt, compute)})\n"
    )
    values = np.resize(SPECIAL, n).astype(src)
    q = torch.zeros(n, dtype=dt.to_torch())
    mod.kernel[(1,)](torch.from_numpy(values), q)
    want = round_to(values.astype(np.float64), dt)
    assert q.numpy().tolist() == want.tolist(), [
        (float(v), int(a), int(b)) for v, a, b in zip(values, q.numpy(), want) if a != b
    ][:6]


_ = ml_dtypes


def test_bf16_pieces_decline_gpus_before_sm80():
    """The bf16 cast helpers are cvt.rn.bf16.f32 instructions (compute capability 8.0+): on an older GPU the
    Triton engine declines a piece with a bf16 tensor, saying why; fp16 pieces and sm_80+ GPUs are unaffected."""
    from opgraph.core.device import Device
    from opgraph.core.piece import make_piece
    from opgraph.engines import get_engine

    engine = get_engine("triton")

    def template(dt, cap):
        g = og.Graph("p", io_data_type=dt)
        g.relu(g.tensor(dim=[4, 8], name="x")).set_output(True)
        return engine.match(make_piece(g.final, 0, g.final.nodes), Device("cuda", 0, "GPU", cap, 40))

    t, why = template(D.BFLOAT16, (7, 5))
    assert t is None and "compute capability 8.0" in why and "7.5" in why
    assert template(D.BFLOAT16, (8, 0))[0] is not None and template(D.HALF, (7, 5))[0] is not None


def test_e4m3_results_decline_gpus_before_sm89():
    """E4M3 results are encoded by cvt.rn.satfinite.e4m3x2.f32 (compute capability 8.9+): an A100 declines a
    piece writing E4M3, saying why; reading E4M3 (decoding is integer arithmetic) and sm_89+ are unaffected."""
    from opgraph.core.device import Device
    from opgraph.core.piece import make_piece
    from opgraph.engines import get_engine

    engine = get_engine("triton")

    def match(out_dt, cap):
        g = og.Graph("p", io_data_type=D.FP8_E4M3, intermediate_data_type=D.FLOAT)
        g.relu(g.tensor(dim=[4, 8], name="x")).set_output(True).set_data_type(out_dt)
        return engine.match(make_piece(g.final, 0, g.final.nodes), Device("cuda", 0, "GPU", cap, 40))

    found, why = match(D.FP8_E4M3, (8, 0))
    assert found is None and "8.9" in why and "cvt.rn.satfinite" in why
    assert match(D.HALF, (8, 0))[0] is not None
    assert match(D.FP8_E4M3, (9, 0))[0] is not None


# -- E4M3 results compiled for Hopper (the cvt instruction packs four elements) ---------------------------------


def _e4m3_out(build):
    def make():
        g = og.Graph("e4m3", io_data_type=D.FLOAT, intermediate_data_type=D.FLOAT)
        build(g)
        return g

    return make


HOPPER_CASES = {  # blocks of 1, 2, 3 and 4+ elements written as E4M3
    "pointwise_1": (
        _e4m3_out(lambda g: g.relu(g.tensor(dim=[1], name="x")).set_output(True).set_data_type(D.FP8_E4M3)),
        "pointwise",
        1,
    ),
    "pointwise_3": (
        _e4m3_out(lambda g: g.relu(g.tensor(dim=[3], name="x")).set_output(True).set_data_type(D.FP8_E4M3)),
        "pointwise",
        1,
    ),
    "reduction_1": (
        _e4m3_out(
            lambda g: (
                g.reduction(g.tensor(dim=[4096], name="x"), mode="AMAX")
                .set_output(True)
                .set_dim([1])
                .set_data_type(D.FP8_E4M3)
            )
        ),
        "reduction",
        1,
    ),
    "reduction_2": (
        _e4m3_out(
            lambda g: (
                g.reduction(g.tensor(dim=[2, 64], name="x"), mode="ADD")
                .set_output(True)
                .set_dim([2, 1])
                .set_data_type(D.FP8_E4M3)
            )
        ),
        "reduction",
        1,
    ),
}


def test_e4m3_results_compile_for_hopper_in_blocks_of_any_size():
    """The E4M3 encoder packs four elements an asm statement; a block of 1-3 results takes its integer
    definition (Triton refuses a packed statement over fewer elements): every case compiles for sm_90."""
    from .hopper_compile import compile_for_hopper

    lines = [line for line in compile_for_hopper(__name__).splitlines() if line.startswith("compiled")]
    assert {line.split()[1] for line in lines} == set(HOPPER_CASES), lines
