"""Compile generated attention kernels for Hopper (sm_90a) without a GPU and print registers, spills,
shared memory and the count of wgmma instructions, per kernel and knob setting.

    PYTHONPATH=$PWD python scripts/attention_compile.py [--sass]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)


def spec_for(B, H, S, D, causal, dtype="tl.bfloat16", bwd=False, **kw):
    from opgraph.engines.triton.attention import AttnSpec, Causal, Operand

    st = (H * S * D, S * D, D, 1)
    sst = (H * S, S, 1, 1)
    ops = {
        "q": Operand("Q", dtype, st),
        "k": Operand("K", dtype, st),
        "v": Operand("V", dtype, st),
        "o": Operand("O", dtype, st),
        "stats": Operand("LSE", "tl.float32", sst),
    }
    if bwd:
        ops.update(
            do=Operand("DO", dtype, st),
            dq=Operand("DQ", dtype, st),
            dk=Operand("DK", dtype, st),
            dv=Operand("DV", dtype, st),
        )
    return AttnSpec(
        B, H, H, H, S, S, D, D, scale=D**-0.5, causal=Causal.TOP_LEFT if causal else Causal.NONE, **ops, **kw
    )


SIG = {"tl.bfloat16": "*bf16", "tl.float16": "*fp16", "tl.float32": "*fp32", "tl.int32": "*i32", "tl.int64": "*i64"}


def compile_source(src, spec, sass=False):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas

    from opgraph.engines.triton.attention.run import load

    ptxas = get_ptxas(90)
    ptxas = getattr(ptxas, "path", ptxas)
    module = load(src, interpret=False)
    types = {}
    for f in ("q", "k", "v", "o", "stats", "do", "dq", "dk", "dv", "bias", "dbias"):
        op = getattr(spec, f)
        if op is not None:
            types[op.name] = SIG[op.dtype]
    out = []
    for l in src.launches:
        fn = getattr(module, l.kernel)
        sig = {a: types.get(a, "*fp32") for a in fn.arg_names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)}
        ck = triton.compile(
            triton.compiler.ASTSource(fn=fn, signature=sig, constexprs={}, attrs=attrs),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": l.num_warps, "num_stages": l.num_stages},
        )
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(ck.asm["ptx"])
        cubin = f.name + ".cubin"
        res = subprocess.run(
            [ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", cubin], capture_output=True, text=True, check=False
        )
        regs = max([int(r) for r in re.findall(r"Used (\d+) registers", res.stderr)] or [0])
        spills = sum(int(s) for s in re.findall(r"(\d+) bytes spill stores", res.stderr))
        wgmma = ck.asm["ptx"].count("wgmma.mma_async")
        mma = ck.asm["ptx"].count("mma.sync")
        out.append((l.kernel, regs, spills, ck.metadata.shared, wgmma, mma))
        if sass:
            nvdis = os.path.join(os.path.dirname(ptxas), "cuobjdump")
            s = subprocess.run([nvdis, "-sass", cubin], capture_output=True, text=True, check=False).stdout
            print(
                f"  SASS {l.kernel}: HGMMA {s.count('HGMMA')} HMMA {s.count('HMMA')} LDL {s.count('LDL')} STL {s.count('STL')}"
            )
        os.unlink(f.name)
    return out


def main():
    from opgraph.engines.triton.attention import backward, forward

    sass = "--sass" in sys.argv
    for D in (64, 128, 256):
        for causal in (False, True):
            spec = spec_for(4, 16, 4096, D, causal)
            for kn in fwd_knobs(D):
                for r in compile_source(forward(spec, kn), spec, sass):
                    print("fwd", D, "causal" if causal else "full", kn, *r)
            spec = spec_for(4, 16, 4096, D, causal, bwd=True)
            for kn in bwd_knobs(D):
                for r in compile_source(backward(spec, kn), spec, sass):
                    print("bwd", D, "causal" if causal else "full", kn, *r)


def fwd_knobs(D):
    from opgraph.engines.triton.attention.knobs import fwd_candidates

    return fwd_candidates(D, cuda=True)[:1]


def bwd_knobs(D):
    from opgraph.engines.triton.attention.knobs import bwd_candidates

    return bwd_candidates(D, cuda=True)[:1]


if __name__ == "__main__":
    main()
