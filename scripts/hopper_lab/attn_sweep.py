"""Hopper attention lab: a flash-attention forward in Triton 3.6 (TMA descriptors, optional
warp_specialize) against cuDNN's SDPA, bf16, D 128, B 4, H 16, S 1k / 4k / 16k, causal and not.

    python scripts/hopper_lab/attn_sweep.py --budget 150 --out $OUT     # on the GPU machine
    python scripts/hopper_lab/attn_sweep.py --selftest                   # on a CPU, TRITON_INTERPRET=1
    python scripts/hopper_lab/attn_sweep.py --compile-check              # sm_90 compile without a GPU

The kernel is the FlashAttention-2 algorithm as Triton's tutorial 06 writes it for Hopper (own code):
one program per (BLOCK_M query rows, batch x head), K/V tiles through host TensorDescriptors (TMA),
online softmax in exp2, the causal case as an unmasked off-diagonal loop plus a masked diagonal loop.
Variants: fa_tma (TMA store of O), fa_ws (the KV loop under tl.range(warp_specialize=True), the
compiler's producer/consumer split; pointer store of O, as 3.6's Hopper WS needs; it hangs on an H200),
gluon_ws (attn_gluon.py: the FA3 split written out in Gluon, a loader warp and two consumer warpgroups;
`--variants gluon_ws` runs it alone). Every output is
checked against cuDNN's (or, failing that, the flash backend's) before it is timed; each config runs
in a child process with a timeout, so a hang or a crash costs that config only. Results:
OUT/attn_sweep.json and OUT/attn_sweep.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _attn_inner(
    acc,
    l_i,
    m_i,
    q,
    k_desc,
    v_desc,
    kv_row0,
    lo,
    hi,
    offs_m,
    qk_scale,
    BN: tl.constexpr,
    MASKED: tl.constexpr,
    WS: tl.constexpr,
):
    for start_n in tl.range(lo, hi, BN, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BN)
        k = k_desc.load([kv_row0 + start_n, 0])
        qk = tl.dot(q, k.T)
        if MASKED:
            offs_n = start_n + tl.arange(0, BN)
            qk = qk * qk_scale + tl.where(offs_m[:, None] >= offs_n[None, :], 0.0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk -= m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = v_desc.load([kv_row0 + start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def attn_fwd(
    q_desc,
    k_desc,
    v_desc,
    o_desc,
    o_ptr,
    sm_scale,
    S,
    D: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    CAUSAL: tl.constexpr,
    WS: tl.constexpr,
    O_TMA: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """Q, K, V, O: [B * H * S, D] row-major views (one row per (batch, head, position))."""
    start_m = tl.program_id(0)
    row0 = tl.program_id(1) * S
    offs_m = start_m * BM + tl.arange(0, BM)
    m_i = tl.zeros([BM], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BM], dtype=tl.float32) + 1.0
    acc = tl.zeros([BM, D], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504  # exp(x) = exp2(x / ln 2)
    q = q_desc.load([row0 + start_m * BM, 0])
    if CAUSAL and SPLIT:  # unmasked blocks left of the diagonal, then the diagonal block masked
        acc, l_i, m_i = _attn_inner(
            acc, l_i, m_i, q, k_desc, v_desc, row0, 0, start_m * BM, offs_m, qk_scale, BN, False, WS
        )
        acc, l_i, m_i = _attn_inner(
            acc, l_i, m_i, q, k_desc, v_desc, row0, start_m * BM, (start_m + 1) * BM, offs_m, qk_scale, BN, True, WS
        )
    elif CAUSAL:  # one loop, every block masked (3.6's Hopper warp specialization fails on two loops)
        acc, l_i, m_i = _attn_inner(
            acc, l_i, m_i, q, k_desc, v_desc, row0, 0, (start_m + 1) * BM, offs_m, qk_scale, BN, True, WS
        )
    else:
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, k_desc, v_desc, row0, 0, S, offs_m, qk_scale, BN, False, WS)
    out = (acc / l_i[:, None]).to(o_ptr.dtype.element_ty)
    if O_TMA:
        o_desc.store([row0 + start_m * BM, 0], out)
    else:
        offs_d = tl.arange(0, D)
        tl.store(o_ptr + (row0 + offs_m)[:, None] * D + offs_d[None, :], out)


VARIANTS = {
    "fa_tma": (
        {"WS": 0, "O_TMA": 1, "SPLIT": 1},
        "FA2 forward, TMA descriptors for Q/K/V/O (Triton tutorial 06's Hopper path)",
    ),
    "fa_ws": (
        {"WS": 1, "O_TMA": 0, "SPLIT": 0},
        "fa_tma with the KV loop under tl.range(warp_specialize=True), pointer store of O, causal as one "
        "masked loop (two loops failed to compile with 3.6)",
    ),
    "gluon_ws": (
        {},
        "Gluon FA3 split (attn_gluon.py): a 1-warp TMA loader and two consumer warpgroups of BM rows each, "
        "async wgmma, P as the register operand; the causal case masks every block",
    ),
}
GLUON = ("gluon_ws",)  # variants of attn_gluon.py (compiled, never interpreted)


def configs(variant: str) -> list[dict]:
    if variant in GLUON:  # (BM rows a consumer: 2 x BM a program; num_stages names the ring's slots)
        import attn_gluon

        return [{**c, "num_warps": 4, "num_stages": c["STAGES"]} for c in attn_gluon.CONFIGS]
    if variant == "fa_ws":  # 3.6's Hopper autoWS partitions at num_warps 4 (two consumer warpgroups + producer)
        return [{"BM": 128, "BN": 128, "num_warps": 4, "num_stages": 2}] + [
            {"BM": 128, "BN": 64, "num_warps": 4, "num_stages": s} for s in (2, 3)
        ]
    return (
        [{"BM": 128, "BN": 128, "num_warps": 8, "num_stages": s} for s in (2, 3)]
        + [{"BM": 128, "BN": 64, "num_warps": 8, "num_stages": s} for s in (2, 3, 4)]
        + [{"BM": 64, "BN": 64, "num_warps": 4, "num_stages": 3}]
    )


def cfg_name(c: dict) -> str:
    return f"{c['BM']}x{c['BN']} w{c['num_warps']} s{c['num_stages']}"


SHAPES = [(4, 16, s, 128, causal) for s in (1024, 4096, 16384) for causal in (False, True)]


def shape_name(sh) -> str:
    B, H, S, D, causal = sh
    return f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}"


def flops(sh) -> float:
    B, H, S, D, causal = sh
    return 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)


def launch_parts(variant: str, cfg: dict, q, k, v, o, causal: bool):
    from triton.tools.tensor_descriptor import TensorDescriptor

    B, H, S, D = q.shape
    rows = B * H * S
    if variant in GLUON:
        import attn_gluon
        import torch

        gl_dtype = attn_gluon.gl.bfloat16 if q.dtype == torch.bfloat16 else attn_gluon.gl.float16
        views = [t.reshape(rows, D) for t in (q, k, v, o)]
        descs = attn_gluon.descriptors(*views, cfg["BM"], cfg["BN"], D, gl_dtype)
        lse = torch.empty(rows, device=q.device, dtype=torch.float32)
        grid = (S // (attn_gluon.CONSUMERS * cfg["BM"]), B * H)
        kw = {"CAUSAL": causal, "BLOCK_N": cfg["BN"], "STAGES": cfg["STAGES"]}
        args = (*descs, lse, S, attn_gluon.LOG2E / D**0.5)
        return attn_gluon.gl_attn_fwd, grid, args, kw, {"num_warps": cfg["num_warps"]}
    views = [t.reshape(rows, D) if hasattr(t, "reshape") else t for t in (q, k, v, o)]
    qd = TensorDescriptor(views[0], [rows, D], [D, 1], [cfg["BM"], D])
    kd = TensorDescriptor(views[1], [rows, D], [D, 1], [cfg["BN"], D])
    vd = TensorDescriptor(views[2], [rows, D], [D, 1], [cfg["BN"], D])
    od = TensorDescriptor(views[3], [rows, D], [D, 1], [cfg["BM"], D])
    knobs, _ = VARIANTS[variant]
    kw = {"D": D, "BM": cfg["BM"], "BN": cfg["BN"], "CAUSAL": int(causal), **knobs}
    opts = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    grid = (S // cfg["BM"], B * H)
    return attn_fwd, grid, (qd, kd, vd, od, views[3], 1.0 / D**0.5, S), kw, opts


# --------------------------------------------------------------------------------------------
# the measuring child
# --------------------------------------------------------------------------------------------
class AttnMeasurer:
    def __init__(self, rep_ms: int):
        import torch

        self.torch = torch
        self.rep_ms = rep_ms
        self.key = None

    def _problem(self, sh):
        torch = self.torch
        if self.key != sh:
            self.key = None
            self.q = self.k = self.v = self.o = self.ref = None
            torch.cuda.empty_cache()
            B, H, S, D, causal = sh
            g = torch.Generator(device="cuda").manual_seed(0)
            self.q, self.k, self.v = (
                torch.randn(B, H, S, D, generator=g, device="cuda").to(torch.bfloat16) for _ in range(3)
            )
            self.o = torch.empty_like(self.q)
            self.ref = None
            self.key = sh
        return self.key

    def library(self, sh, backend: str):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
        causal = sh[4]

        def fn():
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(self.q, self.k, self.v, is_causal=causal)

        return fn

    def reference(self, sh):
        """cuDNN's output (else the flash backend's, else the memory-efficient one's) in fp32."""
        for backend in ("cudnn", "flash"):
            try:
                out = self.library(sh, backend)()
                self.torch.cuda.synchronize()
                return out.float()
            except Exception:  # noqa: BLE001 - try the next backend
                continue
        return None

    def measure(self, task: dict) -> dict:
        from triton.testing import do_bench

        torch = self.torch
        sh = tuple(task["shape"])
        self._problem(sh)
        if task["kind"] == "library":
            fn = self.library(sh, task["label"])
            out = fn()
            torch.cuda.synchronize()
            if self.ref is None:
                self.ref = out.float()
            err = float((out.float() - self.ref).abs().max())
        else:
            kern, grid, args, kw, opts = launch_parts(
                task["variant"], task["cfg"], self.q, self.k, self.v, self.o, sh[4]
            )

            def fn():
                kern[grid](*args, **kw, **opts)

            self.o.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            if self.ref is None:
                self.ref = self.reference(sh)
            if self.ref is None:
                return {"ok": False, "error": "no SDPA backend ran to check against"}
            if torch.isnan(self.o).any():
                return {"ok": False, "error": "NaN in O"}
            err = float((self.o.float() - self.ref).abs().max())
        if err > 2e-2:
            return {"ok": False, "err": err, "error": f"max |O - cuDNN's O| = {err:.3g} > 0.02"}
        ms = float(do_bench(fn, warmup=max(5, self.rep_ms // 4), rep=self.rep_ms, return_mode="median"))
        return {"ok": True, "err": err, "ms": ms, "tflops": flops(sh) / ms / 1e9}


def _fake_child(conn) -> None:
    """--fake: the scheduler's own test without a GPU (a hang and a crash included)."""
    conn.send(("ready", None, None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        tid, task = msg
        time.sleep(0.02)
        cfg = task.get("cfg", {})
        if task.get("label") == "fa_ws" and cfg.get("BN") == 128:
            time.sleep(1000)
        if task.get("label") == "fa_tma" and cfg.get("num_stages") == 4:
            os._exit(5)
        t = 400.0 if task["kind"] == "library" else 300.0 + cfg.get("num_stages", 0)
        conn.send(("done", tid, {"ok": True, "err": 1e-3, "ms": flops(tuple(task["shape"])) / t / 1e9, "tflops": t}))


def child_main(conn, init: dict) -> None:
    if init.get("fake"):
        return _fake_child(conn)
    try:
        os.environ.pop("TRITON_INTERPRET", None)
        import torch

        torch.cuda.init()
        meas = AttnMeasurer(init["rep_ms"])
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
        t0 = time.time()
        try:
            res = meas.measure(task)
        except Exception as e:  # noqa: BLE001
            text = str(e).strip()
            res = {
                "ok": False,
                "error": f"{type(e).__name__}: {text.splitlines()[-1] if text else ''}"[:500],
                "trace": traceback.format_exc()[-1200:],
            }
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 - a sticky CUDA error: this child is done
                conn.send(("done", tid, {**res, "wall_s": round(time.time() - t0, 2)}))
                return
        conn.send(("done", tid, {**res, "wall_s": round(time.time() - t0, 2)}))


def sweep(args) -> None:
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    t0 = time.time()
    deadline = t0 + args.budget
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = []
    for sh in SHAPES:
        tasks.append({"kind": "library", "shape": sh, "label": "cudnn"})
        tasks.append({"kind": "library", "shape": sh, "label": "flash"})
        for v in args.variants.split(",") if args.variants else VARIANTS:
            for c in configs(v):
                tasks.append({"kind": "kernel", "shape": sh, "variant": v, "cfg": c, "label": v})
    results: dict = {"env": {"triton": triton.__version__, "budget_s": args.budget}, "shapes": {}, "notes": []}
    hung: set[str] = set()

    def log(msg):
        print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)

    def record(task, res):
        entry = results["shapes"].setdefault(
            shape_name(task["shape"]), {"flops": flops(task["shape"]), "library": {}, "variants": {}}
        )
        if task["kind"] == "library":
            entry["library"][task["label"]] = res
        else:
            ve = entry["variants"].setdefault(task["label"], {"configs": []})
            ve["configs"].append(
                {"cfg": cfg_name(task["cfg"]), **{k: res.get(k) for k in ("ok", "ms", "tflops", "err", "error")}}
            )
            okc = [c for c in ve["configs"] if c.get("tflops")]
            if okc:
                ve["best"] = max(okc, key=lambda c: c["tflops"])
        what = f"{res['tflops']:7.1f} TFLOP/s" if res.get("tflops") else f"FAILED {res.get('error')}"
        lib = entry["library"].get("cudnn", {}).get("tflops")
        if res.get("tflops") and lib and task["kind"] == "kernel":
            what += f" ({res['tflops'] / lib:.2f}x cuDNN)"
        log(
            f"{shape_name(task['shape']):28s} {task['label']:8s} {cfg_name(task['cfg']) if 'cfg' in task else '':16s} "
            f"{what}"
        )
        (out / "attn_sweep.json").write_text(json.dumps(results, indent=1, default=str))
        (out / "attn_sweep.md").write_text(attn_markdown(results))

    def start():
        parent, child = ctx.Pipe()
        p = ctx.Process(target=child_main, args=(child, {"rep_ms": args.rep, "fake": args.fake}), daemon=True)
        p.start()
        child.close()
        return p, parent

    proc, conn = start()
    ready = False
    current = None
    started = 0.0
    while True:
        if time.time() > deadline and current is None:
            results["notes"].append(f"stopped by the budget with {len(tasks)} tasks not run")
            break
        if ready and current is None:
            while tasks and tasks[0]["kind"] == "kernel" and tasks[0]["label"] in hung:
                record(tasks.pop(0), {"ok": False, "error": "not run: a kernel of this variant hung before"})
            if not tasks:
                break
            current = tasks.pop(0)
            conn.send((0, current))
            started = time.time()
        got = wait([conn, proc.sentinel], timeout=0.5)
        if conn in got:
            try:
                kind, _, payload = conn.recv()
            except (EOFError, OSError):
                kind, payload = "eof", None
            if kind == "ready":
                ready = True
            elif kind == "fatal":
                results["notes"].append(f"the measuring process could not start: {payload}")
                break
            elif kind == "done" and current is not None:
                record(current, payload)
                current = None
        limit = args.timeout
        if time.time() > deadline + args.grace and current is not None:
            limit = 0  # past the budget and its grace: end the task in flight
        dead = not proc.is_alive()
        if current is not None and (dead or time.time() - started > limit):
            if not dead:
                proc.kill()
                proc.join(5)
            if current["kind"] == "kernel" and not dead and limit:
                hung.add(current["label"])
            why = (
                "the process died"
                if dead
                else ("ended at the budget" if limit == 0 else f"timed out after {limit:.0f} s")
            )
            record(current, {"ok": False, "error": why})
            current = None
            if time.time() > deadline:
                break
            proc, conn = start()
            ready = False
        elif dead and current is None:
            proc, conn = start()
            ready = False
    try:
        conn.send(None)
    except Exception:  # noqa: BLE001
        pass
    proc.join(3)
    if proc.is_alive():
        proc.kill()
    results["env"]["elapsed_s"] = round(time.time() - t0, 1)
    (out / "attn_sweep.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "attn_sweep.md").write_text(attn_markdown(results))
    print(attn_markdown(results), flush=True)


def attn_markdown(res: dict) -> str:
    lines = [
        f"# Hopper attention lab (Triton {res['env'].get('triton')}, {res['env'].get('elapsed_s')} s)",
        "",
        "Forward, bf16, TFLOP/s (causal counts half the FLOPs); ratio to cuDNN's SDPA in brackets.",
        "",
        "| shape | cuDNN | flash (FA2) | " + " | ".join(VARIANTS) + " |",
        "|---|---|---|" + "---|" * len(VARIANTS),
    ]
    for name, e in res["shapes"].items():
        lib = e["library"].get("cudnn", {}).get("tflops")
        cells = [f"{lib:.0f}" if lib else str(e["library"].get("cudnn", {}).get("error", "-"))[:60]]
        fl = e["library"].get("flash", {}).get("tflops")
        cells.append(f"{fl:.0f}" if fl else "-")
        for v in VARIANTS:
            b = e["variants"].get(v, {}).get("best")
            cells.append(
                f"{b['tflops']:.0f} ({b['tflops'] / lib:.2f}) {b['cfg']}"
                if b and lib
                else (f"{b['tflops']:.0f} {b['cfg']}" if b else "fail")
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Every config", ""]
    for name, e in res["shapes"].items():
        for v, ve in e["variants"].items():
            parts = [
                f"{c['cfg']}: {c['tflops']:.0f}" if c.get("tflops") else f"{c['cfg']}: {c.get('error')}"
                for c in ve["configs"]
            ]
            lines.append(f"- {name} {v}: " + "; ".join(parts))
    lines += ["", "## Notes", ""] + [f"- {n}" for n in res.get("notes", [])]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# CPU checks
# --------------------------------------------------------------------------------------------
def selftest() -> int:
    import torch

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))
    fails = total = 0
    for causal in (False, True):
        for v in (x for x in VARIANTS if x not in GLUON):  # (Gluon has no interpreter)
            for cfg in (
                {"BM": 32, "BN": 16, "num_warps": 4, "num_stages": 2},
                {"BM": 32, "BN": 32, "num_warps": 4, "num_stages": 2},
            ):
                B, H, S, D = 1, 2, 96, 64
                g = torch.Generator().manual_seed(1)
                q, k, v_ = (torch.randn(B, H, S, D, generator=g) for _ in range(3))
                # fp16 operands (the interpreter's bf16 dot is wrong; the algorithm is the same)
                q, k, v_ = q.half(), k.half(), v_.half()
                o = torch.full_like(q, float("nan"))
                kern, grid, args, kw, opts = launch_parts(v, cfg, q, k, v_, o, causal)
                total += 1
                try:
                    kern[grid](*args, **kw, **opts)
                    ref = torch.nn.functional.scaled_dot_product_attention(
                        q.float(), k.float(), v_.float(), is_causal=causal
                    )
                    err = float((o.float() - ref).abs().max())
                    ok = err < 1e-2
                except Exception as e:  # noqa: BLE001
                    ok, err = False, float("nan")
                    print(f"   {type(e).__name__}: {e}")
                fails += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {v:7s} causal={causal} {cfg_name(cfg)} err {err:.2e}", flush=True)
    print(f"{total - fails} passed, {fails} failed")
    return 1 if fails else 0


def compile_check() -> int:
    """Compile every variant's configs for sm_90a without a GPU (compile_check.py's stand-in driver)."""
    import compile_check as cc
    import torch

    cc._fake_driver()
    rows = 0
    for v in VARIANTS:
        for cfg in configs(v):
            for causal in (False, True):
                q = torch.empty(4, 16, 1024, 128, dtype=torch.bfloat16)
                kern, grid, args, kw, opts = launch_parts(v, cfg, q, q, q, q, causal)
                t0 = time.time()
                try:
                    ck = kern.warmup(*args, grid=grid, **kw, **opts)
                    info = cc.analyze(ck)
                    info["compile_s"] = round(time.time() - t0, 1)
                except Exception as e:  # noqa: BLE001
                    text = str(e).strip()
                    info = {"error": f"{type(e).__name__}: {text.splitlines()[-1] if text else ''}"[:300]}
                rows += 1
                print(
                    v,
                    cfg_name(cfg),
                    "causal" if causal else "full",
                    " ".join(f"{a}={b}" for a, b in info.items()),
                    flush=True,
                )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=float, default=150)
    ap.add_argument("--out", default=os.environ.get("OUT", "hopper_lab_out"))
    ap.add_argument("--rep", type=int, default=40)
    ap.add_argument("--timeout", type=float, default=60, help="seconds a config may take (compile + run)")
    ap.add_argument("--grace", type=float, default=15, help="seconds the task in flight gets after the budget")
    ap.add_argument("--selftest", action="store_true")
    ap.add_argument("--fake", action="store_true", help=argparse.SUPPRESS)  # the scheduler's own test
    ap.add_argument("--compile-check", action="store_true")
    ap.add_argument("--variants", default="", help=f"comma-separated, of {', '.join(VARIANTS)} (default: all)")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    if args.compile_check:
        return compile_check()
    sweep(args)
    return 0


if __name__ == "__main__":
    if "--selftest" in sys.argv and os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"
        os.execv(sys.executable, [sys.executable, *sys.argv])  # triton reads TRITON_INTERPRET at import
    sys.exit(main())
