"""Attention workloads (issue 16): scaled dot-product attention in bf16, B=4, H=16, D=128, S = 1k, 4k
and 16k, causal and not, forward (inference: O) and backward alone (dQ, dK, dV from q, k, v, O, dO and
Stats); tanh soft-capping + ALiBi from positions with a causal mask, forward and backward, S=4k. The
transformer block (one imported graph) is in `attention_block.py`, same group.

Implementations:
  opgraph's four builds of g.sdpa / g.sdpa_backward (bench.ours.graph_impls);
  torch sdpa (flash | cudnn | efficient)  F.scaled_dot_product_attention under
                      torch.nn.attention.sdpa_kernel(<backend>); the backward is the backend's own
                      backward op on the retained forward (its autograd node called directly);
  FlexAttention (torch.compile)  flex_attention compiled (max-autotune-no-cudagraphs: Inductor tunes
                      its kernel), causal as a block mask made at setup, the score modifier as its
                      score_mod; the backward through autograd on the retained compiled forward;
  cuDNN FE heuristic / tuned  the cuDNN frontend's sdpa / sdpa_backward (bench.peers.cudnn_fe).

The backward's inputs O and Stats, for opgraph and cuDNN (PyTorch and Flex keep their own forward's), are
the float64 forward rounded to bf16 and float32. References: float64 on the device, one (batch, head)
at a time (a [S, S] float64 score matrix is 2 GiB at 16k), gradients by autograd. Floors: 4*B*H*S*S*D
flops forward, 2.5x backward, halved with the causal mask, at the measured dense bf16 GEMM rate; bytes:
each input read and each output written once. A TFLOP/s table is printed beside the times.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import opgraph as og

from ..case import Case, Ctx, Impl, Output, Runner
from ..core.floors import Floor
from ..core.registry import workload
from ..ours import graph_impls
from ..peers import cudnn_fe
from ..peers.torch_peers import compiled, eager

DT = og.DataType
SEQS = (("s1k", 1024), ("s4k", 4096), ("s16k", 16384))
BACKENDS = (
    ("flash", "FLASH_ATTENTION", "FlashAttention-2 (PyTorch's flash backend)"),
    ("cudnn", "CUDNN_ATTENTION", "cuDNN SDPA (PyTorch's cudnn backend)"),
    ("efficient", "EFFICIENT_ATTENTION", "memory-efficient attention, CUTLASS (PyTorch's efficient backend)"),
)
FLEX = "FlexAttention (torch.compile)"
FLEX_ENGINE = "Inductor's flex_attention Triton template (autotuned)"
SOFTCAP = 30.0
BF16 = "bfloat16"


def shape(ctx: Ctx, s: int) -> tuple[int, int, int, int]:
    """(B, H, S, D): the issue's shape; --quick keeps B, H, D with S at most 2k; the dry run is tiny."""
    return ctx.pick((4, 16, s, 128), (4, 16, min(s, 2048), 128), (2, 2, 64, 16))


def flops(b: int, h: int, s: int, d: int, causal: bool, backward: bool) -> float:
    f = 4.0 * b * h * s * s * d * (2.5 if backward else 1.0)
    return f / 2 if causal else f


def alibi_slopes(h: int) -> list[float]:
    """ALiBi's slopes for h heads (h a power of two here): 2^(-8 (i+1) / h)."""
    return [2.0 ** (-8.0 * (i + 1) / h) for i in range(h)]


# -- the float64 reference -------------------------------------------------------------------------------
Mod64 = Callable[[Any, int, Any, Any], Any]  # (scores [S, S] float64, head, i [S, 1], j [1, S]) -> scores


def softcap_alibi64(slopes: Sequence[float]) -> Mod64:
    def mod(s: Any, h: int, i: Any, j: Any) -> Any:
        import torch

        return SOFTCAP * torch.tanh(s / SOFTCAP) + slopes[h] * (j - i)

    return mod


def attention64(
    q: Any, k: Any, v: Any, scale: float, causal: bool, mod: Mod64 | None = None, do: Any = None
) -> dict[str, Any]:
    """float64 attention, one (batch, head) at a time: {"o", "lse"} and, given dO, {"dq", "dk", "dv"}
    (autograd through the same float64 math)."""
    import torch

    b_, h_, s_q, _ = q.shape
    s_kv = k.shape[2]
    dev = q.device
    out = {
        "o": torch.empty(q.shape[:3] + v.shape[3:], dtype=torch.float64, device=dev),
        "lse": torch.empty(b_, h_, s_q, 1, dtype=torch.float64, device=dev),
    }
    if do is not None:
        out.update(
            {n: torch.empty(t.shape, dtype=torch.float64, device=dev) for n, t in (("dq", q), ("dk", k), ("dv", v))}
        )
    i = torch.arange(s_q, device=dev, dtype=torch.float64)[:, None]
    j = torch.arange(s_kv, device=dev, dtype=torch.float64)[None, :]
    masked = (j > i) if causal else None
    for b in range(b_):
        for h in range(h_):
            with torch.enable_grad():
                qb, kb, vb = (t[b, h].detach().double().requires_grad_(do is not None) for t in (q, k, v))
                s = (qb @ kb.transpose(0, 1)) * scale
                if mod is not None:
                    s = mod(s, h, i, j)
                if masked is not None:
                    s = s.masked_fill(masked, -math.inf)
                lse = torch.logsumexp(s, -1, keepdim=True)
                o = torch.exp(s - lse) @ vb
                if do is not None:
                    grads = torch.autograd.grad(o, (qb, kb, vb), do[b, h].double())
                    for n, g in zip(("dq", "dk", "dv"), grads):
                        out[n][b, h] = g
            out["o"][b, h] = o.detach()
            out["lse"][b, h] = lse.detach()
            del s, o, lse
    return out


# -- PyTorch's SDPA backends and FlexAttention --------------------------------------------------------------
def _leaf_slots(node: Any, leaves: Sequence[Any]) -> list[int] | None:
    """For each leaf, the index of the node's output gradient that is its gradient, when the node (a
    C++ autograd node) takes every leaf directly; else None."""
    import torch

    if node is None or isinstance(node, torch.autograd.function.BackwardCFunction):
        return None
    slots: list[int | None] = [None] * len(leaves)
    for idx, (fn, _) in enumerate(node.next_functions):
        var = getattr(fn, "variable", None)
        for n, leaf in enumerate(leaves):
            if var is leaf:
                slots[n] = idx
    return None if any(s is None for s in slots) else [int(s) for s in slots]


def grad_call(forward: Callable[..., Any], args: Sequence[Any], do: Any) -> tuple[Callable[[], Any], str, Any]:
    """(call, how, keep): each call returns the gradients of forward(*args) for dO, the forward run once
    here and its graph retained. Where the forward's last autograd node takes the inputs directly (each
    SDPA backend), the call is that node: the backend's backward op, on the caller's stream. Otherwise
    (FlexAttention's compiled backward) torch.autograd.grad on the retained graph; the forward then runs
    on a stream of its own, so that the backward, which autograd runs on the forward's stream, joins a
    CUDA-graph capture of the caller's stream by events instead of touching the legacy stream."""
    import torch

    leaves = [a.detach().requires_grad_() for a in args]
    cuda = leaves[0].is_cuda
    side = torch.cuda.Stream() if cuda else None
    if side is not None:
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext(), torch.enable_grad():
        out = forward(*leaves)
    if side is not None:
        torch.cuda.current_stream().wait_stream(side)
    node = out.grad_fn
    slots = _leaf_slots(node, leaves)
    if slots is not None:

        def direct() -> Any:
            grads = node(do)
            return tuple(grads[s] for s in slots)

        return direct, f"backward: {type(node).__name__} called directly", (out, leaves)

    def through_autograd() -> Any:
        return torch.autograd.grad(out, leaves, do, retain_graph=True)

    return through_autograd, "backward: torch.autograd.grad on the retained forward", (out, leaves)


def torch_sdpa(
    name: str, backend: str, engine: str, args: Sequence[Any], causal: bool, scale: float, do: Any = None
) -> Impl:
    """One PyTorch SDPA backend, forward (do None) or backward alone."""

    def fwd(q: Any, k: Any, v: Any) -> Any:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, backend)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    needs = () if name == "flash" else ("cuda",)  # the flash backend also runs on the CPU (the dry run)
    if do is None:
        return eager(fwd, args, name=f"torch sdpa ({name})", engine=engine, needs=needs)

    def setup() -> Runner:
        call, how, keep = grad_call(fwd, args, do)
        return Runner(call=call, engine=engine, notes=how, keep=keep)

    return Impl(f"torch sdpa ({name})", setup, role="peer", needs=frozenset(needs))


def torch_sdpa_all(args: Sequence[Any], causal: bool, scale: float, do: Any = None) -> list[Impl]:
    return [torch_sdpa(n, b, e, args, causal, scale, do) for n, b, e in BACKENDS]


def flex(
    ctx: Ctx,
    args: Sequence[Any],
    causal: bool,
    scale: float,
    score_mod: Any = None,
    do: Any = None,
    *,
    mask_mod: Any = None,
    stats: bool = False,
) -> list[Impl]:
    """FlexAttention compiled, forward or (do given) backward alone. Its own CUDA-graph mode
    (mode="max-autotune") is not a row: the suite's helper captures this one, and at these sizes
    (0.1-50 ms a call) host time is noise while a second autotuned compile costs minutes. `mask_mod`: a
    block mask of its own instead of the causal one; `stats`: the forward returns the log-sum-exp too
    ([B, H, S, 1], as opgraph's statistics)."""
    s = args[0].shape[2]
    holder: dict[str, Any] = {}
    if causal and mask_mod is None:
        mask_mod = lambda b, h, qi, ki: qi >= ki  # noqa: E731

    def f(q: Any, k: Any, v: Any) -> Any:
        from torch.nn.attention.flex_attention import flex_attention

        mask = holder.get("mask")
        if stats:
            try:  # (PyTorch 2.9+: return_lse deprecated)
                from torch.nn.attention.flex_attention import AuxRequest
            except ImportError:
                o, lse = flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale, return_lse=True)
                return o, lse.unsqueeze(-1)
            o, aux = flex_attention(
                q, k, v, score_mod=score_mod, block_mask=mask, scale=scale, return_aux=AuxRequest(lse=True)
            )
            return o, aux.lse.unsqueeze(-1)
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)

    def prepare_mask() -> None:
        if mask_mod is not None and "mask" not in holder:
            from torch.nn.attention.flex_attention import create_block_mask

            holder["mask"] = create_block_mask(mask_mod, None, None, s, s, device=args[0].device)

    if do is None:

        def prepare(fc: Callable[..., Any]) -> Callable[[], Any]:
            prepare_mask()
            return lambda: fc(*args)

        impls = compiled(f, args, inference=True, cudagraphs=False, prepare=prepare)
    else:

        def prepare(fc: Callable[..., Any]) -> Callable[[], Any]:
            prepare_mask()
            call, _, keep = grad_call(fc, args, do)
            holder["keep"] = keep
            return call

        impls = compiled(f, (), inference=False, cudagraphs=False, prepare=prepare)
    for i in impls:
        i.name = FLEX
        setup = i.setup

        def named(setup: Callable[[], Runner] = setup) -> Runner:
            r = setup()
            r.engine = FLEX_ENGINE
            r.notes = r.notes + "; block mask made at setup" if mask_mod is not None else r.notes
            return r

        i.setup = named
    return impls


# -- the cuDNN frontend --------------------------------------------------------------------------------------
def _packed(dims: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for d in reversed(dims):
        out.append(acc)
        acc *= d
    return out[::-1]


def fe_forward(dims: Sequence[int], causal: bool, scale: float) -> Callable[[Any, Any], list]:
    import torch

    def build(g: Any, t: Any) -> list:
        kw = {"attn_scale": scale, "use_causal_mask": causal}
        try:
            o, _ = g.sdpa(t["q"], t["k"], t["v"], generate_stats=False, **kw)
        except TypeError:  # frontends before generate_stats took is_inference
            o, _ = g.sdpa(t["q"], t["k"], t["v"], is_inference=True, **kw)
        o.set_dim(list(dims)).set_stride(_packed(dims))
        return [(o, torch.bfloat16)]

    return build


def fe_backward(dims: Sequence[int], causal: bool, scale: float) -> Callable[[Any, Any], list]:
    import torch

    def build(g: Any, t: Any) -> list:
        grads = g.sdpa_backward(
            t["q"], t["k"], t["v"], t["o"], t["dO"], t["stats"], attn_scale=scale, use_causal_mask=causal
        )
        for x in grads:
            x.set_dim(list(dims)).set_stride(_packed(dims))
        return [(x, torch.bfloat16) for x in grads]

    return build


# -- opgraph's graphs ----------------------------------------------------------------------------------------
ScoreMod = Callable[[Any, Any], Any]


def softcap_alibi(slopes: Any) -> ScoreMod:
    """The score modifier: 30 tanh(s / 30) + slope[h] (j - i), slopes a graph tensor [1, H, 1, 1]."""

    def mod(g: Any, s: Any) -> Any:
        capped = g.mul(g.tanh(g.div(s, SOFTCAP)), SOFTCAP)
        return g.add(capped, g.mul(g.sub(g.gen_index(s, axis=3), g.gen_index(s, axis=2)), slopes))

    return mod


def forward_graph(
    name: str, q: Any, k: Any, v: Any, causal: bool, scale: float, slopes: Any = None
) -> tuple[Any, dict, list]:
    g = og.Graph(name, io_data_type=DT.BFLOAT16)
    Q, K, V = (g.tensor_like(t, name=n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    inputs = {Q: q, K: k, V: v}
    mod = None
    if slopes is not None:
        S = g.tensor_like(slopes, name="slopes")
        inputs[S] = slopes
        mod = softcap_alibi(S)
    o, _ = g.sdpa(Q, K, V, attn_scale=scale, generate_stats=False, use_causal_mask=causal, score_mod=mod)
    o.set_output(True).set_name("o")
    g.validate()
    return g, inputs, [o]


def backward_graph(name: str, t: dict[str, Any], causal: bool, scale: float) -> tuple[Any, dict, list]:
    """sdpa_backward of q, k, v, o, dO, stats (and slopes: the score modifier) -> dQ, dK, dV."""
    g = og.Graph(name, io_data_type=DT.BFLOAT16)
    h = {n: g.tensor_like(x, name=n) for n, x in t.items()}
    mod = softcap_alibi(h["slopes"]) if "slopes" in h else None
    grads = g.sdpa_backward(
        h["q"], h["k"], h["v"], h["o"], h["dO"], h["stats"], attn_scale=scale, use_causal_mask=causal, score_mod=mod
    )
    for x, n in zip(grads, ("dq", "dk", "dv")):
        x.set_output(True).set_name(n)
    g.validate()
    return g, {h[n]: x for n, x in t.items()}, list(grads)


# -- workloads -----------------------------------------------------------------------------------------------
def _inputs(ctx: Ctx, s: int) -> tuple[tuple[int, int, int, int], list[Any]]:
    import torch

    dims = shape(ctx, s)
    return dims, [ctx.randn(*dims, dtype=torch.bfloat16) for _ in range(3)]


def _floor(dims: Sequence[int], causal: bool, backward: bool) -> Floor:
    b, h, s, d = dims
    elems = b * h * s * d
    moved = (8 * elems * 2 + b * h * s * 4) if backward else 4 * elems * 2
    return Floor(bytes=moved, flops=flops(b, h, s, d, causal, backward), dtype=BF16, tflops=True)


def sdpa_forward(ctx: Ctx, s: int, causal: bool) -> Case:
    dims, (q, k, v) = _inputs(ctx, s)
    scale = dims[3] ** -0.5
    ref = lambda: [attention64(q, k, v, scale, causal)["o"]]  # noqa: E731
    tag = f"sdpa_fwd_s{dims[2]}{'_causal' if causal else ''}"
    impls = graph_impls(ctx, lambda: forward_graph(tag, q, k, v, causal, scale))
    impls += torch_sdpa_all((q, k, v), causal, scale)
    impls += flex(ctx, (q, k, v), causal, scale)
    impls += cudnn_fe.impls(ctx, {"q": q, "k": k, "v": v}, fe_forward(dims, causal, scale), q.dtype)
    return Case(
        [Output("o", BF16)],
        ref,
        impls,
        _floor(dims, causal, False),
        notes="inference forward (O only; opgraph generate_stats=False, cuDNN is_inference)",
    )


def sdpa_backward(ctx: Ctx, s: int, causal: bool) -> Case:
    import torch

    dims, (q, k, v) = _inputs(ctx, s)
    do = ctx.randn(*dims, dtype=torch.bfloat16)
    scale = dims[3] ** -0.5
    full = attention64(q, k, v, scale, causal, do=do)
    o, stats = full["o"].to(torch.bfloat16), full["lse"].float()
    t = {"q": q, "k": k, "v": v, "o": o, "dO": do, "stats": stats}
    tag = f"sdpa_bwd_s{dims[2]}{'_causal' if causal else ''}"
    impls = graph_impls(ctx, lambda: backward_graph(tag, t, causal, scale))
    impls += torch_sdpa_all((q, k, v), causal, scale, do)
    impls += flex(ctx, (q, k, v), causal, scale, do=do)
    impls += cudnn_fe.impls(ctx, t, fe_backward(dims, causal, scale), q.dtype)
    outs = [Output(n, BF16) for n in ("dq", "dk", "dv")]
    return Case(
        outs,
        lambda: [full["dq"], full["dk"], full["dv"]],
        impls,
        _floor(dims, causal, True),
        notes="backward alone; opgraph and cuDNN read O and Stats of the float64 forward (rounded to "
        "bf16 / fp32), PyTorch's backends and Flex those of their own forward",
    )


def _flex_mod(slopes: Any) -> Callable[..., Any]:
    def score_mod(score: Any, b: Any, h: Any, qi: Any, ki: Any) -> Any:
        import torch

        return SOFTCAP * torch.tanh(score / SOFTCAP) + slopes[h] * (ki - qi)

    return score_mod


def softcap_alibi_case(ctx: Ctx, backward: bool) -> Case:
    """tanh soft-capping and ALiBi from positions with the causal mask, against FlexAttention with the
    same score_mod and a causal block mask. No cuDNN or SDPA-backend peer: neither expresses soft-capping
    (and cuDNN's score modifier does not combine with its built-in masks)."""
    import torch

    dims, (q, k, v) = _inputs(ctx, ctx.pick(4096, 2048, 64))
    b, h, s, d = dims
    scale = d**-0.5
    slope_list = alibi_slopes(h)
    slopes = torch.tensor(slope_list, device=ctx.device, dtype=torch.float32)
    mod64 = softcap_alibi64(slope_list)
    flex_mod = _flex_mod(slopes)
    slopes4 = slopes.view(1, h, 1, 1)
    if not backward:
        impls = graph_impls(ctx, lambda: forward_graph("sdpa_softcap_alibi_fwd", q, k, v, True, scale, slopes4))
        impls += flex(ctx, (q, k, v), True, scale, flex_mod)
        return Case(
            [Output("o", BF16)],
            lambda: [attention64(q, k, v, scale, True, mod64)["o"]],
            impls,
            _floor(dims, True, False),
            notes="inference forward (O only)",
        )
    do = ctx.randn(*dims, dtype=torch.bfloat16)
    full = attention64(q, k, v, scale, True, mod64, do=do)
    t = {
        "q": q,
        "k": k,
        "v": v,
        "o": full["o"].to(torch.bfloat16),
        "dO": do,
        "stats": full["lse"].float(),
        "slopes": slopes4,
    }
    impls = graph_impls(ctx, lambda: backward_graph("sdpa_softcap_alibi_bwd", t, True, scale))
    impls += flex(ctx, (q, k, v), True, scale, flex_mod, do=do)
    return Case(
        [Output(n, BF16) for n in ("dq", "dk", "dv")],
        lambda: [full["dq"], full["dk"], full["dv"]],
        impls,
        _floor(dims, True, True),
        notes="backward alone (score modifier's derivative fused)",
    )


_MINUTES = {"s1k": 0.5, "s4k": 0.7, "s16k": 1.6}  # backward; a forward ~0.6x


def _group(backward: bool, tag: str) -> str:
    """The attention family's groups are small enough to spread over GPUs (`--suite attention` selects all)."""
    return "attention-fwd" if not backward else "attention-bwd-16k" if tag == "s16k" else "attention-bwd"


for _backward, _make in ((False, sdpa_forward), (True, sdpa_backward)):
    for _tag, _s in SEQS:
        for _causal in (False, True):
            _kind = "bwd" if _backward else "fwd"
            workload(
                f"attention.sdpa_{_kind}.{_tag}{'_causal' if _causal else ''}",
                group=_group(_backward, _tag),
                quick=_tag == "s1k",
                minutes=_MINUTES[_tag] * (1.0 if _backward else 0.6),
                title=f"SDPA {_kind} B4 H16 S{_s} D128{' causal' if _causal else ''} bf16",
            )(functools.partial(_make, s=_s, causal=_causal))
workload(
    "attention.softcap_alibi_fwd.s4k",
    group="attention-mod",
    minutes=0.6,
    title="SDPA fwd tanh soft-cap 30 + ALiBi (gen_index) causal B4 H16 S4096 D128 bf16",
)(functools.partial(softcap_alibi_case, backward=False))
workload(
    "attention.softcap_alibi_bwd.s4k",
    group="attention-mod",
    minutes=0.8,
    title="SDPA bwd tanh soft-cap 30 + ALiBi (gen_index) causal B4 H16 S4096 D128 bf16",
)(functools.partial(softcap_alibi_case, backward=True))
