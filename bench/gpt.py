"""Training-step benchmark of issue 17: a GPT-2-small-sized decoder (12 layers, d=768, 12 heads, seq
1024, vocab 50304, tied embedding) at batch 8, bf16 mixed precision (fp32 master weights), AdamW,
cross-entropy; and ResNet-18 / MobileNetV2 (224², batch 64, channels-last) with AdamW and bf16.
Self-contained (its own model, timer and table): `python -m bench.gpt [WORKLOAD ...] [options]`.

Implementations, one training step each (forward, loss, backward, optimizer step), all starting from
the same weights and reading the same batch:

  graph vs graph   opgraph (CUDA graph)       opgraph.training.train_step, its plan captured (step.capture)
                   eager (CUDA graph)         autocast + backward + fused AdamW(capturable), captured
                                              (its warm-up steps undone: parameters, buffers, AdamW state)
                   compile max-autotune       torch.compile(model, mode="max-autotune") (CUDA graphs) +
                                              fused AdamW (its graphs are recorded by real steps: no warm-up)
  no graphs        opgraph                    the step's plan.execute (+ the running-stat write-back)
                   eager                      autocast + backward + fused AdamW
                   compile no-cudagraphs      torch.compile(mode="max-autotune-no-cudagraphs") + fused AdamW

Checked before timing, on the first step of each implementation (from the same initial weights and a
fresh optimizer: a warm-up or capture that steps is undone first), against eager fp32's step (no
autocast, no TF32, PyTorch's AdamW with the same hyper-parameters): the loss within 2% (bf16 rounding);
the optimizer's step count 1; and the first, middle and last weight matrices: within 2 lr of fp32's
updated weights elementwise (one AdamW step from a fresh state moves an element by less than lr
whatever its gradient, so this fails when the weights took more or other steps) and the update's
cosine with fp32's >= 0.95 (bf16 gradients flip the sign of AdamW's first update where a gradient is
near zero: a small GPT on the CPU flips ~0.2% of elements, a cosine ~0.996). An implementation failing
any of these is reported as FAILED CHECK, not timed, and the process exits 1 (as it does when an
implementation raises). Timed: the median of per-step CUDA-event times over --iters steps after
--warmup steps. Reported: ms per step, tokens (images) per second, model FLOP utilisation against the
device's dense bf16 peak (989 TFLOP/s for H100/H200 SXM; GPT FLOPs per token 6N + 12·L·d·T with N the
parameters less the position table, as nanoGPT counts; torchvision models 3x the forward FLOPs from
torch.utils.flop_counter), and opgraph's time over the best peer's in its group (target <= 0.8).

Attention is F.scaled_dot_product_attention (flash attention for the peers). from_torch translates it
to opgraph's sdpa op (opgraph/frontends/torch_ops_attention.py; opgraph.grad's sdpa_backward in the
step), so the GPT imports without custom ops (the opgraph rows' note counts them: "0 custom op(s)");
--attention explicit writes attention as matmul / mask / softmax instead (translated op by op).
Splits for 10-minute sessions: --modes picks implementations, WORKLOAD picks rows.

    python -m bench.gpt gpt2 --modes opgraph,opgraph-graph,eager,eager-graph
    python -m bench.gpt gpt2 --modes compile,compile-graph
    python -m bench.gpt resnet18 mobilenet_v2
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import opgraph as og

from .ours import engines_of

PEAK_BF16 = 989.4e12  # dense bf16 tensor-core peak of an H100 / H200 SXM (datasheet)
MODES = {
    "opgraph-graph": "opgraph (CUDA graph)",
    "eager-graph": "eager (CUDA graph)",
    "compile-graph": "compile max-autotune",
    "opgraph": "opgraph",
    "eager": "eager",
    "compile": "compile no-cudagraphs",
}
GROUPS = {"graph": ["opgraph-graph", "eager-graph", "compile-graph"], "plain": ["opgraph", "eager", "compile"]}


# -- the model ------------------------------------------------------------------------------------------------


@dataclass
class GPTConfig:
    vocab: int = 50304
    seq: int = 1024
    layers: int = 12
    heads: int = 12
    d: int = 768
    attention: str = "sdpa"  # or "explicit"


class CausalSelfAttention(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.heads, self.attention = c.heads, c.attention
        self.qkv = nn.Linear(c.d, 3 * c.d)
        self.proj = nn.Linear(c.d, c.d)
        if c.attention == "explicit":
            self.register_buffer("causal", torch.tril(torch.ones(c.seq, c.seq, dtype=torch.bool)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
            y = F.softmax(att.masked_fill(~self.causal[:t, :t], float("-inf")), dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(c.d), nn.LayerNorm(c.d)
        self.attn = CausalSelfAttention(c)
        self.fc, self.fc_proj = nn.Linear(c.d, 4 * c.d), nn.Linear(4 * c.d, c.d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2 (nanoGPT's layout): token + learned position embeddings, pre-LayerNorm blocks, the output
    projection tied to the token embedding."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.config = c
        self.wte, self.wpe = nn.Embedding(c.vocab, c.d), nn.Embedding(c.seq, c.d)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.d)
        self.lm_head = nn.Linear(c.d, c.vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c.layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def flops_per_token(self) -> float:
        c = self.config
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        return 6 * n + 12 * c.layers * c.d * c.seq


# -- workloads ------------------------------------------------------------------------------------------------


@dataclass
class Workload:
    name: str
    model: nn.Module  # fp32, on the GPU, train mode: every implementation trains a copy
    x: torch.Tensor
    y: torch.Tensor
    items: int  # tokens or images per step
    unit: str
    flops: float  # per step
    results: dict[str, dict[str, Any]] = field(default_factory=dict)


def gpt2(args: argparse.Namespace) -> Workload:
    c = GPTConfig(seq=args.seq, attention=args.attention, layers=args.layers)
    torch.manual_seed(0)
    model = GPT(c).cuda().train()
    x = torch.randint(0, c.vocab, (args.batch, c.seq), device="cuda")
    y = torch.randint(0, c.vocab, (args.batch, c.seq), device="cuda")
    tokens = args.batch * c.seq
    return Workload(
        f"GPT-2 small ({c.layers}L d{c.d} seq {c.seq} batch {args.batch}, {c.attention})",
        model,
        x,
        y,
        tokens,
        "tokens/s",
        model.flops_per_token() * tokens,
    )


def vision(name: str, batch: int) -> Workload:
    try:
        import torchvision.models as tvm

        make = getattr(tvm, name)
    except ImportError:  # the replicas the tests use
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from tests.frontends.tv_models import build

        def make(weights: Any = None, name: str = name) -> nn.Module:
            return build(name)

    torch.manual_seed(0)
    model = make(weights=None).cuda().to(memory_format=torch.channels_last).train()
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0  # every implementation computes the same loss
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device="cuda")
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        copy.deepcopy(model)(x)
    return Workload(
        f"{name} (224², batch {batch}, channels-last)",
        model,
        x,
        y,
        batch,
        "images/s",
        3 * float(counter.get_total_flops()),
    )


WORKLOADS: dict[str, Callable[[argparse.Namespace], Workload]] = {
    "gpt2": gpt2,
    "resnet18": lambda a: vision("resnet18", a.vision_batch),
    "mobilenet_v2": lambda a: vision("mobilenet_v2", a.vision_batch),
}


# -- implementations --------------------------------------------------------------------------------------------


@dataclass
class Impl:
    step: Callable[[], Any]  # one training step; returns the loss
    note: str
    model: nn.Module  # the module whose parameters the step trains in place
    step_count: Callable[[], float | None]  # the optimizer's step counter (after the first step: 1)
    after_timing: Callable[[], Any] | None = None  # what may change the weights (--steps-profile)


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))


def torch_step(
    model: nn.Module, w: Workload, lr: float, *, capturable: bool = False
) -> tuple[Callable[[], torch.Tensor], torch.optim.Optimizer]:
    """Eager PyTorch's step (autocast bf16 on the batch's device, fused AdamW) and its optimizer."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True, capturable=capturable)

    def step() -> torch.Tensor:
        with torch.autocast(w.x.device.type, dtype=torch.bfloat16):
            out = model(w.x)
        loss = _loss(out, w.y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=not capturable)
        return loss

    return step, opt


def _adam_steps(opt: torch.optim.Optimizer) -> float:
    counts = [float(s["step"]) for s in opt.state.values() if "step" in s]
    return max(counts) if counts else 0.0


Saved = list[tuple[torch.Tensor, torch.Tensor]]


def torch_state(model: nn.Module, opt: torch.optim.Optimizer) -> Saved:
    """Copies of what a step changes: parameters, buffers (batchnorm statistics) and the optimizer
    state that exists (AdamW makes its own at the first step)."""
    keep = [*model.parameters(), *model.buffers()]
    keep += [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return [(t, t.detach().clone()) for t in keep]


def restore_torch_state(saved: Saved, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """Puts back what `torch_state` copied, in place (a captured graph keeps the addresses); optimizer
    state made since goes back to AdamW's fresh state (zero moments, step 0); gradients to zero (what
    the next backward accumulates into, as into none)."""
    if not isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
        raise TypeError(f"a fresh {type(opt).__name__} state is not known to be zeros")
    known = {id(t) for t, _ in saved}
    with torch.no_grad():
        for t, c in saved:
            t.copy_(c)
        for s in opt.state.values():
            for t in s.values():
                if isinstance(t, torch.Tensor) and id(t) not in known:
                    t.zero_()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.zero_()


def captured(
    fn: Callable[[], torch.Tensor], model: nn.Module, opt: torch.optim.Optimizer
) -> Callable[[], torch.Tensor]:
    """fn recorded in a CUDA graph after a warm-up on a side stream whose steps are undone (as
    opgraph's step.capture does), so the first replay is the first step; returns the replaying callable."""
    saved = torch_state(model, opt)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    restore_torch_state(saved, model, opt)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # records only: nothing runs until a replay
        out = fn()

    def replay() -> torch.Tensor:
        graph.replay()
        return out

    return replay


def make(mode: str, w: Workload, lr: float, args: argparse.Namespace) -> Impl:
    """One step of `mode` on a fresh copy of the workload's model."""
    model = copy.deepcopy(w.model)
    if mode in ("eager", "eager-graph"):
        step, opt = torch_step(model, w, lr, capturable=mode == "eager-graph")
        if mode == "eager-graph":
            step = captured(step, model, opt)
        return Impl(step, "fused AdamW", model, lambda: _adam_steps(opt))
    if mode in ("compile", "compile-graph"):
        cmode = "max-autotune" if mode == "compile-graph" else "max-autotune-no-cudagraphs"
        compiled = torch.compile(model, mode=cmode)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)

        # CUDA graph trees record the compiled forward / backward during these calls, each a real step
        # (the optimizer runs outside them): the first call is the checked first step, nothing to undo
        def step() -> torch.Tensor:
            if mode == "compile-graph":
                torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = compiled(w.x)
            loss = _loss(out, w.y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        return Impl(step, cmode, model, lambda: _adam_steps(opt))
    # opgraph
    t0 = time.perf_counter()
    imported = og.from_torch(model, (w.x,))
    ts = og.training.train_step(
        imported, "cross_entropy", og.training.AdamW(lr), mixed_precision="bf16", grad_clip_norm=args.clip
    )
    t1 = time.perf_counter()
    ts.build("cuda", autotune=args.autotune)
    pack = ts.pack(w.x, target=w.y)
    t2 = time.perf_counter()
    note = (
        f"import+graph {t1 - t0:.1f}s, build {t2 - t1:.1f}s, {len(ts.graph.final.nodes)} ops, "
        f"{engines_of(ts.plan)}; {len(imported.report.custom_ops)} custom op(s)"
        + "".join(f"; {why}" for why in attention_off_cudnn(ts.plan))
    )
    plan, loss_uid = ts.plan, ts.loss_uid

    def profile() -> list[dict[str, Any]]:  # the plan's kernels on the step's own buffers: after the timing
        rows = plan.profile_steps(pack)
        by: dict[str, float] = {}
        for r in rows:
            key = r.engine + (":" + r.template if r.template else "")
            by[key] = by.get(key, 0.0) + r.device_us
        print(
            "   device time per engine/template (us): "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])),
            flush=True,
        )
        for r in sorted(rows, key=lambda r: -r.device_us)[:15]:
            print(f"      {r}", flush=True)
        return steps_profile(plan, rows)

    hook = profile if args.steps_profile else None
    if mode == "opgraph-graph":
        replay = ts.capture(w.x, target=w.y)  # its warm-up step undone (step.capture)
        return Impl(replay.replay, note, imported.module, lambda: ts.step_count, hook)

    def step() -> torch.Tensor:
        plan.execute(pack)
        imported.write_back(pack)
        return pack[loss_uid]

    return Impl(step, note, imported.module, lambda: ts.step_count, hook)


def attention_off_cudnn(plan: Any) -> list[str]:
    """Why the attention steps that did not run on cuDNN did not: the cudnn engine's verdict on each
    such piece (its static check, then cuDNN's own support check), once per distinct reason."""
    from opgraph.engines import get_engine

    reasons: dict[str, int] = {}
    for st in plan.steps:
        kinds = {n.kind for n in st.piece.nodes}
        if st.config.engine == "cudnn" or not kinds & {"sdpa", "sdpa_backward"}:
            continue
        try:
            verdict = get_engine("cudnn").supports(st.piece, plan.device)
            why = "supported (another engine was ranked or timed first)" if verdict.ok else verdict.reason
        except Exception as e:  # a diagnostic: never the run's failure
            why = f"{type(e).__name__}: {e}"
        key = f"{'sdpa_backward' if 'sdpa_backward' in kinds else 'sdpa'} on {st.config.engine}, cudnn: {why[:300]}"
        reasons[key] = reasons.get(key, 0) + 1
    return [f"{n} x {k}" for k, n in reasons.items()]


def steps_profile(plan: Any, rows: list[Any]) -> list[dict[str, Any]]:
    """profile_steps' rows with each step's ops and config, for the JSON."""
    return [
        {
            "step": r.step,
            "kernel": f"{r.engine}:{r.template}",
            "device_us": round(r.device_us, 1),
            "ops": [n.kind for n in plan.steps[r.step].piece.nodes],
            "config": str(plan.steps[r.step].config),
        }
        for r in rows
    ]


# -- the check of the first step ------------------------------------------------------------------------------

LOSS_RTOL = 2e-2  # bf16 rounding of the logits' path
MIN_COSINE = 0.95  # of a weight's first update with fp32's (bf16 gradients flip a few near-zero signs)
PEER_FACTOR = 3.0  # or 3x eager bf16's own distance (1 - cosine) from fp32's update, where that is larger


@dataclass
class Reference:
    """Eager fp32's first step on the workload: its loss, and the checked weights before and after."""

    loss: float
    lr: float
    before: dict[str, torch.Tensor]
    after: dict[str, torch.Tensor]
    peer_cosine: dict[str, float]  # eager bf16's first update against fp32's, per checked weight

    def min_cosine(self, name: str) -> float:
        """One rule for every implementation: 0.95, or 3x eager bf16's own distance from fp32 where the
        weight's first update is noise-dominated in bf16 (AdamW's first step is lr * sign(g): a first
        conv under batchnorm flips 13% of its signs in eager bf16, cosine 0.73); never below 0: the
        update may not point away from fp32's."""
        return max(0.0, min(MIN_COSINE, 1.0 - PEER_FACTOR * (1.0 - self.peer_cosine[name])))


def update_cosine(p0: torch.Tensor, p: torch.Tensor, want: torch.Tensor) -> float:
    ours, theirs = (p.float() - p0).flatten().double(), (want - p0).flatten().double()
    return float(ours @ theirs / (ours.norm() * theirs.norm()).clamp_min(1e-300))


def checked_weights(model: nn.Module) -> list[str]:
    """The first, middle and last weight matrices (or convolution kernels): those AdamW moves by about lr
    per element, so that a step too many or a wrong gradient shows."""
    names = [n for n, p in model.named_parameters() if p.dim() >= 2]
    return list(dict.fromkeys([names[0], names[len(names) // 2], names[-1]]))


def reference(w: Workload, lr: float) -> Reference:
    """One step of a copy of the workload's model in fp32 (no autocast, no TF32) with PyTorch's AdamW
    at the hyper-parameters every implementation uses (lr; betas, eps, weight decay as defaulted)."""
    names = checked_weights(w.model)
    m = copy.deepcopy(w.model)
    params = dict(m.named_parameters())
    before = {n: params[n].detach().clone() for n in names}
    opt = torch.optim.AdamW(m.parameters(), lr=lr)
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        loss = _loss(m(w.x), w.y)
        loss.backward()
        opt.step()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    after = {n: params[n].detach().clone() for n in names}
    loss_value = float(loss.detach())
    del m, opt, params, loss
    peer = copy.deepcopy(w.model)
    torch_step(peer, w, lr)[0]()  # eager bf16's first step: how far bf16 itself lands from fp32
    theirs = dict(peer.named_parameters())
    cos = {n: update_cosine(before[n], theirs[n].detach(), after[n]) for n in names}
    return Reference(loss_value, lr, before, after, cos)


def check(ref: Reference, impl: Impl, loss: float) -> tuple[float, list[str]]:
    """After an implementation's first step (its loss `loss`): the loss's relative error and what
    differs from eager fp32's first step beyond bf16 rounding (empty: passed)."""
    err = abs(loss - ref.loss) / abs(ref.loss)
    problems = []
    if not err <= LOSS_RTOL:
        problems.append(f"first-step loss {loss:.5f} vs fp32 eager {ref.loss:.5f} ({err:.2%} > {LOSS_RTOL:.0%})")
    count = impl.step_count()
    if count is not None and count != 1:
        problems.append(f"optimizer step count {count:g} after the first step (the warm-up stepped?)")
    params = dict(impl.model.named_parameters())
    for name, want in ref.after.items():
        p0, p = ref.before[name], params[name].detach().float()
        # one AdamW step from a fresh state moves each element by lr |g| / (|g| + eps) < lr (plus
        # lr wd |p|, the same in both): two first steps differ by less than 2 lr, whatever their gradients
        bound = 2.02 * ref.lr + 1e-6 * (1.0 + float(p0.abs().max()))
        diff = float((p - want).abs().max())
        if not diff <= bound:
            problems.append(
                f"{name}: max |p - p_fp32| {diff:.3g} > {bound:.3g} (2 lr): not one step from the initial weights"
            )
        cos = update_cosine(p0, p, want)
        if not cos >= ref.min_cosine(name):
            problems.append(f"{name}: the update's cosine with fp32 eager's {cos:.4f} < {ref.min_cosine(name):.4f}")
    return err, problems


def time_steps(fn: Callable[[], Any], warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def run(w: Workload, modes: list[str], args: argparse.Namespace, checkpoint: Callable[[], None]) -> None:
    """Every implementation of `modes` on `w`, checked then timed; `checkpoint` after each (the rows so
    far are written: a run stopped by a time limit keeps what it measured)."""
    print(f"== {w.name}: {w.flops / 1e12:.2f} TFLOP per step", flush=True)
    ref = reference(w, args.lr)
    print(
        f"   eager fp32 first step: loss {ref.loss:.4f}; checked weights (eager bf16's update cosine with "
        f"fp32's -> the bound): {', '.join(f'{n} ({c:.4f} -> {ref.min_cosine(n):.4f})' for n, c in ref.peer_cosine.items())}",
        flush=True,
    )
    for mode in modes:
        label = MODES[mode]
        impl = None
        try:
            t0 = time.perf_counter()
            impl = make(mode, w, args.lr, args)
            first = float(impl.step().detach())  # compiles; graph modes captured already, their warm-up undone
            err, problems = check(ref, impl, first)
            r: dict[str, Any] = {"loss": first, "loss_err": err, "note": impl.note}
            if problems:
                r["check"] = problems
                print(f"   {label:24s} FAILED CHECK (not timed): {'; '.join(problems)}", flush=True)
            else:
                ms = time_steps(impl.step, args.warmup, args.iters)
                r.update(
                    ms=ms,
                    rate=w.items / ms * 1e3,
                    mfu=w.flops / (ms * 1e-3) / PEAK_BF16,
                    setup_s=time.perf_counter() - t0,
                )
                print(
                    f"   {label:24s} {ms:9.2f} ms  {r['rate']:12.0f} {w.unit}  MFU {r['mfu']:6.1%}  "
                    f"loss {first:.4f} ({err:.2%})  [{impl.note}]",
                    flush=True,
                )
                if impl.after_timing is not None:
                    try:  # a failing profile does not undo the timing
                        r["steps_profile"] = impl.after_timing()
                    except Exception as e:  # noqa: BLE001
                        r["steps_profile_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                        traceback.print_exc()
        except Exception as e:  # noqa: BLE001 - one implementation failing does not stop the others
            r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"   {label:24s} FAILED: {r['error']}", flush=True)
            traceback.print_exc()
        w.results[label] = r
        checkpoint()
        del impl
        torch.cuda.empty_cache()


def failures(workloads: list[Workload]) -> list[str]:
    """The rows that failed their check or raised (the process exits 1 when there are any)."""
    return [
        f"{w.name} / {label}: " + ("; ".join(r["check"]) if "check" in r else r.get("error", "no time"))
        for w in workloads
        for label, r in w.results.items()
        if "ms" not in r
    ]


def table(workloads: list[Workload], meta: dict[str, Any]) -> str:
    lines = [
        f"Training steps, {meta['date']}, {meta['device']} (driver {meta.get('driver')}, CPU {meta.get('cpu')}; "
        f"torch {meta['torch']}, Triton {meta.get('triton')}, cuDNN {meta.get('cudnn')}, opgraph "
        f"{meta.get('opgraph_commit')}); {meta.get('settings')}; "
        "ms per step (median), rate, MFU vs 989 TFLOP/s bf16; ratio = opgraph / best peer of its group",
        "",
        "| workload | implementation | ms / step | rate | MFU | opgraph / best peer |",
        "|---|---|---|---|---|---|",
    ]
    for w in workloads:
        for members in GROUPS.values():
            labels = [MODES[m] for m in members]
            ours = w.results.get(labels[0], {})
            peers = [w.results.get(lb, {}).get("ms") for lb in labels[1:]]
            peers = [p for p in peers if p is not None]
            ratio = f"{ours['ms'] / min(peers):.2f}" if "ms" in ours and peers else "—"
            for lb in labels:
                r = w.results.get(lb)
                if r is None:
                    continue
                if "ms" in r:
                    lines.append(
                        f"| {w.name} | {lb} | {r['ms']:.2f} | {r['rate']:,.0f} {w.unit} | {r['mfu']:.1%} | "
                        f"{ratio if lb == labels[0] else ''} |"
                    )
                elif "check" in r:
                    lines.append(f"| {w.name} | {lb} | FAILED CHECK: {r['check'][0][:80]} | | | |")
                else:
                    lines.append(f"| {w.name} | {lb} | failed: {r['error'][:80]} | | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("which", nargs="*", default=["gpt2", "resnet18", "mobilenet_v2"], help=f"of {list(WORKLOADS)}")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {list(MODES)}")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vision-batch", type=int, default=64)
    ap.add_argument("--attention", default="sdpa", choices=["sdpa", "explicit"])
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--clip", type=float, default=None, help="global gradient-norm clipping in every implementation")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--autotune", action="store_true", help="build opgraph's plan with autotune=True")
    ap.add_argument("--steps-profile", action="store_true", help="print opgraph's device time per kernel kind")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args(argv)
    if args.clip is not None:
        print("note: --clip applies to opgraph only; the peers' steps do not clip", flush=True)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES] + [w for w in args.which if w not in WORKLOADS]
    if unknown:
        print(f"unknown: {unknown}; modes {list(MODES)}, workloads {list(WORKLOADS)}", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    from .env import meta as run_meta

    meta = {
        **run_meta("cuda"),
        "settings": "TF32 on for every implementation's fp32 matmuls and convs; "
        "torch.backends.cudnn.benchmark=True; "
        + ("opgraph autotuned" if args.autotune else "opgraph's heuristic configs (no autotuning)"),
    }
    print(meta, flush=True)
    done: list[Workload] = []
    stem = os.path.join(args.out, f"gpt-bench-{'-'.join(args.which)}-{'-'.join(modes)}")
    os.makedirs(args.out, exist_ok=True)

    def write(workloads: list[Workload]) -> str:  # each file replaced whole: a kill mid-write keeps the last
        text = table(workloads, meta)
        doc = json.dumps(
            {"meta": meta, "args": vars(args), "results": {w.name: w.results for w in workloads}}, indent=1
        )
        for path, content in ((stem + ".md", text + "\n"), (stem + ".json", doc)):
            with open(path + ".tmp", "w") as f:
                f.write(content)
            os.replace(path + ".tmp", path)
        return text

    for name in args.which:
        w = WORKLOADS[name](args)
        run(w, modes, args, lambda w=w: write([*done, w]))
        done.append(w)
        del w.model
        torch.cuda.empty_cache()
    print(write(done))
    print(f"wrote {stem}.md and .json")
    bad = failures(done)
    for line in bad:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
