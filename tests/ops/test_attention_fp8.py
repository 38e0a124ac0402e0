"""g.sdpa_fp8 (and opgraph.cudnn's pygraph.sdpa_fp8) against cuDNN's definition written out here in NumPy
(float64 math, fp8 rounding by ml_dtypes): O, Stats, amax_s, amax_o on random fp8 data with non-trivial
scales, causal from either corner, one K/V head shared; the generated kernels under the interpreter; the
typed refusals."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import opgraph as og

DT = og.DataType
E4M3 = ml_dtypes.float8_e4m3fn
SCALES = {"descale_q": 0.5, "descale_k": 0.25, "descale_v": 2.0, "descale_s": 1 / 64, "scale_s": 64.0, "scale_o": 4.0}


def cudnn_sdpa_fp8(q, k, v, attn_scale, causal=None, left=None):
    """The reference: cuDNN frontend's SDPAFP8Node, float64 math, P and O quantized to E4M3; `causal`
    "top_left" / "bottom_right" (right bound 0), `left` a window (keys i + delta - left < j)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) * attn_scale * SCALES["descale_q"] * SCALES["descale_k"]
    sq, skv = s.shape[-2:]
    if causal or left:
        i, j = np.arange(sq)[:, None], np.arange(skv)[None, :]
        delta = skv - sq if causal == "bottom_right" else 0
        keep = np.ones((sq, skv), dtype=bool)
        if causal:
            keep &= j <= i + delta
        if left:
            keep &= j > i + delta - left
        s = np.where(keep, s, np.finfo(np.float32).min)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    z = e.sum(-1, keepdims=True)
    p = e / z
    p8 = (p * SCALES["scale_s"]).astype(np.float32).astype(E4M3).astype(np.float64)
    o = p8 @ v * SCALES["descale_s"] * SCALES["descale_v"]
    out = (o * SCALES["scale_o"]).astype(np.float32).astype(E4M3).astype(np.float64)
    return out, m + np.log(z), np.abs(p).max(), np.abs(o).max()


def build(b=2, h=2, hk=2, sq=24, skv=40, d=32, causal=None, stats=True, left=None):
    g = og.Graph("fp8attn", io_data_type=DT.FP8_E4M3, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    q = g.tensor(dim=[b, h, sq, d], name="q")
    k = g.tensor(dim=[b, hk, skv, d], name="k")
    v = g.tensor(dim=[b, hk, skv, d], name="v")
    scales = [g.tensor(dim=[1, 1, 1, 1], data_type=DT.FLOAT, name=n) for n in SCALES]
    o, st, amax_s, amax_o = g.sdpa_fp8(
        q,
        k,
        v,
        *scales,
        generate_stats=stats,
        attn_scale=d**-0.5,
        use_causal_mask=causal == "top_left",
        use_causal_mask_bottom_right=causal == "bottom_right",
        sliding_window_length=left,
        name="attn",
    )
    for t in (o, st, amax_s, amax_o):
        if t is not None:
            t.set_output(True)
    return g, (q, k, v, scales, o, st, amax_s, amax_o)


def run(g, handles, rng, engines):
    q, k, v, scales, o, st, amax_s, amax_o = handles
    g.validate()
    data = {t: rng.standard_normal(t.dim).astype(np.float32).astype(E4M3) for t in (q, k, v)}
    pack = {**data, **{t: np.full([1, 1, 1, 1], val, np.float32) for t, val in zip(scales, SCALES.values())}}
    outs = {t: np.full(t.dim, np.nan, dtype=t.data_type.numpy) for t in (o, st, amax_s, amax_o) if t is not None}
    plan = g.build(device="cpu", engines=engines)
    plan.execute({**pack, **outs})
    return plan, data, outs


@pytest.mark.parametrize(
    "causal,left", [(None, None), ("top_left", None), ("bottom_right", None), ("top_left", 5), ("bottom_right", 9)]
)
@pytest.mark.parametrize("engines", [["reference"], ["torch"]], ids=["reference", "torch"])
def test_sdpa_fp8_is_cudnns_definition(causal, left, engines, rng):
    g, handles = build(causal=causal, left=left)
    q, k, v, _, o, st, amax_s, amax_o = handles
    _, data, outs = run(g, handles, rng, engines)
    want_o, want_st, want_as, want_ao = cudnn_sdpa_fp8(data[q], data[k], data[v], 32**-0.5, causal, left)
    got_o = outs[o].astype(np.float64)
    # (fp32 math against float64: an E4M3 rounding may flip at a tie; never by more than a step)
    close = np.isclose(got_o, want_o, rtol=0.07, atol=1e-6)
    assert close.all() and (got_o == want_o).mean() > 0.98, np.abs(got_o - want_o).max()
    np.testing.assert_allclose(outs[st], want_st, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[amax_s].item(), want_as, rtol=1e-5)
    np.testing.assert_allclose(outs[amax_o].item(), want_ao, rtol=1e-3)


@pytest.mark.interpreter
def test_sdpa_fp8_generated_kernels_match_the_reference(rng):
    """The composite's pieces as generated kernels (fp8 matmuls, the softmax's reductions, the amaxes)
    under the interpreter, one K/V head shared by every query head, against the reference engine."""
    from ..helpers import assert_engine_matches

    g, _ = build(hk=1, causal="bottom_right")
    plan = assert_engine_matches(g, rng, engines=("triton", "reference"), rtol=0.07, atol=1e-3)
    assert any(s.config.engine == "triton" for s in plan.steps), plan.describe()


def test_sdpa_fp8_without_stats_and_with_numbers_for_scales(rng):
    g = og.Graph("fp8attn", io_data_type=DT.FP8_E4M3, intermediate_data_type=DT.FLOAT)
    q, k, v = (g.tensor(dim=[1, 2, 8, 16], name=n) for n in "qkv")
    o, stats, amax_s, amax_o = g.sdpa_fp8(q, k, v, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, amax=False)
    assert stats is None and amax_s is None and amax_o is None
    o.set_output(True).set_data_type(DT.BFLOAT16)
    assert og.testing.check_plan(g.build(device="cpu", engines=["reference"]), rng) == []


def test_a_band_leaving_rows_without_keys_is_refused():
    """Bottom-right causal with S_q > S_kv leaves the first S_q - S_kv rows no key: refused, as cuDNN does."""
    with pytest.raises(og.UnsupportedGraphError) as info:
        build(sq=40, skv=24, causal="bottom_right")
    assert info.value.rule == "sdpa_fp8.rows_without_keys" and "16 query row(s)" in str(info.value)
    build(sq=24, skv=40, causal="bottom_right")  # (S_q <= S_kv: every row sees a key)


@pytest.mark.parametrize(
    "change,rule",
    [
        (dict(q_dt=DT.HALF), "sdpa_fp8.types"),
        (dict(hk=3), "sdpa_fp8.heads"),
        (dict(both=True), "sdpa_fp8.mask"),
        (dict(rank=3), "sdpa_fp8.dims"),
    ],
)
def test_sdpa_fp8_refusals_name_the_rule(change, rule):
    g = og.Graph("bad", io_data_type=DT.FP8_E4M3, intermediate_data_type=DT.FLOAT)
    dims = [1, 4, 8, 16][4 - change.get("rank", 4) :]
    q = g.tensor(dim=dims, name="q", data_type=change.get("q_dt", DT.FP8_E4M3))
    kd = [1, change.get("hk", 4), 8, 16][4 - change.get("rank", 4) :]
    k, v = g.tensor(dim=kd, name="k"), g.tensor(dim=kd, name="v")
    with pytest.raises(og.GraphError) as info:
        g.sdpa_fp8(
            q,
            k,
            v,
            1.0,
            1.0,
            1.0,
            1.0,
            1.0,
            1.0,
            use_causal_mask=True,
            use_causal_mask_bottom_right=change.get("both", False),
        )
    assert info.value.rule == rule
