"""sdpa / sdpa_backward on the torch engine against the reference engine: the
F.scaled_dot_product_attention path and the math path, every option (masks, GQA, BSHD/BHSD, bias,
ALiBi, score modifiers, both dropout forms), forward and backward; the Philox stream in torch
against the NumPy one bit for bit. GPU tests (fp16/bf16, head dims 64/128/256) are marked gpu."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.ops import attention_ref as R

from ..helpers import assert_engine_matches, requires_cuda
from ..ops import test_attention_features as FEATURES
from ..ops.attention_torch import strides

torch = pytest.importorskip("torch")
from opgraph.engines.torch_engine import attention as TA

DT = og.DataType
B, HQ = 2, 4


def _softcap(g, s):
    return g.mul(g.tanh(g.div(s, 2.0)), 2.0)


def _graph(
    io=DT.FLOAT,
    *,
    sq=5,
    skv=7,
    hk=2,
    hv=2,
    d=8,
    dv=8,
    layout="bshd",
    backward=False,
    stats=None,
    bias=False,
    mod=False,
    padding=False,
    drop=None,
    **opts,
):
    """sdpa (and, with backward, sdpa_backward reading its O and Stats) over tensors of `io` type."""
    g = og.Graph("att", io_data_type=io, intermediate_data_type=DT.FLOAT)
    dims = {"q": (B, HQ, sq, d), "k": (B, hk, skv, d), "v": (B, hv, skv, dv)}
    t = {n: g.tensor(dim=x, stride=strides(x, layout), name=n) for n, x in dims.items()}
    kw = dict(opts)
    if bias:
        kw["bias"] = g.tensor(dim=[1, HQ, sq, skv], name="bias")
    if padding:
        kw["use_padding_mask"] = True
        kw["seq_len_q"] = g.tensor(dim=[B, 1, 1, 1], data_type=DT.INT32, name="seq_len_q")
        kw["seq_len_kv"] = g.tensor(dim=[B, 1, 1, 1], data_type=DT.INT32, name="seq_len_kv")
    if mod:
        cap = g.tensor(dim=[1, 1, 1, 1], data_type=DT.FLOAT, name="cap")
        kw["score_mod"] = lambda sg, s: sg.mul(sg.tanh(sg.div(s, cap)), cap)
    if drop == "mask":
        kw["dropout"] = (g.tensor(dim=[B, HQ, sq, skv], name="dmask"), 1 / 0.75)
    elif drop in ("philox", "philox_by_value"):
        kw["dropout"] = (
            0.25,
            *(
                g.tensor(dim=[1], data_type=DT.INT64, is_pass_by_value=drop == "philox_by_value", name=n)
                for n in ("seed", "offset")
            ),
        )
    want_stats = backward if stats is None else stats
    o, st = g.sdpa(t["q"], t["k"], t["v"], generate_stats=want_stats, **kw, name="fwd")
    o.set_output(True).set_stride(strides((B, HQ, sq, dv), layout))
    if st is not None:
        st.set_output(True)
    if backward:
        do = g.tensor(dim=[B, HQ, sq, dv], stride=strides((B, HQ, sq, dv), layout), name="dO")
        if bias:
            kw["dBias"] = g.tensor(dim=[1, HQ, sq, skv], data_type=DT.FLOAT, name="dBias")
        grads = g.sdpa_backward(t["q"], t["k"], t["v"], o, do, st, **kw, name="bwd")
        for x in grads:
            x.set_output(True)
    return g


def _prepare(pack, g):
    """Valid inputs where random ones are not: lengths within the dims, 0/1 dropout masks."""
    final = g.final
    rng = np.random.default_rng(5)
    for uid in final.inputs:
        t = final.tensors[uid]
        if t.name == "seq_len_q":
            pack[uid][...] = np.array([3, 5]).reshape(B, 1, 1, 1)
        elif t.name == "seq_len_kv":
            pack[uid][...] = np.array([6, 2]).reshape(B, 1, 1, 1)
        elif t.name == "dmask":
            pack[uid][...] = (rng.uniform(size=t.dim) > 0.25).astype(pack[uid].dtype)
        elif t.name == "cap":
            pack[uid][...] = 1.5
        elif t.name in ("seed", "offset") and isinstance(pack[uid], np.ndarray):
            pack[uid][...] = 1234 if t.name == "seed" else 99
        elif t.name in ("seed", "offset"):  # pass-by-value: above 2**53 and 2**32, exact in int64 only
            pack[uid] = 2**60 + 1 if t.name == "seed" else 2**33 + 5


def _check(g, rng, **kw):
    return assert_engine_matches(g, rng, engines=("torch",), prepare=lambda p: _prepare(p, g), **kw)


def _uses_fast_path(g, kind="sdpa"):
    from opgraph.engines.torch_engine.common import Call

    node = next(n for n in g.final.nodes if n.kind == kind)
    return TA.fast_path(Call(node, g.final.tensors, {}, torch.device("cpu")))


MASKS = [
    {},
    {"use_causal_mask": True},
    {"use_causal_mask_bottom_right": True},
    {"sliding_window_length": 3},
    {"use_causal_mask_bottom_right": True, "sliding_window_length": 2},
    {"use_alibi_mask": True},
]


@pytest.mark.parametrize("opts", MASKS)
@pytest.mark.parametrize("stats", [False, True])
@pytest.mark.parametrize("hk,hv,layout", [(4, 4, "bhsd"), (2, 2, "bshd"), (1, 2, "bshd")])
def test_forward(opts, stats, hk, hv, layout, rng):
    g = _graph(hk=hk, hv=hv, layout=layout, stats=stats, **opts)
    fast = _uses_fast_path(g)
    assert fast == (not stats and "sliding_window_length" not in opts)
    _check(g, rng)


@pytest.mark.parametrize(
    "features",
    [
        {"bias": True},
        {"bias": True, "use_causal_mask": True},
        {"mod": True},
        {"padding": True},
        {"padding": True, "use_causal_mask_bottom_right": True},
        {"drop": "mask"},
        {"drop": "philox"},
        {"bias": True, "mod": True, "drop": "mask", "use_causal_mask": True},
    ],
)
@pytest.mark.parametrize("sq,skv", [(5, 7), (7, 5)])
def test_forward_features(features, sq, skv, rng):
    _check(_graph(sq=sq, skv=skv, **features), rng)


@pytest.mark.parametrize("io", [DT.HALF, DT.BFLOAT16])
def test_forward_half_types(io, rng):
    _check(_graph(io, use_causal_mask=True), rng)
    _check(_graph(io, stats=True, bias=True, use_causal_mask=True), rng)


@pytest.mark.parametrize(
    "features",
    [
        {},
        {"use_causal_mask": True},
        {"use_causal_mask_bottom_right": True},
        {"bias": True},
        {"use_alibi_mask": True},
        {"mod": True},
        {"padding": True, "use_causal_mask": True},
        {"sliding_window_length": 2},
        {"drop": "mask"},
        {"drop": "philox", "use_causal_mask": True},
        {"drop": "philox_by_value"},
        {"bias": True, "mod": True, "drop": "mask"},
    ],
)
@pytest.mark.parametrize("hk,hv", [(2, 2), (1, 2)])
def test_backward(features, hk, hv, rng):
    g = _graph(hk=hk, hv=hv, backward=True, **features)
    fast = not ({"mod", "padding", "sliding_window_length", "drop"} & set(features))
    assert _uses_fast_path(g, "sdpa_backward") == fast
    _check(g, rng, rtol=1e-3, atol=1e-4)


def test_philox_torch_matches_numpy():
    seed = torch.tensor(2**40 + 7, dtype=torch.int64)
    counter = torch.arange(5000, dtype=torch.int64) + (2**32 - 2000)
    got = TA.philox_uniform(seed, counter).numpy()
    want = R.philox_uniform(2**40 + 7, counter.numpy())
    np.testing.assert_array_equal(got, want)
    got = TA.philox_uniform(torch.tensor(-3), torch.arange(100, dtype=torch.int64)).numpy()
    np.testing.assert_array_equal(got, R.philox_uniform(-3, np.arange(100)))


# -- GPU ---------------------------------------------------------------------------------------------------


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("io", [DT.HALF, DT.BFLOAT16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_forward_backward(io, d, causal, rng):
    g = _graph(io, sq=256, skv=384, d=d, dv=d, backward=True, use_causal_mask_bottom_right=causal)
    _check_gpu(g, rng)
    g = _graph(io, sq=256, skv=256, d=d, dv=d, use_causal_mask=causal)  # F.scaled_dot_product_attention
    _check_gpu(g, rng)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize(
    "features", [{"mod": True, "use_causal_mask": True}, {"drop": "philox"}, {"padding": True, "bias": True}]
)
def test_gpu_math_path(features, rng):
    _check_gpu(_graph(DT.BFLOAT16, sq=128, skv=192, d=64, dv=64, backward=True, **features), rng)


def _check_gpu(g, rng):
    assert_engine_matches(
        g,
        rng,
        engines=("torch",),
        device="cuda",
        prepare=lambda p: _prepare(p, g),
        rtol=3e-2,
        atol=3e-2,
        low=-1.0,
        high=1.0,
    )


# -- packed, paged, band, sink, extra outputs (the matrix of tests/ops/test_attention_features.py) ----------


@pytest.mark.parametrize("layout,band,extra", FEATURES.MATRIX)
def test_features_forward(layout, band, extra):
    FEATURES.case(
        layout,
        band,
        **FEATURES.EXTRAS[extra],
        engine="torch",
        padding=True if layout == "paged" and extra == 1 else None,
    )


@pytest.mark.parametrize("layout,band,extra", [m for m in FEATURES.MATRIX if m[0] != "paged"])
def test_features_backward(layout, band, extra):
    FEATURES.case(layout, band, **FEATURES.EXTRAS[extra], backward=True, engine="torch")


@pytest.mark.parametrize("layout", ["dense", "packed"])
@pytest.mark.parametrize("sq,skv", [(5, 7), (1, 9)])
def test_features_all_at_once(layout, sq, skv):
    FEATURES.case(
        layout,
        "band_br",
        sink=True,
        mod=True,
        hk=2,
        drop="philox",
        sq=sq,
        skv=skv,
        backward=True,
        extra_outputs=True,
        padding=True,
        engine="torch",
    )


@pytest.mark.parametrize("empty", ["+inf", "-inf"])
def test_features_empty_rows(empty):
    FEATURES.case(
        "dense",
        "left",
        sq=7,
        skv=5,
        sink=True,
        padding=True,
        empty=empty,
        extra_outputs=True,
        backward=True,
        engine="torch",
    )


@pytest.mark.parametrize("layout", ["dense", "paged", "packed"])
def test_features_decode(layout):
    FEATURES.case(layout, "causal_br", hk=1, sq=1, skv=9, padding=True, extra_outputs=True, engine="torch")


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["dense", "packed", "paged"])
def test_gpu_features(layout):
    """The feature matrix's all-in-one case on the GPU (float64 tensors: exact comparison)."""
    backward = layout != "paged"
    FEATURES.case(
        layout,
        "band_br",
        sink=True,
        mod=True,
        hk=2,
        drop="philox",
        sq=5,
        skv=7,
        backward=backward,
        extra_outputs=True,
        padding=True,
        engine="torch",
        device="cuda",
    )


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize(
    "band",
    [
        {"diagonal_band_left_bound": 32, "diagonal_band_right_bound": 8, "diagonal_alignment": "BOTTOM_RIGHT"},
        {"diagonal_band_right_bound": 16},
    ],
)
def test_gpu_band_bf16(band, rng):
    _check_gpu(_graph(DT.BFLOAT16, sq=128, skv=192, d=64, dv=64, backward=True, padding=True, **band), rng)


def test_triton_declines_the_extensions_by_name():
    """A packed float64 sdpa with a sink planned with the generated kernels first runs on the torch
    engine, and the generated kernel's decline names what it lacks: float64, not the sink, the packed
    tensors or the band's right bound, which it runs (what it still declines by feature is named:
    test_triton_attention_sinks.py)."""
    g = FEATURES.case("packed", "right", sink=True, hk=2, engine="torch")
    plan = g.build(device="cpu", engines=["triton", "torch"])
    assert {s.config.engine for s in plan.steps} == {"torch"}
    (pc,) = g.engine_configs(device="cpu", engines=["triton", "torch"])
    why = dict(pc.declined)["triton"]
    assert "DOUBLE" in why and "sink" not in why and "packed" not in why and "right bound" not in why, why
