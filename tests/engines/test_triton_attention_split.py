"""Split-KV (flash-decoding) in the generated attention forward (opgraph/engines/triton/attention/split.py)
and the build's choice of it (opgraph/build/split_kv.py): decode-shaped problems (1 to a few queries
against a longer cache, GQA) run with the keys split over 2 to 32 programs a query block and a combining
launch, under Triton's interpreter (tiles of 16: chunk ends fall inside and across tiles, some splits see
no key), against the reference engine on random inputs with poisoned outputs: contiguous, paged (pages
of 16 and 8 tokens: whole key blocks and a gather a key) and packed caches, padding masks and the
bottom-right causal mask of decode, a window, a sink with score_max / score_sum_exp, dropout, a score
modifier, fp16 / bf16. The policy: which split goes first on an H100 for which shapes."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.build import split_kv
from opgraph.core.config import HeurMode
from opgraph.core.device import Device
from opgraph.core.piece import make_piece
from opgraph.core.tensor import packed_strides
from opgraph.engines import get_engine
from opgraph.engines.triton.templates import attention as fwd_template
from opgraph.testing import check_plan

from ..helpers import requires_cuda

DT = og.DataType
B, HQ, HK = 3, 4, 2
BSHD = (0, 2, 1, 3)
H100 = Device("cuda", 0, "H100", (9, 0), 132)
TOL = {DT.FLOAT: (2e-4, 2e-5), DT.HALF: (3e-2, 3e-2), DT.BFLOAT16: (5e-2, 5e-2)}

pytestmark = pytest.mark.interpreter


def decode(
    io=DT.FLOAT,
    *,
    group=HQ // HK,
    sq=1,
    skv=90,
    d=16,
    hk=HK,
    layout="dense",
    page=16,
    sink=False,
    stats_out=False,
    drop=False,
    mod=False,
    bias=False,
    padding=True,
    **opts,
):
    """A decode step: q [B, hk * group, sq, d] (BSHD) against a cache of skv keys per sequence (dense,
    paged [pages, hk, page, d] with a shuffled table, or packed [1, hk, T, d]), lengths per sequence."""
    hq = hk * group
    g = og.Graph("dec", io_data_type=io, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[B, hq, sq, d], stride=packed_strides((B, hq, sq, d), BSHD), name="q")
    kw = dict(opts, attn_scale=d**-0.5)
    if layout == "paged":
        slots = -(-skv // page)
        k, v = (g.tensor(dim=[B * slots + 2, hk, page, d], name=n) for n in "kv")
        for r in "kv":
            kw[f"paged_attention_{r}_table"] = g.tensor(dim=[B, 1, slots, 1], data_type=DT.INT32, name=f"{r}_table")
        kw["paged_attention_max_seq_len_kv"] = skv
    elif layout == "packed":
        t = B * (skv + 3) + 1
        k, v = (g.tensor(dim=[1, hk, t, d], stride=packed_strides((1, hk, t, d), BSHD), name=n) for n in "kv")
        off = g.tensor(dim=[B + 1, 1, 1, 1], data_type=DT.INT64, name="off_kv")
        kw |= {"k_ragged_offset": off, "v_ragged_offset": off, "max_seq_len_kv": skv}
    else:
        k, v = (g.tensor(dim=[B, hk, skv, d], name=n) for n in "kv")
    if padding or layout == "packed":
        kw["use_padding_mask"] = True
        kw["seq_len_q"] = g.tensor(dim=[B, 1, 1, 1], data_type=DT.INT32, name="seq_len_q")
        kw["seq_len_kv"] = g.tensor(dim=[B, 1, 1, 1], data_type=DT.INT32, name="seq_len_kv")
    if sink:
        kw["sink_token"] = g.tensor(dim=[1, hq, 1, 1], data_type=DT.FLOAT, name="sink")
    if drop:
        kw["dropout"] = (0.2, g.tensor(dim=[1], data_type=DT.INT64, name="seed"), 3)
    if mod:
        kw["score_mod"] = lambda sg, s: sg.mul(sg.tanh(sg.div(s, 2.0)), 2.0)
    if bias:  # a per-head bias over the keys, and ALiBi: values that differ between a tile's rows' heads
        kw["bias"] = g.tensor(dim=[1, hq, 1, skv], data_type=DT.FLOAT, name="bias")
        kw["use_alibi_mask"] = True
    extra = {}
    if stats_out:
        extra = {n: g.tensor(dim=[B, hq, sq, 1], data_type=DT.FLOAT, name=n) for n in ("score_max", "score_sum_exp")}
    o, st = g.sdpa(q, k, v, generate_stats=True, name="fwd", **kw, **extra)
    o.set_output(True).set_stride(packed_strides((B, hq, sq, d), BSHD))
    for x in (st, *extra.values()):
        x.set_output(True)
    return g


def prepare(g, sq, skv, layout, page=16, lens_kv=None, sinks=None):
    """The pack's lengths, page tables, packed offsets (NaN between sequences), sinks and seed;
    `sinks(hq)`: the sink of each of hq heads (default: 4 heads' fixed values)."""
    lens_kv = lens_kv or (skv, 1, skv - 37)

    def prep(pack):
        final = g.final
        by = {final.tensors[u].name: u for u in final.inputs}
        rng = np.random.default_rng(5)
        if "seq_len_q" in by:
            pack[by["seq_len_q"]][...] = np.array([sq, sq, max(sq - 1, 0)]).reshape(B, 1, 1, 1)
            pack[by["seq_len_kv"]][...] = np.array(lens_kv).reshape(B, 1, 1, 1)
        if layout == "paged":  # every sequence's pages, shuffled; page 0 and the last unused
            slots = -(-skv // page)
            table = rng.permutation(np.arange(1, B * slots + 1)).reshape(B, 1, slots, 1)
            for r in "kv":
                pack[by[f"{r}_table"]][...] = table
        if layout == "packed":
            off = np.concatenate([[1], 1 + np.cumsum(np.array(lens_kv) + 2)])
            pack[by["off_kv"]][...] = off.reshape(-1, 1, 1, 1)
            covered = np.zeros(pack[by["k"]].shape[2], dtype=bool)
            for o_, n in zip(off, lens_kv):
                covered[o_ : o_ + n] = True
            for r in "kv":
                pack[by[r]][:, :, ~covered] = np.nan
        if "sink" in by:
            hq = pack[by["sink"]].shape[1]
            values = sinks(hq) if sinks is not None else [0.5, -1.0, 2.0, -np.inf]
            pack[by["sink"]][...] = np.array(values).reshape(1, hq, 1, 1)
        if "seed" in by:
            pack[by["seed"]][...] = 77

    return prep


def run_split(g, prep, split, io=DT.FLOAT, block_n=16):
    """The forward with SPLIT = split, launched directly under the interpreter, against the reference."""
    import torch

    from opgraph.engines.triton.attention import FwdKnobs, forward
    from opgraph.engines.triton.attention.run import launch
    from opgraph.testing import compare, random_pack, reference_outputs

    final = g.final
    spec = fwd_template.TEMPLATE.matched(make_piece(final, 0, list(final.nodes)), Device("cpu")).spec()
    pack = random_pack(final, np.random.default_rng(split))
    prep(pack)
    want = reference_outputs(final, pack)
    buffers = {u: torch.from_numpy(x) for u, x in pack.items()}
    gen = forward(spec, FwdKnobs(16, block_n, 4, 1, SPLIT=split))
    assert "kernel_attn_fwd_combine" in gen.source and gen.scratch_bytes > 0
    launch(gen, buffers, interpret=True)
    rtol, atol = TOL[io]
    for u in final.outputs:
        bad = compare(final.tensors[u], buffers[u].numpy(), want[u], rtol=rtol, atol=atol)
        assert bad is None, bad


CASES = {
    "dense": {},
    "dense_no_lengths": {"padding": False},
    "paged16": {"layout": "paged"},
    "paged8": {"layout": "paged", "page": 8},  # pages smaller than a key block: a gather a key
    "packed": {"layout": "packed"},
    "causal_br_sq3": {"sq": 3, "use_causal_mask_bottom_right": True},
    "window_br": {"sq": 2, "use_causal_mask_bottom_right": True, "sliding_window_length": 20},
    "sink_stats": {"sink": True, "stats_out": True, "layout": "paged"},
    "dropout_softcap": {"drop": True, "mod": True},
}


@pytest.mark.parametrize("split", [2, 3, 8])
@pytest.mark.parametrize("case", list(CASES))
def test_split_kv_forward(case, split):
    opts = CASES[case]
    sq, skv = opts.get("sq", 1), opts.get("skv", 90)
    g = decode(**opts)
    run_split(g, prepare(g, sq, skv, opts.get("layout", "dense"), opts.get("page", 16)), split)


def test_split_kv_half():
    g = decode(DT.HALF, sq=2, layout="paged", use_causal_mask_bottom_right=True, sink=True)
    run_split(g, prepare(g, 2, 90, "paged"), 4, DT.HALF)


def test_more_splits_than_key_blocks():
    """Splits past the last key (and whole sequences shorter than a chunk) see nothing: their partials
    are empty rows the combination ignores."""
    g = decode(skv=40)
    run_split(g, prepare(g, 1, 40, "dense", lens_kv=(40, 3, 17)), 8)


# -- the build's choice ------------------------------------------------------------------------------------


def _configs(b, hq, hk, sq, skv, layout="dense", device=H100):
    g = og.Graph("dec", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[b, hq, sq, 128], name="q")
    kw = {}
    if layout == "paged":
        k, v = (g.tensor(dim=[b * skv // 64, hk, 64, 128], name=n) for n in "kv")
        for r in "kv":
            kw[f"paged_attention_{r}_table"] = g.tensor(dim=[b, 1, skv // 64, 1], data_type=DT.INT32, name=r + "t")
    else:
        k, v = (g.tensor(dim=[b, hk, skv, 128], name=n) for n in "kv")
    o, _ = g.sdpa(q, k, v, attn_scale=128**-0.5, generate_stats=False, **kw)
    o.set_output(True)
    final = g.final
    piece = make_piece(final, 0, list(final.nodes))
    # (the engine's configs and the build's order, as rank_configs makes them: the GPU is not needed)
    configs = get_engine("triton").configs(piece, device, HeurMode.A)
    return split_kv.order(piece, configs, device)


@pytest.mark.parametrize(
    "b, hq, hk, skv, layout, want",
    [
        (1, 32, 32, 32768, "dense", 4),  # 32 programs on 132 SMs: 4 splits fill a wave
        (2, 32, 32, 8192, "paged", 2),
        (64, 32, 32, 8192, "dense", None),  # 2048 programs: no split
        (1, 32, 8, 32768, "dense", 16),  # GQA: packed (test_triton_attention_gqa_pack.py), 8 programs
        (2, 8, 8, 256, "dense", None),  # too few keys to share
    ],
)
def test_policy_puts_the_estimated_split_first(b, hq, hk, skv, layout, want):
    configs = _configs(b, hq, hk, 1, skv, layout)
    splits = [c.knob("SPLIT") for c in configs]
    assert set(s for s in splits if s) <= {2, 4, 8, 16, 32} and (any(splits) or skv <= 256), splits  # offered
    assert configs[0].knob("SPLIT") == want, [str(c) for c in configs[:3]]
    heads = hk if hq > hk else hq  # (GQA-packed: a program per key/value head)
    assert split_kv.split_count(b, heads, hq // heads, skv, 16, H100.sm_count) == (want or 0)


def test_no_split_for_prefill():
    configs = _configs(1, 8, 8, 512, 4096)
    assert not any(c.knob("SPLIT") for c in configs)


def test_a_planned_split_runs_under_the_interpreter(rng):
    """Built for the CPU (the interpreter, 4 'SMs' there), a decode step of one sequence and one head
    group takes the policy's split; the plan matches the reference."""
    g = og.Graph("dec", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[1, 2, 1, 16], name="q")
    k, v = (g.tensor(dim=[1, 1, 200, 16], name=n) for n in "kv")
    o, st = g.sdpa(q, k, v, attn_scale=0.25, use_causal_mask_bottom_right=True)
    o.set_output(True)
    st.set_output(True)
    plan = g.build(device="cpu", engines=["triton"])
    assert [s.config.knob("SPLIT") for s in plan.steps] == [2], plan.describe()
    bad = check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


# -- Hopper (sm_90) compilation without a GPU -------------------------------------------------------------


def _decode_graph(layout, b=4, sink=True):
    """A decode step: b sequences of one query, GQA 32/8, D 128, 8k-token caches (paged: 64-token pages),
    bf16, padding and bottom-right causal masks (and a sink)."""
    hq, hk, skv = 32, 8, 8192
    g = og.Graph("dec", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    q = g.tensor(dim=[b, hq, 1, 128], name="q")
    kw = {"use_padding_mask": True, "use_causal_mask_bottom_right": True}
    if sink:
        kw["sink_token"] = g.tensor(dim=[1, hq, 1, 1])
    kw["seq_len_q"] = g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_q")
    kw["seq_len_kv"] = g.tensor(dim=[b, 1, 1, 1], data_type=DT.INT32, name="seq_len_kv")
    if layout == "paged":
        k, v = (g.tensor(dim=[b * skv // 64, hk, 64, 128], name=n) for n in "kv")
        for r in "kv":
            kw[f"paged_attention_{r}_table"] = g.tensor(dim=[b, 1, skv // 64, 1], data_type=DT.INT32, name=r + "t")
    else:
        k, v = (g.tensor(dim=[b, hk, skv, 128], name=n) for n in "kv")
    o, st = g.sdpa(q, k, v, attn_scale=128**-0.5, **kw)
    o.set_output(True)
    st.set_output(True)
    return g


HOPPER_CASES = {
    f"decode_{layout}": (
        lambda layout=layout: _decode_graph(layout),
        "attention",
        lambda c: [x for x in c if x.get("SPLIT") == 4 and not x.get("PACK_GQA")],
    )
    for layout in ("dense", "paged")
}


def test_split_kv_compiles_for_hopper():
    """The split kernel and the combining launch compile for sm_90 (no GPU), without spills."""
    from .hopper_compile import attention_smem, compile_for_hopper

    out = compile_for_hopper(__name__)
    lines = [line.split() for line in out.splitlines() if line.startswith("compiled")]
    names = {(w[1], w[2]) for w in lines}
    for case in HOPPER_CASES:
        assert {(case, "kernel_attn_fwd"), (case, "kernel_attn_fwd_combine")} <= names, lines
    for w in lines:
        assert int(w[w.index("spills") + 1]) == 0, w
    for case, kernel, smem, estimate in attention_smem(__name__, out):  # (the fit trusts the estimate)
        assert smem <= estimate, (case, kernel, smem, estimate)


# -- GPU --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("layout", ["dense", "paged"])
def test_gpu_decode_split_kv(layout):
    """Batch 2, GQA 32/8, D 128, 8k-token caches (paged: 64-token pages), bf16: the policy's split (64
    programs on 132 SMs: 2) on the GPU against the reference engine."""
    rng = np.random.default_rng(9)
    b, skv = 2, 8192
    g = _decode_graph(layout, b=b, sink=False)
    plan = g.build(device="cuda", engines=["triton"])
    assert plan.steps[0].config.knob("SPLIT"), plan.describe()

    def prep(pack):
        final = g.final
        by = {final.tensors[u].name: u for u in final.inputs}
        pack[by["seq_len_q"]][...] = 1
        pack[by["seq_len_kv"]][...] = np.array([skv, 5000]).reshape(b, 1, 1, 1)
        if layout == "paged":
            table = rng.permutation(b * skv // 64).reshape(b, 1, skv // 64, 1)
            for r in "kv":
                pack[by[r + "t"]][...] = table

    bad = check_plan(plan, rng, prepare=prep, rtol=5e-2, atol=5e-2)
    assert not bad, "\n".join(map(str, bad))
