"""Attention workloads (issue 16): bf16 SDPA, B=4, H=16, D=128, S = 1k, 4k, 16k, forward and backward,
causal and not; a score modifier (tanh soft-capping + ALiBi from gen_index) with a causal mask; a
transformer block (attention + MLP) imported whole, forward and backward.

Peers: PyTorch SDPA with each backend it has ("torch eager (flash)", "(cudnn)", "(efficient)"; the
table's torch eager column is the best of them), FlexAttention compiled (the torch.compile column),
the cuDNN frontend's sdpa / sdpa_backward. opgraph: the default plan (heuristics, and tuned with
--autotune), plus one plan per engine ("opgraph (triton)", "opgraph (cudnn)", "opgraph (torch)": in
the log and results.json) for the generated-kernel-vs-cuDNN ratios. Checks: float64 at S=1k; beyond,
a float64 reference does not fit in memory and outputs are checked against PyTorch's flash backend
(fp32 accumulation). Floors: 4*B*H*S*S*D flops forward, 10*B*H*S*S*D backward (halved when causal)
at the dense fp16 rate."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import opgraph as og

from . import peers
from .common import DEV, out_like, run_opgraph
from .harness import Session, Workload, relerr

DT = og.DataType
B, H, D = 4, 16, 128
SEQS = (1024, 4096, 16384)


def _qkv(s: int, requires_grad: bool = False) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=DEV).manual_seed(s)
    out = [torch.randn(B, H, s, D, device=DEV, dtype=torch.bfloat16, generator=g) for _ in range(3)]
    return tuple(t.requires_grad_(requires_grad) for t in out)


def _reference(q, k, v, causal: bool, do: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """O (and dQ, dK, dV for `do`) in float64 at small S, else PyTorch's flash backend."""
    exact = q.shape[2] <= 1024
    args = [t.detach().double() if exact else t.detach() for t in (q, k, v)]
    args = [t.requires_grad_(do is not None) for t in args]
    if exact:
        o = F.scaled_dot_product_attention(*args, is_causal=causal)
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(*args, is_causal=causal)
    out = {"o": o.detach()}
    if do is not None:
        dq, dk, dv = torch.autograd.grad(o, args, do.to(o.dtype))
        out.update(dq=dq, dk=dk, dv=dv)
    return out


def _flops(s: int, causal: bool, backward: bool) -> float:
    f = 4 * B * H * s * s * D * (2.5 if backward else 1.0)
    return f / 2 if causal else f


def _engine_plans(s: Session, w: Workload, g: og.Graph, pack: dict, checks: dict) -> None:
    for engine in ("triton", "cudnn", "torch"):
        try:
            plan = g.build(device="cuda", engines=[engine])
        except Exception as e:  # noqa: BLE001 - declined: reported with the reason
            s.run(w, f"opgraph ({engine})", lambda e=e: (_ for _ in ()).throw(e))
            continue

        def check(plan=plan) -> float:
            plan.execute(pack)
            torch.cuda.synchronize()
            return max(relerr(pack[t], ref()) for t, ref in checks.items())

        s.run(w, f"opgraph ({engine})", lambda plan=plan: plan.execute(pack), check=check)


def _torch_backends(s: Session, w: Workload, fn: Callable[[], Any], check: Callable[[], float]) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def run(backend=backend):
            with sdpa_kernel(backend):
                return fn()

        def checked(backend=backend):
            with sdpa_kernel(backend):
                return check()

        s.run(w, f"torch eager ({name})", run, check=checked)


def _torch_backward_backends(s: Session, w: Workload, q, k, v, do, causal: bool, ref: dict) -> None:
    """The backward alone of each PyTorch SDPA backend: the forward runs once (untimed), its autograd
    graph is differentiated again at every call (retain_graph)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        except Exception as e:  # noqa: BLE001 - a backend that does not take the shape
            s.run(w, f"torch eager ({name})", lambda e=e: (_ for _ in ()).throw(e))
            continue

        def bwd(out=out):
            return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

        s.run(w, f"torch eager ({name})", bwd,
              check=lambda bwd=bwd: max(relerr(a, ref[n]) for a, n in zip(bwd(), ("dq", "dk", "dv"))))


def _flex(score_mod=None, causal: bool = False, s: int = 0):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention)
    mask = None
    if causal:
        mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, B=None, H=None, Q_LEN=s, KV_LEN=s, device=DEV)
    return lambda q, k, v: compiled(q, k, v, score_mod=score_mod, block_mask=mask)


# -- the cuDNN frontend's sdpa as a peer ------------------------------------------------------------------


def _cudnn_sdpa(g: Any, q, k, v, causal: bool, stats: bool):
    kw = {"attn_scale": 1 / math.sqrt(D), "use_causal_mask": causal}
    try:
        return g.sdpa(q=q, k=k, v=v, generate_stats=stats, **kw)
    except TypeError:
        return g.sdpa(q=q, k=k, v=v, is_inference=not stats, **kw)


def cudnn_forward(q, k, v, causal: bool):
    cudnn = peers.cudnn
    g = peers._graph()
    Q, K, V = g.tensor_like(q), g.tensor_like(k), g.tensor_like(v)
    o, st = _cudnn_sdpa(g, Q, K, V, causal, stats=True)
    o.set_output(True).set_dim(list(q.shape)).set_stride(list(q.stride())).set_data_type(cudnn.data_type.BFLOAT16)
    st.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    (out, stats), run = peers._finish(g, {Q: q, K: k, V: v}, [(o, torch.bfloat16), (st, torch.float32)])
    return out, stats, run


def cudnn_backward(q, k, v, o, do, stats, causal: bool):
    cudnn = peers.cudnn
    g = peers._graph()
    Q, K, V, O, dO, S = (g.tensor_like(t) for t in (q, k, v, o, do, stats))
    dq, dk, dv = g.sdpa_backward(q=Q, k=K, v=V, o=O, dO=dO, stats=S, attn_scale=1 / math.sqrt(D),
                                 use_causal_mask=causal)
    for t, like in ((dq, q), (dk, k), (dv, v)):
        t.set_output(True).set_dim(list(like.shape)).set_stride(list(like.stride()))
        t.set_data_type(cudnn.data_type.BFLOAT16)
    outs, run = peers._finish(g, {Q: q, K: k, V: v, O: o, dO: do, S: stats},
                              [(dq, torch.bfloat16), (dk, torch.bfloat16), (dv, torch.bfloat16)])
    return outs, run


# -- workloads --------------------------------------------------------------------------------------------


def _forward_graph(q, k, v, causal: bool, score_mod=None) -> tuple[og.Graph, Any, Any]:
    g = og.Graph("sdpa_fwd", io_data_type=DT.BFLOAT16)
    Q, K, V = (g.tensor_like(t, name=n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    o, _ = g.sdpa(Q, K, V, attn_scale=1 / math.sqrt(D), generate_stats=False, use_causal_mask=causal,
                  score_mod=score_mod)
    o.set_output(True).set_name("o")
    g.validate()
    return g, (Q, K, V), o


def sdpa_forward(s: Session, autotune: bool) -> None:
    for seq in SEQS:
        for causal in (False, True):
            _forward_case(s, autotune, seq, causal)


def _forward_case(s: Session, autotune: bool, seq: int, causal: bool) -> None:
    w = s.workload(f"sdpa fwd bf16 B{B} H{H} D{D} S{seq}{' causal' if causal else ''}", "attention",
                   flops=_flops(seq, causal, False), bytes=2 * 4 * B * H * seq * D)
    q, k, v = _qkv(seq)
    ref = _reference(q, k, v, causal)
    g, (Q, K, V), O = _forward_graph(q, k, v, causal)
    pack = {Q: q, K: k, V: v, O: out_like(O)}
    checks = {O: lambda: ref["o"]}
    run_opgraph(s, w, g, pack, checks, autotune=autotune)
    _engine_plans(s, w, g, pack, checks)
    f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    _torch_backends(s, w, f, lambda: relerr(f(), ref["o"]))
    try:
        flex = _flex(causal=causal, s=seq)
        s.run(w, "torch.compile (FlexAttention)", lambda: flex(q, k, v),
              check=lambda: relerr(flex(q, k, v), ref["o"]))
    except Exception as e:  # noqa: BLE001
        s.run(w, "torch.compile (FlexAttention)", lambda e=e: (_ for _ in ()).throw(e))
    if peers.available():
        holder: dict[str, Any] = {}

        def cfe():
            if "run" not in holder:
                holder["o"], _, holder["run"] = cudnn_forward(q, k, v, causal)
            holder["run"]()

        s.run(w, "cuDNN frontend", cfe, check=lambda: relerr(holder["o"], ref["o"]))


def sdpa_backward(s: Session, autotune: bool) -> None:
    for seq in SEQS:
        for causal in (False, True):
            _backward_case(s, autotune, seq, causal)


def _backward_case(s: Session, autotune: bool, seq: int, causal: bool) -> None:
    w = s.workload(f"sdpa bwd bf16 B{B} H{H} D{D} S{seq}{' causal' if causal else ''}", "attention",
                   flops=_flops(seq, causal, True), bytes=2 * 8 * B * H * seq * D)
    q, k, v = _qkv(seq, requires_grad=True)
    do = torch.randn_like(q).detach()
    ref = _reference(q, k, v, causal, do)
    # the forward's O and Stats, from opgraph's own forward (what a training step would save)
    g0 = og.Graph("sdpa_fwd_stats", io_data_type=DT.BFLOAT16)
    Q0, K0, V0 = (g0.tensor_like(t.detach(), name=n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    o0, st0 = g0.sdpa(Q0, K0, V0, attn_scale=1 / math.sqrt(D), use_causal_mask=causal)
    o0.set_output(True)
    st0.set_output(True)
    g0.validate()
    o, stats = out_like(o0), out_like(st0)
    g0.build(device="cuda").execute({Q0: q.detach(), K0: k.detach(), V0: v.detach(), o0: o, st0: stats})
    g = og.Graph("sdpa_bwd", io_data_type=DT.BFLOAT16)
    h = {n: g.tensor_like(t.detach(), name=n) for n, t in (("q", q), ("k", k), ("v", v), ("o", o),
                                                          ("dO", do), ("stats", stats))}
    grads = g.sdpa_backward(h["q"], h["k"], h["v"], h["o"], h["dO"], h["stats"], attn_scale=1 / math.sqrt(D),
                            use_causal_mask=causal)
    for t, n in zip(grads, ("dQ", "dK", "dV")):
        t.set_output(True).set_name(n)
    g.validate()
    pack = {h["q"]: q.detach(), h["k"]: k.detach(), h["v"]: v.detach(), h["o"]: o, h["dO"]: do,
            h["stats"]: stats, **{t: out_like(t) for t in grads}}
    checks = {t: (lambda n=n: ref[n]) for t, n in zip(grads, ("dq", "dk", "dv"))}
    run_opgraph(s, w, g, pack, checks, autotune=autotune)
    _engine_plans(s, w, g, pack, checks)

    _torch_backward_backends(s, w, q, k, v, do, causal, ref)
    try:
        flex = _flex(causal=causal, s=seq)
        out_f = flex(q, k, v)

        def flex_bwd():
            return torch.autograd.grad(out_f, (q, k, v), do, retain_graph=True)

        s.run(w, "torch.compile (FlexAttention)", flex_bwd,
              check=lambda: max(relerr(a, ref[n]) for a, n in zip(flex_bwd(), ("dq", "dk", "dv"))))
    except Exception as e:  # noqa: BLE001
        s.run(w, "torch.compile (FlexAttention)", lambda e=e: (_ for _ in ()).throw(e))
    if peers.available():
        holder: dict[str, Any] = {}

        def cfe():
            if "run" not in holder:
                o_c, st_c, _ = cudnn_forward(q.detach(), k.detach(), v.detach(), causal)
                holder["g"], holder["run"] = cudnn_backward(q.detach(), k.detach(), v.detach(), o_c, do,
                                                            st_c, causal)
            holder["run"]()

        s.run(w, "cuDNN frontend", cfe,
              check=lambda: max(relerr(a, ref[n]) for a, n in zip(holder["g"], ("dq", "dk", "dv"))))


SOFTCAP = 30.0


def score_mod_causal(s: Session, autotune: bool) -> None:
    """tanh soft-capping and ALiBi (slopes a [1, H, 1, 1] input, distance from gen_index) with a
    causal mask, forward; FlexAttention (compiled, same score_mod and a causal block mask) is the peer."""
    seq = 4096
    w = s.workload(f"sdpa fwd softcap+ALiBi causal bf16 B{B} H{H} D{D} S{seq}", "attention",
                   flops=_flops(seq, True, False), bytes=2 * 4 * B * H * seq * D)
    q, k, v = _qkv(seq)
    slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / H) for i in range(H)], device=DEV).view(1, H, 1, 1)
    scale = 1 / math.sqrt(D)

    def torch_mod(score, b, h, qi, ki):
        return SOFTCAP * torch.tanh(score / SOFTCAP) + slopes.view(-1)[h] * (ki - qi)

    def reference() -> torch.Tensor:
        out = torch.empty_like(q, dtype=torch.float32)
        for b in range(B):  # one batch at a time in float32 (float64 does not fit)
            s_ = (q[b].float() @ k[b].float().transpose(-1, -2)) * scale
            s_ = SOFTCAP * torch.tanh(s_ / SOFTCAP)
            idx = torch.arange(seq, device=DEV)
            s_ = s_ + slopes[0] * (idx[None, :] - idx[:, None])
            s_ = s_.masked_fill(idx[None, :] > idx[:, None], float("-inf"))
            out[b] = torch.softmax(s_, -1) @ v[b].float()
        return out

    ref = reference()
    g = og.Graph("sdpa_softcap_alibi", io_data_type=DT.BFLOAT16)
    S = g.tensor_like(slopes, name="slopes")

    def mod(sg, score):
        capped = sg.mul(sg.tanh(sg.div(score, SOFTCAP)), SOFTCAP)
        return sg.add(capped, sg.mul(sg.sub(sg.gen_index(score, axis=3), sg.gen_index(score, axis=2)), S))

    Q, K, V = (g.tensor_like(t, name=n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    o, _ = g.sdpa(Q, K, V, attn_scale=scale, generate_stats=False, use_causal_mask=True, score_mod=mod)
    o.set_output(True)
    g.validate()
    pack = {Q: q, K: k, V: v, S: slopes, o: out_like(o)}
    checks = {o: lambda: ref}
    run_opgraph(s, w, g, pack, checks, autotune=autotune)
    _engine_plans(s, w, g, pack, checks)
    try:
        flex = _flex(torch_mod, causal=True, s=seq)
        s.run(w, "torch.compile (FlexAttention)", lambda: flex(q, k, v), check=lambda: relerr(flex(q, k, v), ref))
    except Exception as e:  # noqa: BLE001
        s.run(w, "torch.compile (FlexAttention)", lambda e=e: (_ for _ in ()).throw(e))


def transformer_block(s: Session, autotune: bool) -> None:
    """nn.TransformerEncoderLayer (d_model 2048, 16 heads, MLP 8192, GELU, pre-norm) at batch 4 x 2048
    tokens, bf16, eval: imported whole with from_torch beside eager and torch.compile (forward);
    the same layer's forward + backward through opgraph.grad (combined graph) beside eager autograd."""
    from opgraph.autodiff import grad

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(2048, 16, 8192, dropout=0.0, activation="gelu", batch_first=True,
                                             norm_first=True).to(DEV, torch.bfloat16).eval()
    x = torch.randn(4, 2048, 2048, device=DEV, dtype=torch.bfloat16)
    tokens, d, f = 4 * 2048, 2048, 8192
    flops = 2 * tokens * (4 * d * d + 2 * d * f) + 4 * 4 * 16 * 2048 * 2048 * 128
    w = s.workload("transformer block fwd bf16 (d2048 h16 mlp8192, 4x2048 tokens)", "attention", flops=flops)
    with torch.no_grad():
        ref = layer.float()(x.float())
    layer = layer.to(torch.bfloat16)
    imported = og.from_torch(layer, (x,))
    plan = imported.plan("cuda")
    pack = imported.variant_pack(x)
    out = imported.outputs[0]

    def check() -> float:
        plan.execute(pack)
        torch.cuda.synchronize()
        return relerr(pack[out.uid], ref)

    s.run(w, "opgraph", lambda: plan.execute(pack), check=check, note=f"[{len(plan.steps)} steps]")
    with torch.no_grad():
        s.run(w, "torch eager", lambda: layer(x), check=lambda: relerr(layer(x), ref))
        try:
            compiled = torch.compile(layer)
            compiled(x)
            s.run(w, "torch.compile", lambda: compiled(x), check=lambda: relerr(compiled(x), ref))
        except Exception as e:  # noqa: BLE001
            s.run(w, "torch.compile", lambda e=e: (_ for _ in ()).throw(e))
    wb = s.workload("transformer block fwd+bwd bf16 (d2048 h16 mlp8192, 4x2048 tokens)", "attention", flops=3 * flops)
    res = grad(imported.graph, out, wrt=[imported.inputs[0]], combined=True)
    bplan = res.graph.build(device="cuda", autotune=autotune)
    bpack = imported.variant_pack(x)
    dy = torch.randn_like(x)
    bpack[res.grad_inputs[out.uid].uid] = dy
    for uid in res.graph.final.outputs:
        if uid not in bpack:
            bpack[uid] = torch.empty_strided(res.graph.final.tensors[uid].dim, res.graph.final.tensors[uid].stride,
                                             dtype=res.graph.final.tensors[uid].data_type.to_torch(), device=DEV)
    xr = x.float().clone().requires_grad_(True)
    (ref_dx,) = torch.autograd.grad(layer.float()(xr), (xr,), dy.float())
    layer = layer.to(torch.bfloat16)
    gx = res.grads[imported.inputs[0].uid]

    def bcheck() -> float:
        bplan.execute(bpack)
        torch.cuda.synchronize()
        return relerr(bpack[gx.uid], ref_dx)

    s.run(wb, "opgraph", lambda: bplan.execute(bpack), check=bcheck, note=f"[{len(bplan.steps)} steps]")
    xe = x.clone().requires_grad_(True)
    s.run(wb, "torch eager", lambda: torch.autograd.grad(layer(xe), (xe,), dy),
          check=lambda: relerr(torch.autograd.grad(layer(xe), (xe,), dy)[0], ref_dx))


WORKLOADS = {"sdpa_forward": sdpa_forward, "sdpa_backward": sdpa_backward, "score_mod": score_mod_causal,
             "transformer_block": transformer_block}
