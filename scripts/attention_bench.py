"""GPU check and benchmark of the generated attention kernels (opgraph/engines/triton/attention),
driven directly by their spec on torch tensors (no graph), beside PyTorch's SDPA backends and
FlexAttention.

    PYTHONPATH=$PWD python3 scripts/attention_bench.py [--quick] [--out DIR] [--dry]

1. correctness: forward O / LSE and backward dQ, dK, dV (dBias) against fp32 PyTorch math on the
   upcast inputs (relative L2 error), over masks, GQA, layouts, head dims 64/128/256, bias, score
   modifiers, padding;
2. speed (bf16, B=4, H=16, D=128, S = 1k, 4k, 16k, causal and not): every knob candidate of the
   generated forward and backward, and torch SDPA's flash / cuDNN / efficient backends, timed with
   CUDA graphs (triton.testing.do_bench_cudagraph, median); TFLOP/s with the usual count (forward
   4 B H S^2 D, halved when causal; backward 2.5x the forward);
3. score modifiers with a causal mask (tanh soft-capping; ALiBi from positions): the generated
   kernels with the modifier emitted into the tile loop against FlexAttention (torch.compile).
Kernels are compiled first in parallel worker processes (Triton's cache then serves the timing run).
--dry runs the script's logic under Triton's interpreter on tiny shapes (no peers, no timing).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

DRY = "--dry" in sys.argv
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"

import torch

from opgraph.engines.triton.attention import (
    AttnSpec,
    BwdKnobs,
    Causal,
    FwdKnobs,
    Operand,
    backward,
    forward,
)
from opgraph.engines.triton.attention.knobs import bwd_candidates, fwd_candidates
from opgraph.engines.triton.attention.run import launch, load

DEV = "cpu" if DRY else "cuda"
TL = {torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.int32: "tl.int32"}
T0 = time.time()


def elapsed() -> float:
    return time.time() - T0


def op(name, t):
    return Operand(name, TL[t.dtype], tuple(t.stride()))


# -- score modifiers (what the template emits from a ScoreMod; here by hand) -------------------------


class SoftCap:
    def __init__(self, cap=30.0):
        self.cap = cap

    def params(self):
        return ()

    def forward(self, s, at):
        return [f"sc_t = _og_tanh({s} * {1.0 / self.cap!r})"], f"sc_t * {self.cap!r}"

    def backward(self, s, g, at):
        return [f"sc_t = _og_tanh({s} * {1.0 / self.cap!r})"], f"{g} * (1.0 - sc_t * sc_t)"

    def torch_mod(self, s):
        return self.cap * torch.tanh(s / self.cap)

    def flex(self):
        cap = self.cap

        def mod(score, b, h, qi, kvi):
            return cap * torch.tanh(score / cap)

        return mod


class Alibi:
    """s + slope[h] * (j - i), slopes a graph tensor [1, H, 1, 1] (gen_index ALiBi)."""

    def __init__(self, slopes):
        self.slopes = slopes

    def params(self):
        return ("SLOPES",)

    def forward(self, s, at):
        return [f"al_s = tl.load(SLOPES + {at.h})"], f"{s} + al_s * ({at.j} - {at.i}).to(tl.float32)"

    def backward(self, s, g, at):
        return [], g

    def torch_mod(self, s):
        i = torch.arange(s.shape[2], device=s.device)[:, None]
        j = torch.arange(s.shape[3], device=s.device)[None, :]
        return s + self.slopes.view(1, -1, 1, 1).to(s.dtype) * (j - i)

    def flex(self):
        slopes = self.slopes

        def mod(score, b, h, qi, kvi):
            return score + slopes[h] * (kvi - qi)

        return mod


# -- problems ---------------------------------------------------------------------------------------


def make(
    B,
    Hq,
    Sq,
    D,
    *,
    Hk=None,
    Skv=None,
    Dv=None,
    causal=Causal.NONE,
    layout="bhsd",
    dtype=torch.bfloat16,
    window=None,
    pad=None,
    bias=None,
    mod=None,
    seed=0,
    grad=True,
):
    """Tensors and the forward/backward specs of one problem (inputs random, outputs NaN)."""
    Hk, Skv, Dv = Hk or Hq, Skv or Sq, Dv or D
    g = torch.Generator(device=DEV).manual_seed(seed)

    def rnd(b, h, s, d):
        if layout == "bshd":
            return torch.randn(b, s, h, d, generator=g, device=DEV, dtype=torch.float32).to(dtype).permute(0, 2, 1, 3)
        return torch.randn(b, h, s, d, generator=g, device=DEV, dtype=torch.float32).to(dtype)

    t = {"Q": rnd(B, Hq, Sq, D), "K": rnd(B, Hk, Skv, D), "V": rnd(B, Hk, Skv, Dv)}
    t["O"] = torch.full((B, Hq, Sq, Dv), float("nan"), device=DEV, dtype=dtype)
    t["LSE"] = torch.full((B, Hq, Sq, 1), float("nan"), device=DEV)
    kw = {"scale": D**-0.5, "causal": causal, "window": window, "interpret": DRY}
    if pad is not None:
        t["SQ"] = torch.tensor(pad[0], dtype=torch.int32, device=DEV).view(B, 1, 1, 1)
        t["SKV"] = torch.tensor(pad[1], dtype=torch.int32, device=DEV).view(B, 1, 1, 1)
        kw.update(seq_len_q=op("SQ", t["SQ"]), seq_len_kv=op("SKV", t["SKV"]))
    if bias is not None:
        t["BIAS"] = torch.randn(*bias, generator=g, device=DEV)
        kw.update(bias=op("BIAS", t["BIAS"].expand(B, Hq, Sq, Skv)), bias_dims=tuple(bias))
    if mod == "softcap":
        kw["score_mod"] = SoftCap()
    elif mod == "alibi":
        n = 2 ** int(math.log2(Hq))
        t["SLOPES"] = torch.tensor([2.0 ** (-8.0 * (h + 1) / n) for h in range(Hq)], device=DEV)
        kw["score_mod"] = Alibi(t["SLOPES"])
    base = {
        "B": B,
        "Hq": Hq,
        "Hk": Hk,
        "Hv": Hk,
        "Sq": Sq,
        "Skv": Skv,
        "D": D,
        "Dv": Dv,
        "q": op("Q", t["Q"]),
        "k": op("K", t["K"]),
        "v": op("V", t["V"]),
        "o": op("O", t["O"]),
        "stats": op("LSE", t["LSE"]),
    }
    fspec = AttnSpec(**base, **kw)
    bspec = None
    if grad:
        t["DO"] = rnd(B, Hq, Sq, Dv)
        for n, like in (("DQ", "Q"), ("DK", "K"), ("DV", "V")):
            t[n] = torch.full_like(t[like], float("nan"))
        extra = {}
        if bias is not None:
            t["DB"] = torch.full_like(t["BIAS"], float("nan"))
            extra["dbias"] = op("DB", t["DB"])
        bspec = AttnSpec(
            **base,
            **kw,
            do=op("DO", t["DO"]),
            dq=op("DQ", t["DQ"]),
            dk=op("DK", t["DK"]),
            dv=op("DV", t["DV"]),
            **extra,
        )
    return fspec, bspec, t


def reference(spec: AttnSpec, t, want_grad: bool):
    """fp32 math on the upcast inputs: O, LSE (+inf for empty rows) and the gradients."""
    q, k, v = (t[n].float().detach().requires_grad_(want_grad) for n in ("Q", "K", "V"))
    bias = t.get("BIAS")
    bias = bias.float().detach().requires_grad_(want_grad) if bias is not None else None
    hq = q.shape[1]
    ke, ve = k.repeat_interleave(hq // k.shape[1], 1), v.repeat_interleave(hq // v.shape[1], 1)
    s = (q @ ke.transpose(-1, -2)) * spec.scale
    if bias is not None:
        s = s + bias
    if spec.score_mod is not None:
        s = spec.score_mod.torch_mod(s)
    sq, skv = s.shape[2], s.shape[3]
    i = torch.arange(sq, device=DEV)[:, None]
    j = torch.arange(skv, device=DEV)[None, :]
    ql = t["SQ"].view(-1, 1, 1, 1).long() if "SQ" in t else torch.full((1, 1, 1, 1), sq, device=DEV)
    kl = t["SKV"].view(-1, 1, 1, 1).long() if "SKV" in t else torch.full((1, 1, 1, 1), skv, device=DEV)
    keep = (i < ql) & (j < kl)
    diag = kl - ql if spec.causal is Causal.BOTTOM_RIGHT else 0
    if spec.causal is not Causal.NONE:
        keep = keep & (j <= i + diag)
    if spec.window is not None:
        keep = keep & (i + diag - j < spec.window)
    s = s.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(s, -1, keepdim=True)
    p = torch.exp(s - lse).nan_to_num(0.0)
    o = (p @ ve).masked_fill(~(i < ql), 0.0)
    lse = lse.masked_fill(lse == -math.inf, math.inf).masked_fill(~(i < ql), math.inf)
    grads = {}
    if want_grad:
        o.backward(t["DO"].float())
        grads = {"DQ": q.grad, "DK": k.grad, "DV": v.grad}
        if bias is not None:
            grads["DB"] = bias.grad
    return o.detach(), lse.detach(), grads


def rel(got, want):
    got, want = got.float(), want.float()
    finite = torch.isfinite(want)
    if not torch.equal(finite, torch.isfinite(got)):
        return float("inf")
    d = (got[finite] - want[finite]).norm().item()
    n = want[finite].norm().item()
    return d / n if n else d


# -- compile in parallel ----------------------------------------------------------------------------


def _warm(job):
    """In a worker: build the problem and run its kernels once (compiles into Triton's cache)."""
    try:
        kind, prob, knobs = job
        fspec, bspec, t = make(**prob, grad=kind != "fwd")
        if kind == "flex":  # fills Inductor's caches for the main run's compile
            compile_flex(t, fspec)
        elif kind == "graph":
            graph_checks()
        elif kind == "fwd":
            launch(forward(fspec, knobs), t, interpret=DRY)
        else:
            launch(forward(fspec, fwd_candidates(fspec.D, cuda=not DRY)[0]), t, interpret=DRY)
            launch(backward(bspec, knobs), t, interpret=DRY)
        torch.cuda.synchronize() if not DRY else None
        return None
    except Exception as e:  # noqa: BLE001 - reported, the main run skips the config
        return f"{job[0]} {job[1]} {job[2]}: {type(e).__name__}: {str(e)[:300]}"


def warm(jobs, workers):
    if DRY or not jobs:
        return {}
    t = time.time()
    ctx = __import__("multiprocessing").get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        errors = list(pool.map(_warm, jobs))
    bad = {i: e for i, e in enumerate(errors) if e}
    print(f"# compiled {len(jobs)} configs in {time.time() - t:.0f} s ({len(bad)} failed)", flush=True)
    for e in bad.values():
        print("#   failed:", e, flush=True)
    return bad


# -- timing -----------------------------------------------------------------------------------------


def bench(fn):
    import triton

    if DRY:
        fn()
        return float("nan")
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median")
    except Exception:  # noqa: BLE001 - not capturable: plain events
        return triton.testing.do_bench(fn, warmup=20, rep=40, return_mode="median")


def runner(src, t):
    module = load(src, interpret=DRY)
    launch(src, t, interpret=DRY, module=module)  # allocates nothing new below: scratch kept in t
    for s in src.scratch:
        t.setdefault(s.name, torch.empty(s.numel, dtype=getattr(torch, s.dtype), device=DEV))
    fns = [
        (
            getattr(module, l.kernel)[l.grid],
            [t[p] for p in l.params],
            {"num_warps": l.num_warps, "num_stages": l.num_stages},
        )
        for l in src.launches
    ]

    def run():
        for fn, args, meta in fns:
            fn(*args, **meta)

    run.parts = [lambda f=f, a=a, m=m: f(*a, **m) for f, a, m in fns]
    return run


def flops(B, H, Sq, Skv, D, causal, mode):
    f = 4.0 * B * H * Sq * Skv * D * (0.5 if causal else 1.0)
    return f * (2.5 if mode == "bwd" else 1.0)


def torch_backends():
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }


def time_torch(t, causal, scale, backend):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    q, k, v = (t[n].detach().requires_grad_() for n in ("Q", "K", "V"))
    with sdpa_kernel([backend]):
        f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        fwd = bench(f)
        o = f()
        do = t["DO"]
        b = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        bwd = bench(b)
    return fwd, bwd


# -- main -------------------------------------------------------------------------------------------


def correctness_cases():
    if DRY:
        return [{"B": 1, "Hq": 2, "Sq": 40, "D": 16, "causal": Causal.TOP_LEFT}]
    c = Causal
    return [
        {"B": 2, "Hq": 4, "Sq": 1000, "D": 128, "causal": c.TOP_LEFT},
        {"B": 2, "Hq": 8, "Hk": 2, "Sq": 700, "Skv": 1100, "D": 64, "causal": c.BOTTOM_RIGHT, "layout": "bshd"},
        {"B": 1, "Hq": 4, "Sq": 600, "D": 256},
        {"B": 2, "Hq": 4, "Sq": 1024, "D": 128, "causal": c.TOP_LEFT, "window": 256, "dtype": torch.float16},
        {"B": 2, "Hq": 4, "Sq": 900, "Skv": 1000, "D": 128, "causal": c.BOTTOM_RIGHT, "pad": ((700, 0), (1000, 333))},
        {"B": 2, "Hq": 4, "Sq": 512, "Skv": 640, "D": 128, "bias": (1, 4, 512, 640), "dtype": torch.float16},
        {"B": 2, "Hq": 4, "Sq": 1024, "D": 128, "causal": c.TOP_LEFT, "mod": "softcap"},
        {"B": 2, "Hq": 4, "Sq": 1024, "D": 64, "Dv": 128, "causal": c.TOP_LEFT, "mod": "alibi", "layout": "bshd"},
    ]


def knob_sets(D, cuda):
    """(forward knobs, split backward knobs (each a dK/dV and a dQ setting), fused backward knobs)."""
    if not cuda:
        return (
            fwd_candidates(D, cuda=False),
            bwd_candidates(D, cuda=False),
            [BwdKnobs(16, 32, 32, 16, 4, 1, 4, 1, 16, FUSED=1)],
        )
    fk = [
        FwdKnobs(128, 128, 8, 3),
        FwdKnobs(128, 128, 8, 3, ONELOOP=1),
        FwdKnobs(64, 64, 4, 3),
        FwdKnobs(64, 64, 4, 3, ONELOOP=1),
    ]
    dkdv = [(64, 128, 8, 3, 1), (64, 64, 4, 2, 1), (64, 128, 8, 4, 1), (64, 128, 8, 3, 0)]
    dq = [(128, 64, 8, 3), (64, 64, 4, 2), (128, 64, 8, 4), (128, 64, 8, 3)]
    split = [BwdKnobs(a[0], a[1], b[0], b[1], a[2], a[3], b[2], b[3], ONELOOP=a[4]) for a, b in zip(dkdv, dq)]
    fused = [BwdKnobs(64, 64, 64, 64, 4, 2, 4, 2, FUSED=1, ONELOOP=1)]
    return fk, split, fused


def check_knobs(spec, cuda):
    """The knobs the correctness section runs: the heuristic's first choice, one loop with run-time
    masks, stages cut to fit shared memory."""
    from opgraph.engines.triton.attention.knobs import fit_bwd, fit_fwd

    f = fwd_candidates(spec.D, cuda=cuda)[0]
    b = bwd_candidates(spec.D, cuda=cuda, scored=spec.score_mod is not None)[0]
    f, b = FwdKnobs(**{**f.__dict__, "ONELOOP": 1}), BwdKnobs(**{**b.__dict__, "ONELOOP": 1})
    return (fit_fwd(spec, f), fit_bwd(spec, b)) if cuda else (f, b)


def time_split(src, t, pre=None):
    """Per launch (preprocess, dK/dV, dQ) times of a split backward (`pre`: the preprocess's known time)."""
    run = runner(src, t)
    parts = run.parts if pre is None else run.parts[1:]
    times = [bench(lambda f=f: f()) for f in parts]
    return times if pre is None else [pre, *times]


def best_split(bspec, t, cands, fb):
    """TFLOP/s of the split backward made of the fastest dK/dV and the fastest dQ launch among
    `cands` (their times summed: the launches run back to back), and each candidate's parts."""
    parts, timed = {}, []
    pre = None
    for k in cands:
        parts[_short(k)] = p = _try(lambda k=k, pre=pre: time_split(backward(bspec, k), t, pre))
        if isinstance(p, list):
            pre = p[0]
            timed.append((k, p))
    if not timed:
        return float("nan"), parts, None
    total = min(v[0] for _, v in timed) + min(v[1] for _, v in timed) + min(v[2] for _, v in timed)
    kd = min(timed, key=lambda x: x[1][1])[0]
    kq = min(timed, key=lambda x: x[1][2])[0]
    return fb / total / 1e9, parts, (_short(kd).split("+")[0], _short(kq).split("+")[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="S = 1k and 4k only")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--budget", type=float, default=380.0, help="seconds; later sections are skipped past it")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (our score_mod kernels still run)")
    ap.add_argument("--checks", default="all", help="correctness cases: all, none, or indices like 5,6,7")
    ap.add_argument("--no-mods", action="store_true", help="skip the score_mod section")
    ap.add_argument("--sections", default="graph", help="extra sections: graph (the templates end to end)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = {
        "device": "cpu (dry)" if DRY else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "correctness": [],
        "speed": [],
        "score_mod": [],
    }
    import triton

    results["triton"] = triton.__version__
    print("#", results["device"], "torch", torch.__version__, "triton", triton.__version__, flush=True)

    cuda = not DRY
    seqs = [64] if DRY else ([1024, 4096] if args.quick else [1024, 4096, 16384])
    B, H, D = (1, 2, 16) if DRY else (4, 16, 128)
    fk, split, fused = knob_sets(D, cuda)
    mods = [] if args.no_mods else ["softcap", "alibi"]
    flex = not (DRY or args.no_flex)
    cases = correctness_cases()
    if args.checks == "none":
        cases = []
    elif args.checks != "all":
        cases = [cases[int(i)] for i in args.checks.split(",")]

    jobs = []
    for prob in cases:
        fspec, _, _ = make(**prob, grad=False)
        jobs.append(("bwd", prob, check_knobs(fspec, cuda)[1]))
    for S in seqs:
        for causal in (False, True):
            prob = {"B": B, "Hq": H, "Sq": S, "D": D, "causal": Causal.TOP_LEFT if causal else Causal.NONE}
            jobs += [("fwd", prob, k) for k in fk] + [("bwd", prob, k) for k in split + fused]
        for m in mods:
            prob = {"B": B, "Hq": H, "Sq": S, "D": D, "causal": Causal.TOP_LEFT, "mod": m}
            jobs += [("fwd", prob, k) for k in fk[:2]] + [("bwd", prob, k) for k in split[:2]]
            if flex:
                jobs.insert(0, ("flex", prob, None))
    if "graph" in args.sections and not DRY:
        jobs.insert(0, ("graph", {"B": 1, "Hq": 1, "Sq": 16, "D": 16}, None))
    warm(jobs, args.workers)

    # 0. the templates through the graph API (opgraph's build and execute), against torch SDPA
    if "graph" in args.sections:
        results["graph"] = graph_checks() if not DRY else graph_checks((2, 4, 40), (16, 32))
        _save(results, args.out)

    # 1. correctness
    if cases:
        print("\n## correctness (relative L2 error against fp32 math on the upcast inputs)", flush=True)
    for prob in cases:
        desc = {k: (v.name if isinstance(v, Causal) else str(v)) for k, v in prob.items()}
        try:
            fspec, bspec, t = make(**prob)
            fkn, bkn = check_knobs(fspec, cuda)
            launch(forward(fspec, fkn), t, interpret=DRY)
            launch(backward(bspec, bkn), t, interpret=DRY)
            o, lse, grads = reference(fspec, t, True)
            errs = {"O": rel(t["O"], o), "LSE": rel(t["LSE"], lse)}
            errs.update({n: rel(t[n], g) for n, g in grads.items()})
            ok = all(e < (3e-2 if n == "DB" else 2e-2) for n, e in errs.items())
            results["correctness"].append({"case": desc, "errors": errs, "ok": ok, "knobs": [str(fkn), str(bkn)]})
            print(("ok  " if ok else "BAD ") + " ".join(f"{n} {e:.1e}" for n, e in errs.items()), desc, flush=True)
            del t
        except Exception as e:  # noqa: BLE001 - reported, the run goes on
            results["correctness"].append({"case": desc, "error": f"{type(e).__name__}: {e}"})
            print("ERR ", desc, type(e).__name__, str(e)[:300], flush=True)

    # 2. speed
    print(f"\n## speed: bf16 B={B} H={H} D={D}, TFLOP/s (median, CUDA graphs)", flush=True)
    for S in seqs:
        for causal in (False, True):
            if elapsed() > args.budget:
                print("# budget reached, skipping", S, causal)
                continue
            try:
                speed_row(results, B, H, S, D, causal, fk, split, fused)
            except Exception as e:  # noqa: BLE001
                print("# row failed:", S, causal, type(e).__name__, str(e)[:300], flush=True)
            _save(results, args.out)

    # 3. score modifiers + causal against FlexAttention
    if mods:
        print("\n## score_mod + causal: ours vs FlexAttention (compiled), TFLOP/s fwd/bwd", flush=True)
    for S in sorted(seqs, key=lambda s: (s != 4096, s)):
        for m in mods:
            if elapsed() > args.budget:
                print("# budget reached, skipping", S, m)
                continue
            try:
                mod_row(results, B, H, S, D, m, fk[:2], split[:2], flex)
            except Exception as e:  # noqa: BLE001
                print("# row failed:", S, m, type(e).__name__, str(e)[:300], flush=True)
            _save(results, args.out)
    _save(results, args.out)
    print(f"# done in {elapsed():.0f} s", flush=True)


def graph_checks(size=(2, 8, 1000), dims=(128, 64)):
    """sdpa + sdpa_backward graphs built for the triton engine (the templates' heuristic knobs), run
    through ExecutionPlan.execute on CUDA tensors, against PyTorch SDPA in fp32 (relative L2)."""
    import torch.nn.functional as F

    import opgraph as og
    from opgraph.core.tensor import packed_strides

    DT = og.DataType
    out = []
    print("\n## templates end to end (g.build(engines=['triton']), execute) vs torch SDPA fp32", flush=True)
    for io, d, causal, hk in ((DT.BFLOAT16, dims[0], True, size[1]), (DT.HALF, dims[1], False, 2)):
        desc = f"{io.name} D={d} {'causal' if causal else 'full'} Hk={hk}"
        try:
            b, h, s = size
            g = og.Graph("gpu", io_data_type=io, intermediate_data_type=DT.FLOAT)
            qd, kd = (b, h, s, d), (b, hk, s, d)
            q = g.tensor(dim=list(qd), stride=packed_strides(qd, (0, 2, 1, 3)), name="q")
            k, v = (g.tensor(dim=list(kd), stride=packed_strides(kd, (0, 2, 1, 3)), name=n) for n in "kv")
            o, st = g.sdpa(q, k, v, attn_scale=d**-0.5, use_causal_mask=causal)
            o.set_output(True).set_name("o")
            st.set_output(True).set_name("stats")
            do = g.tensor(dim=list(qd), name="do")
            for x, n in zip(
                g.sdpa_backward(q, k, v, o, do, st, attn_scale=d**-0.5, use_causal_mask=causal), ("dq", "dk", "dv")
            ):
                x.set_output(True).set_name(n)
            t0 = time.time()
            plan = g.build(engines=["triton"], device=DEV)
            templates = sorted({st_.config.knob("template") for st_ in plan.steps})
            dt = {DT.BFLOAT16: torch.bfloat16, DT.HALF: torch.float16}[io]
            gen = torch.Generator(device=DEV).manual_seed(1)
            x = {
                n: torch.randn(b, s, shp[1], d, device=DEV, generator=gen).to(dt).permute(0, 2, 1, 3)
                for n, shp in (("q", qd), ("k", kd), ("v", kd))
            }
            x["do"] = torch.randn(qd, device=DEV, generator=gen).to(dt)
            final = g.final
            res = {}
            for n in ("o", "dq", "dk", "dv", "stats"):
                t = final.tensor(n)
                res[n] = torch.empty_strided(
                    t.dim, t.stride, device=DEV, dtype=torch.float32 if n == "stats" else dt
                ).fill_(float("nan"))
            pack = {final.tensor(n).uid: x[n] for n in ("q", "k", "v", "do")}
            pack.update({final.tensor(n).uid: res[n] for n in ("o", "dq", "dk", "dv", "stats")})
            plan.execute(pack)
            if not DRY:
                torch.cuda.synchronize()
            build_s = time.time() - t0
            qf, kf, vf = (x[n].float().requires_grad_() for n in "qkv")
            ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal, scale=d**-0.5, enable_gqa=True)
            ref.backward(x["do"].float())
            errs = {
                "O": rel(res["o"], ref),
                "dQ": rel(res["dq"], qf.grad),
                "dK": rel(res["dk"], kf.grad),
                "dV": rel(res["dv"], vf.grad),
            }
            ok = all(e < 2e-2 for e in errs.values())
            out.append({"case": desc, "errors": errs, "ok": ok, "templates": templates, "build_s": build_s})
            print(
                ("ok  " if ok else "BAD ")
                + desc
                + " "
                + " ".join(f"{n} {e:.1e}" for n, e in errs.items())
                + f" templates {templates} (build+run {build_s:.0f} s)",
                flush=True,
            )
        except Exception as e:  # noqa: BLE001
            out.append({"case": desc, "error": f"{type(e).__name__}: {e}"})
            print("ERR " + desc, type(e).__name__, str(e)[:400], flush=True)
    return out


def speed_row(results, B, H, S, D, causal, fk, split, fused):
    prob = {"B": B, "Hq": H, "Sq": S, "D": D, "causal": Causal.TOP_LEFT if causal else Causal.NONE}
    fspec, bspec, t = make(**prob)
    row = {"S": S, "causal": causal, "fwd": {}, "bwd": {}}
    ff, fb = flops(B, H, S, S, D, causal, "fwd"), flops(B, H, S, S, D, causal, "bwd")
    for k in fk:
        row["fwd"][_short(k)] = _try(lambda k=k: ff / bench(runner(forward(fspec, k), t)) / 1e9)
    best_f = _best(row["fwd"])
    launch(forward(fspec, fk[0]), t, interpret=DRY)
    sb, row["bwd_parts"], row["split_best"] = best_split(bspec, t, split, fb)
    row["bwd"]["split-best"] = sb
    for k in fused:
        row["bwd"][_short(k)] = _try(lambda k=k: fb / bench(runner(backward(bspec, k), t)) / 1e9)
    best_b = _best(row["bwd"])
    row["peers"] = {}
    if not DRY:
        backends = torch_backends()
        for name in ("cudnn", "flash"):
            try:
                tf, tb = time_torch(t, causal, fspec.scale, backends[name])
                row["peers"][name] = (ff / tf / 1e9, fb / tb / 1e9)
            except Exception as e:  # noqa: BLE001
                row["peers"][name] = f"error {type(e).__name__}: {str(e)[:120]}"
    cud = row["peers"].get("cudnn")
    ratio = (best_f / cud[0], best_b / cud[1]) if isinstance(cud, tuple) else (float("nan"),) * 2
    row["ratio_vs_cudnn"] = ratio
    results["speed"].append(row)
    peers = " ".join(
        f"{n} {v[0]:.0f}/{v[1]:.0f}" if isinstance(v, tuple) else f"{n} err" for n, v in row["peers"].items()
    )
    print(
        f"S={S:5d} {'causal' if causal else 'full  '} ours fwd {best_f:.0f} bwd {best_b:.0f} | {peers} "
        f"| vs cudnn fwd {ratio[0]:.2f} bwd {ratio[1]:.2f}",
        flush=True,
    )
    print("    fwd: " + "; ".join(f"{k} {_fmt(v)}" for k, v in row["fwd"].items()), flush=True)
    print(
        "    bwd: " + "; ".join(f"{k} {_fmt(v)}" for k, v in row["bwd"].items()) + f" (best parts {row['split_best']})",
        flush=True,
    )
    print(
        "    bwd parts (us: pre, dkdv, dq): "
        + "; ".join(
            f"{k} " + ("/".join(f"{x * 1e3:.0f}" for x in v) if isinstance(v, list) else str(v))
            for k, v in row["bwd_parts"].items()
        ),
        flush=True,
    )


def mod_row(results, B, H, S, D, m, fk, split, flex):
    prob = {"B": B, "Hq": H, "Sq": S, "D": D, "causal": Causal.TOP_LEFT, "mod": m}
    fspec, bspec, t = make(**prob)
    ff, fb = flops(B, H, S, S, D, True, "fwd"), flops(B, H, S, S, D, True, "bwd")
    fres = {_short(k): _try(lambda k=k: ff / bench(runner(forward(fspec, k), t)) / 1e9) for k in fk}
    launch(forward(fspec, fk[0]), t, interpret=DRY)
    ours_b, parts, best = best_split(bspec, t, split, fb)
    ours_f = _best(fres)
    o, _, _ = reference(fspec, t, False) if S <= 4096 else (None, None, {})
    err = rel(t["O"], o) if o is not None else float("nan")
    fl = (float("nan"), float("nan"))
    if flex:
        try:
            fl = time_flex(t, fspec, m)
            fl = (ff / fl[0] / 1e9, fb / fl[1] / 1e9)
        except Exception as e:  # noqa: BLE001
            print("# flex failed:", type(e).__name__, str(e)[:300], flush=True)
    row = {
        "S": S,
        "mod": m,
        "ours": (ours_f, ours_b),
        "flex": fl,
        "O_err": err,
        "fwd": fres,
        "bwd_parts": parts,
        "split_best": best,
        "ratio": (ours_f / fl[0], ours_b / fl[1]),
    }
    results["score_mod"].append(row)
    print(
        f"S={S:5d} {m:8s} ours {ours_f:.0f}/{ours_b:.0f} flex {fl[0]:.0f}/{fl[1]:.0f} "
        f"ratio {row['ratio'][0]:.2f}/{row['ratio'][1]:.2f} (O err {err:.1e}) fwd: "
        + "; ".join(f"{k} {_fmt(v)}" for k, v in fres.items())
        + f"; bwd best parts {best}",
        flush=True,
    )


def _short(k) -> str:
    flags = "".join(f" {n.lower()}" for n in ("TMA", "ORDER", "ONELOOP") if getattr(k, n, 0))
    if isinstance(k, FwdKnobs):
        return f"{k.BLOCK_M}x{k.BLOCK_N}/w{k.num_warps}s{k.num_stages}{flags}"
    if k.FUSED:
        return f"fused {k.BLOCK_M1}x{k.BLOCK_N1}+{k.BLOCK_M2}x{k.BLOCK_N2}/w{k.W1}s{k.S1}{flags}"
    return f"{k.BLOCK_M1}x{k.BLOCK_N1}/w{k.W1}s{k.S1}+{k.BLOCK_M2}x{k.BLOCK_N2}/w{k.W2}s{k.S2}{flags}"


def _try(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - recorded in the results
        return f"error {type(e).__name__}: {str(e)[:160]}"


def _best(d) -> float:
    return max((v for v in d.values() if isinstance(v, float) and not math.isnan(v)), default=float("nan"))


def _fmt(v) -> str:
    return f"{v:.0f}" if isinstance(v, float) else str(v)


_FLEX = {}


def compile_flex(t, spec):
    """FlexAttention (compiled) on the problem: (forward callable, its output, q, k, v)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _FLEX:
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    fn = _FLEX["fn"]
    q, k, v = (t[n].detach().requires_grad_() for n in ("Q", "K", "V"))
    S = q.shape[2]
    bm = create_block_mask(lambda b, h, qi, kvi: qi >= kvi, None, None, S, S, device=DEV)
    mod = spec.score_mod.flex()
    f = lambda: fn(q, k, v, score_mod=mod, block_mask=bm, scale=spec.scale)
    o = f()
    torch.autograd.grad(o, (q, k, v), t["DO"], retain_graph=True)
    return f, o, q, k, v


def time_flex(t, spec, m):
    f, o, q, k, v = compile_flex(t, spec)
    S = q.shape[2]
    ref_o, _, _ = reference(spec, t, False) if S <= 4096 else (None, None, None)
    if ref_o is not None:
        print(f"#   flex O err {rel(o.detach(), ref_o):.1e}", flush=True)
    tf = bench(f)
    do = t["DO"]
    tb = bench(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    return tf, tb


def _save(results, out):
    with open(os.path.join(out, "attention_bench.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
