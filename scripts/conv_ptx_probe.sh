#!/usr/bin/env bash
# The conv_fprop case of fuzz seed 20261125508880 (zeros on an H100) run from its own PTX through
# Triton's IR override: unchanged, and with a proxy fence before every barrier (is the wgmma reading
# shared memory that register stores wrote before they are visible to the async proxy?).
set -u
export TRITON_ALWAYS_COMPILE=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
d=$(mktemp -d); o=$(mktemp -d)
TRITON_KERNEL_DUMP=1 TRITON_DUMP_DIR=$d python3 scripts/conv_nan_probe.py --ptx dump
f=$(ls "$d"/*/kernel.ptx | head -1)
h=$(basename "$(dirname "$f")")
mkdir -p "$o/$h"
cp "$f" "$o/$h/kernel.ptx"
TRITON_KERNEL_OVERRIDE=1 TRITON_OVERRIDE_DIR=$o python3 scripts/conv_nan_probe.py --ptx plain
python3 - "$o/$h/kernel.ptx" <<'PY'
import sys
p = sys.argv[1]
lines = open(p).read().split("\n")
out = []
for line in lines:
    if line.strip().startswith("bar.sync"):
        out.append("\tfence.proxy.async.shared::cta;")
    out.append(line)
open(p, "w").write("\n".join(out))
PY
TRITON_KERNEL_OVERRIDE=1 TRITON_OVERRIDE_DIR=$o python3 scripts/conv_nan_probe.py --ptx fence
# the PTX with the sign flips (xor of the sign bit) as neg.f32, then as plain moves (positive results)
cp "$f" "$o/$h/kernel.ptx"
sed -i -E 's/xor\.b32 \t(%r[0-9]+), (%r[0-9]+), -2147483648;/neg.f32 \t\1, \2;/' "$o/$h/kernel.ptx"
grep -c "neg.f32" "$o/$h/kernel.ptx"
TRITON_KERNEL_OVERRIDE=1 TRITON_OVERRIDE_DIR=$o python3 scripts/conv_nan_probe.py --ptx neg.f32
cp "$f" "$o/$h/kernel.ptx"
sed -i -E 's/xor\.b32 \t(%r[0-9]+), (%r[0-9]+), -2147483648;/mov.b32 \t\1, \2;/' "$o/$h/kernel.ptx"
TRITON_KERNEL_OVERRIDE=1 TRITON_OVERRIDE_DIR=$o python3 scripts/conv_nan_probe.py --ptx mov
# the same PTX through the newer ptxas Triton ships for Blackwell
pb=$(python3 -c "import triton, os; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin/ptxas-blackwell'))")
ls -la "$pb" && "$pb" --version | tail -1 && TRITON_PTXAS_PATH=$pb python3 scripts/conv_nan_probe.py --ptx ptxas-blackwell
p=$(python3 -c "import triton, os; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin/ptxas'))"); "$p" --version | tail -1
