"""The attention forward template in dynamic plans (templates/attention.py, attention/sized.py): a piece
of a bucket whose batch, query or key length is dynamic gets one kernel taking them (and the strides
they set) at run time, its grid evaluated per shape, re-pointed at every shape of the bucket, never
generated again; configs whose structure depends on the shape (split-KV, GQA packing, TMA) are
generated at each shape. Each graph is built once with a bucket and run at 1, primes and the range's
ends against the reference engine, on random non-zero inputs, outputs poisoned."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.core.tensor import packed_strides
from opgraph.engines.triton import TritonEngine
from opgraph.engines.triton.templates._attention_common import AttentionMatch
from opgraph.runtime.dynamic import DynamicPlan
from opgraph.testing import compare, random_pack, reference_outputs

from ..helpers import requires_cuda, requires_interpreter

pytestmark = pytest.mark.interpreter
DT = og.DataType
BSHD = (0, 2, 1, 3)
B, S = og.Dim("batch", 1, 5), og.Dim("seq", 1, 37)
SQ, SKV = og.Dim("sq", 1, 23), og.Dim("skv", 1, 41)
LONG = og.Dim("seq", 9, 300)  # (its hint, 52, is no decode shape: the forward is not GQA-packed)
SELF = [{"batch": b, "seq": s} for b, s in ((1, 1), (1, 37), (2, 17), (3, 19), (5, 37), (5, 1), (2, 31))]
LONG_SHAPES = [{"batch": b, "seq": s} for b, s in ((1, 9), (2, 17), (3, 19), (5, 300), (1, 257), (4, 10))]
CROSS = [{"batch": b, "sq": q, "skv": k} for b, q, k in ((1, 1, 1), (2, 23, 41), (3, 7, 29), (5, 13, 1), (1, 1, 41))]


def _graph(dt: og.DataType, name: str) -> og.Graph:
    return og.Graph(name, io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)


def _qkv(g, sq, skv, hq, hk, d, layout):
    dims = {"q": [B, hq, sq, d], "k": [B, hk, skv, d], "v": [B, hk, skv, d]}
    order = BSHD if layout == "bshd" else None
    return [g.tensor(dim=x, stride=packed_strides(x, order) if order else None, name=n) for n, x in dims.items()]


def self_causal(dt: og.DataType, layout: str = "bshd") -> og.Graph:
    """Causal self-attention over a dynamic batch and sequence (BSHD: every stride but the head's and
    the row's is set by seq)."""
    g = _graph(dt, "self_causal")
    q, k, v = _qkv(g, S, S, 4, 4, 16, layout)
    o, _ = g.sdpa(q, k, v, attn_scale=0.3, use_causal_mask=True, generate_stats=False, name="attn")
    o.set_output(True).set_name("o")
    return g


def cross(dt: og.DataType, layout: str = "bhsd") -> og.Graph:
    """Cross-attention: queries and keys of two dynamic lengths (Sq != Skv), Stats out."""
    g = _graph(dt, "cross")
    q, k, v = _qkv(g, SQ, SKV, 2, 2, 16, layout)
    q.set_dim([B, 2, SQ, 16])
    o, st = g.sdpa(q, k, v, attn_scale=0.25, generate_stats=True, name="attn")
    o.set_output(True).set_name("o")
    st.set_output(True).set_name("stats")
    return g


def gqa(dt: og.DataType, layout: str = "bshd", seq: og.Dim = LONG) -> og.Graph:
    """GQA (4 query heads over 2 key/value heads), bottom-right causal, over a dynamic batch and
    sequence, with a fused O epilogue."""
    g = _graph(dt, "gqa")
    q, k, v = _qkv(g, seq, seq, 4, 2, 16, layout)
    o, _ = g.sdpa(q, k, v, attn_scale=0.3, use_causal_mask_bottom_right=True, generate_stats=False, name="attn")
    g.relu(o).set_output(True).set_name("y")
    return g


def padded_bias(dt: og.DataType, layout: str = "bhsd") -> og.Graph:
    """A padding mask (per-sequence lengths over a dynamic batch) and a bias [batch, 1, seq, seq] read
    at strides set by seq, Stats out."""
    g = _graph(dt, "padded_bias")
    q, k, v = _qkv(g, S, S, 2, 2, 16, layout)
    lens = {n: g.tensor(dim=[B, 1, 1, 1], data_type=DT.INT32, name=n) for n in ("seq_len_q", "seq_len_kv")}
    bias = g.tensor(dim=[B, 1, S, S], data_type=DT.FLOAT, name="bias")
    o, st = g.sdpa(q, k, v, attn_scale=0.3, bias=bias, use_padding_mask=True, generate_stats=True, **lens, name="attn")
    o.set_output(True).set_name("o")
    st.set_output(True).set_name("stats")
    return g


def dropout(dt: og.DataType, layout: str = "bhsd") -> og.Graph:
    """Philox dropout (its counter of element (b, h, i, j) spans the run-time Sq x Skv) over a dynamic
    batch and sequence."""
    g = _graph(dt, "dropout")
    q, k, v = _qkv(g, S, S, 2, 2, 16, layout)
    seed, offset = (g.tensor(dim=[1], data_type=DT.INT64, name=n) for n in ("seed", "offset"))
    o, _ = g.sdpa(q, k, v, attn_scale=0.3, dropout=(0.25, seed, offset), generate_stats=False, name="attn")
    o.set_output(True).set_name("o")
    return g


def backward(dt: og.DataType, layout: str = "bshd", causal: bool = True, hk: int = 2) -> og.Graph:
    """The forward and its backward (sdpa_backward reading O and Stats) over a dynamic batch and
    sequence: causal GQA (4 query heads over `hk`), BSHD."""
    g = _graph(dt, "backward")
    q, k, v = _qkv(g, S, S, 4, hk, 16, layout)
    o, st = g.sdpa(q, k, v, attn_scale=0.3, use_causal_mask=causal, generate_stats=True, name="fwd")
    o.set_output(True).set_name("o")
    st.set_output(True).set_name("stats")
    do = g.tensor(dim=[B, 4, S, 16], stride=packed_strides([B, 4, S, 16], BSHD), name="dO")
    for x, n in zip(g.sdpa_backward(q, k, v, o, do, st, attn_scale=0.3, use_causal_mask=causal, name="bwd"), "qkv"):
        x.set_output(True).set_name(f"d{n}")
    return g


def _lengths(static, pack, rng):
    """Sequence lengths within [0, seq], one entry's whole length (the padding mask's inputs)."""
    for uid in static.inputs:
        t = static.tensors[uid]
        if t.name in ("seq_len_q", "seq_len_kv"):
            seq = static.tensors[static.inputs[0]].dim[2]
            pack[uid][...] = rng.integers(0, seq + 1, size=t.dim)
            pack[uid].flat[0] = seq


def run_at(plan: DynamicPlan, env: dict[str, int], rng: np.random.Generator) -> None:
    static = plan.graph.at(env)
    pack = random_pack(static, rng)
    _lengths(static, pack, rng)
    want = reference_outputs(static, pack)
    if plan.device.is_cuda:
        from opgraph.core.torch_interop import pack_to_device, torch_to_numpy

        dev = pack_to_device(pack, plan.device.torch_name)
        plan.execute(dev)
        pack = {**pack, **{u: torch_to_numpy(dev[u]) for u in static.outputs}}
    else:
        plan.execute(pack)
    bad = [  # (on the GPU relative to the output's scale: bf16 / fp16 products over long rows)
        m
        for u in static.outputs
        if (m := compare(static.tensors[u], pack[u], want[u], relative_to_scale=plan.device.is_cuda)) is not None
    ]
    assert not bad, f"{env}: " + "\n".join(map(str, bad))


def attention_steps(plan):
    return [s for s in plan.steps if s.config.knob("template") == "attention"]


CASES = [
    pytest.param(self_causal, SELF, id="self_causal"),
    pytest.param(cross, CROSS, id="cross"),
    pytest.param(gqa, LONG_SHAPES, id="gqa"),
    pytest.param(lambda dt: gqa(dt, seq=S), SELF, id="gqa_packed"),
    pytest.param(padded_bias, SELF, id="padded_bias"),
    pytest.param(dropout, SELF, id="dropout"),
]


@requires_interpreter
@pytest.mark.parametrize("dt", [DT.FLOAT, DT.HALF], ids=lambda d: d.name)
@pytest.mark.parametrize("make,shapes", CASES)
def test_one_attention_kernel_takes_every_shape_of_the_bucket(make, shapes, dt):
    plan = make(dt).build(device="cpu", engines=["triton"], buckets="one")
    assert isinstance(plan, DynamicPlan)
    rng = np.random.default_rng(0)
    modules = set()
    for env in shapes:
        run_at(plan, env, rng)
        (step,) = attention_steps(plan.at(env))
        gen = step.kernel.generated
        assert gen.sized, gen.source
        assert "_OG_SIZES = ('sz0'" in gen.source
        modules.add(id(step.kernel.module))
    assert len(modules) == 1  # one source (and, on a GPU, one binary) for the bucket


@requires_interpreter
def test_a_new_shape_re_points_the_attention_instead_of_generating_it(monkeypatch):
    plan = self_causal(DT.FLOAT).build(device="cpu", engines=["triton"], buckets="one")
    rng = np.random.default_rng(1)
    run_at(plan, SELF[0], rng)
    generated = []
    real = TritonEngine.generated
    monkeypatch.setattr(TritonEngine, "generated", lambda self, p, c, d: generated.append(c) or real(self, p, c, d))
    for env in SELF[1:]:
        run_at(plan, env, rng)
    assert not [c for c in generated if c.knob("template") == "attention"]
    grids = {attention_steps(plan.at(env))[0].kernel.generated.launches[0].grid for env in SELF}
    assert len(grids) > 1  # each shape's grid


@requires_interpreter
def test_a_gqa_packed_bucket_kernel_serves_longer_sequences():
    """The bucket's hint (seq 6) packs the group's heads into the tile's rows; the packed kernel's rows
    are masked by the run-time length, so it serves seq 37 (several packed blocks) too."""
    plan = gqa(DT.FLOAT, seq=S).build(device="cpu", engines=["triton"], buckets="one")
    rng = np.random.default_rng(2)
    for env in SELF:
        run_at(plan, env, rng)
        (step,) = attention_steps(plan.at(env))
        assert step.config.knob("PACK_GQA") == 1 and step.kernel.generated.sized


@requires_interpreter
def test_split_kv_is_generated_at_each_shape(monkeypatch):
    real = AttentionMatch.candidates
    monkeypatch.setattr(AttentionMatch, "candidates", lambda self: [c.replace(SPLIT=2) for c in real(self)])
    plan = cross(DT.FLOAT).build(device="cpu", engines=["triton"], buckets="one")
    rng = np.random.default_rng(3)
    for env in CROSS[:3]:
        run_at(plan, env, rng)
        (step,) = attention_steps(plan.at(env))
        assert step.config.knob("SPLIT") == 2 and not step.kernel.generated.sized


@requires_interpreter
def test_static_plans_keep_literal_sizes():
    g = _graph(DT.FLOAT, "static")
    q, k, v = (g.tensor(dim=[2, 2, 20, 16], name=n) for n in "qkv")
    o, _ = g.sdpa(q, k, v, attn_scale=0.3, use_causal_mask=True, generate_stats=False)
    o.set_output(True)
    plan = g.build(device="cpu", engines=["triton"])
    gen = plan.steps[0].kernel.generated
    assert not gen.sized and "_OG_SIZES" not in gen.source and "q_len = 20" in gen.source


# -- Hopper: the sized kernels compile (ptxas, sm_90) as the static ones do -------------------------------------


def _llama_piece(dynamic: bool, backward_too: bool = False):
    """Llama-like causal GQA attention (32 query heads over 8, D 128, BSHD, bf16) at batch 3 x seq 517:
    the piece of the bucket holding batch 1..16 x seq 1..2048 (`dynamic`), or of the static graph."""
    from opgraph.build.buckets import choose
    from opgraph.core.piece import make_piece

    batch, seq = (og.Dim("batch", 1, 16), og.Dim("seq", 1, 2048)) if dynamic else (3, 517)
    g = og.Graph("llama_attention", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    dims = {"q": [batch, 32, seq, 128], "k": [batch, 8, seq, 128], "v": [batch, 8, seq, 128]}
    q, k, v = (g.tensor(dim=x, stride=packed_strides(x, BSHD), name=n) for n, x in dims.items())
    o, st = g.sdpa(q, k, v, attn_scale=128**-0.5, use_causal_mask=True, generate_stats=backward_too)
    o.set_output(True).set_stride(packed_strides([batch, 32, seq, 128], BSHD))
    kind = "sdpa"
    if backward_too:
        st.set_output(True)
        do = g.tensor(dim=[batch, 32, seq, 128], stride=packed_strides([batch, 32, seq, 128], BSHD), name="dO")
        for x in g.sdpa_backward(q, k, v, o, do, st, attn_scale=128**-0.5, use_causal_mask=True):
            x.set_output(True)
        kind = "sdpa_backward"
    final = g.final
    if dynamic:
        (bucket,) = choose(final, "one").buckets
        final = final.in_bucket({"batch": 3, "seq": 517}, bucket)
    return make_piece(final, 0, [n for n in final.nodes if n.kind == kind])


def _pointer_configs(cands):
    """The best two configs without TMA or split-KV (the ones that take their sizes at run time)."""
    return [c for c in cands if not c.get("TMA") and not c.get("SPLIT")][:2]


HOPPER_CASES = {
    "fwd_dynamic": (lambda: _llama_piece(True), "attention", _pointer_configs),
    "fwd_static": (lambda: _llama_piece(False), "attention", _pointer_configs),
    "bwd_dynamic": (lambda: _llama_piece(True, True), "attention_bwd", _pointer_configs),
    "bwd_static": (lambda: _llama_piece(False, True), "attention_bwd", _pointer_configs),
}


def test_sized_kernels_compile_for_hopper_like_the_static_ones():
    """The bucket's kernels (sizes as arguments, the strides they set spelled `(sz * c)`) compile for
    sm_90 with the static kernels' vector copies (cp.async), 128-bit loads and stores, and no more
    spills than they have (the forward none; the backward's dK/dV launch spills at D 128 either way:
    68-76 bytes sized, 72-100 static, Triton 3.9)."""
    from opgraph.core.device import Device
    from opgraph.engines.triton.templates import attention, attention_bwd

    from .hopper_compile import compile_for_hopper

    h100 = Device("cuda", 0, "H100", (9, 0), 132)
    for template, backward_too in ((attention.TEMPLATE, False), (attention_bwd.TEMPLATE, True)):
        piece = _llama_piece(True, backward_too)
        for k in _pointer_configs(template.candidates(piece, h100)):
            assert template.generate(piece, k, h100).sized, k
    out = compile_for_hopper(__name__)
    lines = [line.split() for line in out.splitlines() if line.startswith("compiled")]
    assert len(lines) == 2 * (2 + 2 * 3), out  # two configs each: a forward launch, 3 backward launches

    def count(w, what):
        return int(w[w.index(what) + 1])

    for kind in ("fwd", "bwd"):
        dynamic = [w for w in lines if w[1] == f"{kind}_dynamic"]
        static = [w for w in lines if w[1] == f"{kind}_static"]
        assert [w[2] for w in dynamic] == [w[2] for w in static]
        for dyn, st in zip(dynamic, static):
            for what in ("cp.async", "ld.v4", "st.v4"):
                assert count(dyn, what) >= count(st, what), (dyn, st)
            assert count(dyn, "spills") <= max(count(st, "spills"), 0 if kind == "fwd" else 80), (dyn, st)


# -- on the GPU: realistic sizes ------------------------------------------------------------------------------


GPU_B, GPU_S = og.Dim("batch", 1, 8), og.Dim("seq", 1, 1024)
GPU_SHAPES = [{"batch": b, "seq": s} for b, s in ((1, 1), (3, 131), (8, 1024), (2, 257), (5, 1021), (1, 17))]


def gpu_llama_attention(dt: og.DataType) -> og.Graph:
    """Llama-like causal GQA (32 query heads over 8 key/value heads, D 128, BSHD) over a dynamic batch
    and sequence."""
    g = _graph(dt, "gpu_attention")
    dims = {"q": [GPU_B, 32, GPU_S, 128], "k": [GPU_B, 8, GPU_S, 128], "v": [GPU_B, 8, GPU_S, 128]}
    q, k, v = (g.tensor(dim=x, stride=packed_strides(x, BSHD), name=n) for n, x in dims.items())
    o, _ = g.sdpa(q, k, v, attn_scale=128**-0.5, use_causal_mask=True, generate_stats=False)
    o.set_output(True).set_stride(packed_strides([GPU_B, 32, GPU_S, 128], BSHD)).set_name("o")
    return g


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("pointer", [False, True], ids=["heuristic", "pointer"])
@pytest.mark.parametrize("dt", [DT.BFLOAT16, DT.HALF], ids=lambda d: d.name)
def test_gpu_attention_over_a_bucket(dt, pointer, monkeypatch):
    """The heuristic's configs (TMA ones generated at each shape) and the pointer configs (one sized
    kernel, compiled once) over one bucket, at 1, primes and the range's ends."""
    if pointer:
        real = AttentionMatch.candidates
        monkeypatch.setattr(AttentionMatch, "candidates", lambda self: [c.replace(TMA=0) for c in real(self)])
    plan = gpu_llama_attention(dt).build(device="cuda", engines=["triton"], buckets="one")
    rng = np.random.default_rng(6)
    modules = set()
    for env in GPU_SHAPES:
        run_at(plan, env, rng)
        (step,) = attention_steps(plan.at(env))
        if step.kernel.generated.sized:
            modules.add(id(step.kernel.module))
    assert len(modules) == 1 if pointer else len(modules) <= 1


BWD_TOL = {"rtol": 2e-3, "atol": 2e-4}


def backward_steps(plan):
    return [s for s in plan.steps if s.config.knob("template") == "attention_bwd"]


@requires_interpreter
@pytest.mark.parametrize("fused", [0, 1], ids=["split", "fused"])
@pytest.mark.parametrize("causal,hk", [(True, 2), (False, 4)], ids=["causal_gqa", "full"])
def test_one_backward_kernel_module_takes_every_shape_of_the_bucket(causal, hk, fused, monkeypatch):
    """The backward's launches (preprocess, dK/dV and dQ, or the fused one) take the sizes at run time;
    delta's scratch is laid out for the bucket's largest shape."""
    real = AttentionMatch.candidates
    monkeypatch.setattr(
        AttentionMatch,
        "candidates",
        lambda self: [c.replace(FUSED=fused) if hasattr(c, "FUSED") else c for c in real(self)],
    )
    plan = backward(DT.FLOAT, causal=causal, hk=hk).build(device="cpu", engines=["triton"], buckets="one")
    rng = np.random.default_rng(7)
    modules, scratch = set(), set()
    for env in SELF:
        run_at(plan, env, rng)
        (step,) = backward_steps(plan.at(env))
        gen = step.kernel.generated
        assert gen.sized and gen.bucket_scratch, gen.source
        assert step.config.knob("FUSED") == fused and len(gen.launches) == 3 - fused
        modules.add(id(step.kernel.module))
        scratch.add(gen.scratch_bytes)
    assert len(modules) == 1 and scratch == {4 * 5 * 4 * 37 + (-(4 * 5 * 4 * 37) % 256)}
