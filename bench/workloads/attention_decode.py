"""Decode attention workloads (issue 41): one query a sequence against its KV cache, bf16, batch 64, GQA
32 query / 8 key-value heads, D 128, caches of 8k and 32k tokens, contiguous and paged (16- and 64-token
pages, a shuffled page table). Bound by reading the cache: the floor is K and V read once (and q read, O
written) at the measured HBM rate; the target is 80% of it.

Implementations:
  opgraph's four builds of g.sdpa (bench.ours.graph_impls); the build's policy picks the GQA-packed
      generated forward (a program per key/value head, opgraph/build/gqa_pack.py), split where the
      grid is short (opgraph/build/split_kv.py);
  torch sdpa (flash | cudnn | efficient)  F.scaled_dot_product_attention(enable_gqa=True) under each
      backend, on the contiguous cache (for the paged rows too: PyTorch's SDPA takes no page table).

Reference: float64 on the device, a sequence at a time (the paged rows' cache gathered back)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import opgraph as og

from ..case import Case, Ctx, Impl, Output
from ..core.floors import Floor
from ..core.registry import workload
from ..ours import graph_impls
from ..peers.torch_peers import eager

DT = og.DataType
BF16 = "bfloat16"
CACHES = (("kv8k", 8192), ("kv32k", 32768))
LAYOUTS = (("contig", 0), ("paged16", 16), ("paged64", 64))
BACKENDS = (
    ("flash", "FLASH_ATTENTION", "FlashAttention-2 (PyTorch's flash backend)"),
    ("cudnn", "CUDNN_ATTENTION", "cuDNN SDPA (PyTorch's cudnn backend)"),
    ("efficient", "EFFICIENT_ATTENTION", "memory-efficient attention, CUTLASS (PyTorch's efficient backend)"),
)


def shape(ctx: Ctx, skv: int) -> tuple[int, int, int, int, int]:
    """(B, Hq, Hk, Skv, D): the issue's shape; --quick batch 8 and at most 8k tokens; the dry run tiny."""
    return ctx.pick((64, 32, 8, skv, 128), (8, 32, 8, min(skv, 8192), 128), (2, 4, 2, 64, 16))


def decode_graph(name: str, dims: Sequence[int], page: int) -> tuple[Any, dict[str, Any], Any]:
    """The decode step's graph: q [B, Hq, 1, D] against k, v [B, Hk, Skv, D] (page 0) or paged containers
    [B * Skv / page, Hk, page, D] with page tables [B, 1, Skv / page, 1]; (graph, {name: handle}, O)."""
    b, hq, hk, skv, d = dims
    g = og.Graph(name, io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    h = {"q": g.tensor(dim=[b, hq, 1, d], name="q")}
    kw: dict[str, Any] = {}
    if page:
        slots = skv // page
        for r in "kv":
            h[r] = g.tensor(dim=[b * slots, hk, page, d], name=r)
            h[f"{r}_table"] = g.tensor(dim=[b, 1, slots, 1], data_type=DT.INT32, name=f"{r}_table")
            kw[f"paged_attention_{r}_table"] = h[f"{r}_table"]
        kw["paged_attention_max_seq_len_kv"] = skv
    else:
        for r in "kv":
            h[r] = g.tensor(dim=[b, hk, skv, d], name=r)
    o, _ = g.sdpa(h["q"], h["k"], h["v"], attn_scale=d**-0.5, generate_stats=False, **kw)
    o.set_output(True).set_name("o")
    g.validate()
    return g, h, o


def paged(x: Any, page: int, perm: Any) -> Any:
    """The cache x [B, H, S, D] as a container of pages: page perm[b * S / page + p] holds rows
    [p * page, (p + 1) * page) of sequence b."""
    b, hk, s, d = x.shape
    pages = x.view(b, hk, s // page, page, d).permute(0, 2, 1, 3, 4).reshape(-1, hk, page, d)
    out = pages.new_empty(pages.shape)
    out[perm] = pages
    return out


def decode64(q: Any, k: Any, v: Any, scale: float) -> Any:
    """float64 GQA attention of one query a sequence, a sequence at a time: O [B, Hq, 1, D]."""
    import torch

    b, hq, _, d = q.shape
    hk = k.shape[1]
    out = torch.empty(b, hq, 1, v.shape[3], dtype=torch.float64, device=q.device)
    for i in range(b):
        qb = q[i].double().view(hk, hq // hk, d)
        kb, vb = k[i].double(), v[i].double()
        p = torch.softmax((qb @ kb.transpose(1, 2)) * scale, -1)
        out[i] = (p @ vb).view(hq, 1, -1)
        del kb, vb, p
    return out


def _sdpa(name: str, backend: str, engine: str, args: Sequence[Any], scale: float) -> Impl:
    def fwd(q: Any, k: Any, v: Any) -> Any:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, backend)):
            return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)

    needs = () if name == "flash" else ("cuda",)  # (the flash backend also runs on the CPU: the dry run)
    return eager(fwd, args, name=f"torch sdpa ({name})", engine=engine, needs=needs)


def decode(ctx: Ctx, skv: int, page: int) -> Case:
    import torch

    dims = shape(ctx, skv)
    b, hq, hk, s, d = dims
    page = min(page, s)
    scale = d**-0.5
    q = ctx.randn(b, hq, 1, d, dtype=torch.bfloat16)
    k, v = (ctx.randn(b, hk, s, d, dtype=torch.bfloat16) for _ in range(2))
    tensors = {"q": q, "k": k, "v": v}
    if page:
        gen = torch.Generator().manual_seed(41)
        perm = torch.randperm(b * (s // page), generator=gen).to(q.device)
        table = perm.view(b, 1, s // page, 1).to(torch.int32)
        tensors = {"q": q, "k": paged(k, page, perm), "v": paged(v, page, perm), "k_table": table, "v_table": table}
    tag = f"sdpa_decode_kv{s}{f'_paged{page}' if page else ''}"

    def make() -> tuple[Any, dict, list]:
        g, h, o = decode_graph(tag, dims, page)
        return g, {h[n]: t for n, t in tensors.items()}, [o]

    impls = graph_impls(ctx, make)
    impls += [_sdpa(n, bk, e, (q, k, v), scale) for n, bk, e in BACKENDS]
    kv_bytes = 2 * b * hk * s * d * 2
    return Case(
        [Output("o", BF16)],
        lambda: [decode64(q, k, v, scale)],
        impls,
        Floor(bytes=kv_bytes + 2 * b * hq * d * 2, flops=4.0 * b * hq * s * d, dtype=BF16),
        notes="decode: one query a sequence; PyTorch's SDPA reads the contiguous cache (no page table)",
    )


for _tag, _skv in CACHES:
    for _layout, _page in LAYOUTS:
        workload(
            f"attention_decode.{_tag}_{_layout}",
            group="decode",
            quick=_tag == "kv8k",
            minutes=0.4 if _tag == "kv8k" else 0.8,
            title=f"SDPA decode B64 GQA 32/8 KV {_skv} D128 {_layout} bf16",
        )(functools.partial(decode, skv=_skv, page=_page))
