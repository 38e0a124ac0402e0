#!/usr/bin/env bash
# Issue 14 on the GPU machine, in one call: wheels, launch-path probes, the GPU tests of the runtime,
# then bench/runtime.py. Usage (repo root): scripts/runtime_gpu.sh [tests|bench|all] [bench args...]
# Results go to $OUT (default /tmp/opgraph-gpu); TEST_TIMEOUT and BENCH_BUDGET bound the two parts.
set -uo pipefail
OUT=${OUT:-/tmp/opgraph-gpu}
mkdir -p "$OUT"
what=${1:-all}
shift || true
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OPGRAPH_CACHE_DIR=${OPGRAPH_CACHE_DIR:-/tmp/opgraph-cache}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/env.txt"
nproc | tee -a "$OUT/env.txt"
# carried wheels (.whl/): the cuDNN frontend, and torchvision where the image lacks it
if ls .whl/nvidia_cudnn_frontend*.whl >/dev/null 2>&1 && ! python3 -c "import cudnn" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/nvidia_cudnn_frontend*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
lib=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(os.path.dirname(nvidia.cudnn.__file__), 'lib'))" 2>/dev/null)
[ -n "$lib" ] && export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
if ls .whl/torchvision*.whl >/dev/null 2>&1 && ! python3 -c "import torchvision" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-tv .whl/torchvision*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site-tv"
fi
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" | tee -a "$OUT/env.txt"
python3 -c "import cudnn; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version())" 2>&1 | tail -1 | tee -a "$OUT/env.txt"
python3 -c "import torchvision; print('torchvision', torchvision.__version__)" 2>&1 | tail -1 | tee -a "$OUT/env.txt"
# probes in their own processes: a launch path that crashes is turned off, not the whole run
PYTHONFAULTHANDLER=1 timeout 90 python3 scripts/runtime_probe.py triton >"$OUT/probe_triton.log" 2>&1 || { echo "native Triton launch probe failed: OPGRAPH_LAUNCH=jit"; tail -5 "$OUT/probe_triton.log"; export OPGRAPH_LAUNCH=jit; }
PYTHONFAULTHANDLER=1 timeout 90 python3 scripts/runtime_probe.py cudnn >"$OUT/probe_cudnn.log" 2>&1 || { echo "cuDNN raw launch probe failed: OPGRAPH_CUDNN_LAUNCH=dict"; tail -5 "$OUT/probe_cudnn.log"; export OPGRAPH_CUDNN_LAUNCH=dict; }
tail -n 4 "$OUT/probe_triton.log" "$OUT/probe_cudnn.log"
if [ "$what" = tests ] || [ "$what" = all ]; then
  OPGRAPH_COMPILE_WORKERS=${TEST_WORKERS:-4} timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 ${TESTS:-tests/test_runtime_gpu.py tests/test_plan_gpu.py tests/test_cudagraph_gpu.py tests/engines/test_cudnn_frontend.py} 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 -m bench.runtime --out "$OUT" --budget ${BENCH_BUDGET:-300} "$@" 2>&1 | tee "$OUT/bench.log" | tail -40
fi
