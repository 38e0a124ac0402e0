"""Generated kernels compiled for Hopper (sm_90) without a GPU: Triton's NVIDIA backend and ptxas, in
a child process without the interpreter. The engine tests use it to check registers, spills, shared
memory and pipelining of the benchmark shapes' kernels."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# what the child process runs: this module's compile_cases, on the test module and the GPU's name
_CHILD = "import sys\nfrom tests.engines.hopper_compile import compile_cases\ncompile_cases(*sys.argv[1:])"

NO_BACKEND = 77  # the child's exit status where Triton has no NVIDIA backend


def compile_for_hopper(module: str, *, gpu: str = "H100", timeout: float = 600) -> str:
    """Compile every kernel of `module`'s HOPPER_CASES for sm_90 in a child process; its output (see
    compile_cases). Skips the test where Triton has no NVIDIA backend."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, module, gpu],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode == NO_BACKEND:
        pytest.skip("Triton has no NVIDIA backend here")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


SIG = {
    "FLOAT": "fp32",
    "DOUBLE": "fp64",
    "HALF": "fp16",
    "BFLOAT16": "bf16",
    "INT8": "i8",
    "UINT8": "u8",
    "INT32": "i32",
    "INT64": "i64",
    "BOOLEAN": "i1",
    "FP8_E4M3": "fp8e4nv",
    "FP8_E5M2": "fp8e5",
}
SCRATCH_SIG = {
    "float32": "fp32",
    "float64": "fp64",
    "int32": "i32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "int8": "i8",
    "int16": "i16",
}


def compile_cases(module: str, gpu: str = "H100") -> None:
    """In the child process: compile the kernels of `module`'s HOPPER_CASES for a Hopper GPU named `gpu`
    and print a line per launch:

        compiled CASE KERNEL regs R spills S smem B cp.async N f16math M f32math M ld.v4 V st.v4 W ld.1 L mul.hi H
                 signbit S tma T
                 wgmma W wgmma.fp8 F setmaxnreg R warps W KNOBS

    HOPPER_CASES maps a case name to (build, template, knobs, ...): build() returns the graph, whose
    nodes make one piece (or the piece itself: one of a dynamic plan's bucket), compiled with the
    template named; knobs None is the heuristic's choice, n the first n candidates, a function of the
    candidates returns some of them, else a list of knob dicts. Items after the knobs are the test's
    own."""
    import importlib
    import re
    import tempfile

    os.environ.pop("TRITON_INTERPRET", None)
    import triton

    try:
        from triton.backends.compiler import GPUTarget
        from triton.backends.nvidia.compiler import get_ptxas
    except ImportError:
        sys.exit(NO_BACKEND)
    from opgraph.core.device import Device
    from opgraph.core.piece import Piece, make_piece
    from opgraph.engines.triton import generate
    from opgraph.engines.triton.loader import load_module
    from opgraph.engines.triton.bound import overlap_mode
    from opgraph.engines.triton.rewrite import fp8_fill, overlapped
    from opgraph.engines.triton.templates import discover
    from opgraph.engines.triton.tma_desc import signature_type

    try:  # (Gluon: Triton >= 3.5; a WS=1 matmul's kernels are Gluon's)
        from triton.experimental.gluon._runtime import GluonASTSource
    except ImportError:
        GluonASTSource = None

    device = Device("cuda", 0, gpu, (9, 0), 132)
    overlap = overlap_mode(device)
    templates = {t.name: t for t in discover()}
    ptxas = get_ptxas(90)
    ptxas = getattr(ptxas, "path", ptxas)
    for name, (build, template, knobs, *_) in importlib.import_module(module).HOPPER_CASES.items():
        built = build()
        piece = built if isinstance(built, Piece) else make_piece(built.final, 0, built.final.nodes)
        final = piece.graph
        t = templates[template]
        if knobs is None or isinstance(knobs, int):
            knobs = t.candidates(piece, device)[: knobs or 1]
        elif callable(knobs):
            knobs = knobs(t.candidates(piece, device))
        for k in knobs:
            # (the engine's rewrite of fp8 masked loads, as TritonEngine applies it to every generated piece)
            gen = fp8_fill(generate(t, piece, dict(k), device), {u: d.data_type for u, d in final.tensors.items()})
            if overlap != "off":  # (as TritonEngine.generated gives Hopper's kernels)
                gen = overlapped(gen, gluon=overlap == "all")
            loaded = load_module(gen.source, interpret=False)
            for launch in gen.launches:
                fn = getattr(loaded, launch.kernel)
                gluon = bool(getattr(fn, "is_gluon", lambda: False)())  # (a WS=1 matmul: a Gluon kernel)
                meta = dict(launch.meta)
                sig, consts = {}, {}
                for arg_name, arg in zip(fn.arg_names, launch.args):
                    if arg.kind == "buf":
                        sig[arg_name] = "*" + SIG[final.tensors[arg.uid].data_type.name]
                    elif arg.kind == "scalar":
                        sig[arg_name] = "fp32"
                    elif arg.kind == "desc":  # a host-side TMA descriptor (engines/triton/tma_desc.py)
                        element = SIG[final.tensors[arg.uid].data_type.name]
                        sig[arg_name] = signature_type(element, arg.block, gluon)
                    elif arg.kind == "size":  # a run-time size (engines/triton/sizes.py)
                        sig[arg_name] = "i64" if arg.dtype == "int64" else "i32"
                    else:
                        sig[arg_name] = "*" + SCRATCH_SIG[arg.dtype]
                for a in fn.arg_names:
                    if a in meta:
                        sig[a] = "constexpr"
                        consts[(fn.arg_names.index(a),)] = meta.pop(a)
                # pointers are 16-byte aligned at run time: without the attribute nothing is vectorised
                # or pipelined, and the code (and registers) would not be the GPU's
                attrs = {
                    (i,): [["tt.divisibility", 16]]
                    for i, a in enumerate(fn.arg_names)
                    if sig.get(a, "").startswith("*")
                }
                src = (GluonASTSource if gluon else triton.compiler.ASTSource)(fn, sig, consts, attrs)
                ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=meta)
                with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
                    f.write(ck.asm["ptx"])
                out = subprocess.run(
                    [ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
                    capture_output=True,
                    text=True,
                    check=False,
                ).stderr
                os.unlink(f.name)
                regs = max([int(r) for r in re.findall(r"Used (\d+) registers", out)] or [0])
                spills = sum(int(s) for s in re.findall(r"(\d+) bytes spill stores", out))
                cp_async = ck.asm["ptx"].count("cp.async.cg") + ck.asm["ptx"].count("cp.async.ca")
                # fp16 / fp32 arithmetic in the PTX (LLVM narrows wider math between round trips to a
                # narrower type, fusing away the rounding of an intermediate)
                f16math = len(re.findall(r"\b(?:fma|mul|add|sub)(?:\.rn)?\.f16(?:x2)?\b", ck.asm["ptx"]))
                f32math = len(re.findall(r"\b(?:fma|mul|add|sub)(?:\.rn)?(?:\.ftz)?\.f32\b", ck.asm["ptx"]))
                # global memory accesses: 128-bit vectors, and loads of one element (a per-row value loaded
                # per element shows as many), and the mul.hi of divisions by a constant (a coordinate)
                ptx = ck.asm["ptx"]
                ld_v4 = len(re.findall(r"\bld\.global(?:\.[\w:]+)*?\.v4\.", ptx))
                st_v4 = len(re.findall(r"\bst\.global(?:\.[\w:]+)*?\.v4\.", ptx))
                ld_1 = len(re.findall(r"\bld\.global(?:\.(?!v[248]\b)[\w:]+)*\.[bfsu](?:8|16|32|64)\b", ptx))
                mulhi = len(re.findall(r"\bmul\.hi\.", ptx))
                # |x| and -x of fp32 values as bit operations on the sign (and 0x7fffffff, xor 0x80000000):
                # ptxas miscompiles them on wgmma accumulators (fuzz seeds 20261125508880, 20261126603140)
                signbit = len(
                    re.findall(
                        r"\b(?:and\.b32\s+%r\d+, %r\d+, 2147483647|xor\.b32\s+%r\d+, %r\d+, "
                        r"-2147483648)\b",
                        ptx,
                    )
                )
                tma = ptx.count("cp.async.bulk.tensor")
                # Hopper's asynchronous tensor-core products, and those of them on fp8 operands
                wgmma = len(re.findall(r"\bwgmma\.mma_async\b", ptx))
                wgmma_fp8 = len(re.findall(r"\bwgmma\.mma_async[\w.]*\.e[45]m[23]\.e[45]m[23]\b", ptx))
                print(
                    "compiled",
                    name,
                    launch.kernel,
                    "regs",
                    regs,
                    "spills",
                    spills,
                    "smem",
                    ck.metadata.shared,
                    "cp.async",
                    cp_async,
                    "f16math",
                    f16math,
                    "f32math",
                    f32math,
                    "ld.v4",
                    ld_v4,
                    "st.v4",
                    st_v4,
                    "ld.1",
                    ld_1,
                    "mul.hi",
                    mulhi,
                    "signbit",
                    signbit,
                    "tma",
                    tma,
                    "wgmma",
                    wgmma,
                    "wgmma.fp8",
                    wgmma_fp8,
                    "setmaxnreg",  # (a warp-specialized kernel's partitions resize their registers)
                    ptx.count("setmaxnreg"),
                    "gdc.wait",  # (rewrite.overlapped: the wait for the previous kernel, before any access)
                    ptx.count("griddepcontrol.wait"),
                    "gdc.first",
                    int(_waits_first(ptx)),
                    "warps",
                    ck.metadata.num_warps,
                    k,
                )


_ACCESS = re.compile(
    r"\b(?:ld|st|atom|red)\.global\b|\bcp\.async\b|\bcp\.reduce\.async\b|\bprefetch\.|\btensormap\.replace\b"
    r"|\b(?:ld|st)\.(?:v\d\.)?[bfsu]\d+\b"  # (generic addressing: may be global)
)


def _waits_first(ptx: str) -> bool:
    """Whether griddepcontrol.wait comes before the PTX's first global memory access (in text order)."""
    wait = ptx.find("griddepcontrol.wait")
    access = _ACCESS.search(ptx)
    return wait >= 0 and (access is None or wait < access.start())


def attention_smem(module: str, output: str) -> list[tuple[str, str, int, int]]:
    """(case, kernel, shared bytes Triton gave, the template's estimate) of every attention forward and
    dK/dV / dQ (or fused) launch in compile_cases' `output` for `module`'s HOPPER_CASES: the estimate
    (attention/knobs.py) is what keeps a config within the device's shared memory."""
    import ast
    import importlib

    from opgraph.core.device import Device
    from opgraph.core.piece import make_piece
    from opgraph.engines.triton.attention.knobs import bwd_smem, fwd_smem
    from opgraph.engines.triton.attention.spec import BwdKnobs, FwdKnobs
    from opgraph.engines.triton.templates import discover

    device = Device("cuda", 0, "H100", (9, 0), 132)
    templates = {t.name: t for t in discover()}
    cases = importlib.import_module(module).HOPPER_CASES
    specs: dict[str, object] = {}
    out = []
    for line in output.splitlines():
        if not line.startswith("compiled"):
            continue
        w = line.split()
        case, kernel, smem = w[1], w[2], int(w[w.index("smem") + 1])
        build, template = cases[case][:2]
        if case not in specs:
            final = build().final
            specs[case] = templates[template].matched(make_piece(final, 0, final.nodes), device).spec()
        knobs = ast.literal_eval(line[line.index("{") :])
        if template == "attention":
            estimate = fwd_smem(specs[case], FwdKnobs(**knobs)) if kernel == "kernel_attn_fwd" else None
        else:
            dkdv, dq = bwd_smem(specs[case], BwdKnobs(**knobs))
            estimate = {"kernel_attn_bwd_dkdv": dkdv, "kernel_attn_bwd_dq": dq, "kernel_attn_bwd": max(dkdv, dq)}.get(
                kernel
            )
        if estimate is not None:
            out.append((case, kernel, smem, estimate))
    return out
