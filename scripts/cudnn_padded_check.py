"""cuDNN's padded SDPA form for a dynamic plan's bucket (opgraph/engines/cudnn_padded.py), through the cuDNN
frontend directly: one plan built at a bucket's largest shape (padding mask, ragged offsets on Q, K, V and
O) run at smaller shapes of the bucket, beside a dense plan built at each shape. The serving Llama's heads
(bf16, GQA 16/4, D 64, BSHD read in place; V also as a slice of a fused projection's rows). Each output
checked against PyTorch's float32 SDPA, O's buffer followed by a guard region that must stay untouched
(batches past the shape's get length 0), then device time (20 launches queued behind a spin, median of 7).

    python scripts/cudnn_padded_check.py        # a GPU with cuDNN's frontend
"""

import math
import time

import cudnn
import torch

HQ, HK, D = 16, 4, 64
BF16, F32, I32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT, cudnn.data_type.INT32
handle = cudnn.create_handle()
cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
print("cudnn", cudnn.backend_version(), "fe", cudnn.__version__, flush=True)


def build(b, s, padded, vrow, causal=True):
    g = cudnn.pygraph(io_data_type=BF16, intermediate_data_type=F32, compute_data_type=F32, handle=handle)
    t = {}
    t["q"] = g.tensor(name="q", dim=[b, HQ, s, D], stride=[s * HQ * D, D, HQ * D, 1], data_type=BF16)
    t["k"] = g.tensor(name="k", dim=[b, HK, s, D], stride=[s * HK * D, D, HK * D, 1], data_type=BF16)
    t["v"] = g.tensor(name="v", dim=[b, HK, s, D], stride=[s * vrow, D, vrow, 1], data_type=BF16)
    kw = {}
    if padded:
        for n in ("sq", "skv"):
            t[n] = g.tensor(name=n, dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=I32)
        for n in ("rq", "rk", "rv", "ro"):
            t[n] = g.tensor(name=n, dim=[b + 1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=I32)
        t["q"].set_ragged_offset(t["rq"])
        t["k"].set_ragged_offset(t["rk"])
        t["v"].set_ragged_offset(t["rv"])
        kw = dict(use_padding_mask=True, seq_len_q=t["sq"], seq_len_kv=t["skv"])
    o, _ = g.sdpa(
        t["q"], t["k"], t["v"], attn_scale=1 / math.sqrt(D), generate_stats=False, use_causal_mask=causal, **kw
    )
    o.set_output(True).set_dim([b, HQ, s, D]).set_stride([s * HQ * D, D, HQ * D, 1]).set_data_type(BF16)
    if padded:
        o.set_ragged_offset(t["ro"])
    t["o"] = o
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A])
    g.check_support()
    n = g.get_execution_plan_count()
    names = [g.get_plan_name_at_index(i) for i in range(n)]
    g.build_plans()
    return g, t, names


def run(g, t, pack, ws):
    g.execute({t[k]: v for k, v in pack.items()}, ws, handle=handle)


def time_it(fn, n=7, k=20):
    fn()
    torch.cuda.synchronize()
    a, e = torch.cuda.Event(True), torch.cuda.Event(True)
    ts = []
    for _ in range(n):
        torch.cuda._sleep(5_000_000)  # (queue the launches behind a spin: device time only)
        a.record()
        for _ in range(k):
            fn()
        e.record()
        e.synchronize()
        ts.append(a.elapsed_time(e) * 1000 / k)
    ts.sort()
    return ts[len(ts) // 2]


GUARD = 1 << 20


def case(Bm, Sm, shapes, vrow, causal=True):
    t0 = time.perf_counter()
    gp, tp, names = build(Bm, Sm, True, vrow, causal)
    print(
        f"== bucket {Bm}x{Sm} vrow {vrow} causal {causal}: padded plan built in {1e3 * (time.perf_counter() - t0):.0f} ms: {names}",
        flush=True,
    )
    wsp = torch.empty(max(1, gp.get_workspace_size()), dtype=torch.uint8, device="cuda")
    for b, s in shapes:
        gen = torch.Generator(device="cuda").manual_seed(b * 10000 + s)
        q = torch.randn(b, s, HQ, D, device="cuda", generator=gen).bfloat16()
        k = torch.randn(b, s, HK, D, device="cuda", generator=gen).bfloat16()
        vbuf = torch.randn(b * s * vrow + 64, device="cuda", generator=gen).bfloat16()
        v = (
            vbuf[: b * s * vrow].view(b, s, vrow)[:, :, : HK * D].reshape(b, s, HK, D)
            if vrow != HK * D
            else vbuf[: b * s * vrow].view(b, s, HK, D)
        )
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float().transpose(1, 2),
            k.float().transpose(1, 2),
            v.float().transpose(1, 2),
            is_causal=causal,
            scale=1 / math.sqrt(D),
            enable_gqa=True,
        ).transpose(1, 2)
        obuf = torch.full((b * s * HQ * D + GUARD,), 7.0, dtype=torch.bfloat16, device="cuda")
        obuf[: b * s * HQ * D] = float("nan")
        o = obuf[: b * s * HQ * D].view(b, s, HQ, D)
        seq = torch.tensor([s] * b + [0] * (Bm - b), dtype=torch.int32, device="cuda").view(Bm, 1, 1, 1)

        def rag(row):
            return torch.tensor([min(i, b) * s * row for i in range(Bm + 1)], dtype=torch.int32, device="cuda").view(
                Bm + 1, 1, 1, 1
            )

        vbase = vbuf
        pack = {
            "q": q,
            "k": k,
            "v": vbase,
            "o": obuf,
            "sq": seq,
            "skv": seq,
            "rq": rag(HQ * D),
            "rk": rag(HK * D),
            "rv": rag(vrow),
            "ro": rag(HQ * D),
        }
        try:
            run(gp, tp, pack, wsp)
            torch.cuda.synchronize()
            err = float((o.float() - ref).abs().max() / ref.abs().max())
            guard = bool((obuf[b * s * HQ * D :] == 7.0).all())
            us_p = time_it(lambda: run(gp, tp, pack, wsp))
        except Exception as ex:
            print(f"   {b}x{s}: padded FAILED {type(ex).__name__}: {str(ex)[:300]}", flush=True)
            continue
        t0 = time.perf_counter()
        gd, td, nd = build(b, s, False, vrow, causal)
        ms_build = 1e3 * (time.perf_counter() - t0)
        wsd = torch.empty(max(1, gd.get_workspace_size()), dtype=torch.uint8, device="cuda")
        o2 = torch.empty_like(o)
        dpack = {"q": q, "k": k, "v": vbase, "o": o2}  # (v's elements start at the buffer's start)
        run(gd, td, dpack, wsd)
        torch.cuda.synchronize()
        err2 = float((o2.float() - ref).abs().max() / ref.abs().max())
        us_d = time_it(lambda: run(gd, td, dpack, wsd))
        print(
            f"   {b:3d}x{s:5d}: padded {us_p:8.1f} us err {err:.2e} guard {'ok' if guard else 'WRITTEN'} | dense {us_d:8.1f} us err {err2:.2e} built {ms_build:.0f} ms {nd[:1]} | ratio {us_p / us_d:.3f}",
            flush=True,
        )


def main() -> None:
    big = [
        (13, 1569),
        (5, 1900),
        (14, 1714),
        (9, 1160),
        (10, 928),
        (2, 1935),
        (16, 2048),
        (2, 300),
        (1, 257),
        (16, 846),
    ]
    case(16, 2048, big, HK * D)
    case(16, 2048, [(13, 1569), (5, 1900), (2, 300)], 1536)
    case(16, 256, [(14, 99), (3, 20), (16, 256), (2, 17), (9, 144)], HK * D)
    case(1, 2048, [(1, 1270), (1, 300), (1, 2048)], HK * D)
    case(16, 2048, [(13, 1569), (2, 300)], HK * D, causal=False)


if __name__ == "__main__":
    main()
