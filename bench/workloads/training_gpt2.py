"""GPT-2 small's training step (issue 17; the model of bench/gpt.py: 12 layers, d 768, 12 heads, seq
1024, vocab 50304, tied embedding, causal F.scaled_dot_product_attention) at batch 8: bf16 mixed
precision (fp32 master weights and AdamW state), cross-entropy, AdamW(lr 1e-2, betas (0.9, 0.95),
eps 1, weight decay 0.1). opgraph.training.train_step against eager PyTorch (autocast + fused AdamW,
capturable so that the suite's helper can capture it) and torch.compile of the model (+ the same fused
AdamW), each on its own copy of the same initial weights, reading the same batch.

Checked before timing: one step from the initial state (parameters restored, AdamW state and step
count zeroed) against the float64 step of the same module (no autocast): the loss, every parameter's
gradient (AdamW's first moment after one step from zero is (1 - beta1) x the gradient) and every
updated parameter; fp32 outputs, judged by the tolerance rule alone (sane_limit off, as for the other
training steps). eps is 1, not 1e-8: AdamW's first step moves each parameter by lr g / (|g| + eps), which
with a tiny eps is lr sign(g), discontinuous where a gradient element is within rounding of zero (one
flipped sign and an implementation fails or passes by luck); with eps >> |g| the update is lr g,
continuous, and checkable. The values do not change a kernel, so timing (which keeps stepping) keeps
them. Floor: 6N + 12 L d T flops per token (nanoGPT's count, N
without the position table) at the measured bf16 GEMM rate; the TFLOP/s table is the step's model FLOP
rate. `python -m bench.gpt` keeps its own ResNet-18 / MobileNetV2 AdamW rows and modes."""

from __future__ import annotations

import copy
from typing import Any

from ..case import Case, Ctx, Impl, Output, Runner
from ..core.floors import Floor
from ..core.registry import workload
from ..ours import VARIANTS, diagnose, engines_of, step_profile
from ..ours import build as og_build
from ..peers.torch_peers import INDUCTOR_ENGINE, OPGRAPH_BACKEND_ENGINE, register_opgraph_backend

LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1.0, 0.1  # eps 1: a continuous first update (module docstring)


def _setup(ctx: Ctx) -> dict[str, Any]:
    import torch

    from ..gpt import GPT, GPTConfig

    batch, seq, layers, d, heads, vocab = ctx.pick(
        (8, 1024, 12, 768, 12, 50304), (4, 512, 12, 768, 12, 50304), (2, 32, 2, 32, 2, 128)
    )
    c = GPTConfig(vocab=vocab, seq=seq, layers=layers, heads=heads, d=d)
    torch.manual_seed(0)
    model = GPT(c).to(ctx.device).train()
    x = torch.randint(0, vocab, (batch, seq), device=ctx.device)
    y = torch.randint(0, vocab, (batch, seq), device=ctx.device)
    return {"model": model, "x": x, "y": y, "c": c, "tokens": batch * seq, "label": "GPT-2 training step"}


def _loss(logits: Any, y: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def _reference(model: Any, x: Any, y: Any, pnames: list[str]) -> list[Any]:
    """The float64 step: [loss, gradients..., updated parameters...]."""
    import torch

    m = copy.deepcopy(model).double()
    params = dict(m.named_parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    x = x.double() if x.is_floating_point() else x  # (an image batch: the float64 model's input type)
    with torch.enable_grad():
        loss = _loss(m(x), y)
        loss.backward()
    grads = [params[n].grad.detach().clone() for n in pnames]
    opt.step()
    return [loss.detach().reshape(1)] + grads + [params[n].detach().clone() for n in pnames]


class _AdamState:
    """A module's parameters and AdamW state: `reset` restores the initial parameters, zeroes the
    moments and the step count and poisons the loss; `read` gives [loss, gradients, parameters]."""

    def __init__(self, m: Any, pnames: list[str]) -> None:
        self.m, self.pnames = m, pnames
        self.init = {n: p.detach().clone() for n, p in m.named_parameters()}
        self.moments: Any = dict  # () -> {param name: {"exp_avg": ..., "exp_avg_sq": ...}}
        self.counters: Any = list  # () -> [step-count tensors]
        self.loss: Any = lambda: None

    def reset(self) -> None:
        import torch

        with torch.no_grad():
            for n, p in self.m.named_parameters():
                p.copy_(self.init[n])
            for state in self.moments().values():
                state["exp_avg"].zero_()
                state["exp_avg_sq"].zero_()
            for t in self.counters():
                t.zero_()
            loss = self.loss()
            if loss is not None:
                loss.fill_(float("nan"))

    def read(self, _: Any) -> list[Any]:
        params = dict(self.m.named_parameters())
        moments = self.moments()
        loss = self.loss()
        grads = [moments[n]["exp_avg"] / (1.0 - BETAS[0]) if n in moments else None for n in self.pnames]
        return (
            [None if loss is None else loss.reshape(-1)[:1].float()] + grads + [params[n].detach() for n in self.pnames]
        )


def adamw_train_step(model: Any, x: Any, **options: Any) -> tuple[Any, Any]:
    """`model` imported with `from_torch` on `x` and its training step as these rows run it (cross-entropy,
    AdamW with the module's LR, BETAS, EPS and WD, bf16 mixed precision; `options` for train_step):
    (imported, step), not built."""
    import opgraph as og

    imported = og.from_torch(model, (x,))
    optimizer = og.training.AdamW(LR, betas=BETAS, eps=EPS, weight_decay=WD)
    return imported, og.training.train_step(imported, "cross_entropy", optimizer, mixed_precision="bf16", **options)


def _ours(ctx: Ctx, v: dict[str, Any], pnames: list[str], name: str, engines: list[str] | None, tuned: bool) -> Impl:
    def setup() -> Runner:

        m = copy.deepcopy(v["model"])
        st = _AdamState(m, pnames)
        imported, ts = adamw_train_step(m, v["x"])
        plan, note = og_build(ts.graph, ctx, engines, tuned)
        ts.plan = plan
        pack = ts.pack(v["x"], target=v["y"])
        loss = pack[ts.loss_uid]

        def call() -> None:
            plan.execute(pack)
            imported.write_back(pack)

        st.moments = lambda: {n: ts.param_state(n) for n in pnames}
        st.counters = lambda: [pack[ts.scalars["optimizer.step"]]]
        st.loss = lambda: loss

        def reset() -> None:
            st.reset()
            ts.refresh_compute_copies()  # (the parameters restored: their 16-bit copies cast again)

        diagnose(f"{v['label']} [{name}]", plan, pack)
        return Runner(
            call=call,
            read=st.read,
            reset=reset,
            engine=engines_of(plan),
            notes=note,
            keep=(plan, ts, imported, m, st),
            after=step_profile(ctx, plan, pack),
        )

    return Impl(name, setup, role="ours", tuned=tuned)


def _torch_step(ctx: Ctx, v: dict[str, Any], pnames: list[str], mode: str | None, backend: str | None = None) -> Runner:
    """The step through PyTorch: eager (mode and backend None), or the model under torch.compile with
    `mode` and `backend` (inductor unless named: "opgraph" is opgraph's torch.compile backend)."""
    import torch

    compiling = mode is not None or backend is not None
    if compiling:
        torch._dynamo.reset()  # nothing compiled for another mode serves this one
    if backend == "opgraph":  # (the GPU machine's checkout has no installed entry point naming it)
        register_opgraph_backend()
    cuda = v["x"].is_cuda
    m = copy.deepcopy(v["model"])
    st = _AdamState(m, pnames)
    opt = torch.optim.AdamW(
        m.parameters(),
        lr=LR,
        betas=BETAS,
        eps=EPS,
        weight_decay=WD,
        **({"fused": True, "capturable": True} if cuda else {}),
    )
    net = torch.compile(m, backend=backend or "inductor", mode=mode, dynamic=False) if compiling else m
    device = "cuda" if cuda else "cpu"
    out: dict[str, Any] = {}

    def call() -> Any:
        if mode in ("max-autotune", "reduce-overhead"):
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = net(v["x"])
        loss = _loss(logits, v["y"])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out["loss"] = loss.detach()
        return loss

    def moments() -> dict[str, Any]:
        params = dict(m.named_parameters())
        return {n: opt.state[params[n]] for n in pnames if params[n] in opt.state}

    for _ in range(3):  # compile; create the AdamW state (a captured step needs it to exist)
        call()
    if cuda:
        torch.cuda.synchronize()
    st.moments = moments
    st.counters = lambda: [s["step"] for s in moments().values() if torch.is_tensor(s.get("step"))]
    st.loss = lambda: out.get("loss")
    engine = "ATen + autograd (autocast bf16)" if not compiling else INDUCTOR_ENGINE
    if backend == "opgraph":
        engine = OPGRAPH_BACKEND_ENGINE
    engine += " + fused AdamW" + (" (not compiled)" if compiling else "")
    return Runner(
        call=call,
        read=st.read,
        reset=st.reset,
        engine=engine,
        graph_native=mode in ("max-autotune", "reduce-overhead"),
        capturable=mode not in ("max-autotune", "reduce-overhead"),
        notes=", ".join(x for x in (f"backend={backend}" if backend else "", f"mode={mode}" if mode else "") if x),
        keep=(m, opt, net, st),
    )


def adamw_step_case(ctx: Ctx, v: dict[str, Any], flops: float, notes: str, backend_rows: bool = False) -> Case:
    """The Case of one AdamW training step of `v["model"]` (logits from `v["x"]`, cross-entropy against
    `v["y"]`): opgraph's builds, eager and torch.compile, each checked against the float64 step on the
    loss, every gradient and every updated parameter; floor and TFLOP/s from `flops` per step."""
    model = v["model"]
    pnames = [n for n, _ in model.named_parameters()]
    refs = _reference(model, v["x"], v["y"], pnames)
    outputs = (
        [Output("loss", "float32")]
        + [Output(f"grad:{n}", "float32") for n in pnames]
        + [Output(f"param:{n}", "float32") for n in pnames]
    )
    impls = [_ours(ctx, v, pnames, n, e, t) for n, e, t in VARIANTS if not t or (ctx.tune and ctx.tune_networks)]
    if ctx.scale == "tiny":  # a training step's generated kernels under Triton's interpreter: too slow
        impls = [i for i in impls if not i.name.startswith("generated")]
    impls.append(Impl("torch eager", lambda: _torch_step(ctx, v, pnames, None)))
    if backend_rows:  # opgraph reached through torch.compile (issue 43), before the peers
        # whose max-autotune setup (minutes) would leave a time-limited run none of its time
        impls += [
            Impl(n, (lambda mode=mode: _torch_step(ctx, v, pnames, mode, "opgraph")), role="ours", needs=frozenset(nd))
            for n, mode, nd in (
                ("opgraph (torch.compile backend)", None, {"compile"}),
                ("opgraph (torch.compile backend, CUDA graphs)", "reduce-overhead", {"compile", "cuda"}),
            )
            if mode is None or ctx.compile_cudagraphs
        ]
    impls += [
        Impl(n, (lambda mode=mode: _torch_step(ctx, v, pnames, mode)), needs=frozenset(nd))
        for n, mode, nd in (
            ("torch.compile", "max-autotune-no-cudagraphs", {"compile"}),
            ("torch.compile (CUDA graphs)", "max-autotune", {"compile", "cuda"}),
        )
        if mode != "max-autotune" or ctx.compile_cudagraphs
    ]
    notes = (
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters; {notes}; one checked step at lr "
        f"{LR}; {len(outputs)} outputs (loss, {len(pnames)} gradients, {len(pnames)} updated parameters)"
    )
    return Case(
        outputs,
        lambda: refs,
        impls,
        Floor(flops=flops, dtype="bfloat16", tflops=True),
        notes=notes,
        sane_limit=float("inf"),
    )


@workload(
    "training.gpt2.b8",
    group="training-gpt2",
    kind="training",
    minutes=3.0,
    title="GPT-2 small training step, batch 8 × seq 1024, bf16 mixed precision, AdamW",
)
def gpt2_training(ctx: Ctx) -> Case:
    v = _setup(ctx)
    flops = v["model"].flops_per_token() * v["tokens"]
    return adamw_step_case(ctx, v, flops, "tied embedding; floor and TFLOP/s: 6N + 12 L d T flops per token")
