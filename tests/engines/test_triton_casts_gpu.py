"""The bfloat16 and E4M3 cast instructions of generated kernels on the GPU (casts.py: `_og_to_bf16` and
`_og_round_bf16` are cvt.rn.bf16.f32 in asm statements, `_og_to_e4m3` cvt.rn.satfinite.e4m3x2.f32) against
their definitions in integer arithmetic
(`_og_to_bf16_bits`, which the interpreter tests hold to the reference) and the reference engine's
rounding, over float32 values of every exponent with tie, near-tie, subnormal, overflow and special
bit patterns; and conversions to integer types (truncation toward zero, saturation, NaN -> 0: issue 38)
by compiled kernels and the torch engine on the GPU, against the definition and PyTorch's CUDA casts."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.core.rounding import round_to

from ..helpers import requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]
D = og.DataType


def _patterns() -> np.ndarray:
    """float32 bit patterns: every high half (sign, exponent, 7 mantissa bits) with low halves that
    round down, tie (odd and even), round up, and the extremes."""
    high = np.arange(1 << 16, dtype=np.uint32) << 16
    low = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    return (high[:, None] | low[None, :]).ravel().view(np.float32)


def _run_helpers(values: np.ndarray, helpers: dict[str, object]) -> list:
    """Each cast helper (name -> output torch dtype) applied to `values` on the GPU in one kernel."""
    import torch

    from opgraph.engines.triton.loader import load_module
    from opgraph.engines.triton.templates.base import module_source

    names = [f"o{i}" for i in range(len(helpers))]
    body = (
        f"def kernel(p, {', '.join(names)}, n, BLOCK: tl.constexpr):\n"
        "    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    m = i < n\n"
        "    x = tl.load(p + i, mask=m)\n"
        + "".join(f"    tl.store({o} + i, {h}(x), mask=m)\n" for o, h in zip(names, helpers))
    )
    mod = load_module(module_source(body), interpret=False)
    n = values.size
    outs = [torch.empty(n, dtype=dt, device="cuda") for dt in helpers.values()]
    mod.kernel[(-(-n // 1024),)](torch.from_numpy(values).cuda(), *outs, n, BLOCK=1024)
    return outs


def test_gpu_bf16_cast_instructions_match_their_definition():
    import torch

    values = _patterns()
    helpers = {"_og_to_bf16": torch.bfloat16, "_og_to_bf16_bits": torch.bfloat16, "_og_round_bf16": torch.float32}
    q, r, s = _run_helpers(values, helpers)
    asm = q.view(torch.int16).cpu().numpy().view(np.uint16)
    bits = r.view(torch.int16).cpu().numpy().view(np.uint16)
    nan = np.isnan(values)
    assert np.array_equal(asm[~nan], bits[~nan])
    want = round_to(values.astype(np.float64), D.BFLOAT16).view(np.uint16)
    assert np.array_equal(asm[~nan], want[~nan])
    assert np.isnan(q.float().cpu().numpy()[nan]).all()
    rounded = s.cpu().numpy()
    assert np.array_equal(rounded[~nan].view(np.uint32), want[~nan].astype(np.uint32) << 16)
    assert np.isnan(rounded[nan]).all()


def test_gpu_e4m3_cast_instruction_matches_its_definition():
    """`_og_to_e4m3` (cvt.rn.satfinite.e4m3x2.f32, four elements an asm statement) against its definition in
    integer arithmetic and the reference engine's rounding, bit for bit (NaN: a NaN), over every float32
    high half with its tie and near-tie low halves: subnormals, 448's neighbourhood, infinities."""
    import torch

    values = _patterns()
    q, r = _run_helpers(values, {"_og_to_e4m3": torch.float8_e4m3fn, "_og_to_e4m3_bits": torch.float8_e4m3fn})
    asm = q.view(torch.uint8).cpu().numpy()
    bits = r.view(torch.uint8).cpu().numpy()
    nan = np.isnan(values)
    assert np.array_equal(asm[~nan], bits[~nan]), np.flatnonzero(asm[~nan] != bits[~nan])[:8]
    want = round_to(values.astype(np.float64), D.FP8_E4M3).view(np.uint8)
    assert np.array_equal(asm[~nan], want[~nan])
    assert ((asm[nan] & 0x7F) == 0x7F).all()  # (E4M3's NaN: S.1111.111)


@pytest.mark.parametrize("engine", ["triton", "torch"])
@pytest.mark.parametrize("src", [D.FLOAT, D.DOUBLE, D.HALF])
def test_gpu_integer_casts_truncate_and_saturate(engine, src):
    import torch

    from ..core.test_rounding import INTS, SPECIAL, _defined

    values = SPECIAL.astype(src.numpy)
    n = values.size
    g = og.Graph("casts", io_data_type=src, compute_data_type=D.DOUBLE if src is D.DOUBLE else D.FLOAT)
    x = g.tensor(dim=[n], name="x")
    outs = {dt: g.identity(x).set_output(True).set_name(f"to_{dt.name}").set_data_type(dt) for dt in INTS + [D.BOOLEAN]}
    mid = g.identity(x).set_data_type(D.INT32)
    back = g.add(mid, 0.0).set_output(True).set_name("back").set_data_type(D.DOUBLE)
    plan = g.build(device="cuda", engines=[engine])
    assert {s.config.engine for s in plan.steps} == {engine}
    xt = torch.from_numpy(values).cuda()
    bufs = {dt: torch.full((n,), 99, dtype=dt.to_torch(), device="cuda") for dt in outs}
    back_buf = torch.full((n,), float("nan"), dtype=torch.float64, device="cuda")
    for _ in range(2):  # the second execute replays the plan's CUDA graph
        plan.execute({x: xt, back: back_buf, **{outs[dt]: bufs[dt] for dt in outs}})
    torch.cuda.synchronize()
    as_f64 = values.astype(np.float64)
    for dt, buf in bufs.items():
        got = buf.cpu().tolist()
        want = [int(w) for w in _defined(as_f64, dt)]
        bad = [(float(v), int(b), w) for v, b, w in zip(as_f64, got, want) if int(b) != w]
        assert not bad, f"{engine} {src.name} -> {dt.name}: (value, got, want) {bad[:6]}"
        if dt in (D.INT32, D.INT64):  # PyTorch's CUDA conversion, where it is defined
            inside = np.isfinite(as_f64) & (np.abs(as_f64) < float(np.iinfo(dt.numpy).max))
            theirs = xt[torch.from_numpy(inside).cuda()].to(dt.to_torch()).cpu().tolist()
            assert [g for g, i in zip(got, inside) if i] == theirs
    np.testing.assert_array_equal(back_buf.cpu().numpy(), [float(v) for v in _defined(as_f64, D.INT32)])
