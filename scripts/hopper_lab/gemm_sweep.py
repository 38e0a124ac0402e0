"""Hopper GEMM lab: which Triton kernel design reaches cuBLAS on an H100/H200, for one GPU session.

    python scripts/hopper_lab/gemm_sweep.py --budget 420 --out $OUT     # on the GPU machine
    python scripts/hopper_lab/gemm_sweep.py --selftest                   # on a CPU, TRITON_INTERPRET=1

For each shape (8192^3, the Llama / GPT-2 transformer projections at 8192 tokens, matmul + bias + GELU,
fp8 E4M3 8192^3 with per-tensor scales) it times cuBLAS (torch) and every variant of gemm_kernels.py
over its config space: the full space on the first shape, then each variant's best configs (--topk) on
the others. Every kernel is checked against an fp32 torch product (C poisoned with NaN first) before it
is timed; a failure is recorded with its reason and the sweep goes on.

Robustness: the parent process never touches CUDA. Kernels compile in a pool of child processes
(warmup into Triton's file cache; a compiler crash costs one kernel) while one measuring child times
what is compiled; a child that dies or hangs is replaced and its task recorded as failed. After
--budget seconds nothing new starts and the results are written; they are also rewritten after every
result, so a hard kill leaves what was measured. Output: OUT/gemm_sweep.json, OUT/gemm_sweep.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


# --------------------------------------------------------------------------------------------
# shapes
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    name: str
    M: int
    N: int
    K: int
    b: str = "nk"  # "nk": B is [N, K] (an nn.Linear weight, x @ W^T); "kn": B is [K, N]
    dtype: str = "bf16"  # bf16 | fp16 | fp8 (E4M3, per-tensor scales, bf16 output)
    act: int = 0  # 0 none, 2 bias + tanh GELU (cuBLASLt's GELU_BIAS epilogue: torch._addmm_activation)
    what: str = ""

    @property
    def flops(self) -> float:
        return 2.0 * self.M * self.N * self.K

    @property
    def has_bias(self) -> bool:
        return self.act != 0

    @property
    def key(self) -> tuple:  # what a compiled kernel depends on
        return (self.dtype, self.b, self.act)


T = 8192  # tokens (batch 8 x 1024)
SHAPES = [
    # first: the full sweep of every variant's space (nk: the transformer shapes reuse its kernels)
    Shape("square8k.nk", T, 8192, 8192, "nk", what="8192^3, B as an nn.Linear weight [N, K]"),
    Shape("llama.lm_head", T, 32000, 1024, what="Llama LM head 1024 -> 32000 (the issue's 460 vs 800 TFLOP/s)"),
    Shape("gpt2.mlp_up", T, 8192, 2048, what="GPT-2 d2048 MLP up 2048 -> 8192"),
    Shape("gpt2.mlp_down", T, 2048, 8192, what="GPT-2 MLP down 8192 -> 2048"),
    Shape("gpt2.qkv", T, 6144, 2048, what="GPT-2 QKV 2048 -> 6144"),
    Shape("gpt2.o", T, 2048, 2048, what="GPT-2 attention output 2048 -> 2048"),
    Shape("llama.gate_up", T, 5632, 1024, what="Llama SwiGLU gate+up fused 1024 -> 2 x 2816"),
    Shape("llama.up", T, 2816, 1024, what="Llama SwiGLU up (or gate) 1024 -> 2816"),
    Shape("llama.down", T, 1024, 2816, what="Llama SwiGLU down 2816 -> 1024"),
    Shape("llama.qkv", T, 1536, 1024, what="Llama QKV 1024 -> 16 q + 2 x 4 kv heads of 64"),
    Shape("llama.o", T, 1024, 1024, what="Llama attention output 1024 -> 1024"),
    Shape("gelu.8192x4096x4096", T, 4096, 4096, act=2, what="matmul + bias + GELU vs torch._addmm_activation"),
    Shape("gelu.gpt2.mlp_up", T, 8192, 2048, act=2, what="GPT-2 MLP up + bias + GELU"),
    Shape("square8k.kn", T, 8192, 8192, "kn", what="8192^3, B row-major [K, N] (torch.matmul(a, b))"),
    Shape(
        "fp8.square8k",
        T,
        8192,
        8192,
        dtype="fp8",
        what="fp8 E4M3 8192^3, per-tensor scales, bf16 out, vs torch._scaled_mm",
    ),
]


# --------------------------------------------------------------------------------------------
# tensors and launches (child processes; torch imported lazily)
# --------------------------------------------------------------------------------------------
def torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn, "fp32": torch.float32}[name]


class Problem:
    """The tensors of one shape on one device: A, B (layout b), bias, scales, C, the fp32 reference."""

    def __init__(self, shape: Shape, device: str, seed: int = 0):
        import torch

        self.shape = shape
        M, N, K = shape.M, shape.N, shape.K
        g = torch.Generator(device=device).manual_seed(seed)
        # A ~ U(-1, 1), B ~ N(0, 1/K): outputs of order 0.5, no overflow anywhere
        a = torch.rand(M, K, generator=g, device=device) * 2 - 1
        b_nk = torch.randn(N, K, generator=g, device=device) / math.sqrt(K)
        self.out_dtype = torch.bfloat16 if shape.dtype == "fp8" else torch_dtype(shape.dtype)
        self.sa = torch.ones(1, device=device, dtype=torch.float32)
        self.sb = torch.ones(1, device=device, dtype=torch.float32)
        if shape.dtype == "fp8":
            fp8 = torch.float8_e4m3fn
            self.sa = (a.abs().max() / 448.0).reshape(1).float()
            self.sb = (b_nk.abs().max() / 448.0).reshape(1).float()
            self.a = (a / self.sa).to(fp8)
            b_q = (b_nk / self.sb).to(fp8)
            a_ref = self.a.float() * self.sa
            b_ref = b_q.float() * self.sb
            self.b = b_q  # fp8: B is always [N, K] (wgmma's fp8 operands are K-major)
        else:
            dt = torch_dtype(shape.dtype)
            self.a = a.to(dt)
            b_q = b_nk.to(dt)
            a_ref, b_ref = self.a.float(), b_q.float()
            self.b = b_q if shape.b == "nk" else b_q.t().contiguous()  # kn: [K, N] row-major
        self.bias = (torch.randn(N, generator=g, device=device) * 0.5).to(self.out_dtype) if shape.has_bias else None
        self.c = torch.empty(M, N, device=device, dtype=self.out_dtype)
        ref = a_ref @ b_ref.t()
        if self.bias is not None:
            ref = ref + self.bias.float()
        if shape.act == 2:
            ref = torch.nn.functional.gelu(ref, approximate="tanh")
        elif shape.act == 1:
            ref = torch.nn.functional.gelu(ref)
        self.ref = ref
        self.ref_max = float(ref.abs().max())
        del a, b_nk

    @property
    def b_kmajor(self) -> bool:
        return self.shape.dtype == "fp8" or self.shape.b == "nk"

    @property
    def b_as_kn(self):
        """B as a [K, N] operand for torch (a transposed view for nk)."""
        return self.b.t() if self.b_kmajor else self.b

    def check(self, out) -> tuple[bool, float, str]:
        import torch

        if torch.isnan(out).any():
            return False, float("nan"), "NaN in C (unwritten tiles or a NaN result)"
        err = float((out.float() - self.ref).abs().max()) / max(self.ref_max, 1e-30)
        tol = {"bf16": 2e-2, "fp16": 5e-3, "fp8": 3e-2}[self.shape.dtype]
        if self.shape.act:
            tol *= 1.5
        return err <= tol, err, "" if err <= tol else f"max error {err:.3g} of max |ref| > {tol:g}"

    def library(self, fast_accum: bool = False):
        """The vendor's call for this problem (cuBLAS / cuBLASLt through torch)."""
        import torch

        s = self.shape
        a, b = self.a, self.b_as_kn
        if s.dtype == "fp8":

            def fn():
                return torch._scaled_mm(
                    a, b, scale_a=self.sa, scale_b=self.sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum
                )
        elif s.act == 2:
            bias = self.bias

            def fn():
                return torch._addmm_activation(bias, a, b, use_gelu=True)
        else:

            def fn():
                return torch.matmul(a, b)

        return fn


def launch_parts(variant_name: str, cfg: dict, p, num_sms: int, fp8_promote: int = 0):
    """(kernel, grid, args, constexprs, options) of the variant's launch on problem p (into p.c)."""
    import gemm_kernels as gk

    v = gk.VARIANTS[variant_name]
    s = p.shape
    M, N, K = s.M, s.N, s.K
    kw = gk.constexprs(
        v,
        cfg,
        b_kmajor=p.b_kmajor,
        has_bias=s.has_bias,
        act=s.act,
        scaled=s.dtype == "fp8",
        fp8_promote=fp8_promote,
        num_sms=num_sms,
    )
    bias = p.bias if p.bias is not None else p.c
    a, b, c = p.a, p.b, p.c
    BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
    tiles = triton_cdiv(M, BM) * triton_cdiv(N, BN)
    s_bk, s_bn = (b.stride(1), b.stride(0)) if p.b_kmajor else (b.stride(0), b.stride(1))
    if v.kernel == "plain":
        args = (a, b, c, bias, p.sa, p.sb, M, N, K, a.stride(0), a.stride(1), s_bk, s_bn, c.stride(0), c.stride(1))
        grid = (tiles,)
    elif v.kernel == "persistent_ptr":
        args = (a, b, c, bias, p.sa, p.sb, M, N, K, a.stride(0), a.stride(1), s_bk, s_bn)
        grid = (min(num_sms, tiles),)
    elif v.kernel in ("gluon", "gluon_ws"):
        import gemm_gluon

        out_dt = "bf16" if s.dtype == "fp8" else s.dtype
        da, db, dc = gemm_gluon.descriptors(a, b, c, M, N, K, cfg, p.b_kmajor, s.dtype, out_dt)
        args = (da, db, dc, bias, p.sa, p.sb, M, N, K)
        grid = (min(num_sms, tiles),)
    else:
        if v.desc == "host":
            from triton.tools.tensor_descriptor import TensorDescriptor

            c_bn = BN // 2 if kw.get("SUBTILE") else BN
            da = TensorDescriptor(a, [M, K], [K, 1], [BM, BK])
            db = (
                TensorDescriptor(b, [N, K], [K, 1], [BN, BK])
                if p.b_kmajor
                else TensorDescriptor(b, [K, N], [N, 1], [BK, BN])
            )
            dc = TensorDescriptor(c, [M, N], [N, 1], [BM, c_bn])
        else:
            da, db, dc = a, b, c
        args = (da, db, dc, c, bias, p.sa, p.sb, M, N, K)
        grid = (tiles,) if v.kernel == "tma" else (min(num_sms, tiles),)
    return gk.kernel_fn(v), grid, args, kw, gk.options(cfg, v)


def launcher(variant_name: str, cfg: dict, p, num_sms: int, fp8_promote: int = 0):
    """A no-argument function that runs the variant's kernel on problem p into p.c."""
    fn, grid, args, kw, opts = launch_parts(variant_name, cfg, p, num_sms, fp8_promote)

    def run():
        fn[grid](*args, **kw, **opts)

    return run


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def compile_kernel(spec: dict, num_sms: int, device: str = "cuda"):
    """Compile one kernel through Triton's JIT warmup (the launch path: same specialization, same
    file-cache entry as the timed launch) on problem-shaped stand-in arguments; the CompiledKernel."""
    s = Shape("compile", 4096, 4096, 4096, spec["b"], spec["dtype"], spec["act"])
    fn, grid, args, kw, opts = launch_parts(
        spec["variant"], spec["cfg"], _TinyProblem(s, device), num_sms, spec.get("fp8_promote", 0)
    )
    return fn.warmup(*args, grid=grid, **kw, **opts)


def compile_spec(spec: dict, num_sms: int) -> dict:
    """In a compile child: compile one kernel into Triton's file cache (the measuring child reads it)
    and load it, for its registers, spills and shared memory."""
    t0 = time.time()
    ck = compile_kernel(spec, num_sms)
    ck._init_handles()  # loads it: registers, spills; raises OutOfResources past the shared memory
    return {
        "ok": True,
        "compile_s": round(time.time() - t0, 2),
        "regs": ck.n_regs,
        "spills": ck.n_spills,
        "smem": ck.metadata.shared,
        "warps": ck.metadata.num_warps,
    }


class _TinyProblem:
    """Problem-shaped arguments for compiling: tiny buffers posing as 4096 x 4096 row-major tensors
    (the specialization of the real shapes: every size and leading stride divisible by 16, unit
    inner strides, 16-byte aligned pointers). Never read: warmup compiles only."""

    def __init__(self, shape: Shape, device: str = "cuda"):
        import torch

        self.shape = shape
        dt = torch_dtype(shape.dtype)
        self.out_dtype = torch.bfloat16 if shape.dtype == "fp8" else dt
        self.a = _FakeBig(torch.empty(64, dtype=dt, device=device), 4096)
        self.b = _FakeBig(torch.empty(64, dtype=dt, device=device), 4096)
        self.c = _FakeBig(torch.empty(64, dtype=self.out_dtype, device=device), 4096)
        self.bias = torch.empty(64, dtype=self.out_dtype, device=device) if shape.has_bias else None
        self.sa = torch.ones(1, device=device)
        self.sb = torch.ones(1, device=device)

    @property
    def b_kmajor(self) -> bool:
        return self.shape.dtype == "fp8" or self.shape.b == "nk"


class _FakeBig:
    """A real buffer's data_ptr and dtype with the sizes and strides of an n x n row-major tensor."""

    def __init__(self, t, n: int):
        self._t = t
        self.shape = (n, n)
        self._stride = (n, 1)
        self.dtype = t.dtype
        self.device = t.device

    def data_ptr(self) -> int:
        return self._t.data_ptr()

    def stride(self, i=None):
        return self._stride if i is None else self._stride[i]

    def element_size(self) -> int:
        return self._t.element_size()


# --------------------------------------------------------------------------------------------
# the measuring child
# --------------------------------------------------------------------------------------------
class Measurer:
    def __init__(self, timer: str, rep_ms: int):
        import torch
        import triton

        self.torch = torch
        self.triton = triton
        self.timer = timer
        self.rep_ms = rep_ms
        self.problem: Problem | None = None
        self.num_sms = torch.cuda.get_device_properties(0).multi_processor_count
        if hasattr(triton, "set_allocator"):
            triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))

    def _problem(self, shape: Shape) -> Problem:
        if self.problem is None or self.problem.shape != shape:
            self.problem = None
            self.torch.cuda.empty_cache()
            self.problem = Problem(shape, "cuda")
            self.torch.cuda.synchronize()
        return self.problem

    def _time(self, fn) -> float:
        from triton.testing import do_bench

        if self.timer == "graph":
            try:
                from triton.testing import do_bench_cudagraph

                return float(do_bench_cudagraph(fn, rep=self.rep_ms, return_mode="median"))
            except Exception:  # noqa: BLE001 - fall back to events
                pass
        return float(do_bench(fn, warmup=max(5, self.rep_ms // 4), rep=self.rep_ms, return_mode="median"))

    def measure(self, task: dict) -> dict:
        torch = self.torch
        shape = Shape(**task["shape"])
        p = self._problem(shape)
        if task["kind"] == "library":
            fn = p.library(task.get("fast_accum", False))
            out = fn()
        else:
            fn = launcher(task["variant"], task["cfg"], p, self.num_sms, task.get("fp8_promote", 0))
            p.c.fill_(float("nan"))
            torch.cuda.synchronize()
            t0 = time.time()
            fn()
            out = p.c
        torch.cuda.synchronize()
        first = time.time() - t0 if task["kind"] != "library" else 0.0
        ok, err, why = p.check(out)
        res: dict[str, Any] = {"ok": ok, "err": err, "first_call_s": round(first, 3)}
        if first > 1.0:  # the compile children's cache entry was not this launch's: compiled here
            res["note"] = f"first call took {first:.1f} s (compiled in the measuring process)"
        if not ok:
            res["error"] = "wrong result: " + why
            return res
        ms = self._time(fn)
        res.update(ms=ms, tflops=shape.flops / ms / 1e9)
        return res


def child_main(role: str, conn, init: dict) -> None:
    """A child process: reads tasks from conn, answers ("start", id) then ("done", id, result)."""
    if init.get("fake"):
        return _fake_child(role, conn)
    try:
        os.environ.pop("TRITON_INTERPRET", None)
        import torch

        torch.cuda.init()
        num_sms = torch.cuda.get_device_properties(0).multi_processor_count
        meas = Measurer(init["timer"], init["rep_ms"]) if role == "measure" else None
    except Exception as e:  # noqa: BLE001
        conn.send(("fatal", None, f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None, None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        tid, task = msg
        conn.send(("start", tid, None))
        t0 = time.time()
        try:
            if role == "compile":
                res = compile_spec(task, num_sms)
            else:
                res = meas.measure(task)
        except Exception as e:  # noqa: BLE001 - every failure is a finding
            text = str(e).strip()
            first = text.splitlines()[-1] if text else ""
            res = {"ok": False, "error": f"{type(e).__name__}: {first}"[:500], "trace": traceback.format_exc()[-1500:]}
            if role == "measure":
                try:
                    torch.cuda.synchronize()
                except Exception as e2:  # noqa: BLE001 - a sticky CUDA error: this child is done
                    res["error"] += f" (then {type(e2).__name__}: the CUDA context is lost)"
                    conn.send(("done", tid, {**res, "wall_s": round(time.time() - t0, 2)}))
                    return
        conn.send(("done", tid, {**res, "wall_s": round(time.time() - t0, 2)}))


def _fake_child(role: str, conn) -> None:
    """--fake: the scheduler's test without a GPU (children that compile, measure, crash and hang)."""
    import random

    if os.environ.get("HOPPER_LAB_FAKE_FATAL") == role:
        conn.send(("fatal", None, "a stand-in failure"))
        return
    conn.send(("ready", None, None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        tid, task = msg
        conn.send(("start", tid, None))
        time.sleep(random.uniform(0.01, 0.05))
        cfg = task.get("cfg", {})
        if role == "compile":
            if task["variant"] == "tma_dev" and cfg.get("BM") == 256:
                os._exit(3)
            res = {
                "ok": task["variant"] != "persist_flat_sub",
                "error": "PassManager::run failed",
                "regs": 168,
                "spills": 0,
                "smem": 1000,
                "warps": cfg.get("num_warps"),
                "compile_s": 0.1,
            }
        else:
            if task.get("variant") == "persist_ptr" and cfg.get("BN") == 256:
                time.sleep(1000)
            shape = Shape(**task["shape"])
            t = 500 + 10 * len(task.get("variant", "")) + cfg.get("num_stages", 0) if task["kind"] == "kernel" else 700
            res = {"ok": True, "err": 1e-3, "ms": shape.flops / t / 1e9, "tflops": t}
        conn.send(("done", tid, res))


# --------------------------------------------------------------------------------------------
# the parent: scheduling, workers, results
# --------------------------------------------------------------------------------------------
class Worker:
    def __init__(self, ctx, role: str, init: dict, name: str):
        self.role = role
        self.name = name
        parent, child = ctx.Pipe()
        self.conn = parent
        self.proc = ctx.Process(target=child_main, args=(role, child, init), daemon=True, name=name)
        self.proc.start()
        child.close()
        self.ready = False
        self.task: tuple[int, dict] | None = None
        self.started = 0.0
        self.dead = False

    def send(self, tid: int, task: dict) -> None:
        self.task = (tid, task)
        self.started = time.time()
        self.conn.send((tid, task))

    def kill(self) -> None:
        self.dead = True
        try:
            self.proc.kill()
            self.proc.join(5)
        except Exception:  # noqa: BLE001
            pass


class Sweep:
    def __init__(self, args):
        import multiprocessing as mp

        import gemm_kernels as gk

        self.gk = gk
        self.args = args
        self.ctx = mp.get_context("spawn")
        self.t0 = time.time()
        self.deadline = self.t0 + args.budget
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.init = {"timer": args.timer, "rep_ms": args.rep, "fake": args.fake}
        self.features = gk.features()
        names = (
            [n for n in args.variants.split(",") if n]
            if args.variants
            else [n for n, v in gk.VARIANTS.items() if v.default]
        )
        self.variants = [n for n in names if n in gk.VARIANTS]
        self.shapes = [s for s in SHAPES if not args.shapes or s.name in args.shapes.split(",")]
        if args.no_fp8:
            self.shapes = [s for s in self.shapes if s.dtype != "fp8"]
        if args.dtype != "bf16":
            self.shapes = [
                Shape(s.name, s.M, s.N, s.K, s.b, args.dtype if s.dtype != "fp8" else "fp8", s.act, s.what)
                for s in self.shapes
            ]
        self.compiled: dict[str, dict] = {}  # compile key -> result
        self.compile_waiting: dict[str, list] = {}  # compile key -> measure tasks waiting on it
        self.compile_queue: list[tuple[str, dict]] = []
        self.measure_queue: list[dict] = []
        self.results: dict[str, Any] = {"shapes": {}, "compile": [], "notes": []}
        self.next_id = 0
        self.workers: list[Worker] = []
        self.hung: set[str] = set()  # variant labels one of whose kernels hung: not run again
        self.env: dict[str, Any] = {}

    # -- bookkeeping --
    def log(self, msg: str) -> None:
        print(f"[{time.time() - self.t0:6.1f}s] {msg}", flush=True)

    def ckey(self, variant: str, cfg: dict, shape: Shape, promote: int = 0) -> str:
        return json.dumps([variant, self.gk.cfg_name(cfg), shape.key, promote])

    def shape_entry(self, s: Shape) -> dict:
        return self.results["shapes"].setdefault(
            s.name,
            {
                "M": s.M,
                "N": s.N,
                "K": s.K,
                "b": s.b,
                "dtype": s.dtype,
                "act": s.act,
                "what": s.what,
                "flops": s.flops,
                "library": {},
                "variants": {},
            },
        )

    def variant_entry(self, s: Shape, vname: str) -> dict:
        return self.shape_entry(s)["variants"].setdefault(vname, {"configs": []})

    # -- planning --
    def fp8_variants(self) -> list[tuple[str, int]]:
        out = [(n, 0) for n in self.gk.FP8_VARIANTS if n in self.variants]
        # two-level accumulation (fp32 promotion every BK elements): the precise counterpart
        out += [(n, -1) for n in ("persist", "persist_ws") if n in self.variants]
        return out

    def plan_shape(self, s: Shape, first: bool) -> None:
        """Queue the library runs and the variants' configs of shape s."""
        entry = self.shape_entry(s)
        self.measure_queue.append({"kind": "library", "shape": s.__dict__, "label": "cublas", "pos": 0})
        if s.dtype == "fp8":
            self.measure_queue.append(
                {"kind": "library", "shape": s.__dict__, "label": "cublas_fast_accum", "fast_accum": True, "pos": 0}
            )
        # cuBLAS again after the shape's kernels: clocks drift under load (the ratios use the faster)
        self.measure_queue.append({"kind": "library", "shape": s.__dict__, "label": "cublas_end", "pos": 2})
        pairs = self.fp8_variants() if s.dtype == "fp8" else [(n, 0) for n in self.variants]
        for vname, promote in pairs:
            v = self.gk.VARIANTS[vname]
            label = vname + ("+promote" if promote else "")
            missing = [f"{f}: {self.features[f]}" for f in v.needs if self.features.get(f)]
            if missing:
                self.variant_entry(s, label)["skipped"] = "; ".join(missing)
                continue
            elem = 1 if s.dtype == "fp8" else 2
            cfgs = v.configs(elem)
            if s.dtype == "fp8":
                cfgs = [c for c in cfgs if c["BK"] <= 128] or cfgs
            if not first and s.dtype != "fp8":
                cfgs = self.best_configs(vname, cfgs)
                if cfgs is None:
                    self.variant_entry(s, label)["skipped"] = "no config of it ran on the first shape"
                    continue
            for cfg in cfgs:
                pr = cfg["BK"] if promote < 0 else promote
                key = self.ckey(vname, cfg, s, pr)
                task = {
                    "kind": "kernel",
                    "shape": s.__dict__,
                    "variant": vname,
                    "cfg": cfg,
                    "label": label,
                    "fp8_promote": pr,
                    "ckey": key,
                }
                self.need_compile(
                    key,
                    {"variant": vname, "cfg": cfg, "dtype": s.dtype, "b": s.b, "act": s.act, "fp8_promote": pr},
                    task,
                )
        del entry

    def best_configs(self, vname: str, space: list[dict]) -> list[dict] | None:
        """Configs of vname for a later shape: its --topk best on the first shape, plus its best
        128x128 config (more tiles for narrow N) when not among them."""
        first = self.results["shapes"].get(self.shapes[0].name, {}).get("variants", {}).get(vname)
        if not first:
            return None
        ran = sorted([c for c in first["configs"] if c.get("tflops")], key=lambda c: -c["tflops"])
        if not ran:
            return None
        by_name = {self.gk.cfg_name(c): c for c in space}
        picked = [by_name[c["cfg"]] for c in ran[: self.args.topk] if c["cfg"] in by_name]
        mid = next((by_name[c["cfg"]] for c in ran if c["cfg"] in by_name and by_name[c["cfg"]]["BN"] == 128), None)
        if mid is not None and mid not in picked:
            picked.append(mid)
        return picked

    def need_compile(self, key: str, spec: dict, task: dict) -> None:
        if key in self.compiled:
            if self.compiled[key].get("ok"):
                self.measure_queue.append(task)
            else:
                self.record(task, {"ok": False, "error": "compile: " + self.compiled[key].get("error", "?")})
            return
        if key in self.compile_waiting:
            self.compile_waiting[key].append(task)
            return
        self.compile_waiting[key] = [task]
        self.compile_queue.append((key, spec))

    # -- results --
    def record(self, task: dict, res: dict) -> None:
        s = Shape(**task["shape"])
        if task["kind"] == "library":
            entry = self.shape_entry(s)["library"]
            entry[task["label"]] = {k: res.get(k) for k in ("ok", "ms", "tflops", "err", "error")}
            if res.get("tflops"):
                self.log(f"{s.name:22s} {task['label']:26s} {res['tflops']:7.1f} TFLOP/s  {res['ms'] * 1e3:9.1f} us")
            else:
                self.log(f"{s.name:22s} {task['label']:26s} FAILED {res.get('error')}")
        else:
            ve = self.variant_entry(s, task["label"])
            row = {
                "cfg": self.gk.cfg_name(task["cfg"]),
                **{k: res.get(k) for k in ("ok", "ms", "tflops", "err", "error", "first_call_s", "note")},
            }
            ve["configs"].append(row)
            ok = [c for c in ve["configs"] if c.get("tflops")]
            if ok:
                ve["best"] = max(ok, key=lambda c: c["tflops"])
            lib = self.shape_entry(s)["library"].get("cublas", {}).get("tflops")
            if res.get("tflops"):
                ratio = f" ({res['tflops'] / lib:.2f}x cuBLAS)" if lib else ""
                note = f"  [{res['note']}]" if res.get("note") else ""
                self.log(f"{s.name:22s} {task['label']:18s} {row['cfg']:26s} {res['tflops']:7.1f} TFLOP/s{ratio}{note}")
            else:
                self.log(f"{s.name:22s} {task['label']:18s} {row['cfg']:26s} FAILED {res.get('error')}")
        self.write()

    def write(self) -> None:
        self.results["env"] = {
            **self.env,
            "elapsed_s": round(time.time() - self.t0, 1),
            "budget_s": self.args.budget,
            "features": self.features,
            "variants": {n: self.gk.VARIANTS[n].what for n in self.variants},
        }
        tmp = self.out / "gemm_sweep.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        tmp.replace(self.out / "gemm_sweep.json")
        (self.out / "gemm_sweep.md").write_text(markdown(self.results, self.variants))

    # -- the loop --
    def spawn(self, role: str) -> Worker:
        w = Worker(self.ctx, role, self.init, f"{role}-{len(self.workers)}")
        self.workers.append(w)
        return w

    def run(self) -> None:
        from multiprocessing.connection import wait

        self.log(
            f"budget {self.args.budget:.0f} s, {len(self.variants)} variants, {len(self.shapes)} shapes, "
            f"{self.args.jobs} compile processes; features: "
            + ", ".join(f"{k}={'yes' if v is None else 'NO'}" for k, v in self.features.items())
        )
        self.env = probe_env()
        self.log("env: " + ", ".join(f"{k}={v}" for k, v in self.env.items()))
        self.plan_shape(self.shapes[0], first=True)
        planned = 1
        measurer = self.spawn("measure")
        compilers = [self.spawn("compile") for _ in range(self.args.jobs)]
        stopping = False
        while True:
            now = time.time()
            if now > self.deadline and not stopping:
                stopping = True
                self.log("budget spent: no new tasks; writing results")
                self.results["notes"].append(
                    f"stopped by the budget at {now - self.t0:.0f} s with "
                    f"{len(self.measure_queue)} measurements and {len(self.compile_queue)} "
                    "compiles not run"
                )
            # plan later shapes once the first shape's measurements are all done
            first_pending = (
                any(Shape(**t["shape"]) == self.shapes[0] for t in self.measure_queue)
                or any(
                    Shape(**t["shape"]) == self.shapes[0]
                    for w in self.workers
                    if w.task and w.role == "measure"
                    for t in [w.task[1]]
                )
                or any(Shape(**t["shape"]) == self.shapes[0] for ts in self.compile_waiting.values() for t in ts)
            )
            while planned < len(self.shapes) and not first_pending and not stopping:
                self.plan_shape(self.shapes[planned], first=False)
                planned += 1
            # no compile process could start (fatal): the measuring process compiles at first launch
            if self.compile_queue and not any(not w.dead for w in compilers):
                for key, spec in self.compile_queue:
                    self.on_compiled({**spec, "key": key}, {"ok": True, "note": "compiled in the measuring process"})
                self.compile_queue = []
            if (
                measurer.dead
                and not measurer.proc.is_alive()
                and measurer.ready is False
                and not stopping
                and any("measure" in n and "could not start" in n for n in self.results["notes"])
            ):
                self.log("the measuring process could not start: stopping")
                stopping = True
                self.deadline = time.time()
            # hand out work
            if not stopping:
                for w in compilers:
                    if w.ready and w.task is None and not w.dead and self.compile_queue:
                        key, spec = self.compile_queue.pop(0)
                        w.send(self.new_id(), {**spec, "key": key})
                while measurer.ready and measurer.task is None and not measurer.dead and self.measure_queue:
                    task = self.next_measurement()
                    if task is None:
                        break
                    if task.get("label") in self.hung and task["kind"] == "kernel":
                        self.record(task, {"ok": False, "error": "not run: a kernel of this variant hung before"})
                        continue
                    measurer.send(self.new_id(), task)
            busy = [w for w in self.workers if not w.dead and w.task is not None]
            idle_work = self.compile_queue or self.measure_queue or self.compile_waiting
            if stopping and not busy:
                break
            if not stopping and not busy and not idle_work and planned >= len(self.shapes):
                break
            if stopping and time.time() > self.deadline + self.args.grace:
                self.log("grace period over: ending the tasks in flight")
                for w in busy:
                    self.fail_task(w, "ended at the budget")
                break
            # wait for messages
            live = [w for w in self.workers if not w.dead]
            ready = wait([w.conn for w in live] + [w.proc.sentinel for w in live], timeout=0.5)
            for w in live:
                if w.conn in ready:
                    try:
                        while w.conn.poll():
                            self.on_message(w, w.conn.recv())
                    except (EOFError, OSError):
                        pass
                if not w.proc.is_alive() and not w.dead:
                    w.dead = True
                    if w.task is not None:
                        self.fail_task(w, f"the {w.role} process died (exit code {w.proc.exitcode})")
                    if not stopping:
                        repl = self.spawn(w.role)
                        if w.role == "measure":
                            measurer = repl
                        else:
                            compilers[compilers.index(w)] = repl
                elif w.task is not None and not w.dead:
                    limit = self.args.compile_timeout if w.role == "compile" else self.args.measure_timeout
                    if time.time() - w.started > limit:
                        if w.role == "measure" and w.task[1]["kind"] == "kernel":
                            self.hung.add(w.task[1]["label"])
                        self.fail_task(w, f"timed out after {limit:.0f} s (hang?)")
                        w.kill()
                        if not stopping:
                            repl = self.spawn(w.role)
                            if w.role == "measure":
                                measurer = repl
                            else:
                                compilers[compilers.index(w)] = repl
        for w in self.workers:
            if not w.dead:
                try:
                    w.conn.send(None)
                except Exception:  # noqa: BLE001
                    pass
        time.sleep(0.5)
        for w in self.workers:
            if w.proc.is_alive():
                w.kill()
        self.results["notes"].append(f"finished at {time.time() - self.t0:.0f} s")
        self.write()
        self.log(f"wrote {self.out / 'gemm_sweep.json'} and {self.out / 'gemm_sweep.md'}")
        print(markdown(self.results, self.variants, summary_only=True), flush=True)

    def next_measurement(self) -> dict | None:
        """The first queued measurement that may run now: a shape's closing cuBLAS run waits until
        none of the shape's kernels is still compiling."""
        for i, task in enumerate(self.measure_queue):
            if task.get("pos") == 2:
                shape = task["shape"]
                if any(t["shape"] == shape for ts in self.compile_waiting.values() for t in ts) or any(
                    t["shape"] == shape and t.get("pos", 1) < 2 for t in self.measure_queue
                ):
                    continue
            return self.measure_queue.pop(i)
        return None

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def fail_task(self, w: Worker, why: str) -> None:
        tid, task = w.task
        w.task = None
        if w.role == "compile":
            self.on_compiled(task, {"ok": False, "error": why})
        else:
            self.record(task, {"ok": False, "error": why})

    def on_message(self, w: Worker, msg) -> None:
        kind, tid, payload = msg
        if kind == "ready":
            w.ready = True
        elif kind == "fatal":
            self.log(f"{w.name} could not start: {payload}")
            self.results["notes"].append(f"{w.name} could not start: {payload}")
            w.dead = True
        elif kind == "start":
            w.started = time.time()
        elif kind == "done":
            task = w.task[1] if w.task else None
            w.task = None
            if task is None:
                return
            if w.role == "compile":
                self.on_compiled(task, payload)
            else:
                self.record(task, payload)

    def on_compiled(self, spec: dict, res: dict) -> None:
        key = spec["key"]
        self.compiled[key] = res
        row = {
            "variant": spec["variant"],
            "cfg": self.gk.cfg_name(spec["cfg"]),
            "dtype": spec["dtype"],
            "b": spec["b"],
            "act": spec["act"],
            "fp8_promote": spec.get("fp8_promote", 0),
            **{k: res.get(k) for k in ("ok", "error", "regs", "spills", "smem", "warps", "compile_s")},
        }
        self.results["compile"].append(row)
        if not res.get("ok"):
            self.log(f"compile {row['variant']:18s} {row['cfg']:26s} {row['dtype']} FAILED {res.get('error')}")
        elif res.get("spills"):
            self.log(f"compile {row['variant']:18s} {row['cfg']:26s} spills {res['spills']} bytes ({res['regs']} regs)")
        for task in self.compile_waiting.pop(key, []):
            if res.get("ok"):
                # measure the first shape's configs in the order they were planned
                self.measure_queue.append(task)
            else:
                self.record(task, {"ok": False, "error": "compile: " + str(res.get("error"))})
        order = {json.dumps(s.__dict__, sort_keys=True): i for i, s in enumerate(self.shapes)}
        self.measure_queue.sort(key=lambda t: (order.get(json.dumps(t["shape"], sort_keys=True), 99), t.get("pos", 1)))


def probe_env() -> dict:
    """Versions, without touching CUDA in this process (nvidia-smi for the GPU)."""
    import platform
    import subprocess

    env: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        env["triton"] = f"unavailable: {e}"
    try:
        from importlib.metadata import version

        env["torch"] = version("torch")
    except Exception:  # noqa: BLE001
        pass
    try:
        q = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        env["gpu"] = q.stdout.strip()
    except Exception as e:  # noqa: BLE001
        env["gpu"] = f"nvidia-smi failed: {e}"
    return env


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------
def markdown(res: dict, variants: list[str], summary_only: bool = False) -> str:
    env = res.get("env", {})
    lines = [
        f"# Hopper GEMM lab: {env.get('gpu', '?')}",
        f"torch {env.get('torch')}, Triton {env.get('triton')}, {env.get('elapsed_s')} s of a {env.get('budget_s')} s "
        "budget. TFLOP/s from the median of triton.testing.do_bench (L2 flushed between runs); "
        "every number's output was checked against an fp32 torch product first. cuBLAS: the faster of its runs "
        "before and after the shape's kernels (clocks drift under load).",
        "",
    ]
    seen = {v for sh in res["shapes"].values() for v in sh["variants"]}
    labels = [v for v in variants if v in seen]
    labels += sorted(seen - set(labels))  # (the fp8 "+promote" rows)
    lines += [
        "## Best TFLOP/s per variant (ratio to cuBLAS)",
        "",
        "| shape | M x N x K | cuBLAS | " + " | ".join(labels) + " | best |",
        "|---|---|---|" + "---|" * len(labels) + "---|",
    ]
    for name, sh in res["shapes"].items():
        lib = sh["library"].get("cublas", {})
        lt = max([sh["library"].get(k, {}).get("tflops") or 0 for k in ("cublas", "cublas_end")]) or None
        cells = []
        best = None
        for v in labels:
            ve = sh["variants"].get(v)
            if ve is None:
                cells.append("")
            elif ve.get("best"):
                t = ve["best"]["tflops"]
                cells.append(f"{t:.0f}" + (f" ({t / lt:.2f})" if lt else ""))
                if best is None or t > best[1]:
                    best = (v, t, ve["best"]["cfg"])
            elif ve.get("skipped"):
                cells.append("skip")
            else:
                cells.append("fail" if ve.get("configs") else "")
        bcell = f"{best[0]} {best[2]}: {best[1] / lt:.2f}x" if best and lt else (best[0] if best else "")
        lines.append(
            f"| {name} | {sh['M']}x{sh['N']}x{sh['K']} {sh['b']} {sh['dtype']}{' +bias+gelu' if sh['act'] else ''} "
            f"| {lt:.0f} | "
            if lt
            else f"| {name} | {sh['M']}x{sh['N']}x{sh['K']} | {lib.get('error', '-')} | "
        )
        lines[-1] += " | ".join(cells) + f" | {bcell} |"
    if summary_only:
        return "\n".join(lines)
    lines += ["", "## Library rows", ""]
    for name, sh in res["shapes"].items():
        for lab, r in sh["library"].items():
            lines.append(
                f"- {name} {lab}: "
                + (
                    f"{r['tflops']:.1f} TFLOP/s, {r['ms'] * 1e3:.1f} us, err {r['err']:.2g}"
                    if r.get("tflops")
                    else f"FAILED {r.get('error')}"
                )
            )
    lines += ["", "## Every config (TFLOP/s, or why not)", ""]
    for name, sh in res["shapes"].items():
        lines.append(f"### {name}: {sh['what']}")
        for v, ve in sh["variants"].items():
            if ve.get("skipped"):
                lines.append(f"- {v}: skipped: {ve['skipped']}")
                continue
            parts = []
            for c in sorted(ve["configs"], key=lambda c: -(c.get("tflops") or 0)):
                parts.append(f"{c['cfg']}: {c['tflops']:.0f}" if c.get("tflops") else f"{c['cfg']}: {c.get('error')}")
            lines.append(f"- {v}: " + "; ".join(parts))
        lines.append("")
    comp = res.get("compile", [])
    if comp:
        lines += [
            "## Compiles (registers, spills, shared memory as loaded on the GPU)",
            "",
            "| variant | config | dtype | B | act | ok | regs | spills | smem | warps | s | error |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in comp:
            lines.append(
                f"| {r['variant']}{'+promote' if r.get('fp8_promote') else ''} | {r['cfg']} | {r['dtype']} | "
                f"{r['b']} | {r['act']} | {r['ok']} | {r.get('regs')} | {r.get('spills')} | {r.get('smem')} | "
                f"{r.get('warps')} | {r.get('compile_s')} | {str(r.get('error') or '')[:160]} |"
            )
    lines += ["", "## Variants", ""] + [f"- {n}: {w}" for n, w in env.get("variants", {}).items()]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in res.get("notes", [])]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# selftest: every variant under the interpreter on a CPU
# --------------------------------------------------------------------------------------------
def selftest(args) -> int:
    os.environ["TRITON_INTERPRET"] = "1"
    import gemm_kernels as gk
    import torch

    feats = gk.features()
    if hasattr(__import__("triton"), "set_allocator"):
        import triton

        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))
    cases = [  # (M, N, K, config): ragged edges on the small tiles, several tiles and K steps
        (72, 80, 96, {"BM": 32, "BN": 32, "BK": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}),
        (128, 128, 128, {"BM": 64, "BN": 64, "BK": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 2}),
    ]
    names = [n for n in args.variants.split(",") if n] if args.variants else list(gk.VARIANTS)
    failures = 0
    total = 0
    for vname in names:
        v = gk.VARIANTS[vname]
        missing = [f for f in v.needs if feats.get(f)]
        if missing:
            print(f"SKIP {vname}: " + "; ".join(f"{f}: {feats[f]}" for f in missing))
            continue
        if v.kernel.startswith("gluon"):
            print(f"SKIP {vname}: Gluon kernels do not run under the interpreter (compile_check.py compiles it)")
            continue
        for dtype, b, act in (
            ("fp16", "nk", 0),
            ("fp16", "kn", 0),
            ("bf16", "nk", 2),
            ("fp8", "nk", 0),
            ("fp16", "kn", 1),
        ):
            if dtype == "fp8" and vname not in gk.FP8_VARIANTS:
                continue
            for M, N, K, cfg in cases:
                cfg = dict(cfg)
                if dtype == "fp8":
                    cfg["BK"] = max(cfg["BK"], 32)
                s = Shape(f"selftest.{vname}", M, N, K, b, dtype, act)
                total += 1
                try:
                    p = Problem(s, "cpu", seed=M + N + K)
                    p.c.fill_(float("nan"))
                    run = launcher(vname, cfg, p, num_sms=3, fp8_promote=cfg["BK"] if dtype == "fp8" and act else 0)
                    run()
                    ok, err, why = p.check(p.c)
                except Exception as e:  # noqa: BLE001
                    ok, err, why = (
                        False,
                        float("nan"),
                        f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}",
                    )
                failures += not ok
                print(
                    f"{'ok  ' if ok else 'FAIL'} {vname:18s} {dtype} B {b} act {act} {M}x{N}x{K} "
                    f"{gk.cfg_name(cfg):22s} err {err:.2e} {why}",
                    flush=True,
                )
    print(f"{total - failures} passed, {failures} failed")
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=float, default=420, help="seconds after which nothing new starts (default 420)")
    ap.add_argument("--grace", type=float, default=15, help="seconds the tasks in flight get after the budget")
    ap.add_argument("--out", default=os.environ.get("OUT", "hopper_lab_out"), help="output folder (default $OUT)")
    ap.add_argument("--shapes", default="", help="comma-separated shape names (default: all, in priority order)")
    ap.add_argument("--variants", default="", help="comma-separated variant names (default: the default ones)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"], help="the 16-bit type of the non-fp8 rows")
    ap.add_argument("--no-fp8", action="store_true", help="leave the fp8 row out")
    ap.add_argument("--topk", type=int, default=3, help="configs per variant on the shapes after the first")
    ap.add_argument("--jobs", type=int, default=max(1, min(14, (os.cpu_count() or 4) - 3)), help="compile processes")
    ap.add_argument("--rep", type=int, default=40, help="do_bench rep (ms) per measurement")
    ap.add_argument(
        "--timer",
        default="bench",
        choices=["bench", "graph"],
        help="bench: do_bench with L2 flushes; graph: do_bench_cudagraph (warm L2)",
    )
    ap.add_argument("--compile-timeout", type=float, default=240)
    ap.add_argument("--measure-timeout", type=float, default=30)
    ap.add_argument("--selftest", action="store_true", help="run every variant under TRITON_INTERPRET=1 on the CPU")
    ap.add_argument("--fake", action="store_true", help=argparse.SUPPRESS)  # the scheduler's own test
    ap.add_argument("--list", action="store_true", help="print variants, their configs and the shapes, then exit")
    args = ap.parse_args()
    if args.selftest:
        return selftest(args)
    if args.list:
        import gemm_kernels as gk

        for n, v in gk.VARIANTS.items():
            print(f"{n:18s} default={v.default} {len(v.configs(2))} bf16 configs, {len(v.configs(1))} fp8: {v.what}")
        for s in SHAPES:
            print(f"{s.name:22s} {s.M}x{s.N}x{s.K} {s.b} {s.dtype} act={s.act}: {s.what}")
        return 0
    Sweep(args).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
