"""GEMM workloads: matmul + bias + GELU (tanh approximation: what cuBLASLt's GELU epilogue computes) in
fp16 and bf16, and a transformer MLP block, layernorm -> matmul -> GELU -> matmul, forward and
forward + backward, in bf16. Peers: eager (addmm: cuBLAS with the bias in its epilogue),
torch._addmm_activation (cuBLASLt's bias+GELU epilogue), torch.compile, the cuDNN frontend (matmul)."""

from __future__ import annotations

import functools
from typing import Any

import opgraph as og

from ..case import Case, Ctx, Impl, Output, Runner
from ..core.floors import Floor, Layer
from ..core.registry import workload
from ..ours import graph_impls
from ..peers import cudnn_fe
from ..peers.torch_peers import compiled, eager
from .common import TORCH_TO_OG, short, torch_dtype

EPS = 1e-5
ADDMM_ENGINE = "cuBLASLt bias+GELU epilogue (where PyTorch's conditions hold) through torch._addmm_activation"


def matmul_bias_gelu(ctx: Ctx, dtype: str) -> Case:
    import torch
    import torch.nn.functional as F

    M, K, N = ctx.pick((8192, 4096, 4096), (2048, 4096, 4096), (16, 32, 24))
    tdt = torch_dtype(dtype)
    a = ctx.randn(M, K, dtype=tdt)
    b = ctx.randn(K, N, dtype=tdt, scale=K**-0.5)
    bias = ctx.randn(N, dtype=tdt, scale=0.5)

    ref = lambda: [F.gelu(a.double() @ b.double() + bias.double(), approximate="tanh")]  # noqa: E731

    def make() -> Any:
        g = og.Graph("matmul_bias_gelu", io_data_type=TORCH_TO_OG[dtype])
        A, B, BI = g.tensor_like(a, name="a"), g.tensor_like(b, name="b"), g.tensor_like(bias.view(1, N), name="bias")
        Y = g.gelu_approx_tanh(g.add(g.matmul(A, B), BI)).set_output(True).set_name("y")
        g.validate()
        return g, {A: a, B: b, BI: bias.view(1, N)}, [Y]

    def f(a: Any, b: Any, bias: Any) -> Any:
        return F.gelu(torch.addmm(bias, a, b), approximate="tanh")

    def fe_build(g: Any, t: Any) -> list:
        y = g.gelu_approx_tanh(input=g.add(g.matmul(A=t["a"], B=t["b"]), t["bias"]))
        return [(y, tdt)]

    impls = graph_impls(ctx, make) + [eager(f, (a, b, bias)), addmm_activation(a, b, bias)]
    impls += compiled(f, (a, b, bias), cudagraphs=ctx.compile_cudagraphs)
    impls += cudnn_fe.impls(
        ctx, {"a": a.view(1, M, K), "b": b.view(1, K, N), "bias": bias.view(1, 1, N)}, fe_build, tdt
    )
    moved = (a.numel() + b.numel() + N + M * N) * a.element_size()
    return Case([Output("y", dtype)], ref, impls, Floor(bytes=moved, flops=2 * M * K * N, dtype=dtype))


def addmm_activation(a: Any, b: Any, bias: Any) -> Impl:
    import torch

    def setup() -> Runner:
        return Runner(call=lambda: torch._addmm_activation(bias, a, b, use_gelu=True), engine=ADDMM_ENGINE)

    return Impl("torch._addmm_activation", setup, role="peer")


for _dt in ("float16", "bfloat16"):
    workload(
        f"matmul.bias_gelu.{short(_dt)}",
        group="matmul",
        minutes=0.5,
        title=f"matmul+bias+GELU(tanh) 8192×4096×4096 {short(_dt)}",
    )(functools.partial(matmul_bias_gelu, dtype=_dt))


# -- the transformer MLP block -------------------------------------------------------------------------
def _mlp_tensors(ctx: Ctx) -> dict[str, Any]:
    import torch

    M, D, H = ctx.pick((8192, 1024, 4096), (2048, 1024, 4096), (16, 32, 64))
    bf = torch.bfloat16
    return dict(
        M=M,
        D=D,
        H=H,
        x=ctx.randn(M, D, dtype=bf),
        gamma=ctx.rand(D, dtype=bf, lo=0.5, hi=1.5),
        beta=ctx.randn(D, dtype=bf, scale=0.1),
        w1=ctx.randn(D, H, dtype=bf, scale=D**-0.5),
        b1=ctx.randn(H, dtype=bf, scale=0.1),
        w2=ctx.randn(H, D, dtype=bf, scale=H**-0.5),
        b2=ctx.randn(D, dtype=bf, scale=0.1),
    )


PARAMS = ("x", "gamma", "beta", "w1", "b1", "w2", "b2")


def mlp(x: Any, gamma: Any, beta: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    import torch
    import torch.nn.functional as F

    h = F.layer_norm(x, [x.shape[-1]], gamma, beta, EPS)
    h = F.gelu(torch.addmm(b1, h, w1), approximate="tanh")
    return torch.addmm(b2, h, w2)


def mlp_fused(x: Any, gamma: Any, beta: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    import torch
    import torch.nn.functional as F

    h = F.layer_norm(x, [x.shape[-1]], gamma, beta, EPS)
    return torch.addmm(b2, torch._addmm_activation(b1, h, w1, use_gelu=True), w2)


def _mlp_graph(v: dict[str, Any]) -> tuple[Any, dict[Any, Any], Any]:
    """The block as one graph; its layernorm in INFERENCE phase (no statistics out: the backward of
    opgraph.grad recomputes them from the input, as a fused kernel would)."""
    bf = og.DataType.BFLOAT16
    D, H = v["D"], v["H"]
    g = og.Graph("mlp_block", io_data_type=bf)
    X = g.tensor_like(v["x"], name="x")
    G = g.tensor(dim=[1, D], data_type=bf, name="gamma")
    B = g.tensor(dim=[1, D], data_type=bf, name="beta")
    W1, W2 = g.tensor_like(v["w1"], name="w1"), g.tensor_like(v["w2"], name="w2")
    B1 = g.tensor(dim=[1, H], data_type=bf, name="b1")
    B2 = g.tensor(dim=[1, D], data_type=bf, name="b2")
    ln = g.layernorm(og.NormForwardPhase.INFERENCE, X, scale=G, bias=B, epsilon=EPS, name="ln")[0]
    ln.set_data_type(bf)  # bf16 between the kernels, as eager has it
    h = g.gelu_approx_tanh(g.add(g.matmul(ln, W1, name="fc1"), B1)).set_data_type(bf)
    Y = g.add(g.matmul(h, W2, name="fc2"), B2).set_output(True).set_name("y")
    g.validate()
    inputs = {
        X: v["x"],
        G: v["gamma"].view(1, D),
        B: v["beta"].view(1, D),
        W1: v["w1"],
        B1: v["b1"].view(1, H),
        W2: v["w2"],
        B2: v["b2"].view(1, D),
    }
    return g, inputs, Y


def _mlp_layers(M: int, D: int, H: int, backward: bool) -> tuple[Layer, ...]:
    e = 2  # bf16
    fwd = (
        Layer("ln+fc1+gelu", 2 * M * D * H, e * (M * D + D * H + M * H)),
        Layer("fc2", 2 * M * H * D, e * (M * H + H * D + M * D)),
    )
    if not backward:
        return fwd
    return fwd + (
        Layer("fc2.dgrad+gelu'", 2 * M * H * D, e * (M * D + H * D + 2 * M * H)),
        Layer("fc2.wgrad", 2 * M * H * D, e * (M * H + M * D + H * D)),
        Layer("fc1.dgrad", 2 * M * D * H, e * (M * H + D * H + M * D)),
        Layer("fc1.wgrad", 2 * M * D * H, e * (M * D + M * H + D * H)),
        Layer("ln.bwd", 0, e * 3 * M * D),
    )


@workload(
    "mlp.fwd.bf16",
    group="matmul",
    title="MLP block fwd: layernorm → matmul → GELU → matmul, 8192×1024 → 4096 → 1024 bf16",
    minutes=0.6,
)
def mlp_forward(ctx: Ctx) -> Case:
    v = _mlp_tensors(ctx)
    args = tuple(v[k] for k in PARAMS)
    ref = lambda: [mlp(*(a.double() for a in args))]  # noqa: E731

    def make() -> Any:
        g, inputs, Y = _mlp_graph(v)
        return g, inputs, [Y]

    impls = graph_impls(ctx, make) + [
        eager(mlp, args),
        eager(mlp_fused, args, name="torch fused ops", engine="ATen + " + ADDMM_ENGINE),
    ]
    impls += compiled(mlp, args, cudagraphs=ctx.compile_cudagraphs)
    return Case(
        [Output("y", "bfloat16")],
        ref,
        impls,
        Floor(layers=_mlp_layers(v["M"], v["D"], v["H"], False), dtype="bfloat16"),
        notes="no cuDNN frontend peer: the block is not one cuDNN graph (its matmul is in the matmul rows)",
    )


@workload(
    "mlp.fwd_bwd.bf16",
    group="matmul",
    title="MLP block fwd+bwd (y and all 7 gradients), 8192×1024 → 4096 → 1024 bf16",
    minutes=0.8,
)
def mlp_forward_backward(ctx: Ctx) -> Case:
    import torch

    v = _mlp_tensors(ctx)
    dy = ctx.randn(v["M"], v["D"], dtype=torch.bfloat16)
    names = ["y"] + [f"d{k}" for k in PARAMS]

    def ref() -> list[Any]:
        leaves = [v[k].double().requires_grad_() for k in PARAMS]
        with torch.enable_grad():
            y = mlp(*leaves)
            grads = torch.autograd.grad(y, leaves, dy.double())
        return [y.detach()] + [gr.detach() for gr in grads]

    def make() -> Any:
        from opgraph.training.classifier import _handle

        g, inputs, Y = _mlp_graph(v)
        keys = list(inputs)
        res = og.grad(g, [Y], keys, combined=True, intermediate_data_type=og.DataType.BFLOAT16)
        gg = res.graph
        pack = {_handle(gg, k.uid): t for k, t in inputs.items()}
        pack[res.grad_inputs[Y.uid]] = dy
        outs = [_handle(gg, Y.uid)] + [res.grads[k.uid] for k in keys]
        return gg, pack, outs

    def autograd_call(fn: Any) -> Any:
        leaves = [v[k].detach().clone().requires_grad_() for k in PARAMS]
        if hasattr(fn, "_torchdynamo_orig_callable"):  # compiled: the leaves never move (no per-call copies)
            for leaf in leaves:
                torch._dynamo.mark_static_address(leaf)

        def call() -> Any:
            y = fn(*leaves)
            return (y, *torch.autograd.grad(y, leaves, dy))

        return call

    def eager_setup() -> Runner:
        return Runner(call=autograd_call(mlp), engine="ATen + autograd")

    impls = graph_impls(ctx, make) + [Impl("torch eager", eager_setup)]
    impls += compiled(mlp, (), inference=False, prepare=autograd_call, cudagraphs=ctx.compile_cudagraphs)
    outs = [Output(n, "bfloat16") for n in names]
    return Case(
        outs,
        ref,
        impls,
        Floor(layers=_mlp_layers(v["M"], v["D"], v["H"], True), dtype="bfloat16"),
        notes="fwd+bwd: one opgraph plan of the combined graph (opgraph.grad(combined=True)); peers run "
        "the forward then autograd's backward",
    )
