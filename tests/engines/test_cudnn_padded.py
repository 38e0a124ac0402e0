"""engines/cudnn_padded: bucket attention through one cuDNN plan built at the bucket's largest shape in the
padded form (per-batch lengths, ragged offsets). On the CPU: which pieces take the form, the lengths buffer
a shape writes, the reasons for the rest and the policy's lead. On the GPU: a dynamic plan's attention run
at many shapes of its bucket through that one plan, against the reference engine, nothing written
outside the output, nothing built per shape."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph import DataType as DT
from opgraph.build.buckets import choose
from opgraph.build.policy import POLICY
from opgraph.core.piece import make_piece
from opgraph.engines import get_engine
from opgraph.engines.base import PieceFact
from opgraph.engines.cudnn_padded import EXTRAS, PaddedForm, lengths, padded_form, sections
from opgraph.engines.cudnn_sdpa import attention_views

from ..build.fakes import H200
from ..helpers import requires_cuda, run_at_shape

HQ, HK, D = 16, 4, 64  # (the serving Llama's heads)


def heads_graph(fused: bool = True, layout: str = "bshd", batch=(2, 16), seq=(257, 2048), **kw) -> og.Graph:
    """Causal GQA attention over a dynamic batch and sequence: q, k and v the heads of one [batch, seq,
    (HQ + 2 HK) * D] projection read in place (`fused`), or three tensors of their own in `layout`."""
    b, s = og.Dim("batch", *batch), og.Dim("seq", *seq)
    g = og.Graph("heads", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    if fused:
        qkv = g.tensor(dim=[b, s, (HQ + 2 * HK) * D], name="qkv")
        spans = [(0, HQ), (HQ, HQ + HK), (HQ + HK, HQ + 2 * HK)]
        q, k, v = (
            g.transpose(
                g.reshape(g.slice(qkv, [slice(None), slice(None), slice(lo * D, hi * D)])).set_dim([b, s, hi - lo, D]),
                [0, 2, 1, 3],
            )
            for lo, hi in spans
        )
    else:

        def stride(h):
            return [s * h * D, D, h * D, 1] if layout == "bshd" else [h * s * D, s * D, D, 1]

        q, k, v = (g.tensor(dim=[b, h, s, D], stride=stride(h), name=n) for n, h in (("q", HQ), ("k", HK), ("v", HK)))
    kw.setdefault("use_causal_mask", True)
    kw.setdefault("generate_stats", False)
    o, stats = g.sdpa(q, k, v, attn_scale=D**-0.5, name="attention", **kw)
    if stats is not None:
        stats.set_output(True)
    o.set_output(True).set_name("o").set_stride([s * HQ * D, D, HQ * D, 1])
    return g


def piece_at(g: og.Graph, env: dict | None = None):
    final = g.final
    (bucket,) = choose(final, "one").buckets
    at = final.in_bucket(env or bucket.hint_map, bucket)
    return make_piece(at, 0, at.nodes)


def expected(piece, b: int, s: int, batches: int, steps: list[int]) -> list[int]:
    """The lengths buffer written by hand: seq_len_q and seq_len_kv (b lengths, then zeros), then the ragged
    offsets of q, k, v and o (batch i starts at min(i, b) batch strides), each section 16-byte aligned."""
    out: list[int] = []
    for name in EXTRAS:
        if name.startswith("seq_len"):
            part = [s] * b + [0] * (batches - b)
        else:
            step = steps[EXTRAS.index(name) - 2]
            part = [min(i, b) * step for i in range(batches + 1)]
        out += part + [0] * (-len(part) % 4)
    return out


@pytest.mark.parametrize("fused", [True, False], ids=["fused-qkv", "three-tensors"])
def test_heads_read_in_place_take_the_padded_form_and_each_shape_its_lengths(fused):
    g = heads_graph(fused)
    for b, s in [(6, 720), (13, 1569), (2, 257), (16, 2048)]:
        piece = piece_at(g, {"batch": b, "seq": s})
        form = padded_form(piece)
        assert isinstance(form, PaddedForm), form
        assert form.batch == 16 and form.layouts[0].dim == (16, HQ, 2048, D)
        row = (HQ + 2 * HK) * D if fused else None
        steps = [s * (row or h * D) for h in (HQ, HK, HK)] + [s * HQ * D]
        got = lengths(form, piece, attention_views(piece) or {})
        assert got == expected(piece, b, s, 16, steps), (b, s)
    assert all(start % 4 == 0 for start, _ in sections(16).values())


def test_a_layout_that_changes_within_the_bucket_is_declined_with_a_reason():
    """[batch, heads, seq, dim] contiguous: the heads' stride is seq * dim, a run-time value that ragged
    offsets do not carry (the generated kernel runs the bucket)."""
    why = padded_form(piece_at(heads_graph(False, "bhsd")))
    assert isinstance(why, str) and "changes its layout within the bucket" in why, why


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"generate_stats": True}, "no Stats"),
        ({"use_causal_mask": False, "use_causal_mask_bottom_right": True}, "bottom-right"),
        ({"sliding_window_length": 64}, "sliding window"),
    ],
)
def test_what_the_padded_form_does_not_take_is_declined_with_a_reason(kw, words):
    why = padded_form(piece_at(heads_graph(**kw)))
    assert isinstance(why, str) and words in why, why


def test_a_piece_whose_operands_do_not_vary_is_not_padded():
    g = heads_graph(batch=(4, 4), seq=(512, 512))  # (a static graph)
    static = g.final
    assert padded_form(make_piece(static, 0, static.nodes)) is None


def test_cudnn_leads_on_bucket_attention_in_the_padded_form_worth_its_launch():
    """The policy's first cudnn rule: the engine reports the form (ONE_PLAN_PER_BUCKET), and cuDNN leads
    where the estimate at the bucket's hint is worth a launch; a layout the form does not take keeps the
    generated kernel first (test_policy's bucket test)."""
    cudnn = get_engine("cudnn")
    long = piece_at(heads_graph())
    assert PieceFact.ONE_PLAN_PER_BUCKET in cudnn.facts(long, H200).facts
    assert POLICY.leads(long, cudnn, H200)
    short = piece_at(heads_graph(batch=(1, 1), seq=(17, 256)))
    assert PieceFact.ONE_PLAN_PER_BUCKET in cudnn.facts(short, H200).facts
    assert not POLICY.leads(short, cudnn, H200)  # (a few µs at its hint: the generated kernel's launch wins)
    bhsd = piece_at(heads_graph(False, "bhsd"))
    assert PieceFact.ONE_PLAN_PER_BUCKET not in cudnn.facts(bhsd, H200).facts and not POLICY.leads(bhsd, cudnn, H200)


def test_queries_and_keys_of_other_lengths_get_their_own_lengths():
    """Cross attention over two sequence dims: seq_len_q from q's rows, seq_len_kv from k's."""
    b, sq, skv = og.Dim("batch", 2, 8), og.Dim("sq", 17, 512), og.Dim("skv", 65, 1024)
    g = og.Graph("cross", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)

    def bshd(s, h):
        return [s * h * D, D, h * D, 1]

    q = g.tensor(dim=[b, HQ, sq, D], stride=bshd(sq, HQ), name="q")
    k, v = (g.tensor(dim=[b, HK, skv, D], stride=bshd(skv, HK), name=n) for n in "kv")
    o, _ = g.sdpa(q, k, v, attn_scale=D**-0.5, generate_stats=False, name="attention")
    o.set_output(True).set_stride(bshd(sq, HQ))
    piece = piece_at(g, {"batch": 3, "sq": 40, "skv": 300})
    form = padded_form(piece)
    assert isinstance(form, PaddedForm), form
    got = lengths(form, piece, attention_views(piece) or {})
    spans = sections(form.batch)
    seq_q, seq_kv = (got[spans[n][0] : spans[n][0] + spans[n][1]] for n in ("seq_len_q", "seq_len_kv"))
    assert seq_q == [40] * 3 + [0] * 5 and seq_kv == [300] * 3 + [0] * 5


def test_a_layout_that_differs_only_at_the_bucket_s_smallest_shape_is_declined():
    """[batch, heads, seq, dim] over seq 1020-1024: the hint rounds to the largest shape, where the layouts
    agree; the smallest shape's heads stride differs, and the form is declined there."""
    why = padded_form(piece_at(heads_graph(False, "bhsd", batch=(2, 4), seq=(1020, 1024)), {"batch": 4, "seq": 1024}))
    assert isinstance(why, str) and "changes its layout" in why, why


def test_an_op_beside_the_attention_or_one_tensor_for_q_k_v_is_declined():
    b, s = og.Dim("batch", 2, 16), og.Dim("seq", 257, 2048)
    g = og.Graph("relu_after", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    q, k, v = (
        g.tensor(dim=[b, h, s, D], stride=[s * h * D, D, h * D, 1], name=n)
        for n, h in (("q", HQ), ("k", HK), ("v", HK))
    )
    o, _ = g.sdpa(q, k, v, attn_scale=D**-0.5, generate_stats=False, name="attention")
    g.relu(o).set_output(True)
    why = padded_form(piece_at(g))
    assert isinstance(why, str) and "one attention op" in why, why
    g = og.Graph("self", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=[b, HQ, s, D], stride=[s * HQ * D, D, HQ * D, 1], name="x")
    g.sdpa(x, x, x, attn_scale=D**-0.5, generate_stats=False, name="attention")[0].set_output(True)
    why = padded_form(piece_at(g))
    assert isinstance(why, str) and "tensors of their own" in why, why


def test_a_stride_along_an_axis_of_one_element_may_change():
    """One key/value head whose heads stride is seq x dim (never stepped): the form holds; its ragged
    offsets step by the batch stride."""
    b, s = og.Dim("batch", 2, 16), og.Dim("seq", 257, 2048)
    g = og.Graph("mqa", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[b, HQ, s, D], stride=[s * HQ * D, D, HQ * D, 1], name="q")
    k, v = (g.tensor(dim=[b, 1, s, D], stride=[s * D, s * D, D, 1], name=n) for n in "kv")
    o, _ = g.sdpa(q, k, v, attn_scale=D**-0.5, generate_stats=False, use_causal_mask=True, name="attention")
    o.set_output(True).set_stride([s * HQ * D, D, HQ * D, 1])
    piece = piece_at(g, {"batch": 3, "seq": 300})
    form = padded_form(piece)
    assert isinstance(form, PaddedForm), form
    got = lengths(form, piece, attention_views(piece) or {})
    start, count = sections(16)["ragged_k"]
    assert got[start : start + count] == [min(i, 3) * 300 * D for i in range(17)]


def test_a_bucket_whose_dims_the_attention_reads_do_not_vary_is_not_padded():
    from opgraph.core.bucket import Bucket

    final = heads_graph().final
    fixed = Bucket(0, (("batch", 4, 4), ("seq", 512, 512)), (("batch", 4), ("seq", 512)))
    at = final.in_bucket({"batch": 4, "seq": 512}, fixed)
    assert padded_form(make_piece(at, 0, at.nodes)) is None


@pytest.mark.gpu
@requires_cuda
def test_one_padded_plan_runs_every_shape_of_the_bucket_on_cuda():
    """bf16 GQA attention over the heads of a fused projection, batch 2-4 x seq 65-320 (small enough for the
    reference engine): the cudnn step at every shape (one plan, re-pointed: nothing built per shape),
    right against the reference engine at the range's ends, primes and the hint; O bound inside a larger
    poisoned buffer comes back with everything past it untouched."""
    import torch

    pytest.importorskip("cudnn")
    g = heads_graph(batch=(2, 4), seq=(65, 320))
    plan = g.build(device="cuda", engines=["cudnn"], buckets="one")
    rng = np.random.default_rng(21)
    for b, s in [(2, 65), (4, 320), (3, 127), (2, 320), (4, 65), (3, 192)]:
        run_at_shape(plan, {"batch": b, "seq": s}, rng, relative_to_scale=True)
        at = plan.at({"batch": b, "seq": s})
        (step,) = at.steps
        assert step.config.engine == "cudnn" and step.kernel.padded is not None, at.describe()
        assert "padded form: one plan for the bucket, built at batch 4 x 320 rows" in at.describe()
    assert plan.stats["shape_builds"] == 0 and plan.stats["shape_kernels"] == 0, plan.stats

    b, s = 3, 211
    static = g.final.at({"batch": b, "seq": s})
    qkv = torch.randn(b, s, (HQ + 2 * HK) * D, device="cuda").to(torch.bfloat16)
    o_desc = static.tensor("o")
    size = b * s * HQ * D
    room = torch.full((size + 4096,), 7.0, device="cuda", dtype=torch.bfloat16)
    o = room[:size].as_strided(o_desc.dim, o_desc.stride)
    o.fill_(float("nan"))
    plan.execute({static.tensor("qkv").uid: qkv, o_desc.uid: o})
    torch.cuda.synchronize()
    assert bool(torch.isfinite(o).all()) and bool((room[size:] == 7.0).all())


class _FakeTensor:
    """What the lowering declares and sets on a cuDNN frontend tensor, recorded."""

    def __init__(self, **kw):
        self.kw, self.ragged, self.output = kw, None, False

    def set_ragged_offset(self, t):
        self.ragged = t
        return self

    def set_output(self, flag):
        self.output = flag
        return self

    def __getattr__(self, name):  # set_uid, set_dim, set_stride, set_data_type: recorded
        if not name.startswith("set_"):
            raise AttributeError(name)

        def setter(value):
            self.kw[name.removeprefix("set_")] = value
            return self

        return setter


class _FakeGraph:
    def __init__(self, **kw):
        self.sdpa_kw = None

    def tensor(self, **kw):
        return _FakeTensor(**kw)

    def tensor_scalar(self, value, kind):
        return _FakeTensor(value=value)

    def sdpa(self, q, k, v, **kw):
        self.sdpa_kw = dict(kw, q=q, k=k, v=v)
        return _FakeTensor(), None


def test_the_lowering_declares_the_lengths_and_ragged_offsets_at_the_largest_shape(monkeypatch):
    """The cuDNN graph of the padded form, lowered against a stand-in frontend (no cuDNN here): q, k and v
    declared at the bucket's largest shape, each with its ragged offsets, O's set too; the lengths and
    offsets int32 tensors of the largest batch, numbered after the piece's operands; sdpa asked for the
    padding mask with them. A kernel at a shape binds its stand-in UIDs to those numbers."""
    import sys
    import types

    from opgraph.engines.cudnn_lowering import CANON_BASE, Lowering, canonical_extras
    from opgraph.engines.cudnn_padded import EXTRA_UIDS
    from opgraph.engines.cudnn_sdpa import operand_slots

    kinds = types.SimpleNamespace(BFLOAT16="bf16", HALF="f16", FLOAT="f32", INT32="i32")
    fake = types.SimpleNamespace(
        pygraph=_FakeGraph, data_type=kinds, scalar_type=types.SimpleNamespace(COMPILE_TIME_CONST=0)
    )
    monkeypatch.setitem(sys.modules, "cudnn", fake)
    form = padded_form(piece_at(heads_graph(), {"batch": 5, "seq": 611}))
    assert isinstance(form, PaddedForm)
    lowered = Lowering(form.largest, handle=None, padded=form)
    keys, _ = operand_slots(form.largest)
    assert form.slots == len(keys) and canonical_extras(len(keys)) == {u: lowered.canon[u] for u in EXTRA_UIDS.values()}
    extras = lowered.extras
    assert list(extras) == list(EXTRAS)
    for i, name in enumerate(EXTRAS):
        t = extras[name]
        assert t.kw["data_type"] == "i32" and t.kw["uid"] == CANON_BASE + len(keys) + i
        assert t.kw["dim"] == [16 if name.startswith("seq_len") else 17, 1, 1, 1]
    call = lowered.graph.sdpa_kw
    assert (
        call["use_padding_mask"]
        and call["seq_len_q"] is extras["seq_len_q"]
        and call["seq_len_kv"] is extras["seq_len_kv"]
    )
    for role in "qkv":
        assert call[role].ragged is extras[f"ragged_{role}"]
    assert call["q"].kw["dim"] == [16, HQ, 2048, D] and call["q"].kw["stride"][1:] == [D, (HQ + 2 * HK) * D, 1]
    node = next(n for n in form.largest.nodes if n.kind == "sdpa")
    o = lowered.tensors[node.output("o")]
    assert o.ragged is extras["ragged_o"] and o.output
