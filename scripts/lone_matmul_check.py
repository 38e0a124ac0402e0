"""A lone bf16 matmul (the Llama zoo model's LM head at inference and training batch, its query projection)
four ways on the GPU: cuBLAS through torch.matmul (2-D weight, as PyTorch's nn.Linear), the same inside the
torch engine's pinned exact-math flags, a batched GEMM against a broadcast weight, and opgraph plans with
engines=["triton"] (the generated kernel) and engines=["torch"] (the torch engine's direct path), each plan's
output checked against fp32 first. Device µs per call from CUDA-graph replays of 10 calls (median of 9). The
evidence behind build/policy.py's lone-matmul rule (bench/results/constants.md#lone-matmuls).

    PYTHONPATH=$PWD python scripts/lone_matmul_check.py          # from the repo root, ~30 s
"""

import sys

import torch

sys.path.insert(0, ".")
import opgraph as og  # noqa: E402
from bench.measure import replay_us  # noqa: E402
from opgraph.engines.torch_engine.precision import exact_math  # noqa: E402


def plan_row(engine: str, a, w3, out) -> str:
    """opgraph's plan of the product with `engine`: its output checked, then timed."""
    dt = og.DataType
    b, m, k = a.shape
    n = w3.shape[-1]
    g = og.Graph("mm", io_data_type=dt.BFLOAT16, intermediate_data_type=dt.FLOAT, compute_data_type=dt.FLOAT)
    ta = g.tensor(dim=[b, m, k], name="A")
    tw = g.tensor(dim=[1, k, n], stride=[k * n, 1, k], name="W")
    tc = g.matmul(ta, tw).set_output(True)
    plan = g.build(device="cuda", engines=[engine])
    pack = {ta: a, tw: w3, tc: out}
    out.fill_(float("nan"))
    plan.execute(pack)
    torch.cuda.synchronize()
    ref = a.float() @ w3[0].float()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    return f" | plan-{engine} {replay_us(lambda: plan.execute(pack)):.1f} (err {err:.1e})"


def main() -> None:
    for b, m, n, k in ((4, 1024, 32000, 1024), (8, 1024, 32000, 1024), (8, 1024, 1024, 1024)):
        a = torch.randn(b, m, k, device="cuda").to(torch.bfloat16)
        w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        w3 = w.t().unsqueeze(0)
        out = torch.empty(b, m, n, device="cuda", dtype=torch.bfloat16)

        def mm(a=a, w=w, out=out) -> None:
            torch.matmul(a, w.t(), out=out)

        def pinned(a=a, w=w, out=out) -> None:
            with exact_math(True):
                torch.matmul(a, w.t(), out=out)

        def batched(a=a, w3=w3, out=out) -> None:
            with exact_math(True):
                torch.matmul(a, w3, out=out)

        row = f"{b}x{m}x{n}x{k}: mm {replay_us(mm):.1f} mm-pinned {replay_us(pinned):.1f} bmm-pinned {replay_us(batched):.1f}"
        row += plan_row("triton", a, w3, out) + plan_row("torch", a, w3, out)
        print(row, f"[{2 * b * m * n * k / 1e9:.0f} GF]", flush=True)


if __name__ == "__main__":
    main()
