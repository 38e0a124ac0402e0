"""fp8 GEMMs (E4M3 operands, fp32 accumulation), A row-major and B column-major as cuBLAS's fp8 GEMMs take
them: per-tensor scales with a bf16 output; per-row / per-column scales with a bf16 output; per-tensor scales
with the output cast to E4M3 and its amax (Transformer Engine's fp8 GEMM with its output quantized). Peers:
`torch._scaled_mm` (cuBLASLt's fp8 GEMM; its default joins the fp32 sum as opgraph's heuristic does, and its
`use_fast_accum=True` row is the like of a tuned plan that chose FP8_ACC=0, noted reduced_precision_reduction)
and torch.compile of the same calls (max-autotune weighs Inductor's own fp8 Triton templates against cuBLAS);
for the amax row, eager PyTorch's `_scaled_mm` to fp32, then the amax and the cast, and torch.compile of that."""

from __future__ import annotations

import functools
from typing import Any

import opgraph as og

from ..case import Case, Ctx, Impl, Output, Runner
from ..core.floors import Floor
from ..core.registry import workload
from ..ours import graph_impls
from ..peers.torch_peers import compiled, eager

SCALED_MM_ENGINE = "cuBLASLt fp8 GEMM through torch._scaled_mm"
DT = og.DataType


def _operands(ctx: Ctx, scales: str) -> dict[str, Any]:
    import torch

    M, N, K = ctx.pick((8192, 8192, 8192), (4096, 4096, 4096), (32, 48, 64))
    f8 = torch.float8_e4m3fn
    a = ctx.randn(M, K, dtype=torch.float32).to(f8)
    b = ctx.randn(N, K, dtype=torch.float32).to(f8).t()  # [K, N], column-major
    if scales == "tensor":
        sa = torch.full((), 0.5, device=ctx.device, dtype=torch.float32)
        sb = torch.full((), K**-0.5, device=ctx.device, dtype=torch.float32)
    else:
        sa = ctx.rand(M, 1, dtype=torch.float32, lo=0.25, hi=1.0)
        sb = ctx.rand(1, N, dtype=torch.float32, lo=0.5, hi=2.0).mul_(K**-0.5)
    return dict(M=M, N=N, K=K, a=a, b=b, sa=sa, sb=sb)


def _graph(v: dict[str, Any], out: Any, amax: bool) -> tuple[Any, dict[Any, Any], list[Any]]:
    g = og.Graph("fp8_matmul", io_data_type=DT.FP8_E4M3, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    A, B = g.tensor_like(v["a"], name="a"), g.tensor_like(v["b"], name="b")
    sa, sb = v["sa"].reshape(-1, 1) if v["sa"].dim() else v["sa"].view(1, 1), v["sb"].reshape(1, -1)
    SA, SB = g.tensor_like(sa, name="scale_a"), g.tensor_like(sb, name="scale_b")
    D = g.mul(g.mul(g.matmul(A, B, name="mm"), SA), SB)
    Y = g.identity(D).set_output(True).set_data_type(out).set_name("y")
    outs = [Y]
    if amax:
        outs.append(g.reduction(D, mode="AMAX").set_output(True).set_dim([1, 1]).set_name("amax"))
    g.validate()
    return g, {A: v["a"], B: v["b"], SA: sa, SB: sb}, outs


def scaled_mm(scales: str, ctx: Ctx) -> Case:
    import torch

    v = _operands(ctx, scales)
    a, b, sa, sb = v["a"], v["b"], v["sa"], v["sb"]
    ref = lambda: [(a.double() @ b.double()) * sa.double() * sb.double()]  # noqa: E731

    def f(a: Any, b: Any, sa: Any, sb: Any, fast: bool = False) -> Any:
        return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast)

    def peer(fast: bool) -> Impl:
        engine = SCALED_MM_ENGINE + (", use_fast_accum=True" if fast else "")
        name = "torch._scaled_mm" + (" (fast accumulation)" if fast else "")
        return Impl(name, lambda: Runner(call=lambda: f(a, b, sa, sb, fast), engine=engine), role="peer")

    impls = graph_impls(ctx, lambda: _graph(v, DT.BFLOAT16, amax=False))
    impls += [peer(False), peer(True)]
    impls += compiled(f, (a, b, sa, sb), cudagraphs=ctx.compile_cudagraphs)
    M, N, K = v["M"], v["N"], v["K"]
    moved = M * K + K * N + 2 * M * N + 4 * (sa.numel() + sb.numel())
    return Case(
        [Output("y", "bfloat16")],
        ref,
        impls,
        Floor(bytes=moved, flops=2 * M * N * K, dtype="float8_e4m3fn", tflops=True),
    )


def scaled_mm_amax(ctx: Ctx) -> Case:
    import torch

    v = _operands(ctx, "tensor")
    a, b, sa, sb = v["a"], v["b"], v["sa"], v["sb"]

    def ref() -> list[Any]:
        d = (a.double() @ b.double()) * sa.double() * sb.double()
        return [d.float().to(torch.float8_e4m3fn).double(), d.abs().amax().reshape(1, 1)]

    def f(a: Any, b: Any, sa: Any, sb: Any) -> Any:
        d = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
        return d.to(torch.float8_e4m3fn), d.abs().amax().reshape(1, 1)

    impls = graph_impls(ctx, lambda: _graph(v, DT.FP8_E4M3, amax=True))
    impls += [eager(f, (a, b, sa, sb), engine=f"{SCALED_MM_ENGINE} (fp32 out), then ATen's amax and cast")]
    impls += compiled(f, (a, b, sa, sb), cudagraphs=ctx.compile_cudagraphs)
    M, N, K = v["M"], v["N"], v["K"]
    return Case(
        [Output("y", "float8_e4m3fn"), Output("amax", "float32")],
        ref,
        impls,
        Floor(bytes=M * K + K * N + M * N + 12, flops=2 * M * N * K, dtype="float8_e4m3fn", tflops=True),
        notes="y is the E4M3 cast of the scaled product (the reference rounds float64 -> float32 -> E4M3)",
    )


for _scales in ("tensor", "row"):
    workload(
        f"matmul.fp8.{_scales}wise",
        group="matmul-fp8",
        minutes=1.0,
        title=f"fp8 E4M3 matmul 8192³, {_scales}-wise scales, bf16 out",
    )(functools.partial(scaled_mm, _scales))

workload(
    "matmul.fp8.amax_fp8_out",
    group="matmul-fp8",
    minutes=1.0,
    title="fp8 E4M3 matmul 8192³, tensor-wise scales, E4M3 out + amax",
)(scaled_mm_amax)
