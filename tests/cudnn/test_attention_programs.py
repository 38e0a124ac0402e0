"""cuDNN frontend attention programs through opgraph.cudnn on the CPU (the reference engine, PyTorch CPU
tensors): the calling patterns of NVIDIA's tests and samples (packed THD buffers smaller than their
padded dims with NaN guard margins, interleaved t3hd q/k/v/dQ/dK/dV, paged caches with dense and
packed page tables, decode, sinks, score_max, rng_dump, is_inference, the band masks) checked against
a float64 formulation written here, sequence by sequence; the wrapper's cuDNN output names; the
kernel cache; cudnn.ops.causal_conv1d; the reported versions."""

from __future__ import annotations

import math

import pytest

import opgraph as og
from opgraph.ops import attention_ref as R

from ..helpers import requires_cuda

torch = pytest.importorskip("torch")
import opgraph.cudnn as cudnn  # noqa: E402

F = torch.nn.functional
HALF, FLOAT, INT32, INT64 = cudnn.data_type.HALF, cudnn.data_type.FLOAT, cudnn.data_type.INT32, cudnn.data_type.INT64


def bshd(dims):
    b, h, s, d = dims
    return (s * h * d, d, h * d, 1)


def prefix(lens):
    t = torch.as_tensor(lens).flatten()
    return torch.cat([torch.zeros(1, dtype=t.dtype, device=t.device), torch.cumsum(t, 0)])


def guarded(shape, dtype, values=None, margin=24, device="cpu"):
    """A tensor inside a NaN-filled buffer with `margin` elements before and after (NVIDIA's guards)."""
    n = math.prod(shape)
    raw = torch.full((n + 2 * margin,), float("nan"), dtype=dtype, device=device)
    t = raw.as_strided(shape, [math.prod(shape[i + 1 :]) for i in range(len(shape))], margin)
    if values is not None:
        t.copy_(values)
    return t, raw


def sequence_attention(q, k, v, *, scale, left=None, right=None, br=False, sink=None, drop=None):
    """One sequence [H, s, d] in float64: O, Stats (-inf on empty rows), score_max."""
    hq, sq, skv = q.shape[0], q.shape[1], k.shape[1]
    k = k.repeat_interleave(hq // k.shape[0], 0)
    v = v.repeat_interleave(hq // v.shape[0], 0)
    s = q @ k.transpose(-1, -2) * scale
    i, j = torch.arange(sq, device=q.device)[:, None], torch.arange(skv, device=q.device)[None, :]
    delta = skv - sq if br else 0
    keep = torch.ones(sq, skv, dtype=torch.bool, device=q.device)
    if right is not None:
        keep &= j <= i + delta + right
    if left is not None:
        keep &= j > i + delta - left
    s = s.masked_fill(~keep, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.reshape(hq, 1, 1).expand(hq, sq, 1)], -1)
    empty = (s == float("-inf")).all(-1, keepdim=True)
    safe = s.masked_fill(empty, 0.0)
    p = torch.softmax(safe, -1).masked_fill(empty, 0.0)
    stats = torch.logsumexp(safe, -1, keepdim=True).masked_fill(empty, float("-inf"))
    smax = s.amax(-1, keepdim=True)
    if sink is not None:
        p = p[..., :-1]
    if drop is not None:
        p = p * drop
    return p @ v, stats, smax


def build(graph):
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    return graph


# -- THD buffers (test_mhas_v2's layout) ----------------------------------------------------------------


GPU = [requires_cuda, pytest.mark.gpu]


@pytest.mark.parametrize(
    "device, engines, right",
    [
        ("cpu", None, 0),
        pytest.param("cpu", ("triton",), 0, marks=pytest.mark.interpreter),  # the generated kernels
        pytest.param("cpu", ("triton",), 2, marks=pytest.mark.interpreter),
        pytest.param("cuda", None, 0, marks=GPU),
        pytest.param("cuda", ("triton",), 2, marks=GPU),
    ],
    ids=["cpu", "cpu-triton", "cpu-triton-right2", "cuda", "cuda-triton-right2"],
)
def test_thd_forward_and_backward_with_sink_band_and_score_max(device, engines, right):
    """With engines=("triton",) the forward and the backward run as the generated kernels (no engine
    else is given: a graph they declined would not build)."""
    torch.manual_seed(0)
    b, hq, hk, sq, skv, d, dv = 3, 4, 2, 6, 8, 16, 8
    lq, lkv = torch.tensor([4, 0, 6], dtype=torch.int32), torch.tensor([5, 3, 8], dtype=torch.int32)
    tq = max(64, (int(lq.sum()) + 63) // 64 * 64)
    tkv = max(64, (int(lkv.sum()) + 63) // 64 * 64)
    q, _ = guarded((tq, hq, d), torch.float16, torch.randn(tq, hq, d), device=device)
    k, _ = guarded((tkv, hk, d), torch.float16, torch.randn(tkv, hk, d), device=device)
    v, _ = guarded((tkv, hk, dv), torch.float16, torch.randn(tkv, hk, dv), device=device)
    o, o_raw = guarded((tq, hq, dv), torch.float16, device=device)
    st, _ = guarded((tq, hq, 1), torch.float32, device=device)
    smax, _ = guarded((tq, hq, 1), torch.float32, device=device)
    sink = torch.randn(1, hq, 1, 1).to(device)
    offs = {
        n: t.to(device)
        for n, t in {
            "q": prefix(lq) * hq * d,
            "k": prefix(lkv) * hk * d,
            "v": prefix(lkv) * hk * dv,
            "o": prefix(lq) * hq * dv,
            "s": prefix(lq) * hq,
        }.items()
    }
    lq, lkv = lq.to(device), lkv.to(device)
    g = cudnn.pygraph(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT, engines=engines)
    Q = g.tensor(uid=0, dim=(b, hq, sq, d), stride=bshd((b, hq, sq, d)), data_type=HALF)
    K = g.tensor(uid=1, dim=(b, hk, skv, d), stride=bshd((b, hk, skv, d)), data_type=HALF)
    V = g.tensor(uid=2, dim=(b, hk, skv, dv), stride=bshd((b, hk, skv, dv)), data_type=HALF)
    LQ = g.tensor(uid=11, dim=(b, 1, 1, 1), stride=(1, 1, 1, 1), data_type=INT32)
    LKV = g.tensor(uid=12, dim=(b, 1, 1, 1), stride=(1, 1, 1, 1), data_type=INT32)
    OFF = {
        n: g.tensor(uid=13 + i, dim=(b + 1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=INT64) for i, n in enumerate(offs)
    }
    Q.set_ragged_offset(OFF["q"])
    K.set_ragged_offset(OFF["k"])
    V.set_ragged_offset(OFF["v"])
    SM = g.tensor(uid=27, dim=(b, hq, sq, 1), stride=bshd((b, hq, sq, 1)), data_type=FLOAT)
    SM.set_output(True)
    SINK = g.tensor(uid=29, dim=(1, hq, 1, 1), stride=(hq, 1, 1, 1), data_type=FLOAT)
    O, S = g.sdpa(
        name="f",
        q=Q,
        k=K,
        v=V,
        generate_stats=True,
        attn_scale=0.125,
        use_padding_mask=True,
        seq_len_q=LQ,
        seq_len_kv=LKV,
        diagonal_band_left_bound=3,
        diagonal_band_right_bound=right,
        diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT,
        score_max=SM,
        sink_token=SINK,
        implementation=cudnn.attention_implementation.AUTO,
        unfuse_fma=True,
    )
    O.set_uid(3).set_output(True).set_dim((b, hq, sq, dv)).set_stride(bshd((b, hq, sq, dv)))
    O.set_ragged_offset(OFF["o"])
    S.set_uid(4).set_output(True).set_data_type(FLOAT).set_dim((b, hq, sq, 1)).set_stride(bshd((b, hq, sq, 1)))
    S.set_ragged_offset(OFF["s"])
    SM.set_ragged_offset(OFF["s"])
    build(g)
    if engines:
        assert {st.config.engine for st in g._selected().steps} == set(engines)
    pack = {
        0: q,
        1: k,
        2: v,
        3: o,
        4: st,
        27: smax,
        29: sink,
        11: lq.view(-1, 1, 1, 1),
        12: lkv.view(-1, 1, 1, 1),
        13: offs["q"],
        14: offs["k"],
        15: offs["v"],
        16: offs["o"],
        17: offs["s"],
    }
    g.execute(pack, torch.empty(g.get_workspace_size(), dtype=torch.uint8))
    total = int(lq.sum())
    assert torch.isnan(o[total:]).all() and torch.isnan(o_raw[:24]).all() and torch.isnan(o_raw[-24:]).all()
    pq, pkv = prefix(lq), prefix(lkv)
    for i in range(b):
        qs = q[pq[i] : pq[i + 1]].double().permute(1, 0, 2)
        ks = k[pkv[i] : pkv[i + 1]].double().permute(1, 0, 2)
        vs = v[pkv[i] : pkv[i + 1]].double().permute(1, 0, 2)
        wo, wst, wm = sequence_attention(qs, ks, vs, scale=0.125, left=3, right=right, br=True, sink=sink.double())
        torch.testing.assert_close(o[pq[i] : pq[i + 1]].double().permute(1, 0, 2), wo, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(st[pq[i] : pq[i + 1]].double().permute(1, 0, 2), wst, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(smax[pq[i] : pq[i + 1]].double().permute(1, 0, 2), wm, atol=1e-4, rtol=1e-4)

    # the backward graph over the same buffers, with dSink_token
    do, _ = guarded((tq, hq, dv), torch.float16, 0.1 * torch.randn(tq, hq, dv), device=device)
    grads = {n: guarded(t.shape, t.dtype, device=device)[0] for n, t in (("dq", q), ("dk", k), ("dv", v))}
    dsink = torch.full((1, hq, 1, 1), float("nan"), device=device)
    gb = cudnn.pygraph(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT, engines=engines)
    t = {
        n: gb.tensor(uid=u, dim=dm, stride=bshd(dm), data_type=dt)
        for n, u, dm, dt in (
            ("q", 0, (b, hq, sq, d), HALF),
            ("k", 1, (b, hk, skv, d), HALF),
            ("v", 2, (b, hk, skv, dv), HALF),
            ("o", 3, (b, hq, sq, dv), HALF),
            ("dO", 9, (b, hq, sq, dv), HALF),
            ("st", 4, (b, hq, sq, 1), FLOAT),
        )
    }
    lens = [gb.tensor(uid=u, dim=(b, 1, 1, 1), stride=(1, 1, 1, 1), data_type=INT32) for u in (11, 12)]
    off = {
        n: gb.tensor(uid=13 + i, dim=(b + 1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=INT64) for i, n in enumerate(offs)
    }
    for n, o_ in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "o"), ("dO", "o"), ("st", "s")):
        t[n].set_ragged_offset(off[o_])
    sk = gb.tensor(uid=29, dim=(1, hq, 1, 1), stride=(hq, 1, 1, 1), data_type=FLOAT)
    dsk = gb.tensor(uid=30, dim=(1, hq, 1, 1), stride=(hq, 1, 1, 1), data_type=FLOAT)
    dQ, dK, dV = gb.sdpa_backward(
        name="b",
        q=t["q"],
        k=t["k"],
        v=t["v"],
        o=t["o"],
        dO=t["dO"],
        stats=t["st"],
        attn_scale=0.125,
        use_padding_mask=True,
        seq_len_q=lens[0],
        seq_len_kv=lens[1],
        max_total_seq_len_q=tq,
        max_total_seq_len_kv=tkv,
        diagonal_band_left_bound=3,
        diagonal_band_right_bound=right,
        diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT,
        use_deterministic_algorithm=True,
        sink_token=sk,
        dSink_token=dsk,
    )
    for h, u, n, dm in ((dQ, 6, "q", (b, hq, sq, d)), (dK, 7, "k", (b, hk, skv, d)), (dV, 8, "v", (b, hk, skv, dv))):
        h.set_uid(u).set_output(True).set_dim(dm).set_stride(bshd(dm))
        h.set_ragged_offset(off[n])
    build(gb)
    if engines:
        assert {st.config.engine for st in gb._selected().steps} == set(engines)
    gb.execute(
        {
            0: q,
            1: k,
            2: v,
            3: o,
            9: do,
            4: st,
            6: grads["dq"],
            7: grads["dk"],
            8: grads["dv"],
            29: sink,
            30: dsink,
            11: lq.view(-1, 1, 1, 1),
            12: lkv.view(-1, 1, 1, 1),
            13: offs["q"],
            14: offs["k"],
            15: offs["v"],
            16: offs["o"],
            17: offs["s"],
        },
        None,
    )
    want_dsink = torch.zeros(hq, dtype=torch.float64, device=device)
    for i in range(b):
        leaves = [
            x[p[i] : p[i + 1]].double().permute(1, 0, 2).requires_grad_() for x, p in ((q, pq), (k, pkv), (v, pkv))
        ]
        sink_leaf = sink.double().requires_grad_()
        wo, _, _ = sequence_attention(*leaves, scale=0.125, left=3, right=right, br=True, sink=sink_leaf)
        gq, gk, gv, gs = torch.autograd.grad(wo, [*leaves, sink_leaf], do[pq[i] : pq[i + 1]].double().permute(1, 0, 2))
        want_dsink += gs.reshape(-1)
        for got, want, p in ((grads["dq"], gq, pq), (grads["dk"], gk, pkv), (grads["dv"], gv, pkv)):
            torch.testing.assert_close(got[p[i] : p[i + 1]].double().permute(1, 0, 2), want, atol=3e-3, rtol=3e-3)
    for got, p in ((grads["dq"], pq), (grads["dk"], pkv), (grads["dv"], pkv)):
        assert torch.isnan(got[int(p[-1]) :]).all()  # rows past the last sequence untouched
    torch.testing.assert_close(dsink.reshape(-1).double(), want_dsink, atol=1e-3, rtol=1e-3)


# -- interleaved packed q/k/v (test_mhas's t3hd) with Philox dropout and rng_dump ------------------------


def test_t3hd_forward_backward_with_dropout_and_rng_dump():
    torch.manual_seed(1)
    b, h, s, d = 2, 3, 8, 8
    lens = torch.tensor([5, 8], dtype=torch.int32).view(b, 1, 1, 1)
    dims = (b, h, s, d)
    stride = (s * 3 * h * d, d, 3 * h * d, 1)
    qkv = torch.randn(b * s * 3 * h * d, dtype=torch.float16)
    q, k, v = (torch.as_strided(qkv, dims, stride, storage_offset=i * h * d) for i in range(3))
    off = (prefix(lens) * 3 * h * d).to(torch.int64).view(-1, 1, 1, 1)
    off_o = (prefix(lens) * h * d).to(torch.int64).view(-1, 1, 1, 1)
    o = torch.empty(b * s * h * d, dtype=torch.float16).as_strided(dims, bshd(dims))
    stats = torch.empty(b, h, s, 1)
    rng_dump = torch.zeros(b, h, s, s)
    seed, offset = torch.full((1, 1, 1, 1), 123456, dtype=torch.int64), torch.full((1, 1, 1, 1), 789, dtype=torch.int64)
    g = cudnn.pygraph(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    Q, K, V = (g.tensor_like(x) for x in (q, k, v))
    LQ, LKV = g.tensor_like(lens), g.tensor_like(lens)
    QO, OO = g.tensor_like(off), g.tensor_like(off_o)
    SEED, OFFSET = g.tensor_like(seed), g.tensor_like(offset)
    RNG = g.tensor_like(rng_dump)
    for x in (Q, K, V):
        x.set_ragged_offset(QO)
    O, ST = g.sdpa(
        name="sdpa",
        q=Q,
        k=K,
        v=V,
        generate_stats=True,
        attn_scale=0.125,
        use_padding_mask=True,
        seq_len_q=LQ,
        seq_len_kv=LKV,
        diagonal_band_right_bound=0,
        dropout=(0.1, SEED, OFFSET),
        rng_dump=RNG,
    )
    O.set_output(True).set_dim(dims).set_stride(bshd(dims))
    O.set_ragged_offset(OO)
    ST.set_output(True).set_data_type(FLOAT)
    build(g)
    g.execute(
        {
            Q: q,
            K: k,
            V: v,
            LQ: lens,
            LKV: lens,
            QO: off,
            OO: off_o,
            SEED: seed,
            OFFSET: offset,
            RNG: rng_dump,
            O: o,
            ST: stats,
        },
        None,
    )
    assert set(rng_dump.unique().tolist()) == {0.0, 1.0}
    packed_q = qkv.view(b * s, 3, h, d)
    packed_o = o.as_strided((b * s, h, d), (h * d, d, 1))
    p = prefix(lens)
    for i in range(b):
        seq = packed_q[p[i] : p[i + 1]].double().permute(1, 2, 0, 3)  # [3, H, s_i, D]
        n = int(lens[i])
        wo, wst, _ = sequence_attention(
            seq[0], seq[1], seq[2], scale=0.125, right=0, drop=rng_dump[i, :, :n, :n].double() / 0.9
        )
        torch.testing.assert_close(packed_o[p[i] : p[i + 1]].double().permute(1, 0, 2), wo, atol=3e-3, rtol=3e-3)
        torch.testing.assert_close(stats[i, :, :n].double(), wst, atol=1e-4, rtol=1e-4)
        assert torch.isneginf(stats[i, :, n:]).all()  # padded rows: cuDNN's -inf

    # the backward writes dQ, dK, dV into one interleaved buffer: every element once
    do = (0.1 * torch.randn(b * s * h * d, dtype=torch.float16)).as_strided(dims, bshd(dims))
    dqkv = torch.full_like(qkv, float("nan"))
    dq, dk, dv = (torch.as_strided(dqkv, dims, stride, storage_offset=i * h * d) for i in range(3))
    gb = cudnn.pygraph(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    t = [gb.tensor_like(x) for x in (q, k, v, o, do, stats)]
    LQ, LKV, QO, OO = (gb.tensor_like(x) for x in (lens, lens, off, off_o))
    SEED, OFFSET = gb.tensor_like(seed), gb.tensor_like(offset)
    for x, ro in zip(t[:5], (QO, QO, QO, OO, OO)):
        x.set_ragged_offset(ro)
    grads = gb.sdpa_backward(
        name="sdpa_backward",
        q=t[0],
        k=t[1],
        v=t[2],
        o=t[3],
        dO=t[4],
        stats=t[5],
        attn_scale=0.125,
        use_padding_mask=True,
        seq_len_q=LQ,
        seq_len_kv=LKV,
        diagonal_band_right_bound=0,
        dropout=(0.1, SEED, OFFSET),
    )
    for hnd, buf in zip(grads, (dq, dk, dv)):
        hnd.set_output(True).set_dim(buf.size()).set_stride(buf.stride())
        hnd.set_ragged_offset(QO)
    build(gb)
    gb.execute(
        {
            **dict(zip(t, (q, k, v, o, do, stats))),
            LQ: lens,
            LKV: lens,
            QO: off,
            OO: off_o,
            SEED: seed,
            OFFSET: offset,
            grads[0]: dq,
            grads[1]: dk,
            grads[2]: dv,
        },
        None,
    )
    packed_d = dqkv.view(b * s, 3, h, d)
    packed_do = do.as_strided((b * s, h, d), (h * d, d, 1))
    for i in range(b):
        n = int(lens[i])
        seq = packed_q[p[i] : p[i + 1]].double().permute(1, 2, 0, 3)
        leaves = [seq[j].clone().requires_grad_() for j in range(3)]
        wo, _, _ = sequence_attention(*leaves, scale=0.125, right=0, drop=rng_dump[i, :, :n, :n].double() / 0.9)
        want = torch.autograd.grad(wo, leaves, packed_do[p[i] : p[i + 1]].double().permute(1, 0, 2))
        for j in range(3):
            torch.testing.assert_close(
                packed_d[p[i] : p[i + 1], j].double().permute(1, 0, 2), want[j], atol=3e-3, rtol=3e-3
            )
    assert torch.isnan(packed_d[int(p[-1]) :]).all()


# -- the dropout seed and offset as the frontend declares host values -----------------------------------

BIG_SEED, BIG_OFFSET = 2**60 + 1, 2**33 + 5  # above 2**53 / 2**32: exact in int64 only


def _philox_sdpa(declare, engines, seed, offset):
    """sdpa with Philox dropout and rng_dump, then sdpa_backward, through cudnn.pygraph; seed and offset
    declared `declare`: "device" (1-element tensors read at run time), "is_pass_by_value"
    (tensor(..., is_pass_by_value=True)), "set_is_pass_by_value" or "tensor_like" (of a CPU tensor, as
    cuDNN makes a CPU scalar pass-by-value); bound to `seed` / `offset` (Python ints, or CPU tensors
    [1, 1, 1, 1] for "device" and "tensor_like"). Returns O, Stats, rng_dump, dQ, dK, dV."""
    torch.manual_seed(4)
    b, h, s, d = 2, 2, 6, 8
    dims = (b, h, s, d)
    q, k, v, do = (torch.randn(dims, dtype=torch.float16) for _ in range(4))
    kw = dict(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT, engines=engines, device="cpu")
    cpu = {
        "seed": torch.full((1, 1, 1, 1), seed, dtype=torch.int64),
        "offset": torch.full((1, 1, 1, 1), offset, dtype=torch.int64),
    }
    host = {"seed": seed, "offset": offset}

    def declare_in(g):
        out = []
        for n in ("seed", "offset"):
            if declare == "tensor_like":
                t = g.tensor_like(cpu[n])
                assert t.is_pass_by_value
            else:
                t = g.tensor(
                    name=n,
                    dim=[1, 1, 1, 1],
                    stride=[1, 1, 1, 1],
                    data_type=INT64,
                    is_pass_by_value=declare == "is_pass_by_value",
                )
                if declare == "set_is_pass_by_value":
                    t.set_is_pass_by_value(True)
            out.append(t)
        return out, [cpu[n] if declare in ("device", "tensor_like") else host[n] for n in ("seed", "offset")]

    g = cudnn.pygraph(**kw)
    Q, K, V = (g.tensor_like(x) for x in (q, k, v))
    (SEED, OFF), (sv, ov) = declare_in(g)
    o, stats, dump = torch.empty(dims, dtype=torch.float16), torch.empty(b, h, s, 1), torch.empty(b, h, s, s)
    RNG = g.tensor_like(dump)
    O, ST = g.sdpa(
        name="sdpa", q=Q, k=K, v=V, generate_stats=True, attn_scale=0.25, dropout=(0.3, SEED, OFF), rng_dump=RNG
    )
    O.set_output(True).set_dim(dims).set_stride(o.stride())
    ST.set_output(True).set_data_type(FLOAT)
    build(g)
    if engines:
        assert {st.config.engine for st in g._selected().steps} == set(engines)
    g.execute({Q: q, K: k, V: v, SEED: sv, OFF: ov, RNG: dump, O: o, ST: stats}, None)

    gb = cudnn.pygraph(**kw)
    t = [gb.tensor_like(x) for x in (q, k, v, o, do, stats)]
    (SEED, OFF), (sv, ov) = declare_in(gb)
    grads = gb.sdpa_backward(
        name="sdpa_backward",
        q=t[0],
        k=t[1],
        v=t[2],
        o=t[3],
        dO=t[4],
        stats=t[5],
        attn_scale=0.25,
        dropout=(0.3, SEED, OFF),
    )
    bufs = [torch.empty(dims, dtype=torch.float16) for _ in range(3)]
    for hnd, buf in zip(grads, bufs):
        hnd.set_output(True).set_dim(dims).set_stride(buf.stride())
    build(gb)
    gb.execute({**dict(zip(t, (q, k, v, o, do, stats))), SEED: sv, OFF: ov, **dict(zip(grads, bufs))}, None)
    return [o, stats, dump, *bufs]


@pytest.mark.parametrize(
    "engines", [None, pytest.param(("triton",), marks=pytest.mark.interpreter)], ids=["default", "triton"]
)
def test_dropout_seed_and_offset_pass_by_value_as_the_frontend_declares_them(engines):
    """The frontend's ways of giving the Philox seed and offset as host values (INT64 [1, 1, 1, 1]
    declared is_pass_by_value, or set so after, bound to Python ints; tensor_like of CPU tensors) draw the
    mask of device tensors of the same values, forward and backward; a seed one apart above 2**53 draws
    another."""
    want = _philox_sdpa("device", None, BIG_SEED, BIG_OFFSET)
    keep = R.dropout_keep(0.3, BIG_SEED, BIG_OFFSET, want[2].shape)
    torch.testing.assert_close(want[2], torch.from_numpy(keep.astype("float32")), rtol=0, atol=0)
    for declare in ("is_pass_by_value", "set_is_pass_by_value", "tensor_like"):
        got = _philox_sdpa(declare, engines, BIG_SEED, BIG_OFFSET)
        for name, a, w in zip(("o", "stats", "rng_dump", "dq", "dk", "dv"), got, want):
            torch.testing.assert_close(a, w, rtol=2e-3, atol=2e-3, msg=f"{declare}: {name}")
        torch.testing.assert_close(got[2], want[2], rtol=0, atol=0)
    other = _philox_sdpa("is_pass_by_value", engines, BIG_SEED - 1, BIG_OFFSET)
    assert (other[2] != want[2]).any()


def test_a_float_or_negative_seed_for_a_pass_by_value_int64_is_refused():
    with pytest.raises(og.VariantPackError) as info:
        _philox_sdpa("is_pass_by_value", None, 5.0, 3)
    assert info.value.rule == "pack.pass_by_value" and "'seed'" in str(info.value)
    with pytest.raises(og.VariantPackError) as info:
        _philox_sdpa("is_pass_by_value", None, 5, -3)
    assert info.value.rule == "sdpa.dropout" and "'offset'" in str(info.value)


# -- paged caches, decode --------------------------------------------------------------------------------


def _container(x, block):
    """(container [pages, H, block, D], page table [B, 1, pages per sequence, 1] batch-major)."""
    bsz, h, s, d = x.shape
    per = math.ceil(s / block)
    padded = torch.cat([x, torch.zeros(bsz, h, per * block - s, d, dtype=x.dtype)], 2)
    container = torch.cat(padded.clone().chunk(per, dim=2), dim=0)
    table = torch.arange(bsz * per, dtype=torch.int32).reshape(per, 1, bsz, 1).transpose(0, 2)
    return container, torch.zeros(bsz * per, dtype=torch.int32).as_strided((bsz, 1, per, 1), (per, per, 1, 1)).copy_(
        table
    )


@pytest.mark.parametrize(
    "engines", [None, pytest.param(("triton",), marks=pytest.mark.interpreter)], ids=["default", "triton"]
)
@pytest.mark.parametrize("packed_table", [False, True])
def test_paged_decode(packed_table, engines):
    torch.manual_seed(2)
    b, h, hk, s_kv, d, block = 3, 4, 2, 40, 16, 8
    q = torch.randn(b, h, 1, d, dtype=torch.float16)
    k, v = torch.randn(b, hk, s_kv, d, dtype=torch.float16), torch.randn(b, hk, s_kv, d, dtype=torch.float16)
    lkv = torch.tensor([17, 40, 1], dtype=torch.int32).view(b, 1, 1, 1)
    lq = torch.ones(b, 1, 1, 1, dtype=torch.int32)
    ck, tk = _container(k, block)
    cv, tv = _container(v, block)
    o = torch.empty(b, h, 1, d, dtype=torch.float16)
    g = cudnn.pygraph(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT, engines=engines)
    Q, CK, CV, LQ, LKV = (g.tensor_like(x) for x in (q, ck, cv, lq, lkv))
    feeds = {Q: q, CK: ck, CV: cv, LQ: lq, LKV: lkv}
    tables = []
    for tab in (tk, tv):
        if packed_table:  # sequence b's pages packed one after the other, with their offsets
            pages = [(int(n) + block - 1) // block for n in lkv.flatten()]
            rows = torch.cat([tab[i, 0, : pages[i], 0] for i in range(b)])
            flat = torch.zeros(b * tab.shape[2], dtype=torch.int32)
            flat[: rows.numel()] = rows
            packed = flat.view(b, tab.shape[2], 1, 1).permute(0, 2, 1, 3)
            off = prefix(torch.tensor(pages, dtype=torch.int32)).view(-1, 1, 1, 1)
            T, OFF = g.tensor_like(packed), g.tensor_like(off)
            T.set_ragged_offset(OFF)
            feeds.update({T: packed, OFF: off})
        else:
            T = g.tensor_like(tab)
            feeds[T] = tab
        tables.append(T)
    O, _ = g.sdpa(
        name="sdpa",
        q=Q,
        k=CK,
        v=CV,
        is_inference=True,
        attn_scale=0.25,
        use_padding_mask=True,
        seq_len_q=LQ,
        seq_len_kv=LKV,
        paged_attention_k_table=tables[0],
        paged_attention_v_table=tables[1],
        paged_attention_max_seq_len_kv=s_kv,
    )
    O.set_output(True).set_dim(o.shape).set_stride(o.stride())
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    if engines:  # (the generated forward: packed page tables too)
        assert {st.config.engine for st in g._selected().steps} == set(engines)
    g.execute({**feeds, O: o}, None)
    for i in range(b):
        n = int(lkv[i])
        wo, _, _ = sequence_attention(q[i].double(), k[i, :, :n].double(), v[i, :, :n].double(), scale=0.25)
        torch.testing.assert_close(o[i].double(), wo, atol=2e-3, rtol=2e-3)


def test_packed_q_dense_o_int64_lengths_and_an_unread_stats():
    """sample 52's pattern: q packed, O dense, INT64 lengths, `o, _ = sdpa(..., is_inference=False)`."""
    torch.manual_seed(3)
    b, h, s, d = 2, 2, 6, 8
    dims = (b, h, s, d)
    q = torch.randn(b * s * h * d, dtype=torch.float16).as_strided(dims, bshd(dims))
    k, v = (torch.randn(b * s * h * d, dtype=torch.float16).as_strided(dims, bshd(dims)) for _ in range(2))
    lq = torch.tensor([4, 2]).view(b, 1, 1, 1)  # int64, as torch.randint makes them
    lkv = torch.full((b, 1, 1, 1), s)
    off = torch.cat([torch.zeros(1, 1, 1, 1, dtype=torch.int32), torch.cumsum(lq, 0)]) * h * d
    o = torch.empty(b * s * h * d, dtype=torch.float16).as_strided(dims, bshd(dims))
    g = cudnn.pygraph(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    Q, K, V, LQ, LKV, OFF = (g.tensor_like(x) for x in (q, k, v, lq, lkv, off))
    Q.set_ragged_offset(OFF)
    O, _ = g.sdpa(
        name="sdpa",
        q=Q,
        k=K,
        v=V,
        is_inference=False,
        attn_scale=0.3,
        use_causal_mask=True,
        use_padding_mask=True,
        seq_len_q=LQ,
        seq_len_kv=LKV,
    )
    O.set_output(True).set_dim(dims).set_stride(bshd(dims))
    build(g)
    g.execute({Q: q, K: k, V: v, LQ: lq, LKV: lkv, OFF: off, O: o}, None)
    packed = q.as_strided((b * s, h, d), (h * d, d, 1))
    p = prefix(lq)
    for i in range(b):
        n = int(lq[i])
        wo, _, _ = sequence_attention(
            packed[p[i] : p[i + 1]].double().permute(1, 0, 2), k[i].double(), v[i].double(), scale=0.3, right=0
        )
        torch.testing.assert_close(o[i, :, :n].double(), wo, atol=2e-3, rtol=2e-3)
        assert (o[i, :, n:] == 0).all()


# -- the API surface -------------------------------------------------------------------------------------


def _qkv_graph():
    g = cudnn.pygraph(io_data_type=HALF)
    q, k, v = (g.tensor(dim=(1, 2, 4, 8), stride=(64, 32, 8, 1), data_type=HALF) for _ in range(3))
    return g, q, k, v


def test_generate_stats_or_is_inference_exactly_one():
    g, q, k, v = _qkv_graph()
    for kw in ({}, {"generate_stats": True, "is_inference": False}):
        with pytest.raises(RuntimeError, match="exactly one"):
            g.sdpa(q=q, k=k, v=v, **kw)
    assert g.sdpa(q=q, k=k, v=v, is_inference=True)[1] is None
    assert g.sdpa(q=q, k=k, v=v, generate_stats=True)[1] is not None


@pytest.mark.parametrize("causal", [None, "top_left"])
def test_sdpa_fp8_runs_a_cudnn_program(causal):
    """NVIDIA's fp8 attention program (scales as [1, 1, 1, 1] tensors, Stats an output, the amaxes left
    virtual with set_output(False): dropped with the ops only they read) against cuDNN's definition."""
    import numpy as np

    from ..ops.test_attention_fp8 import SCALES, cudnn_sdpa_fp8

    f8 = torch.float8_e4m3fn
    b, h, s, d = 2, 2, 24, 32
    gen = torch.Generator().manual_seed(3)
    qt, kt, vt = (torch.randn(b, h, s, d, generator=gen).to(f8) for _ in range(3))
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.FP8_E4M3,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    q, k, v = (g.tensor_like(t) for t in (qt, kt, vt))
    scale_t = {n: torch.full((1, 1, 1, 1), val) for n, val in SCALES.items()}
    scales = {n: g.tensor_like(t) for n, t in scale_t.items()}
    o, stats, amax_s, amax_o = g.sdpa_fp8(
        q=q, k=k, v=v, **scales, generate_stats=True, attn_scale=d**-0.5, use_causal_mask=causal == "top_left"
    )
    o.set_output(True).set_dim([b, h, s, d]).set_stride([h * s * d, s * d, d, 1])
    stats.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    amax_s.set_output(False).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1])
    amax_o.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(cudnn.data_type.FLOAT)
    build(g)
    out = torch.full((b, h, s, d), float("nan")).to(f8)
    st = torch.full((b, h, s, 1), float("nan"))
    ao = torch.full((1, 1, 1, 1), float("nan"))
    pack = {q: qt, k: kt, v: vt, o: out, stats: st, amax_o: ao, **{scales[n]: t for n, t in scale_t.items()}}
    g.execute(pack, torch.empty(g.get_workspace_size(), dtype=torch.uint8))
    want_o, want_st, _, want_ao = cudnn_sdpa_fp8(*(t.float().numpy() for t in (qt, kt, vt)), d**-0.5, causal)
    got = out.float().double().numpy()
    assert np.isclose(got, want_o, rtol=0.07, atol=1e-6).all() and (got == want_o).mean() > 0.98
    np.testing.assert_allclose(st.numpy(), want_st, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ao.item(), want_ao, rtol=1e-3)
    names = [n.name for n in g.final.nodes]
    assert any(n.endswith("amax_o") for n in names) and not any(n.endswith("amax_s") for n in names), names


def _fp8_qkv():
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FP8_E4M3, intermediate_data_type=FLOAT)
    q, k, v = (g.tensor(dim=(1, 2, 8, 16), stride=(256, 128, 16, 1)) for _ in range(3))
    return g, q, k, v


def _mask_ops(g):
    return sorted(
        n.name.rsplit(".", 1)[-1] for n in g.final.nodes if n.name.rsplit(".", 1)[-1] in ("right_bound", "left_bound")
    )


def test_sdpa_fp8_takes_cudnns_positional_order_defaults_and_band():
    """cuDNN's order after scale_o (is_inference, attn_scale, use_padding_mask, seq_len_q, seq_len_kv,
    use_causal_mask, ...): a positional causal flag lands where cuDNN puts it; its defaults passed
    explicitly are accepted; right bound 0 is the causal mask (not dropped), a left bound a window."""
    g, q, k, v = _fp8_qkv()
    o = g.sdpa_fp8(q, k, v, *[1.0] * 6, True, 0.25, False, None, None, True)[0]
    o.set_output(True)
    g.validate()
    assert _mask_ops(g) == ["right_bound"]
    g, q, k, v = _fp8_qkv()
    o = g.sdpa_fp8(
        q,
        k,
        v,
        *[1.0] * 6,
        generate_stats=False,
        diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT,
        diagonal_band_right_bound=0,
        diagonal_band_left_bound=3,
        implementation=cudnn.attention_implementation.AUTO,
    )[0]
    o.set_output(True)
    g.validate()
    assert _mask_ops(g) == ["left_bound", "right_bound"]


def test_fp8_attention_backward_and_unimplemented_arguments_are_refused():
    g, q, k, v = _fp8_qkv()
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="sdpa_fp8_backward"):
        g.sdpa_fp8_backward(q, k, v)
    for kw in ({"use_padding_mask": True}, {"dropout": (0.1, q, q)}, {"seq_len_q": q}, {"score_mod": print}):
        with pytest.raises(cudnn.cudnnGraphNotSupportedError, match=next(iter(kw))):
            g.sdpa_fp8(q, k, v, *[1.0] * 6, is_inference=True, **kw)
    with pytest.raises(RuntimeError, match="exactly one"):
        g.sdpa_fp8(q, k, v, *[1.0] * 6)
    g2, q2, k2, v2 = _fp8_qkv()
    k2.set_dim((1, 2, 4, 16)).set_stride((128, 64, 16, 1))
    v2.set_dim((1, 2, 4, 16)).set_stride((128, 64, 16, 1))
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="no key"):
        g2.sdpa_fp8(q2, k2, v2, *[1.0] * 6, is_inference=True, use_causal_mask_bottom_right=True)


BANDS_WITHOUT_KEYS = {
    "bottom_right_causal": {"diagonal_band_right_bound": 0, "diagonal_alignment": "BOTTOM_RIGHT"},
    "top_left_window": {"diagonal_band_left_bound": 2, "diagonal_band_right_bound": 0},
    "bottom_right_window": {"diagonal_band_left_bound": 2, "diagonal_alignment": "BOTTOM_RIGHT"},
}


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("band", list(BANDS_WITHOUT_KEYS))
def test_bands_leaving_rows_without_keys_are_refused_as_cudnn_refuses_them(band, backward):
    """S_q > S_kv, no padding mask: cuDNN's GRAPH_NOT_SUPPORTED (NVIDIA's tests skip on it); S_q <= S_kv,
    or with the padding mask, build."""
    opts = dict(BANDS_WITHOUT_KEYS[band])
    opts["diagonal_alignment"] = getattr(cudnn.diagonal_alignment, opts.get("diagonal_alignment", "TOP_LEFT"))

    def graph(sq, skv, padding=False):
        g = cudnn.pygraph(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
        q = g.tensor(dim=(1, 2, sq, 8), stride=(16 * sq, 8 * sq, 8, 1), data_type=HALF)
        k, v = (g.tensor(dim=(1, 2, skv, 8), stride=(16 * skv, 8 * skv, 8, 1), data_type=HALF) for _ in range(2))
        more = dict(opts)
        if padding:
            lens = [g.tensor(dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=INT32) for _ in range(2)]
            more |= {"use_padding_mask": True, "seq_len_q": lens[0], "seq_len_kv": lens[1]}
        o, st = g.sdpa(q=q, k=k, v=v, generate_stats=True, attn_scale=0.5, **more)
        o.set_output(True)
        st.set_output(True).set_data_type(FLOAT)
        if backward:
            do = g.tensor(dim=(1, 2, sq, 8), stride=(16 * sq, 8 * sq, 8, 1), data_type=HALF)
            for x in g.sdpa_backward(q=q, k=k, v=v, o=o, dO=do, stats=st, attn_scale=0.5, **more):
                x.set_output(True)
        return g

    g = graph(12, 5)
    for _ in range(2):  # (validating again does not get past it)
        with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="S_q=12 > k's S_kv=5 and no padding") as err:
            g.validate()
    assert "cudnn.band_sq_gt_skv" in str(err.value)
    assert ("slice Q" in str(err.value)) == (band == "bottom_right_causal")  # (a window empties the last rows)
    graph(5, 12).validate()
    graph(12, 5, padding=True).validate()


@pytest.mark.parametrize("band", list(BANDS_WITHOUT_KEYS))
def test_a_backward_alone_with_such_a_band_is_refused_too(band):
    opts = dict(BANDS_WITHOUT_KEYS[band])
    opts["diagonal_alignment"] = getattr(cudnn.diagonal_alignment, opts.get("diagonal_alignment", "TOP_LEFT"))
    g = cudnn.pygraph(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    q, o, do = (g.tensor(dim=(1, 2, 12, 8), stride=(192, 96, 8, 1), data_type=HALF) for _ in range(3))
    k, v = (g.tensor(dim=(1, 2, 5, 8), stride=(80, 40, 8, 1), data_type=HALF) for _ in range(2))
    st = g.tensor(dim=(1, 2, 12, 1), stride=(24, 12, 1, 1), data_type=FLOAT)
    for x in g.sdpa_backward(q=q, k=k, v=v, o=o, dO=do, stats=st, attn_scale=0.5, **opts):
        x.set_output(True)
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="cudnn.band_sq_gt_skv"):
        g.validate()


def test_implementation_values_and_engines():
    assert [m.name for m in cudnn.attention_implementation] == ["AUTO", "COMPOSITE", "UNIFIED"]
    g, q, k, v = _qkv_graph()
    g.sdpa(q=q, k=k, v=v, is_inference=True, implementation=cudnn.attention_implementation.UNIFIED)
    assert g.implementation_engines()[0] == "triton"
    with pytest.raises(RuntimeError, match="COMPOSITE and the UNIFIED"):
        g.sdpa(q=q, k=k, v=v, is_inference=True, implementation=cudnn.attention_implementation.COMPOSITE)


def test_shape_overrides_that_restate_the_shapes():
    g = cudnn.pygraph(io_data_type=FLOAT, compute_data_type=FLOAT)
    a, b_ = g.tensor(dim=[1, 4, 3], stride=[12, 3, 1], uid=0), g.tensor(dim=[1, 3, 2], stride=[6, 2, 1], uid=1)
    c = g.matmul(a, b_).set_output(True).set_uid(2)
    build(g)
    x, y, z = torch.randn(1, 4, 3), torch.randn(1, 3, 2), torch.empty(1, 4, 2)
    g.execute(
        {0: x, 1: y, 2: z},
        None,
        override_uids=[0, 1, 2],
        override_shapes=[[1, 4, 3], [1, 3, 2], [1, 4, 2]],
        override_strides=[[12, 3, 1], [6, 2, 1], [8, 2, 1]],
    )
    torch.testing.assert_close(z, x @ y)
    with pytest.raises(RuntimeError, match="issue 42"):
        g.execute({0: x, 1: y, 2: z}, None, override_uids=[0], override_shapes=[[1, 8, 3]], override_strides=None)
    assert c is not None


def test_a_buffer_of_the_other_16_bit_type_is_read_as_declared():
    """cuDNN binds addresses: test_kernel_cache binds bfloat16 buffers to HALF tensors."""
    g = cudnn.pygraph(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT)
    a = g.tensor(name="A", dim=[1, 4, 8], stride=[32, 8, 1]).set_uid(0)
    b_ = g.tensor(name="B", dim=[1, 8, 4], stride=[32, 4, 1]).set_uid(1)
    g.matmul(name="matmul", A=a, B=b_).set_output(True).set_uid(2)
    build(g)
    x, y = torch.randn(1, 4, 8, dtype=torch.bfloat16), torch.randn(1, 8, 4, dtype=torch.bfloat16)
    z = torch.empty(1, 4, 4, dtype=torch.bfloat16)
    g.execute({0: x, 1: y, 2: z}, None)
    torch.testing.assert_close(
        z.view(torch.float16).float(),
        x.view(torch.float16).float() @ y.view(torch.float16).float(),
        atol=1e-2,
        rtol=1e-2,
    )


def test_kernel_cache_and_versions():
    assert cudnn.backend_version() >= 92000 and cudnn.backend_version_string() == "9.20.0"
    cache = cudnn.create_kernel_cache()
    g = cudnn.pygraph(kernel_cache=cache)
    assert g is not None
    text = cache.serialize()
    fresh = cudnn.create_kernel_cache()
    fresh.deserialize(text)
    with pytest.raises(RuntimeError, match="already deserialized"):
        fresh.deserialize(text)
    with pytest.raises(og.SerializationError):
        cudnn.create_kernel_cache().deserialize("not json")


def test_wrapper_output_names_are_cudnn_s():
    x = torch.randn(2, 4, 6)
    w, bias = torch.randn(1, 6, 3), torch.randn(1, 1, 3)
    with cudnn.Graph(io_data_type=FLOAT, compute_data_type=FLOAT, device="cpu") as graph:
        c = graph.matmul(name="mm", A=x, B=w)
        y = graph.bias(name="bias", input=c, bias=bias)
        y.set_output(True).set_name("final")
    graph.set_io_tuples(["mm::A", "mm::B", "bias::bias"], ["bias::OUT_0"])
    out = graph(x, w, bias)
    torch.testing.assert_close(out, x @ w + bias)
    x = torch.randn(2, 5, 8)
    scale, shift = torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    eps = torch.full((1, 1, 1), 1e-3)
    with cudnn.Graph(
        io_data_type=FLOAT,
        compute_data_type=FLOAT,
        device="cpu",
        inputs=["adaln::input", "adaln::scale", "adaln::bias", "adaln::epsilon"],
        outputs=["adaln::Y", "adaln::MEAN", "adaln::INV_VARIANCE"],
    ) as graph:
        out, mean, inv = graph.adalayernorm(
            name="adaln",
            norm_forward_phase=cudnn.norm_forward_phase.TRAINING,
            input=x,
            scale=scale,
            bias=shift,
            epsilon=eps,
        )
        out.set_name("output").set_output(True)
        mean.set_name("mean").set_output(True)
        inv.set_name("inv_var").set_output(True)
    y, m, iv = graph(x, scale, shift, eps)
    torch.testing.assert_close(y, F.layer_norm(x, (8,), eps=1e-3) * scale + shift, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m, x.mean(-1, keepdim=True))


def test_wrapper_sdpa_with_a_dropout_tuple():
    q = torch.randn(1, 2, 4, 8)
    mask = (torch.rand(1, 2, 4, 4) > 0.5).float()
    scale = torch.full((1, 1, 1, 1), 2.0)
    with cudnn.Graph(io_data_type=FLOAT, compute_data_type=FLOAT, device="cpu") as graph:
        o, _ = graph.sdpa(name="SDPA", q=q, k=q, v=q, is_inference=True, dropout=(mask, scale))
        o.set_output(True)
    graph.set_io_tuples(["SDPA::q", "SDPA::dropout::0", "SDPA::dropout::1"], ["SDPA::O"])
    got = graph(q, mask, scale)
    want = torch.softmax(q @ q.transpose(-1, -2), -1) * mask * 2.0 @ q
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_causal_conv1d_op_autograd_and_compile():
    torch.manual_seed(4)
    x = torch.randn(2, 6, 11, requires_grad=True)
    w, b = torch.randn(6, 4, requires_grad=True), torch.randn(6, requires_grad=True)
    y = cudnn.ops.causal_conv1d(x, w, b, activation="silu")
    dy = torch.randn_like(y)
    y.backward(dy)
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    yr = F.silu(F.conv1d(F.pad(xr, (3, 0)), wr.unsqueeze(1), bias=br, groups=6))
    yr.backward(dy)
    torch.testing.assert_close(y, yr, atol=1e-5, rtol=1e-5)
    for got, want in ((x.grad, xr.grad), (w.grad, wr.grad), (b.grad, br.grad)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    compiled = torch.compile(lambda x, w, b: cudnn.ops.causal_conv1d(x, w, b, activation="identity"))
    torch.testing.assert_close(
        compiled(x.detach(), w.detach(), None), cudnn.ops.causal_conv1d(x.detach(), w.detach()), atol=0, rtol=0
    )
    assert isinstance(og.DataType.HALF, og.DataType)


def test_a_packed_q_changes_its_sequence_length_at_execute():
    """test_sdpa_thd's cached graph: built for S = 4, run with override_shapes of S = 9 (one plan per S)."""
    torch.manual_seed(5)
    b, h, d, skv = 2, 2, 8, 12

    def run(g, lq, q_uid=0, o_uid=3):
        tq = int(lq.sum())
        q = torch.randn(tq, h, d, dtype=torch.float16)
        k, v = (torch.randn(b, skv, h, d, dtype=torch.float16).transpose(1, 2) for _ in range(2))
        off = (prefix(lq) * h * d).to(torch.int64).view(-1, 1, 1, 1)
        o = torch.full((tq, h, d), float("nan"), dtype=torch.float16)
        s = int(lq.max())
        lkv = torch.full((b, 1, 1, 1), skv, dtype=torch.int32)
        pack = {0: q, 1: k, 2: v, 3: o, 4: lq.view(-1, 1, 1, 1), 5: lkv, 6: off, 7: off}
        g.execute(
            pack,
            None,
            override_uids=[0, 3],
            override_shapes=[[b, h, s, d], [b, h, s, d]],
            override_strides=[list(q.stride()), list(o.stride())],
        )
        p = prefix(lq)
        for i in range(b):
            wo, _, _ = sequence_attention(
                q[p[i] : p[i + 1]].double().permute(1, 0, 2), k[i].double(), v[i].double(), scale=0.3
            )
            torch.testing.assert_close(o[p[i] : p[i + 1]].double().permute(1, 0, 2), wo, atol=2e-3, rtol=2e-3)

    g = cudnn.pygraph(
        io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT, is_override_shape_enabled=True
    )
    dims = (b, h, 4, d)
    Q = g.tensor(uid=0, dim=dims, stride=(h * d, d, h * d, 1), data_type=HALF)
    K, V = (g.tensor(uid=u, dim=(b, h, skv, d), stride=(h * skv * d, d, h * d, 1), data_type=HALF) for u in (1, 2))
    LQ, LKV = (g.tensor(uid=u, dim=(b, 1, 1, 1), stride=(1, 1, 1, 1), data_type=INT32) for u in (4, 5))
    QO, OO = (g.tensor(uid=u, dim=(b + 1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=INT64) for u in (6, 7))
    Q.set_ragged_offset(QO)
    O, _ = g.sdpa(
        q=Q, k=K, v=V, attn_scale=0.3, use_padding_mask=True, seq_len_q=LQ, seq_len_kv=LKV, generate_stats=False
    )
    O.set_uid(3).set_output(True).set_dim(dims).set_stride((h * d, d, h * d, 1)).set_ragged_offset(OO)
    build(g)
    run(g, torch.tensor([3, 4], dtype=torch.int32))
    run(g, torch.tensor([9, 2], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="issue 42"):
        g.execute({}, None, override_uids=[1], override_shapes=[[b, h, skv + 1, d]], override_strides=None)
