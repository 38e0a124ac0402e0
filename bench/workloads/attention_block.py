"""The transformer block of issue 16, imported whole with opgraph.from_torch: GPT-2's pre-norm block
(bench.gpt.Block: layernorm -> QKV linear -> causal F.scaled_dot_product_attention -> projection +
residual, layernorm -> linear 4d -> GELU(tanh) -> linear + residual), d 2048, 16 heads (D 128), batch 4
x 2048 tokens, bf16. Forward (y) and forward + backward (y, dx and all 12 parameter gradients: one
combined graph of opgraph.grad), beside eager PyTorch (autograd) and torch.compile.

Parameters are bound into the imported graph through views (a linear weight transposed), so its
gradients come out in those views' layouts: the references and the peers' gradients are compared
through the same views (`Source.apply`), a view and no copy. Layernorm weights and biases are random
(not 1 and 0) so that their gradients are not degenerate."""

from __future__ import annotations

import copy
import time
from typing import Any

import opgraph as og

from ..case import Case, Ctx, Impl, Output, Runner
from ..core.floors import Floor, Layer
from ..core.registry import workload
from ..ours import graph_impls
from ..peers.torch_peers import compiled, eager

BF16 = "bfloat16"
EAGER_ENGINE = "ATen (cuBLAS, PyTorch's default SDPA backend) + autograd"


def _block(ctx: Ctx) -> dict[str, Any]:
    import torch

    from ..gpt import Block, GPTConfig

    b, s, d, h = ctx.pick((4, 2048, 2048, 16), (2, 1024, 2048, 16), (2, 64, 32, 2))
    torch.manual_seed(0)
    m = Block(GPTConfig(seq=s, layers=1, heads=h, d=d)).to(ctx.device)
    with torch.no_grad():
        for ln in (m.ln_1, m.ln_2):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.normal_(0.0, 0.1)
    m = m.to(torch.bfloat16).eval()
    x = ctx.randn(b, s, d, dtype=torch.bfloat16)
    return {"m": m, "x": x, "b": b, "s": s, "d": d, "h": h}


def layers(b: int, s: int, d: int, backward: bool) -> tuple[Layer, ...]:
    """The block's roofline: each GEMM reads its input and weights and writes its output once (layernorm,
    bias and GELU fused into the GEMM before or after), attention reads q, k, v and writes O (causal:
    half the square's flops); backward adds each GEMM's data and weight gradients, attention's backward
    (2.5x its forward) and the layernorms' backward."""
    t, e = b * s, 2
    fwd = (
        Layer("ln1+qkv", 2 * t * d * 3 * d, e * (t * d + 3 * d * d + 3 * t * d)),
        Layer("attention", 2.0 * b * s * s * d, e * 4 * t * d),
        Layer("proj+residual", 2 * t * d * d, e * (3 * t * d + d * d)),
        Layer("ln2+fc+gelu", 2 * t * d * 4 * d, e * (t * d + 4 * d * d + 4 * t * d)),
        Layer("fc_proj+residual", 2 * t * 4 * d * d, e * (6 * t * d + 4 * d * d)),
    )
    if not backward:
        return fwd
    out = list(fwd)
    for x in fwd:
        if x.name == "attention":
            out.append(Layer("attention.bwd", 2.5 * x.flops, e * 8 * t * d))
        else:
            out += [Layer(x.name + ".dgrad", x.flops, x.bytes), Layer(x.name + ".wgrad", x.flops, x.bytes)]
    out += [Layer("ln1.bwd", 0, e * 3 * t * d), Layer("ln2.bwd", 0, e * 3 * t * d)]
    return tuple(out)


def _import(v: dict[str, Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    imported = og.from_torch(v["m"], (v["x"],))
    return imported, time.perf_counter() - t0


@workload(
    "attention.block_fwd.bf16",
    group="attention-block",
    minutes=1.0,
    title="transformer block fwd (GPT-2 block, causal SDPA) d2048 h16 4×2048 tokens bf16",
)
def block_forward(ctx: Ctx) -> Case:
    import torch

    v = _block(ctx)
    m, x = v["m"], v["x"]
    with torch.no_grad():
        want = copy.deepcopy(m).double()(x.double())
    state: dict[str, Any] = {}

    def make() -> Any:
        if "made" not in state:
            imported, _ = _import(v)
            pack = imported.variant_pack(x)
            final = imported.graph.final
            state["made"] = (
                imported.graph,
                {k: t for k, t in pack.items() if k not in final.outputs},
                imported.outputs,
            )
        return state["made"]

    impls = graph_impls(ctx, make)
    impls += [eager(m, (x,), engine="ATen (cuBLAS, PyTorch's default SDPA backend)")]
    impls += compiled(m, (x,), inference=True, freezing=True, cudagraphs=ctx.compile_cudagraphs)
    return Case(
        [Output("y", BF16)],
        lambda: [want],
        impls,
        Floor(layers=layers(v["b"], v["s"], v["d"], False), dtype=BF16, tflops=True),
        notes="one graph imported with opgraph.from_torch (the import is in the first build's setup_s)",
    )


@workload(
    "attention.block_fwd_bwd.bf16",
    group="attention-block",
    minutes=1.5,
    title="transformer block fwd+bwd (y, dx, 12 parameter gradients) d2048 h16 4×2048 tokens bf16",
)
def block_forward_backward(ctx: Ctx) -> Case:
    import torch

    from opgraph.training.classifier import _handle

    v = _block(ctx)
    m, x = v["m"], v["x"]
    dy = ctx.randn(*x.shape, dtype=torch.bfloat16)
    pnames = [n for n, _ in m.named_parameters()]
    imported, import_s = _import(v)
    sources = {src.key: (t, src) for t, src in imported.bound_inputs if src.kind == "parameter"}
    missing = [n for n in pnames if n not in sources]
    if missing or len(sources) != len(imported.bound_inputs):
        raise RuntimeError(
            f"expected each parameter bound once; unbound {missing}, bound "
            f"{[s.label() for _, s in imported.bound_inputs]}"
        )
    views = [sources[n][1].apply for n in pnames]

    def ref() -> list[Any]:
        m64 = copy.deepcopy(m).double()
        params = dict(m64.named_parameters())
        x64 = x.detach().double().requires_grad_()
        with torch.enable_grad():
            y = m64(x64)
            grads = torch.autograd.grad(y, [x64] + [params[n] for n in pnames], dy.double())
        return [y.detach(), grads[0]] + [view(g) for view, g in zip(views, grads[1:])]

    def make() -> Any:
        pack = imported.variant_pack(x)
        (X,) = imported.inputs
        Y = imported.outputs[0]
        keys = [X] + [sources[n][0] for n in pnames]
        res = og.grad(imported.graph, [Y], keys, combined=True, intermediate_data_type=og.DataType.BFLOAT16)
        gg = res.graph
        gpack = {_handle(gg, k.uid): pack[k.uid] for k in keys}
        gpack[res.grad_inputs[Y.uid]] = dy
        return gg, gpack, [_handle(gg, Y.uid)] + [res.grads[k.uid] for k in keys]

    def read(ret: Any) -> list[Any]:
        y, dx, *grads = ret
        return [y, dx] + [view(g) for view, g in zip(views, grads)]

    def autograd_call(fn: Any) -> Any:
        xl = x.detach().clone().requires_grad_()
        params = dict(m.named_parameters())
        leaves = [xl] + [params[n] for n in pnames]
        if fn is not m:  # compiled: the input never moves (no per-call copy into Inductor's CUDA graphs)
            torch._dynamo.mark_static_address(xl)

        def call() -> Any:
            y = fn(xl)
            return (y, *torch.autograd.grad(y, leaves, dy))

        return call

    def eager_setup() -> Runner:
        return Runner(call=autograd_call(m), read=read, engine=EAGER_ENGINE)

    impls = graph_impls(ctx, make) + [Impl("torch eager", eager_setup)]
    impls += compiled(m, (), inference=False, prepare=autograd_call, read=read, cudagraphs=ctx.compile_cudagraphs)
    names = ["y", "dx"] + [f"d{n}" for n in pnames]
    return Case(
        [Output(n, BF16) for n in names],
        ref,
        impls,
        Floor(layers=layers(v["b"], v["s"], v["d"], True), dtype=BF16, tflops=True),
        notes=(
            f"fwd+bwd: one opgraph plan of the combined graph (opgraph.grad(combined=True)) of the imported "
            f"block (from_torch {import_s:.1f} s, not in setup_s); peers run the forward then autograd's "
            "backward; parameter gradients compared in the graph's bound views"
        ),
    )
