"""The attention forward template in dynamic plans (templates/attention.py, attention/sized.py): a piece
of a bucket whose batch, query or key length is dynamic gets one kernel taking them (and the strides
they set) at run time, its grid evaluated per shape, re-pointed at every shape of the bucket, never
generated again: GQA packing and split-KV too (its chunk length a run-time size, its partials laid out
for the bucket's largest shape); TMA configs are generated at each shape. Each graph is built once with a bucket and run at 1, primes and the range's
ends against the reference engine, on random non-zero inputs, outputs poisoned."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.core.device import Device
from opgraph.core.tensor import packed_strides
from opgraph.engines.triton.templates._attention_common import AttentionMatch
from opgraph.runtime.dynamic import DynamicPlan

from ..helpers import (
    check_one_sized_kernel,
    check_re_pointed,
    record_generations,
    requires_cuda,
    requires_interpreter,
    run_at_shape,
)

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
    """Sequence lengths within [0, Sq] and [0, Skv], one entry's whole lengths (the padding mask's inputs)."""
    by_name = {static.tensors[u].name: static.tensors[u] for u in static.inputs}
    for uid in static.inputs:
        t = static.tensors[uid]
        if t.name in ("seq_len_q", "seq_len_kv"):
            seq = by_name["q" if t.name == "seq_len_q" else "k"].dim[2]
            pack[uid][...] = rng.integers(0, seq + 1, size=t.dim)
            pack[uid].flat[0] = seq


def run_at(plan: DynamicPlan, env: dict[str, int], rng: np.random.Generator) -> None:
    # (on the GPU relative to the output's scale: bf16 / fp16 products over long rows)
    run_at_shape(plan, env, rng, prepare=_lengths, relative_to_scale=plan.device.is_cuda)


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
    check_one_sized_kernel(plan, shapes, np.random.default_rng(0), "attention", run=run_at)


@requires_interpreter
def test_a_new_shape_re_points_the_attention_instead_of_generating_it(monkeypatch):
    plan = self_causal(DT.FLOAT).build(device="cpu", engines=["triton"], buckets="one")
    check_re_pointed(plan, SELF, np.random.default_rng(1), "attention", monkeypatch, run=run_at)


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


# -- split-KV (flash-decoding, attention/split.py): the chunk length, the partials and the merge over a bucket ----

DB, DQ, DKV = og.Dim("batch", 1, 5), og.Dim("sq", 1, 4), og.Dim("skv", 1, 97)
DECODE = [{"batch": b, "skv": k} for b, k in ((1, 1), (2, 97), (3, 13), (5, 2), (1, 31), (5, 97), (2, 47))]
DECODE_SQ = [
    {"batch": b, "sq": q, "skv": k} for b, q, k in ((1, 1, 1), (2, 4, 97), (3, 3, 13), (5, 2, 2), (1, 4, 31), (4, 4, 2))
]


def decode(dt: og.DataType, sq=1, hq=4, hk=2, causal=False, padding=False, skv: og.Dim = DKV) -> og.Graph:
    """A decode step over a dynamic batch and KV length: q [batch, hq, sq, 16] (BSHD; sq 1 or a few
    tokens) against a cache [batch, hk, skv, 16], bottom-right causal and / or a padding mask, Stats out."""
    g = _graph(dt, "decode")
    dims = {"q": [DB, hq, sq, 16], "k": [DB, hk, skv, 16], "v": [DB, hk, skv, 16]}
    q, k, v = (g.tensor(dim=x, stride=packed_strides(x, BSHD) if n == "q" else None, name=n) for n, x in dims.items())
    kw = {}
    if padding:
        kw = {n: g.tensor(dim=[DB, 1, 1, 1], data_type=DT.INT32, name=n) for n in ("seq_len_q", "seq_len_kv")}
    o, st = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.25,
        use_causal_mask_bottom_right=causal,
        use_padding_mask=padding,
        generate_stats=True,
        name="attn",
        **kw,
    )
    o.set_output(True).set_stride(packed_strides([DB, hq, sq, 16], BSHD)).set_name("o")
    st.set_output(True).set_name("stats")
    return g


def force_split(monkeypatch, split: int, pack: bool) -> None:
    """The forward's candidates all split-KV with `split` splits (pointer reads: no TMA), GQA-packed or not."""
    real = AttentionMatch.candidates
    monkeypatch.setattr(
        AttentionMatch,
        "candidates",
        lambda self: [c.replace(SPLIT=split, TMA=0) for c in real(self) if bool(getattr(c, "PACK_GQA", 0)) == pack],
    )


def split_bucket(plan: DynamicPlan, shapes, split: int, pack: bool, seed: int) -> set[int]:
    """Runs the plan at every shape against the reference; each shape's forward is the bucket's split
    kernel (its two launches, its scratch at the bucket's largest shape); returns the scratch sizes."""
    rng = np.random.default_rng(seed)
    modules, scratch = set(), set()
    for env in shapes:
        run_at(plan, env, rng)
        (step,) = attention_steps(plan.at(env))
        gen = step.kernel.generated
        assert step.config.knob("SPLIT") == split and bool(step.config.knob("PACK_GQA")) == pack
        assert gen.sized and gen.bucket_scratch, gen.source
        assert [l.kernel for l in gen.launches] == ["kernel_attn_fwd", "kernel_attn_fwd_combine"]
        assert gen.launches[0].grid[2] == split
        modules.add(id(step.kernel.module))
        scratch.add(gen.scratch_bytes)
    assert len(modules) == 1  # one source (on a GPU one binary) holding both launches, for the bucket
    return scratch


SPLIT_CASES = {
    "sq1": ({}, DECODE, 4, False),
    "sq1_padding": ({"padding": True}, DECODE, 2, False),
    "sq1_packed_padding": ({"padding": True}, DECODE, 4, True),
    "mqa_packed": ({"hq": 4, "hk": 1}, DECODE, 3, True),
    "few_causal_br": ({"sq": DQ, "causal": True}, DECODE_SQ, 2, False),
    "few_causal_br_padding_packed": ({"sq": DQ, "causal": True, "padding": True}, DECODE_SQ, 4, True),
    "few_causal_br_padding_gqa": ({"sq": DQ, "hq": 4, "hk": 1, "causal": True, "padding": True}, DECODE_SQ, 8, False),
}


@requires_interpreter
@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_one_split_kv_kernel_takes_every_shape_of_the_bucket(case, monkeypatch):
    """Decode graphs forced to split-KV: one source, its chunk length a run-time size, its partials laid
    out for the bucket's largest batch x Sq (the same bytes at every shape), its merge launch's grid and
    row masks the run-time Sq's; bottom-right alignment with Sq != Skv (and Sq > Skv: rows that see no
    key) and padding lengths at every size."""
    opts, shapes, split, pack = SPLIT_CASES[case]
    force_split(monkeypatch, split, pack)
    plan = decode(DT.FLOAT, **opts).build(device="cpu", engines=["triton"], buckets="one")
    scratch = split_bucket(plan, shapes, split, pack, seed=len(case))
    sq = opts.get("sq", 1)
    rows = split * 5 * 4 * (4 if isinstance(sq, og.Dim) else sq)  # SPLIT x batch x Hq x Sq at their largest
    assert scratch == {2 * (rows * 4 + (-(rows * 4) % 256)) + rows * 16 * 4 + (-(rows * 64) % 256)}


@requires_interpreter
def test_a_half_split_kv_bucket_kernel():
    """fp16 inputs, split-KV GQA-packed decode with a padding mask over a bucket (forced as above)."""
    mp = pytest.MonkeyPatch()
    with mp.context() as m:
        force_split(m, 2, True)
        plan = decode(DT.HALF, padding=True).build(device="cpu", engines=["triton"], buckets="one")
        split_bucket(plan, DECODE[:4], 2, True, seed=11)


@requires_interpreter
def test_split_kv_with_fewer_keys_than_split_key_blocks(monkeypatch):
    """Skv below SPLIT * BLOCK_N (8 x 16 keys) at every shape: each chunk is one key block, the splits past
    the last key run no block and their partials (m = -inf, l = 0, O = 0) merge as neutral elements,
    rows whose padding length is 0 included."""
    force_split(monkeypatch, 8, False)
    plan = decode(DT.FLOAT, padding=True, skv=og.Dim("skv", 1, 100)).build(
        device="cpu", engines=["triton"], buckets="one"
    )
    shapes = [{"batch": b, "skv": k} for b, k in ((1, 1), (3, 15), (2, 16), (4, 17), (5, 63), (1, 100))]
    split_bucket(plan, shapes, 8, False, seed=12)
    (step,) = attention_steps(plan.at({"batch": 2, "skv": 17}))
    (chunk,) = [a for a in step.kernel.generated.launches[0].args if a.expr is not None and "//" in str(a.expr)]
    assert chunk.value == 1  # ceil(17 / 8) keys rounded up to a key block: one block (spelled `(sz * 16)`)


@requires_interpreter
@pytest.mark.parametrize(
    "make,shapes",
    [
        pytest.param(cross, CROSS, id="cross"),
        pytest.param(padded_bias, SELF, id="padded_bias"),
        pytest.param(dropout, SELF, id="dropout"),
    ],
)
def test_split_kv_over_a_bucket_is_re_pointed(make, shapes, monkeypatch):
    """Split-KV over dynamic Sq and Skv (cross-attention: Sq up to 23, more than a merge program's rows;
    a bias read at strides set by seq; Philox dropout, its 1/(1-p) in the partials) re-points one kernel
    at every shape, never generating it again."""
    real = AttentionMatch.candidates
    monkeypatch.setattr(AttentionMatch, "candidates", lambda self: [c.replace(SPLIT=2) for c in real(self)])
    plan = make(DT.FLOAT).build(device="cpu", engines=["triton"], buckets="one")
    rng = np.random.default_rng(3)
    run_at(plan, shapes[0], rng)
    generated = record_generations(monkeypatch)
    modules = set()
    for env in shapes:
        run_at(plan, env, rng)
        (step,) = attention_steps(plan.at(env))
        assert step.config.knob("SPLIT") == 2 and step.kernel.generated.sized
        modules.add(id(step.kernel.module))
    assert len(modules) == 1 and not [c for _, c in generated if c.knob("template") == "attention"]


H100 = Device("cuda", 0, "H100", (9, 0), 132)


def h100_decode(batch, kv):
    """A bf16 decode step of 32 query heads over 8 (D 128, BSHD) against a cache of `kv` keys."""
    g = og.Graph("decode", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[batch, 32, 1, 128], stride=packed_strides([batch, 32, 1, 128], BSHD), name="q")
    k, v = (g.tensor(dim=[batch, 8, kv, 128], name=n) for n in "kv")
    o, _ = g.sdpa(q, k, v, attn_scale=128**-0.5, generate_stats=False)
    o.set_output(True).set_stride(packed_strides([batch, 32, 1, 128], BSHD))
    return g.final


def ranked_on_h100(final):
    """The piece of a one-piece graph and the generated configs as the build ranks them on an H100."""
    from opgraph.build import split_kv
    from opgraph.core.config import HeurMode
    from opgraph.core.piece import make_piece
    from opgraph.engines import get_engine

    piece = make_piece(final, 0, list(final.nodes))
    configs = split_kv.order(piece, get_engine("triton").configs(piece, H100, HeurMode.A), H100)
    return piece, [c for c in configs if c.engine == "triton"]


def test_the_build_still_splits_a_decode_bucket():
    """The build's policy (build/split_kv.py) decides at a bucket's hint as a static build decides at that
    shape: in the default buckets of a decode graph (batch 1-4, KV 1-8192, 32 query heads over 8), the
    long-cache bucket holding batch 3 x KV 4096 (hint batch 3 x KV 1456: 24 GQA-packed programs, a fifth
    of an H100's multiprocessors) puts the static build's split config first, and that config's kernels
    take the bucket's sizes at run time; a bucket of short caches does not split."""
    from opgraph.build.buckets import choose
    from opgraph.engines.triton.templates import attention

    dynamic = h100_decode(og.Dim("batch", 1, 4), og.Dim("kv", 1, 8192))
    buckets = choose(dynamic).buckets
    (long,) = [b for b in buckets if b.contains({"batch": 3, "kv": 4096})]
    assert long.hint_map == {"batch": 3, "kv": 1456}, long
    piece, (chosen, *_) = ranked_on_h100(dynamic.in_bucket(long.hint_map, long))
    _, (static_choice, *_) = ranked_on_h100(h100_decode(3, 1456))
    assert chosen.knob("SPLIT") == 4 and chosen.knob("PACK_GQA") == 1 and chosen.knobs == static_choice.knobs
    gen = attention.TEMPLATE.generate(piece, {k: v for k, v in chosen.knobs if k != "template"}, H100)
    assert gen.sized and gen.bucket_scratch and len(gen.launches) == 2
    (short,) = [b for b in buckets if b.contains({"batch": 3, "kv": 64})]
    assert not ranked_on_h100(dynamic.in_bucket(short.hint_map, short))[1][0].knob("SPLIT")


@pytest.mark.parametrize(
    "kv, split",
    [(1456, None), (8192, 16), (4096, 16), (2048, None), (300, 0), (257, 0)],  # None: the bucket's own (SPLIT 4)
)
def test_the_split_is_decided_again_at_each_shape_of_a_bucket(kv, split):
    """split_kv.at_shape: in the long-cache bucket above (KV 257-8192, planned at KV 1456 with 4 splits), a
    shape takes the split a static build at its KV length would, among the splits the bucket offers
    (those of its largest KV length: up to 32): 16 at 4096 and 8192 keys, 4 at 2048, none at 300 (chunks of fewer
    than MIN_BLOCKS key blocks); the same tile, GQA-packed."""
    from opgraph.build import split_kv
    from opgraph.build.buckets import choose

    dynamic = h100_decode(og.Dim("batch", 1, 4), og.Dim("kv", 1, 8192))
    (long,) = [b for b in choose(dynamic).buckets if b.contains({"batch": 3, "kv": 4096})]
    hint, (config, *alternatives) = ranked_on_h100(dynamic.in_bucket(long.hint_map, long))
    assert config.knob("SPLIT") == 4 and {c.knob("SPLIT") for c in alternatives} >= {2, 8, 16, 32}
    piece, _ = ranked_on_h100(dynamic.in_bucket({"batch": 3, "kv": kv}, long))
    got = split_kv.at_shape(piece, config, alternatives, H100, hint)
    if split is None:
        assert got is None
        return
    # a bucket whose config was timed (another split than the estimate's at the hint) keeps it wherever
    # the estimate at the shape is the hint's, and changes where it is not
    timed = next(c for c in alternatives if c.knob("SPLIT") == 2 and c.knob("PACK_GQA"))
    rest = [c for c in (config, *alternatives) if c is not timed]
    assert split_kv.at_shape(hint, timed, rest, H100, hint) is None
    _, (static_choice, *_) = ranked_on_h100(h100_decode(3, kv))
    assert (got.knob("SPLIT") or 0) == split == (static_choice.knob("SPLIT") or 0)
    assert got.knob("PACK_GQA") == 1 and got.knob("BLOCK_N") == config.knob("BLOCK_N")


@requires_interpreter
def test_a_dynamic_decode_plan_splits_each_shape_as_the_policy_says(monkeypatch):
    """Over one bucket of KV 1-300 (its hint 16 keys: no split fits there), with the policy's estimate
    replaced by one of the KV length alone: every shape runs the split it gives, against the reference;
    each split's kernel is generated once for the bucket and re-pointed at the other shapes."""
    from opgraph.build import split_kv

    def by_length(b, hq, sq, skv, block_m, sm_count, block_n=64, splits=()):
        want = 2 if skv < 100 else 4 if skv < 200 else 8
        return max((s for s in splits if s <= want), default=0)

    monkeypatch.setattr(split_kv, "split_count", by_length)
    plan = decode(DT.FLOAT, skv=og.Dim("skv", 1, 300)).build(device="cpu", engines=["triton"], buckets="one")
    generated = record_generations(monkeypatch)
    rng = np.random.default_rng(21)
    modules = {}
    for batch, skv in ((2, 50), (3, 150), (1, 290), (2, 20), (5, 199), (4, 120), (1, 99)):
        env = {"batch": batch, "skv": skv}
        run_at(plan, env, rng)
        (step,) = attention_steps(plan.at(env))
        assert step.config.knob("SPLIT") == by_length(0, 0, 0, skv, 0, 0, splits=(2, 4, 8)), env
        assert step.kernel.generated.sized and step.config.knob("PACK_GQA") == 1
        modules.setdefault(step.config.knob("SPLIT"), set()).add(id(step.kernel.module))
    assert {s: len(m) for s, m in modules.items()} == {2: 1, 4: 1, 8: 1}  # one source a split, every shape
    splits = [c.knob("SPLIT") for _, c in generated if c.knob("template") == "attention"]
    assert sorted(splits) == [4]  # 2 (the hint's) and 8 (the range's maximum, at build) came before
    assert plan.stats["resplits"] == 5 and plan.stats["shape_kernels"] == 0  # 150, 290, 199, 120, and 300
    assert "split-KV decided at each shape: 5 step(s)" in plan.describe()


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


def _decode_piece(dynamic: bool):
    """Llama-like decode (1 query, 32 query heads over 8, D 128, bf16) at batch 3 x KV 1456: the piece of
    the bucket holding batch 1..16 x KV 1..8192 (`dynamic`), or of the static graph."""
    from opgraph.build.buckets import choose
    from opgraph.core.piece import make_piece

    batch, kv = (og.Dim("batch", 1, 16), og.Dim("kv", 1, 8192)) if dynamic else (3, 1456)
    g = og.Graph("llama_decode", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[batch, 32, 1, 128], stride=packed_strides([batch, 32, 1, 128], BSHD), name="q")
    k, v = (g.tensor(dim=[batch, 8, kv, 128], name=n) for n in "kv")
    o, _ = g.sdpa(q, k, v, attn_scale=128**-0.5, use_causal_mask_bottom_right=True, generate_stats=False)
    o.set_output(True).set_stride(packed_strides([batch, 32, 1, 128], BSHD))
    final = g.final
    if dynamic:
        (bucket,) = choose(final, "one").buckets
        final = final.in_bucket({"batch": 3, "kv": 1456}, bucket)
    return make_piece(final, 0, list(final.nodes))


def _split_configs(cands):
    """The split-KV configs of 4 splits, GQA-packed and not."""
    return [c for c in cands if c.get("SPLIT") == 4]


def _bucket_piece(g: og.Graph, env: dict, kind: str, dynamic: bool = True):
    """The `kind` node's piece of the bucket holding the whole range of `g` at the shape `env` (`dynamic`),
    or of the static graph of that shape."""
    from opgraph.build.buckets import choose
    from opgraph.core.piece import make_piece

    final = g.final
    if dynamic:
        (bucket,) = choose(final, "one").buckets
        final = final.in_bucket(env, bucket)
    else:
        final = final.at(env)
    return make_piece(final, 0, [n for n in final.nodes if n.kind == kind])


def _packed_piece(backward: bool, dynamic: bool):
    kind = "sdpa_backward" if backward else "sdpa"
    return _bucket_piece(packed_causal(backward, DT.BFLOAT16, 128), {"batch": 3, "tokens": 100}, kind, dynamic)


HOPPER_CASES = {
    "fwd_dynamic": (lambda: _llama_piece(True), "attention", _pointer_configs),
    "fwd_static": (lambda: _llama_piece(False), "attention", _pointer_configs),
    "bwd_dynamic": (lambda: _llama_piece(True, True), "attention_bwd", _pointer_configs),
    "bwd_static": (lambda: _llama_piece(False, True), "attention_bwd", _pointer_configs),
    "split_dynamic": (lambda: _decode_piece(True), "attention", _split_configs),
    "split_static": (lambda: _decode_piece(False), "attention", _split_configs),
    "packed_fwd": (lambda: _packed_piece(False, True), "attention", _pointer_configs),
    "packed_fwd_at_shape": (lambda: _packed_piece(False, False), "attention", _pointer_configs),
    "packed_bwd": (lambda: _packed_piece(True, True), "attention_bwd", _pointer_configs),
    "packed_bwd_at_shape": (lambda: _packed_piece(True, False), "attention_bwd", _pointer_configs),
    "paged": (lambda: _bucket_piece(paged_decode(), {"batch": 3}, "sdpa"), "attention", _pointer_configs),
}


def test_sized_kernels_compile_for_hopper_like_the_static_ones():
    """The bucket's kernels (sizes as arguments, the strides they set spelled `(sz * c)`) compile for
    sm_90 with the static kernels' vector copies (cp.async), 128-bit loads and stores, and no more
    spills than they have (the forward none; the backward's dK/dV launch spills at D 128 either way:
    68-76 bytes sized, 72-100 static, Triton 3.9); the split-KV decode launches too (more registers
    sized, 104-128 against 84 at 4 warps, below the 3 programs an SM their shared memory allows)."""
    from opgraph.core.device import Device
    from opgraph.engines.triton.templates import attention, attention_bwd

    from .hopper_compile import compile_for_hopper

    h100 = Device("cuda", 0, "H100", (9, 0), 132)
    templates = {t.name: t for t in (attention.TEMPLATE, attention_bwd.TEMPLATE)}
    for case in ("fwd_dynamic", "bwd_dynamic", "split_dynamic", "packed_fwd", "packed_bwd", "paged"):
        make, name, configs = HOPPER_CASES[case]
        piece = make()
        for k in configs(templates[name].candidates(piece, h100)):
            assert templates[name].generate(piece, k, h100).sized, (case, k)
    out = compile_for_hopper(__name__)
    every = [line.split() for line in out.splitlines() if line.startswith("compiled")]
    lines = [w for w in every if w[1].rsplit("_", 1)[-1] in ("dynamic", "static")]
    # two configs each: a forward launch, 3 backward launches, a split forward's 2 launches
    assert len(lines) == 2 * (2 + 2 * 3 + 2 * 2), out

    def count(w, what):
        return int(w[w.index(what) + 1])

    # the packed (THD) bucket kernels (the packed outputs' zeroing launch first) as the kernels generated at
    # the shape (the dK/dV launch spills 96-136 bytes either way); the paged decode's without spills
    for kind in ("packed_fwd", "packed_bwd"):
        dynamic, static = ([w for w in every if w[1] == name] for name in (kind, f"{kind}_at_shape"))
        assert [w[2] for w in dynamic] == [w[2] for w in static] and dynamic, out
        for dyn, st in zip(dynamic, static):
            for what in ("cp.async", "ld.v4", "st.v4"):
                assert count(dyn, what) >= count(st, what), (dyn, st)
            assert count(dyn, "spills") <= count(st, "spills") + 8, (dyn, st)
    paged = [w for w in every if w[1] == "paged"]
    assert len(paged) == 2 and all(count(w, "spills") == 0 for w in paged), out

    for kind in ("fwd", "bwd", "split"):
        dynamic = [w for w in lines if w[1] == f"{kind}_dynamic"]
        static = [w for w in lines if w[1] == f"{kind}_static"]
        assert [w[2] for w in dynamic] == [w[2] for w in static]
        for dyn, st in zip(dynamic, static):
            for what in ("cp.async", "ld.v4", "st.v4"):
                assert count(dyn, what) >= count(st, what), (dyn, st)
            assert count(dyn, "spills") <= max(count(st, "spills"), 80 if kind == "bwd" else 0), (dyn, st)


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


GPU_KV = og.Dim("kv", 1, 4096)
GPU_DECODE = [{"batch": b, "kv": k} for b, k in ((1, 1), (3, 131), (8, 4096), (2, 257), (5, 4093), (1, 17), (8, 63))]


def gpu_decode(dt: og.DataType, sq: int) -> og.Graph:
    """A Llama-like decode step (32 query heads over 8 key/value heads, D 128, q and O BSHD, the cache
    BHSD) over a dynamic batch and KV length, bottom-right causal, Stats out."""
    g = _graph(dt, "gpu_decode")
    dims = {"q": [GPU_B, 32, sq, 128], "k": [GPU_B, 8, GPU_KV, 128], "v": [GPU_B, 8, GPU_KV, 128]}
    q, k, v = (g.tensor(dim=x, stride=packed_strides(x, BSHD) if n == "q" else None, name=n) for n, x in dims.items())
    o, st = g.sdpa(q, k, v, attn_scale=128**-0.5, use_causal_mask_bottom_right=True, generate_stats=True)
    o.set_output(True).set_stride(packed_strides([GPU_B, 32, sq, 128], BSHD)).set_name("o")
    st.set_output(True).set_name("stats")
    return g


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("pack", [False, True], ids=["heads", "packed"])
@pytest.mark.parametrize("sq", [1, 3])
def test_gpu_split_kv_decode_over_a_bucket(sq, pack, monkeypatch):
    """Split-KV decode (8 splits, forced) over one bucket of batch 1-8 x KV 1-4096: one compiled module
    (both launches) at every shape, KV lengths below 8 x BLOCK_N included."""
    force_split(monkeypatch, 8, pack)
    plan = gpu_decode(DT.BFLOAT16, sq).build(device="cuda", engines=["triton"], buckets="one")
    rng = np.random.default_rng(9)
    modules = set()
    for env in GPU_DECODE:
        run_at(plan, env, rng)
        (step,) = attention_steps(plan.at(env))
        assert step.config.knob("SPLIT") == 8 and step.kernel.generated.sized
        modules.add(id(step.kernel.module))
    assert len(modules) == 1


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


@pytest.mark.gpu
@requires_cuda
def test_gpu_decode_over_a_wide_bucket_splits_each_shape_as_the_estimate_says():
    """The build's own policy over one bucket of KV 1-4096 (batch 1-8): long caches at small batches split,
    short ones do not (split_kv.at_shape), each split's kernel compiled once for the bucket; every shape
    right."""
    plan = gpu_decode(DT.BFLOAT16, 1).build(device="cuda", engines=["triton"], buckets="one")
    rng = np.random.default_rng(15)
    modules: dict[int, set[int]] = {}
    for env in [{"batch": 1, "kv": 4096}, {"batch": 1, "kv": 64}, {"batch": 2, "kv": 4093}, *GPU_DECODE]:
        run_at(plan, env, rng)
        (step,) = attention_steps(plan.at(env))
        assert step.kernel.generated.sized, step.config
        modules.setdefault(step.config.knob("SPLIT") or 0, set()).add(id(step.kernel.module))
    assert len(modules) > 1 and all(len(m) == 1 for m in modules.values()), (modules, plan.describe())
    assert plan.stats["resplits"] > 0 and plan.stats["shape_kernels"] == 0


# -- packed (THD) and paged tensors in a bucket kernel -------------------------------------------------------

TOKENS = og.Dim("tokens", 1, 120)
PACKED_SHAPES = [{"batch": b, "tokens": t} for b, t in ((1, 17), (3, 100), (5, 120), (2, 33))]


def packed_causal(backward: bool, dt: og.DataType = DT.FLOAT, d: int = 16) -> og.Graph:
    """Packed (THD) causal self-attention, forward (and backward), over a dynamic batch of sequences and
    token count: every tensor [1, H, T, d] BSHD, one offsets tensor [B + 1] in rows, max length 40."""
    g = _graph(dt, "packed")
    t = {}
    for n, h in (("q", 4), ("k", 2), ("v", 2)):
        t[n] = g.tensor(dim=[1, h, TOKENS, d], stride=packed_strides([1, h, TOKENS, d], BSHD), name=n)
    lens = [g.tensor(dim=[B, 1, 1, 1], data_type=DT.INT32, name=n) for n in ("seq_len_q", "seq_len_kv")]
    off = g.tensor(dim=[B + 1, 1, 1, 1], data_type=DT.INT32, name="off")
    roles = ("q", "k", "v", "o", "stats", *(("dQ", "dK", "dV", "dO") if backward else ()))
    kw = dict(use_padding_mask=True, seq_len_q=lens[0], seq_len_kv=lens[1], max_seq_len_q=40, max_seq_len_kv=40)
    kw |= {f"{r}_ragged_offset": off for r in roles}
    fwd_kw = {k: v for k, v in kw.items() if not k.startswith(("dQ", "dK", "dV", "dO"))}
    o, st = g.sdpa(t["q"], t["k"], t["v"], attn_scale=0.3, use_causal_mask=True, name="fwd", **fwd_kw)
    o.set_output(True).set_dim([1, 4, TOKENS, d]).set_stride(packed_strides([1, 4, TOKENS, d], BSHD))
    st.set_output(True)
    if backward:
        do = g.tensor(dim=[1, 4, TOKENS, d], stride=packed_strides([1, 4, TOKENS, d], BSHD), name="dO")
        for x in g.sdpa_backward(t["q"], t["k"], t["v"], o, do, st, attn_scale=0.3, use_causal_mask=True, **kw):
            x.set_output(True)
    return g


def _packed_lengths(static, pack, rng):
    """Sequences of 0 to 40 tokens that fit the shape's T, packed from row 0."""
    named = {static.tensors[u].name: u for u in static.inputs}
    b, total = static.tensors[named["seq_len_q"]].dim[0], static.tensors[named["q"]].dim[2]
    lens = rng.integers(0, 41, size=b)
    while lens.sum() > total:
        lens //= 2
    for name in ("seq_len_q", "seq_len_kv"):
        pack[named[name]][...] = lens.reshape(b, 1, 1, 1)
    pack[named["off"]][...] = np.concatenate([[0], np.cumsum(lens)]).reshape(b + 1, 1, 1, 1)


@requires_interpreter
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_one_packed_kernel_takes_every_batch_and_token_count(backward):
    """The packed tensors' token count and the batch of lengths taken at run time (the packed outputs'
    zeroing launch too): one forward and one backward kernel for the bucket, each right at every shape."""
    plan = packed_causal(backward).build(device="cpu", engines=["triton"], buckets="one")
    run = lambda p, env, rng: run_at_shape(p, env, rng, prepare=_packed_lengths)  # noqa: E731
    for template in ("attention", "attention_bwd") if backward else ("attention",):
        check_one_sized_kernel(plan, PACKED_SHAPES, np.random.default_rng(5), template, run=run)


def paged_decode() -> og.Graph:
    """Decode (one query a sequence) over a paged cache of 30 pages of 8 rows, 4 slots a sequence, over a
    dynamic batch, GQA 4/2, with the lengths' padding mask."""
    g = _graph(DT.FLOAT, "paged")
    q = g.tensor(dim=[B, 4, 1, 16], stride=packed_strides([B, 4, 1, 16], BSHD), name="q")
    k, v = (g.tensor(dim=[30, 2, 8, 16], stride=packed_strides([30, 2, 8, 16], BSHD), name=n) for n in "kv")
    table = g.tensor(dim=[B, 1, 4, 1], data_type=DT.INT32, name="table")
    lens = [g.tensor(dim=[B, 1, 1, 1], data_type=DT.INT32, name=n) for n in ("seq_len_q", "seq_len_kv")]
    o, _ = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.3,
        paged_attention_k_table=table,
        paged_attention_v_table=table,
        paged_attention_max_seq_len_kv=32,
        use_padding_mask=True,
        seq_len_q=lens[0],
        seq_len_kv=lens[1],
        generate_stats=False,
        name="attn",
    )
    o.set_output(True).set_stride(packed_strides([B, 4, 1, 16], BSHD))
    return g


def _paged_inputs(static, pack, rng):
    named = {static.tensors[u].name: u for u in static.inputs}
    b = static.tensors[named["q"]].dim[0]
    pack[named["table"]][...] = rng.permutation(30)[: b * 4].reshape(b, 1, 4, 1)
    pack[named["seq_len_q"]][...] = 1
    pack[named["seq_len_kv"]][...] = rng.integers(1, 33, size=(b, 1, 1, 1))


@requires_interpreter
def test_one_paged_decode_kernel_takes_every_batch():
    """The batch sets only the grid (the container and the table's rows are indexed per program): one
    module, its launch's grid evaluated per shape."""
    plan = paged_decode().build(device="cpu", engines=["triton"], buckets="one")
    rng, modules = np.random.default_rng(6), set()
    for b in (1, 3, 5, 2):
        run_at_shape(plan, {"batch": b}, rng, prepare=_paged_inputs)
        (step,) = plan.at({"batch": b}).steps
        assert step.kernel.generated.sized and step.kernel.generated.launches[0].grid == (1, 2 * b)
        modules.add(id(step.kernel.module))
    assert len(modules) == 1
