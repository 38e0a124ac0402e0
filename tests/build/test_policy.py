"""build.policy: which engine's configs go first on a piece, decided from the piece's shape and what
engines report (Engine.facts) by a table of rules, with per-engine launch thresholds. The default rules
with the real cuDNN engine's reports (cuDNN itself is not needed to report them), and the mechanism with
fake engines and rules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import opgraph as og
from opgraph import DataType as DT
from opgraph.build.policy import LEAD_ABOVE_US, POLICY, RULES, Match, PieceFacts, Policy, Rule
from opgraph.core.device import CPU
from opgraph.core.piece import make_piece
from opgraph.engines import get_engine
from opgraph.engines.base import EngineFacts, PieceFact
from opgraph.engines.cost import estimate_us
from opgraph.engines.shared.conv_shapes import FEW_CHANNELS, NARROW_GROUP
from opgraph.tools.samples import nhwc

from ..engines.test_cudnn_frontend import conv_bias_relu, whole
from ..engines.test_triton_conv import conv_graph, sbr_conv_genstats
from ..engines.test_triton_conv_bwd import dgrad_graph, wgrad_graph
from ..engines.test_triton_matmul import mm_graph
from .fakes import H100, H200, FakeEngine, chain

ROOT = Path(__file__).resolve().parents[2]
CUDNN_BAR = LEAD_ABOVE_US["cudnn"]


def leads(g, dev) -> bool:
    """Whether the default policy puts cuDNN's configs first on graph `g` as one piece."""
    return POLICY.leads(whole(g), get_engine("cudnn"), dev)


# -- the default rules, with cuDNN's reports ---------------------------------------------------------------


def test_cudnn_leads_on_convolutions_but_not_tiny_depthwise_or_matmul():
    dev = H100
    assert leads(conv_bias_relu(n=32, c=64, k=64, hw=56), dev)
    assert not leads(conv_bias_relu(), dev)  # a few µs: host launch cost decides
    assert leads(sbr_conv_genstats(n=32, c=64, k=64, hw=56), dev)
    g, _, _, dx = dgrad_graph((32, 64, 56, 56), (64, 64, 3, 3), padding=[1, 1])
    dx.set_output(True)
    assert leads(g, dev)
    g, _, _, dw = wgrad_graph((32, 64, 56, 56), (64, 64, 3, 3), padding=[1, 1])
    dw.set_output(True)
    assert leads(g, dev)
    g, x, w, y = conv_graph((32, 256, 56, 56), (256, 1, 3, 3), padding=[1, 1])  # depthwise
    y.set_output(True)
    assert not leads(g, dev)
    g, _, _, c = mm_graph((1, 4096, 4096), (1, 4096, 4096))
    c.set_output(True)
    assert not leads(g, dev)


def test_cudnn_rules_measured_residual_and_scale_epilogues_narrow_groups_bf16_stems():
    dev = H200

    def conv1x1():
        """ResNet's bottleneck conv 1x1 C64->K256 56², N32, and a maker of tensors broadcast to its output."""
        g, x, w, y = conv_graph((32, 64, 56, 56), (256, 64, 1, 1))
        return (
            g,
            y,
            lambda name, dim=(1, 256, 1, 1), **kw: g.tensor(dim=list(dim), stride=nhwc(list(dim)), name=name, **kw),
        )

    # conv 1x1 + bias + residual + relu (ResNet's bottleneck end): the generated kernel goes first
    g, y, t = conv1x1()
    g.relu(g.add(g.bias(y, t("b")), t("residual", (32, 256, 56, 56)))).set_output(True)
    assert not leads(g, dev)
    # the same conv with a broadcast bias only: cuDNN first
    g, y, t = conv1x1()
    g.relu(g.bias(y, t("b"))).set_output(True)
    assert leads(g, dev)
    # a per-channel scale and shift (an inference batchnorm as from_torch imports it): the generated kernel
    # first (whole networks, H100: ResNet-50 b256 and MobileNetV2 plans 1.15 / 1.29x with cuDNN on these)
    g, y, t = conv1x1()
    g.relu(g.add(g.mul(y, t("s")), t("b"))).set_output(True)
    assert not leads(g, dev)
    # a scalar factor is no per-channel scale: cuDNN first
    g, y, t = conv1x1()
    g.relu(g.mul(g.bias(y, t("b")), t("alpha", (1, 1, 1, 1), data_type=DT.FLOAT))).set_output(True)
    assert leads(g, dev)
    # an SBR prologue (scale on the conv's input) is not an epilogue: cuDNN first
    assert leads(sbr_conv_genstats(n=32, c=64, k=64, hw=56), dev)
    # grouped 3x3, 32 groups of 8 channels: cuDNN first although the cost model calls it cheap (its estimate
    # counts the generated kernel's padded K tile); a tiny one stays with the generated kernel (host cost)
    g, x, w, y = conv_graph((32, 256, 28, 28), (256, 8, 3, 3), padding=[1, 1])
    y.set_output(True)
    assert estimate_us(whole(g), dev) < CUDNN_BAR and leads(g, dev)
    g, x, w, y = conv_graph((1, 64, 7, 7), (64, 8, 3, 3), padding=[1, 1])
    y.set_output(True)
    assert not leads(g, dev)
    # a plain conv of few input channels (the stem, C=3): with a filter row of several taps the generated
    # kernel first (its MERGE_TAPS configs, H100: 76.5 against cuDNN's 84.0 µs); a 1x1 one: the cost model
    g, x, w, y = conv_graph((32, 3, 224, 224), (64, 3, 7, 7), padding=[3, 3], stride=[2, 2])
    y.set_output(True)
    assert not leads(g, dev)
    g, x, w, y = conv_graph((32, 3, 224, 224), (64, 3, 1, 1))
    y.set_output(True)
    assert leads(g, dev)
    g, x, w, y = conv_graph((1, 3, 8, 8), (8, 3, 3, 3), padding=[1, 1])
    y.set_output(True)
    assert not leads(g, dev)
    # the same stem in bf16: the generated kernel first (cuDNN's bf16 plans for C=3, H100: 3.2x its fp16 ones)
    g, x, w, y = conv_graph((32, 3, 224, 224), (64, 3, 7, 7), padding=[3, 3], stride=[2, 2], dt=DT.BFLOAT16)
    y.set_output(True)
    assert estimate_us(whole(g), dev) >= CUDNN_BAR and not leads(g, dev)
    g, x, w, y = conv_graph((32, 64, 56, 56), (64, 64, 3, 3), padding=[1, 1], dt=DT.BFLOAT16)
    y.set_output(True)
    assert leads(g, dev)  # bf16 with 64 channels: cuDNN first, as fp16
    # grouped with 16 channels a group: an MMA tile's depth, the cost model decides as for plain convs
    g, x, w, y = conv_graph((32, 256, 28, 28), (256, 16, 3, 3), padding=[1, 1])
    y.set_output(True)
    assert leads(g, dev) == (estimate_us(whole(g), dev) >= CUDNN_BAR)


def test_attention_leads_where_worth_a_launch():
    from ..engines.test_cudnn_attention import attention_graph

    big = attention_graph(b=4, hq=12, hk=12, sq=1024, skv=1024)
    assert estimate_us(whole(big), H100) >= CUDNN_BAR and leads(big, H100)
    small = attention_graph()
    assert estimate_us(whole(small), H100) < CUDNN_BAR and not leads(small, H100)


def test_attention_in_a_bucket_of_several_shapes_is_the_generated_kernels():
    """A cuDNN plan is built again at every new shape of a bucket; the generated attention is one
    kernel for the bucket: it goes first there, cuDNN still leads where the bucket is one shape."""
    import opgraph as og
    from opgraph.core.bucket import Bucket

    seq, other = og.Dim("seq", 1, 4096), og.Dim("other", 1, 64)
    g = og.Graph("att", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    q, k, v = (g.tensor(dim=[4, 16, seq, 128], name=n) for n in "qkv")
    g.sdpa(q, k, v, attn_scale=0.088, use_causal_mask=True, generate_stats=False)[0].set_output(True)
    g.relu(g.tensor(dim=[other, 8], name="x")).set_output(True)  # a dim the attention does not read
    cudnn = get_engine("cudnn")

    def at(seq_range, other_range=(64, 64)):
        ranges = (("seq", *seq_range), ("other", *other_range))
        static = g.final.in_bucket({"seq": 2048, "other": 64}, Bucket(0, ranges, (("seq", 2048), ("other", 64))))
        return make_piece(static, 0, [n for n in static.nodes if n.kind == "sdpa"])

    assert estimate_us(at((2048, 2048)), H100) >= CUDNN_BAR
    assert POLICY.leads(at((2048, 2048)), cudnn, H100)
    assert PieceFacts.of(at((1025, 4096))).bucketed and not POLICY.leads(at((1025, 4096)), cudnn, H100)
    assert not PieceFacts.of(at((2048, 2048), (1, 64))).bucketed  # only a dim it does not read varies
    assert POLICY.leads(at((2048, 2048), (1, 64)), cudnn, H100)


def lone_matmul(m, n, k, dt=DT.BFLOAT16, out=None, epilogue=False, views=False):
    if views:  # (as AOTAutograd's linear reads its operands: [B, S, K] merged into rows, W [N, K] transposed)
        g = og.Graph("head", io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
        x, w = g.tensor(dim=[4, m // 4, k], name="x"), g.tensor(dim=[n, k], name="w")
        g.matmul(g.reshape(x, [m, k]), g.transpose(w, [1, 0])).set_output(True)
        return g
    g, _, _, c = mm_graph((m, k), (k, n), dt=dt, b_layout="col")
    if epilogue:
        c = g.relu(c, name="relu")
    c.set_output(True).set_data_type(out or dt)
    return g


def test_cublas_leads_on_a_lone_16_bit_matmul_worth_its_launch():
    """cuBLAS (the library engine's call alone, writing the output in place) goes first on a piece that is
    one fp16 or bf16 matmul with a result of its type, where its estimate reaches LEAD_ABOVE_US["library"];
    a matmul with an epilogue, an fp32 result or fp32 operands, or a small one stays with the generated
    kernels; the torch engine (op by op) never leads."""
    library = get_engine("library")
    bar = LEAD_ABOVE_US["library"]

    def library_leads(g, dev=H200):
        return POLICY.leads(whole(g), library, dev)

    head = lone_matmul(8192, 32000, 1024)
    reported = library.facts(whole(head), H200)
    assert PieceFact.NATIVE_GEMM in reported.facts and reported.estimate_us >= bar
    assert library_leads(head) and library_leads(lone_matmul(8192, 1024, 1024, DT.HALF))
    assert not POLICY.leads(whole(head), get_engine("torch"), H200)
    small = lone_matmul(256, 256, 256)
    assert library.facts(whole(small), H200).estimate_us < bar and not library_leads(small)
    assert not library_leads(lone_matmul(8192, 32000, 1024, epilogue=True))
    assert not library_leads(lone_matmul(8192, 32000, 1024, out=DT.FLOAT))
    assert not library_leads(lone_matmul(8192, 32000, 1024, DT.FLOAT))
    assert PieceFact.NATIVE_GEMM not in library.facts(whole(head), CPU).facts
    assert not library_leads(head, CPU)
    assert library_leads(lone_matmul(8192, 32000, 1024, views=True))  # (AOTAutograd's linear: views count no op)


def test_cublas_leads_on_a_lone_16_bit_matmul_in_a_bucket_too():
    """A dynamic plan's LM head (tokens 257-32768 in the bucket): the library call takes every shape with
    nothing compiled, so it leads there as at one shape; the piece is planned at the bucket's hint."""
    from opgraph.build.buckets import choose

    batch, seq = og.Dim("batch", 2, 16), og.Dim("seq", 257, 2048)
    g = og.Graph("head", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x, w = g.tensor(dim=[batch, seq, 1024], name="x"), g.tensor(dim=[1, 1024, 32000], stride=[0, 1, 1024])
    g.matmul(x, w).set_output(True)
    final = g.final
    (bucket,) = choose(final, "one").buckets
    hint = final.in_bucket(bucket.hint_map, bucket)
    piece = make_piece(hint, 0, hint.nodes)
    assert PieceFacts.of(piece).bucketed and POLICY.leads(piece, get_engine("library"), H200)


def test_nothing_leads_on_the_cpu_where_nothing_is_estimated():
    assert not leads(conv_bias_relu(n=32, c=64, k=64, hw=56), CPU)


def test_the_stem_rule_counts_the_channels_merge_taps_covers():
    """The policy sends a few-channel stem to the generated kernel because its MERGE_TAPS configs exist
    for it, and cuDNN's narrow-group rule pads as the generated kernel's K tile: one threshold each, read
    by both sides from engines/shared/conv_shapes.py."""
    from opgraph.engines.triton.templates import conv_fprop

    assert conv_fprop.MERGE_BELOW == FEW_CHANNELS and conv_fprop.NARROW_GROUP == NARROW_GROUP


def test_every_rule_names_its_evidence_in_bench_results():
    for rule in RULES:
        path, _, anchor = rule.evidence.partition("#")
        text = (ROOT / path).read_text()
        headings = {
            re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)
        }
        assert anchor in headings, (rule, sorted(headings))
        assert rule.why


# -- the mechanism, with fake engines and rules -------------------------------------------------------------


class Reporting(FakeEngine):
    def __init__(self, name, estimate=None, facts=frozenset()):
        super().__init__(name)
        self.report = EngineFacts(estimate, frozenset(facts))
        self.asked = 0

    def facts(self, piece, device):
        self.asked += 1
        return self.report


@pytest.fixture
def piece():
    g = chain()
    return make_piece(g, 0, g.nodes[:2])


def test_the_first_rule_of_an_engine_that_holds_decides(piece):
    e = Reporting("e", estimate=5.0)
    no_first = Policy(
        (
            Rule("e", Match(max_ops=1), True, "alone"),
            Rule("e", Match(), False, "no"),
            Rule("e", Match(), True, "never reached"),
        ),
        {},
    )
    assert not no_first.leads(piece, e, H100)
    one = make_piece(piece.graph, 0, piece.nodes[:1])
    assert no_first.leads(one, e, H100)
    decided = no_first.decide(one, PieceFacts.of(one), e, H100)
    assert decided is not None and decided[0].why == "alone" and decided[1] is e.report
    other = Reporting("other")
    assert no_first.decide(one, PieceFacts.of(one), other, H100) is None and other.asked == 0  # no rule: not asked


def test_launch_thresholds_and_padding(piece):
    lead = (Rule("e", Match(), True, "first"),)
    assert Policy(lead, {"e": 5.0}).leads(piece, Reporting("e", estimate=5.0), H100)
    assert not Policy(lead, {"e": 5.0}).leads(piece, Reporting("e", estimate=4.9), H100)
    assert not Policy(lead, {"e": 5.0}).leads(piece, Reporting("e"), H100)  # no estimate: no lead
    assert Policy(lead, {}).leads(piece, Reporting("e"), H100)  # no threshold: the rule alone
    # pads_to scales the estimate by pads_to / channels per group, for convolutions only
    g, x, w, y = conv_graph((2, 32, 8, 8), (32, 4, 3, 3), padding=[1, 1])  # 8 groups of 4 channels
    y.set_output(True)
    padded = Policy((Rule("e", Match(), True, "padded", pads_to=16),), {"e": 10.0})
    assert padded.leads(whole(g), Reporting("e", estimate=2.5), H100)  # 2.5 * 16 / 4 = 10
    assert not padded.leads(whole(g), Reporting("e", estimate=2.4), H100)
    assert not padded.leads(piece, Reporting("e", estimate=2.5), H100)  # not a conv: the estimate as it is


def test_matches_on_kinds_ops_facts_and_conv_shapes(piece):
    flat = PieceFacts.of(piece)
    assert flat.anchor == piece.nodes[0].kind and flat.ops == 2 and flat.conv is None
    none = EngineFacts()
    assert Match().holds(flat, none) and Match(kinds=frozenset({flat.anchor})).holds(flat, none)
    assert not Match(kinds=frozenset({"matmul"})).holds(flat, none) and not Match(max_ops=1).holds(flat, none)
    assert not Match(depthwise=False).holds(flat, none)  # conv fields need a conv anchor
    fused = EngineFacts(facts=frozenset({PieceFact.RUNTIME_FUSED_EPILOGUE}))
    assert Match(fact=PieceFact.RUNTIME_FUSED_EPILOGUE).holds(flat, fused)
    assert not Match(fact=PieceFact.RUNTIME_FUSED_EPILOGUE).holds(flat, none)
    g, x, w, y = conv_graph((2, 3, 8, 8), (8, 3, 3, 3), padding=[1, 1], dt=DT.BFLOAT16)
    y.set_output(True)
    stem = PieceFacts.of(whole(g))
    assert stem.anchor == "conv_fprop" and stem.conv.channels_per_group == 3 and not stem.conv.grouped
    assert Match(
        channels_per_group_below=4,
        filter_row_above=1,
        depthwise=False,
        grouped=False,
        image_types=frozenset({DT.BFLOAT16}),
    ).holds(stem, none)
    for miss in (
        Match(channels_per_group_below=3),
        Match(filter_row_above=3),
        Match(depthwise=True),
        Match(grouped=True),
        Match(image_types=frozenset({DT.HALF})),
    ):
        assert not miss.holds(stem, none), miss
    g, _, _, dw = wgrad_graph((2, 8, 6, 6), (16, 8, 3, 1), padding=[1, 0])
    dw.set_output(True)
    wg = PieceFacts.of(whole(g)).conv  # wgrad: the filter is its result
    assert wg.kind == "conv_wgrad" and wg.channels_per_group == 8 and wg.filter_row == 1


def test_ahead_by_compares_with_the_preferred_engine_and_stakes_its_time(piece):
    """An `ahead_by` rule holds where the engine's estimate times the factor is at most the estimate of the
    engine the build prefers (the first of the order), asked only then; the launch threshold weighs the
    preferred engine's time, the device time the choice is about. No estimate on either side: no lead."""
    policy = Policy((Rule("lib", Match(ahead_by=1.2), True, "ahead"),), {"lib": 20.0})
    gen, lib = Reporting("gen", estimate=24.5), Reporting("lib", estimate=19.8)
    assert [e.name for e in policy.order(piece, [gen, lib], H100)] == ["lib", "gen"]
    assert gen.asked == 1  # (once: for the rule and the threshold)
    assert not policy.leads(piece, Reporting("lib", estimate=20.5), H100, preferred=gen)  # 24.6 > 24.5
    assert not policy.leads(piece, lib, H100, preferred=Reporting("gen", estimate=19.9))  # (below the bar)
    assert not policy.leads(piece, lib, H100, preferred=Reporting("gen"))
    assert not policy.leads(piece, Reporting("lib"), H100, preferred=gen)
    assert not policy.leads(piece, lib, H100)  # (no preferred engine: nothing to be ahead of)
    assert policy.order(piece, [lib, gen], H100) == [lib, gen]  # (the preferred engine itself)
    cold = Reporting("gen", estimate=24.5)
    Policy((Rule("lib", Match(max_ops=1), True, "x"), Rule("lib", Match(ahead_by=2.0), True, "y")), {}).leads(
        piece, Reporting("lib", estimate=1.0), H100, preferred=cold
    )
    assert cold.asked == 1
    plain = Reporting("gen", estimate=24.5)
    Policy((Rule("lib", Match(), True, "x"),), {"lib": 1.0}).leads(
        piece, Reporting("lib", estimate=5.0), H100, preferred=plain
    )
    assert plain.asked == 0  # (no rule compares: the preferred engine is not asked)


def test_cublas_leads_on_weight_gradients_the_generated_kernels_run_slowly():
    """The Llama step's 1024 x 1024 weight gradients (dY^T X over 4096 tokens, the bf16 product cast to fp32):
    cuBLAS plus the cast is estimated 20% ahead of the generated kernel, so the library engine leads; on
    256 x 1024 (too short to be worth the library's launch) and 2816 x 1024 (cuBLAS not far enough ahead)
    the generated kernels stay (bench/results/constants.md#hopper-small-tiles)."""
    library, triton = get_engine("library"), get_engine("triton")

    def wgrad(m, n):
        g = og.Graph("wgrad", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
        dy, x = g.tensor(dim=[4096, m], name="dY"), g.tensor(dim=[4096, n], name="X")
        product = g.matmul(g.transpose(dy, [1, 0], name="dYt"), x, name="mm")
        product.set_data_type(DT.BFLOAT16)
        g.identity(product, name="cast").set_output(True).set_data_type(DT.FLOAT)
        return whole(g)

    def library_leads(piece):
        return POLICY.leads(piece, library, H200, preferred=triton)

    square = wgrad(1024, 1024)
    ours, theirs = library.facts(square, H200).estimate_us, triton.facts(square, H200).estimate_us
    assert ours * 1.2 <= theirs and library_leads(square)
    assert not library_leads(wgrad(256, 1024)) and not library_leads(wgrad(2816, 1024))
    assert not POLICY.leads(square, library, CPU, preferred=triton)


def test_order_is_stable_and_asks_each_engine_once(piece):
    engines = [Reporting("p"), Reporting("q", estimate=20.0), Reporting("r"), Reporting("s", estimate=20.0)]
    policy = Policy((Rule("s", Match(), True, "s"), Rule("q", Match(), True, "q")), {"q": 10.0, "s": 10.0})
    assert [e.name for e in policy.order(piece, engines, H100)] == ["q", "s", "p", "r"]
    assert [e.asked for e in engines] == [0, 1, 0, 1]


def test_engine_rank_first_is_a_deprecated_no_op(piece):
    with pytest.warns(DeprecationWarning, match="opgraph.build.policy"):
        assert get_engine("cudnn").rank_first(piece, H100) is False
