"""The weight gradients of the Llama zoo model's training step (batch 4 x 1024 tokens, bf16) as the
torch.compile backend's plans hold them: dW = dY^T X (dY read transposed in place), cast to the fp32 of
the weight, for the q/o (1024 x 1024), k/v (256 x 1024) and SwiGLU (2816 x 1024, 1024 x 2816) projections.
Each planned by the heuristics, autotuned, and autotuned without the library's "wide" precision (the product
unrounded: NumericalNote.WIDENED_INTERMEDIATE) (`describe()` lists every candidate with its estimate and, tuned,
its time: the cost model's error on transposed-operand GEMMs with few output tiles, and whether split-K
wins), against cuBLAS (`torch.mm`, then the cast; and `out_dtype=float32` where PyTorch has it). Outputs
are checked against PyTorch in fp32 first; device µs per call from CUDA-graph replays of 10 calls.

    PYTHONPATH=$PWD python scripts/wgrad_check.py        # from the repo root, ~2 min
"""

import sys

import torch

sys.path.insert(0, ".")
import opgraph as og  # noqa: E402
from bench.measure import replay_us  # noqa: E402

TOKENS = 4 * 1024
SHAPES = {"q/o": (1024, 1024), "k/v": (256, 1024), "gate/up": (2816, 1024), "down": (1024, 2816)}


def graph(m: int, n: int) -> tuple:
    bf16, fp32 = og.DataType.BFLOAT16, og.DataType.FLOAT
    g = og.Graph("wgrad", io_data_type=bf16, intermediate_data_type=fp32, compute_data_type=fp32)
    dy = g.tensor(dim=[TOKENS, m], name="dY")
    x = g.tensor(dim=[TOKENS, n], name="X")
    product = g.matmul(g.transpose(dy, [1, 0], name="dYt"), x, name="mm")
    product.set_data_type(bf16)  # (AOTAutograd's mm is bf16, then the cast to the weight's fp32)
    dw = g.identity(product, name="cast").set_output(True).set_data_type(fp32)
    return g, dy, x, dw


def main() -> None:
    torch.manual_seed(0)
    for name, (m, n) in SHAPES.items():
        dy = torch.randn(TOKENS, m, device="cuda").to(torch.bfloat16)
        x = torch.randn(TOKENS, n, device="cuda").to(torch.bfloat16)
        want = dy.float().t() @ x.float()
        row = f"{name:8s} M {m} N {n} K {TOKENS}"
        for label, opts in (
            ("heur", {}),
            ("tuned", {"autotune": True}),
            ("tuned exact", {"autotune": True, "deselect_numeric_notes": ["widened_intermediate"]}),
        ):
            g, dy_t, x_t, dw_t = graph(m, n)
            plan = g.build(**opts)
            out = torch.full((m, n), float("nan"), device="cuda")
            pack = {dy_t: dy, x_t: x, dw_t: out}
            plan.execute(pack)
            torch.cuda.synchronize()
            err = ((out - want).norm() / want.norm()).item()
            us = replay_us(lambda plan=plan, pack=pack: plan.execute(pack))
            row += f" | {label} {us:6.1f} (err {err:.1e})"
            print(f"== {name} {label}: {us:.1f} us\n{plan.describe()[:4000]}", flush=True)
        us = replay_us(lambda dy=dy, x=x: torch.mm(dy.t(), x).float())
        row += f" | cuBLAS+cast {us:6.1f}"
        try:
            us = replay_us(lambda dy=dy, x=x: torch.mm(dy.t(), x, out_dtype=torch.float32))
            row += f" | cuBLAS fp32 out {us:6.1f}"
        except (RuntimeError, TypeError) as err:
            row += f" | cuBLAS fp32 out: {type(err).__name__}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
