"""Attention as LLM training runs it (issue 41), bf16, D 128, 16 heads:

  attention.packed_{fwd,bwd}   packed variable-length sequences (THD): 32 causal sequences of 128 to 4096
                               tokens summing to 32k, in one [tokens, heads, D] buffer with per-sequence
                               offsets; the forward writes O and the statistics (a training forward),
                               the backward reads them and writes dQ, dK, dV (packed)
  attention.window_{fwd,bwd}   a sliding window of 4k keys over a 32k sequence (causal), batch 1

Implementations:
  opgraph's four builds of g.sdpa / g.sdpa_backward (bench.ours.graph_impls): packed tensors with ragged
      offsets and the padding mask; the window as `sliding_window_length`;
  FlexAttention (torch.compile)  the same attention as a block mask made at setup (the document mask:
      a key of the same sequence at or before the query; the window: at most 4k keys back);
  cuDNN FE heuristic / tuned  the cuDNN frontend's ragged SDPA (`set_ragged_offset`, offsets in
      elements) and its band (`diagonal_band_left_bound`).
PyTorch's SDPA backends take neither packed sequences nor a window (a dense mask would be 32k x 32k).

References: float64 on the device, a sequence (packed) or a block of queries against its window's keys at
a time, gradients by autograd. The backward's O and statistics are the float64 forward's rounded to bf16
and fp32. Floors: 4 D flops a (query, key) pair the masks keep forward, 2.5x backward, at the measured
dense bf16 GEMM rate; bytes: each input read and each output written once.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import opgraph as og
from opgraph.core.tensor import packed_strides

from ..case import Case, Ctx, Output
from ..core.floors import Floor
from ..core.registry import workload
from ..ours import graph_impls
from ..peers import cudnn_fe
from .attention import BF16, attention64, flex

DT = og.DataType
BSHD = (0, 2, 1, 3)
FP32 = "float32"


# -- shapes -----------------------------------------------------------------------------------------------------
def packed_lengths(count: int, total: int, lo: int, hi: int, seed: int = 41) -> list[int]:
    """`count` sequence lengths in [lo, hi] summing to `total`: drawn from `seed`, their excess over `lo`
    scaled to the tokens left, the rounding spread one token at a time."""
    assert count * lo <= total <= count * hi
    rng = random.Random(seed)
    excess = [rng.randint(0, hi - lo) for _ in range(count)]
    spare, drawn = total - count * lo, sum(excess) or 1
    lengths = [lo + min(hi - lo, e * spare // drawn) for e in excess]
    i = 0
    while (diff := total - sum(lengths)) != 0:
        step = 1 if diff > 0 else -1
        if lo <= lengths[i % count] + step <= hi:
            lengths[i % count] += step
        i += 1
    return lengths


def packed_shape(ctx: Ctx) -> tuple[list[int], int, int]:
    """(sequence lengths, heads, D): the issue's 32 sequences of 128-4096 tokens summing to 32k; --quick 8
    summing to 8k; the dry run three tiny ones."""
    lengths = ctx.pick(packed_lengths(32, 32768, 128, 4096), packed_lengths(8, 8192, 128, 2048), [5, 17, 30])
    return lengths, ctx.pick(16, 16, 2), ctx.pick(128, 128, 16)


def window_shape(ctx: Ctx) -> tuple[int, int, int, int]:
    """(heads, S, window, D): 4k of 32k; --quick 1k of 8k; the dry run tiny."""
    return ctx.pick((16, 32768, 4096, 128), (16, 8192, 1024, 128), (2, 64, 16, 16))


def offsets(lengths: Sequence[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def _as_bhsd(x: Any) -> Any:
    """[T, H, D] (token-major, contiguous) as the [1, H, T, D] view opgraph and FlexAttention take."""
    return x.unsqueeze(0).transpose(1, 2)


def _floor(pairs: int, heads: int, d: int, elems: int, backward: bool, stats_rows: int) -> Floor:
    moved = (8 * elems * 2 + stats_rows * 4) if backward else (4 * elems * 2 + stats_rows * 4)
    return Floor(bytes=moved, flops=4.0 * pairs * heads * d * (2.5 if backward else 1.0), dtype=BF16, tflops=True)


# -- float64 references ------------------------------------------------------------------------------------------
def attention64_masked(
    q: Any, k: Any, v: Any, scale: float, keep: Callable[[Any, Any], Any], do: Any = None
) -> dict[str, Any]:
    """float64 attention of [H, S, D] q, k, v over the (query, key) pairs `keep(i, j)` holds (attention.py's
    attention64, the pairs dropped by its score modifier): {"o", "lse"} ([H, S, D], [H, S, 1]) and, given
    dO, {"dq", "dk", "dv"}."""

    def drop(scores: Any, h: int, i: Any, j: Any) -> Any:
        return scores.masked_fill(~keep(i, j), -math.inf)

    out = attention64(q[None], k[None], v[None], scale, False, drop, None if do is None else do[None])
    return {n: x[0] for n, x in out.items()}


def causal(i: Any, j: Any) -> Any:
    return j <= i


def packed64(q: Any, k: Any, v: Any, lengths: Sequence[int], scale: float, do: Any = None) -> dict[str, Any]:
    """Causal attention within each packed sequence of [T, H, D] q, k, v: {"o", "lse", ...} packed like
    them ([T, H, D], [T, H, 1])."""
    import torch

    out: dict[str, Any] = {}
    names = ("o", "lse", "dq", "dk", "dv") if do is not None else ("o", "lse")
    for a, b in zip(offsets(lengths), offsets(lengths)[1:]):
        seg = [t[a:b].transpose(0, 1) for t in (q, k, v)]
        part = attention64_masked(*seg, scale, causal, None if do is None else do[a:b].transpose(0, 1))
        for n in names:
            out.setdefault(n, []).append(part[n].transpose(0, 1))
    return {n: torch.cat(parts) for n, parts in out.items()}


def window64(q: Any, k: Any, v: Any, window: int, scale: float, do: Any = None, block: int = 2048) -> dict[str, Any]:
    """Sliding-window causal attention of [H, S, D] q, k, v (each query the `window` keys ending at it), a
    block of queries against the keys its window reaches at a time: {"o", "lse", ...} ([H, S, D], [H, S, 1])."""
    import torch

    h_, s_, _ = q.shape
    out: dict[str, Any] = {"o": torch.empty(q.shape, dtype=torch.float64, device=q.device)}
    out["lse"] = torch.empty(h_, s_, 1, dtype=torch.float64, device=q.device)
    if do is not None:
        for n in ("dq", "dk", "dv"):
            out[n] = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for a in range(0, s_, block):
        b = min(a + block, s_)
        lo = max(0, a - window + 1)

        def keep(i: Any, j: Any, a: int = a, lo: int = lo) -> Any:
            qi, kj = i + a, j + lo
            return (kj <= qi) & (kj > qi - window)

        part = attention64_masked(q[:, a:b], k[:, lo:b], v[:, lo:b], scale, keep, None if do is None else do[:, a:b])
        out["o"][:, a:b], out["lse"][:, a:b] = part["o"], part["lse"]
        if do is not None:
            out["dq"][:, a:b] = part["dq"]
            out["dk"][:, lo:b] += part["dk"]
            out["dv"][:, lo:b] += part["dv"]
    return out


# -- opgraph's graphs ----------------------------------------------------------------------------------------------
def packed_graph(name: str, t: dict[str, Any], lengths: Sequence[int], scale: float, backward: bool) -> tuple:
    """sdpa (or sdpa_backward) over packed [1, H, T, D] tensors with per-sequence offsets and lengths."""
    b, smax = len(lengths), max(lengths)
    g = og.Graph(name, io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    h: dict[str, Any] = {}
    for n, x in t.items():
        if n in ("off", "seq_len"):
            h[n] = g.tensor(dim=list(x.shape), data_type=DT.INT32, name=n)
        elif n == "stats":
            h[n] = g.tensor(dim=list(x.shape), stride=list(x.stride()), data_type=DT.FLOAT, name=n)
        else:
            h[n] = g.tensor(dim=list(x.shape), stride=list(x.stride()), name=n)
    kw: dict[str, Any] = {
        "attn_scale": scale,
        "use_causal_mask": True,
        "use_padding_mask": True,
        "seq_len_q": h["seq_len"],
        "seq_len_kv": h["seq_len"],
        "max_seq_len_q": smax,
        "max_seq_len_kv": smax,
    }
    roles = ("q", "k", "v", "o", "stats") + (("dO", "dQ", "dK", "dV") if backward else ())
    kw |= {f"{r}_ragged_offset": h["off"] for r in roles}
    dims = list(t["q"].shape)
    if not backward:
        o, stats = g.sdpa(h["q"], h["k"], h["v"], generate_stats=True, **kw)
        o.set_output(True).set_name("o").set_stride(packed_strides(dims, BSHD))
        stats.set_output(True).set_name("stats")
        outs = [o, stats]
    else:
        outs = list(g.sdpa_backward(h["q"], h["k"], h["v"], h["o"], h["dO"], h["stats"], **kw))
        for x, n in zip(outs, ("dq", "dk", "dv")):
            x.set_output(True).set_name(n).set_stride(packed_strides(dims, BSHD))
    g.validate()
    assert b == t["seq_len"].shape[0]
    return g, {h[n]: x for n, x in t.items()}, outs


def window_graph(name: str, t: dict[str, Any], window: int, scale: float, backward: bool) -> tuple:
    g = og.Graph(name, io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    h = {
        n: g.tensor(dim=list(x.shape), data_type=DT.FLOAT if n == "stats" else DT.BFLOAT16, name=n)
        for n, x in t.items()
    }
    kw = {"attn_scale": scale, "use_causal_mask": True, "sliding_window_length": window}
    if not backward:
        o, stats = g.sdpa(h["q"], h["k"], h["v"], generate_stats=True, **kw)
        o.set_output(True).set_name("o")
        stats.set_output(True).set_name("stats")
        outs = [o, stats]
    else:
        outs = list(g.sdpa_backward(h["q"], h["k"], h["v"], h["o"], h["dO"], h["stats"], **kw))
        for x, n in zip(outs, ("dq", "dk", "dv")):
            x.set_output(True).set_name(n)
    g.validate()
    return g, {h[n]: x for n, x in t.items()}, outs


# -- FlexAttention's block masks ----------------------------------------------------------------------------------
def document_mask(lengths: Sequence[int], device: Any) -> Callable[..., Any]:
    """Flex's mask_mod of packed causal sequences: a key of the query's own sequence, at or before it."""
    import torch

    doc = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))

    def mask_mod(b: Any, h: Any, qi: Any, ki: Any) -> Any:
        return (doc[qi] == doc[ki]) & (ki <= qi)

    return mask_mod


def window_mask(window: int) -> Callable[..., Any]:
    def mask_mod(b: Any, h: Any, qi: Any, ki: Any) -> Any:
        return (ki <= qi) & (qi - ki < window)

    return mask_mod


# -- the cuDNN frontend ---------------------------------------------------------------------------------------------
def fe_packed(lengths: Sequence[int], heads: int, d: int, scale: float, backward: bool) -> cudnn_fe.Build:
    """cuDNN's ragged SDPA: [B, H, Smax, D] tensors at the packed buffer's strides, ragged offsets in
    elements (`off` x H x D); the statistics dense [B, H, Smax, 1]."""
    import torch

    b, smax = len(lengths), max(lengths)
    dims, strides = [b, heads, smax, d], [smax * heads * d, d, heads * d, 1]

    def ragged(x: Any, off: Any) -> Any:
        return x.set_dim(dims).set_stride(strides).set_ragged_offset(off)

    def build(g: Any, t: Any) -> list:
        for n in ("q", "k", "v", "o", "dO"):
            if n in t:
                ragged(t[n], t["off_elems"])
        kw = {
            "attn_scale": scale,
            "use_causal_mask": True,
            "use_padding_mask": True,
            "seq_len_q": t["seq_len"],
            "seq_len_kv": t["seq_len"],
        }
        if not backward:
            o, stats = g.sdpa(t["q"], t["k"], t["v"], generate_stats=True, **kw)
            ragged(o, t["off_elems"])
            stats.set_dim([b, heads, smax, 1]).set_stride([heads * smax, smax, 1, 1])
            return [(o, torch.bfloat16), (stats, torch.float32)]
        grads = g.sdpa_backward(t["q"], t["k"], t["v"], t["o"], t["dO"], t["stats"], **kw)
        for x in grads:
            ragged(x, t["off_elems"])
        return [(x, torch.bfloat16) for x in grads]

    return build


def fe_packed_views(lengths: Sequence[int], heads: int, d: int, backward: bool) -> Callable[[list], list]:
    """The frontend's outputs as the Case's: each packed [B, H, Smax, D] buffer's first T tokens as the
    [1, H, T, D] view, the dense statistics gathered to the packed [1, H, T, 1]."""
    import torch

    total = sum(lengths)

    def views(outs: list) -> list:
        tokens = outs if backward else outs[:1]
        packed = [o.as_strided((1, heads, total, d), (total * heads * d, d, heads * d, 1)) for o in tokens]
        if backward:
            return packed
        stats = outs[1]
        rows = [stats[i, :, :n] for i, n in enumerate(lengths)]  # [H, n, 1] each
        return [packed[0], torch.cat(rows, dim=1).unsqueeze(0)]

    return views


def fe_window(window: int, scale: float, backward: bool) -> cudnn_fe.Build:
    import torch

    def band(g: Any, call: str, *args: Any, **kw: Any) -> Any:
        try:  # cuDNN 9.9+ / frontend 1.12+: the band; before, the window's own name
            return getattr(g, call)(*args, diagonal_band_left_bound=window, **kw)
        except TypeError:
            return getattr(g, call)(*args, sliding_window_length=window, **kw)

    def build(g: Any, t: Any) -> list:
        kw = {"attn_scale": scale, "use_causal_mask": True}
        if not backward:
            o, stats = band(g, "sdpa", t["q"], t["k"], t["v"], generate_stats=True, **kw)
            return [(o, torch.bfloat16), (stats, torch.float32)]
        grads = band(g, "sdpa_backward", t["q"], t["k"], t["v"], t["o"], t["dO"], t["stats"], **kw)
        return [(x, torch.bfloat16) for x in grads]

    return build


# -- workloads --------------------------------------------------------------------------------------------------
def packed_case(ctx: Ctx, backward: bool) -> Case:
    import torch

    lengths, heads, d = packed_shape(ctx)
    total, scale = sum(lengths), d**-0.5
    q, k, v = (ctx.randn(total, heads, d, dtype=torch.bfloat16) for _ in range(3))
    off = torch.tensor(offsets(lengths), dtype=torch.int32, device=ctx.device).view(-1, 1, 1, 1)
    seq_len = torch.tensor(lengths, dtype=torch.int32, device=ctx.device).view(-1, 1, 1, 1)
    do = ctx.randn(total, heads, d, dtype=torch.bfloat16) if backward else None
    full = packed64(q, k, v, lengths, scale, do)
    t = {"q": _as_bhsd(q), "k": _as_bhsd(k), "v": _as_bhsd(v), "off": off, "seq_len": seq_len}
    fe_t = {"q": t["q"], "k": t["k"], "v": t["v"], "off_elems": off * (heads * d), "seq_len": seq_len}
    args = (t["q"], t["k"], t["v"])
    mask = document_mask(lengths, ctx.device)
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    floor = _floor(pairs, heads, d, total * heads * d, backward, total * heads)
    name = f"sdpa_packed_{'bwd' if backward else 'fwd'}_t{total}"
    note = f"{len(lengths)} causal sequences of {min(lengths)}-{max(lengths)} tokens, {total} in all"
    if not backward:
        impls = graph_impls(ctx, lambda: packed_graph(name, t, lengths, scale, False))
        impls += flex(ctx, args, False, scale, mask_mod=mask, stats=True)
        build = fe_packed(lengths, heads, d, scale, False)
        impls += cudnn_fe.impls(ctx, fe_t, build, torch.bfloat16, views=fe_packed_views(lengths, heads, d, False))
        return Case(
            [Output("o", BF16), Output("stats", FP32)],
            lambda: [_as_bhsd(full["o"]), _as_bhsd(full["lse"])],
            impls,
            floor,
            notes=note + "; the training forward: O and the statistics (log-sum-exp)",
        )
    o, stats = _as_bhsd(full["o"].to(torch.bfloat16)), _as_bhsd(full["lse"].float())
    bt = {**t, "o": o, "dO": _as_bhsd(do), "stats": stats.contiguous()}
    dense_stats = torch.zeros(len(lengths), heads, max(lengths), 1, dtype=torch.float32, device=ctx.device)
    for i, (a, b) in enumerate(zip(offsets(lengths), offsets(lengths)[1:])):
        dense_stats[i, :, : b - a] = full["lse"][a:b].transpose(0, 1).float()
    fe_bt = {**fe_t, "o": o, "dO": bt["dO"], "stats": dense_stats}
    impls = graph_impls(ctx, lambda: packed_graph(name, bt, lengths, scale, True))
    impls += flex(ctx, args, False, scale, do=_as_bhsd(do), mask_mod=mask)
    build = fe_packed(lengths, heads, d, scale, True)
    impls += cudnn_fe.impls(ctx, fe_bt, build, torch.bfloat16, views=fe_packed_views(lengths, heads, d, True))
    return Case(
        [Output(n, BF16) for n in ("dq", "dk", "dv")],
        lambda: [_as_bhsd(full[n]) for n in ("dq", "dk", "dv")],
        impls,
        floor,
        notes=note + "; backward alone: opgraph and cuDNN read O and the statistics of the float64 "
        "forward (bf16 / fp32), Flex those of its own forward",
    )


def window_case(ctx: Ctx, backward: bool) -> Case:
    import torch

    heads, s, window, d = window_shape(ctx)
    scale = d**-0.5
    q, k, v = (ctx.randn(1, heads, s, d, dtype=torch.bfloat16) for _ in range(3))
    do = ctx.randn(1, heads, s, d, dtype=torch.bfloat16) if backward else None
    full = window64(q[0], k[0], v[0], window, scale, None if do is None else do[0])
    pairs = sum(min(i + 1, window) for i in range(s))
    floor = _floor(pairs, heads, d, heads * s * d, backward, heads * s)
    name = f"sdpa_window{window}_{'bwd' if backward else 'fwd'}_s{s}"
    note = f"a window of {window} keys ending at each query, causal, over {s} tokens"
    mask = window_mask(window)
    t = {"q": q, "k": k, "v": v}
    if not backward:
        impls = graph_impls(ctx, lambda: window_graph(name, t, window, scale, False))
        impls += flex(ctx, (q, k, v), False, scale, mask_mod=mask, stats=True)
        impls += cudnn_fe.impls(ctx, t, fe_window(window, scale, False), torch.bfloat16)
        return Case(
            [Output("o", BF16), Output("stats", FP32)],
            lambda: [full["o"][None], full["lse"][None]],
            impls,
            floor,
            notes=note + "; the training forward: O and the statistics",
        )
    bt = {**t, "o": full["o"][None].to(torch.bfloat16), "dO": do, "stats": full["lse"][None].float()}
    impls = graph_impls(ctx, lambda: window_graph(name, bt, window, scale, True))
    impls += flex(ctx, (q, k, v), False, scale, do=do, mask_mod=mask)
    impls += cudnn_fe.impls(ctx, bt, fe_window(window, scale, True), torch.bfloat16)
    return Case(
        [Output(n, BF16) for n in ("dq", "dk", "dv")],
        lambda: [full[n][None] for n in ("dq", "dk", "dv")],
        impls,
        floor,
        notes=note + "; backward alone (O and the statistics of the float64 forward for opgraph and cuDNN)",
    )


WORKLOADS = (  # name, make, id tag, minutes (forward, backward), title
    (
        "packed",
        packed_case,
        "t32k",
        (1.0, 1.5),
        "packed (THD) causal SDPA {}: 32 sequences of 128-4096 tokens, 32k in all, H16 D128 bf16",
    ),
    (
        "window",
        window_case,
        "w4k_s32k",
        (1.2, 2.0),
        "sliding-window causal SDPA {}: 4k of 32k tokens, B1 H16 D128 bf16",
    ),
)
for _backward in (False, True):
    _kind = "bwd" if _backward else "fwd"
    for _name, _make, _tag, _minutes, _title in WORKLOADS:
        workload(
            f"attention.{_name}_{_kind}.{_tag}",
            group="llm-attention",
            minutes=_minutes[_backward],
            title=_title.format(_kind),
        )(functools.partial(_make, backward=_backward))
