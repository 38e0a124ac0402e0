"""The Llama zoo model's output and down projections with what follows them (the residual add, then the
next RMSNorm), imported with from_torch and planned several ways on the GPU: the product alone, with the
residual add, with the add and the norm's square-mean (the piece the default plan fuses), the whole
add+RMSNorm, and the norm alone; each heuristic and autotuned, against torch.compile (max-autotune) of the
same module. Every output is checked against PyTorch in fp32 first; device µs per call from CUDA-graph
replays of 10 calls (median of 9). Prints each plan's steps and the configs it chose.

    PYTHONPATH=$PWD python scripts/epilogue_gemm_check.py        # from the repo root, ~2 min
"""

import sys

import torch
from torch import nn

sys.path.insert(0, ".")
import opgraph as og  # noqa: E402
from bench.measure import replay_us  # noqa: E402

ROWS, D, FF = 8192, 1024, 2816
EPS = 1e-6


class Tail(nn.Module):
    """`what`: "mm" (the product), "add" (+ the residual), "stats" (+ the square-mean), "norm" (+ the
    whole RMSNorm), "only-norm" (the RMSNorm of the residual alone)."""

    def __init__(self, k: int, what: str) -> None:
        super().__init__()
        self.proj = nn.Linear(k, D, bias=False)
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(D))
        self.what = what

    def forward(self, *args):
        a, h = (None, *args) if self.what == "only-norm" else (*args, None)[:2]
        if self.what == "only-norm":
            r = h
        else:
            p = self.proj(a)
            if self.what == "mm":
                return p
            r = h + p
            if self.what == "add":
                return r
        var = r.float().pow(2).mean(-1, keepdim=True)
        if self.what == "stats":
            return r, var
        y = self.weight * (r.float() * torch.rsqrt(var + EPS)).to(torch.bfloat16)
        return r, y


def flat(out):
    return [o.float() for o in (out if isinstance(out, (tuple, list)) else (out,))]


def check(got, want) -> float:
    return max(((g - w).norm() / w.norm()).item() for g, w in zip(flat(got), flat(want)))


def steps(plan) -> str:
    rows = []
    for s in plan.steps:
        kinds = "+".join(n.kind if n.kind != "pointwise" else str(n.op.mode.value) for n in s.piece.nodes)
        rows.append(f"      {s.config.engine:8s} {str(s.config)[:150]}  [{kinds[:80]}]")
    return "\n".join(rows)


def main() -> None:
    torch.manual_seed(0)
    for name, k in (("o-proj", D), ("down-proj", FF)):
        a = torch.randn(1, ROWS, k, device="cuda").to(torch.bfloat16)
        h = torch.randn(1, ROWS, D, device="cuda").to(torch.bfloat16)
        for what in ("mm", "add", "stats", "norm", "only-norm"):
            m = Tail(k, what).cuda().to(torch.bfloat16).eval()
            args = {"mm": (a,), "only-norm": (h,)}.get(what, (a, h))
            with torch.no_grad():
                want = m.float()(*(x.float() for x in args))
                m.to(torch.bfloat16)
                imp = og.from_torch(m, args)
                row = f"{name:9s} {what:9s}"
                for label, opts in (("heur", {}), ("tuned", {"autotune": True})):
                    plan = imp.graph.build(**opts)
                    pack = imp.variant_pack(*args)
                    for u in imp.graph.final.outputs:
                        pack[u].fill_(float("nan"))
                    plan.execute(pack)
                    torch.cuda.synchronize()
                    got = [pack[t.known_uid()] for t in imp.outputs]
                    err = check(got if len(got) > 1 else got[0], want)
                    row += f" | {label} {replay_us(lambda plan=plan, pack=pack: plan.execute(pack)):7.1f} ({len(plan.steps)} steps, err {err:.1e})"
                    print(f"   {name} {what} {label}:\n{steps(plan)}", flush=True)
                tc = torch.compile(m, mode="max-autotune-no-cudagraphs")
                err = check(tc(*args), want)
                row += f" | torch.compile {replay_us(lambda tc=tc, args=args: tc(*args)):7.1f} (err {err:.1e})"
            print(row, flush=True)


if __name__ == "__main__":
    main()
