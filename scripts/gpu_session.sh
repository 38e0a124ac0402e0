#!/usr/bin/env bash
# One GPU session on the lent machine: environment, the GPU test tier, then the benchmark suite.
# Usage (from the repo root, on the GPU machine): scripts/gpu_session.sh [tests|bench|all] [bench args...]
#        scripts/gpu_session.sh ab --old .old --new . [ab_kernels args...]   (scripts/ab_kernels.py: A/B of two versions)
#        scripts/gpu_session.sh serving [bench.serving args...]   (bench/serving.py: the dynamic-shape serving loop)
#        scripts/gpu_session.sh ws [attention_ws_check args...]   (the warp-specialised attention check, a process a config)
# Results go to $OUT (default /tmp/opgraph-gpu); TESTS picks test paths (default: tests).
set -uo pipefail
OUT=${OUT:-/tmp/opgraph-gpu}
mkdir -p "$OUT"
what=${1:-all}
shift || true
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OPGRAPH_CACHE_DIR=${OPGRAPH_CACHE_DIR:-/tmp/opgraph-cache}
# the bench header names the commit (OPGRAPH_COMMIT=<sha> where given, else the copy's git HEAD, "+dirty"
# where its files differ: the GPU machine's git metadata may be older than the tree it runs) and always
# the digest of opgraph's sources (bench/env.py; `python -m bench.env` prints a checkout's)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" | tee -a "$OUT/env.txt"
# wheels carried in .whl/ (the image has no network): the cuDNN frontend peer, the package's own
# dependencies the image lacks (jsonschema and its own); torchvision is handled below
wheels=$(ls .whl/*.whl 2>/dev/null | grep -v torchvision || true)
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
  lib=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(os.path.dirname(nvidia.cudnn.__file__), 'lib'))" 2>/dev/null)
  [ -n "$lib" ] && export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
fi
# torchvision for the whole-network benchmark, when its wheel (matching the image's torch) was carried
if ls .whl/torchvision*.whl >/dev/null 2>&1 && ! python3 -c "import torchvision" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-tv .whl/torchvision*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site-tv"
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  # a test past --timeout (a kernel that never finishes spins in the CUDA runtime, where no signal
  # reaches Python) is stopped by pytest-timeout's thread: its stacks go to the log, its worker exits,
  # xdist reports the test and starts another, and the tier still ends with its summary
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -rfE -m gpu -p no:cacheprovider --timeout ${TEST_DEADLINE:-240} \
    --timeout-method=thread -n ${WORKERS:-4} ${TESTS:-tests} 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  # bench v2 keeps within --time-limit itself (repeats it cannot finish are not started); the timeout is a backstop
  limit=${BENCH_TIMEOUT:-540}
  timeout $((limit + 30)) python3 -m bench.run --out "$OUT" --time-limit $((limit - 20)) "$@" 2>&1 \
    | tee "$OUT/bench.log" | tail -80
fi
if [ "$what" = ab ]; then
  # opgraph's own plans at two versions (scripts/ab_kernels.py keeps within --budget; the timeout is a backstop)
  timeout ${AB_TIMEOUT:-300} python3 scripts/ab_kernels.py --out "$OUT" "$@" 2>&1 | tee "$OUT/ab.log" | tail -150
  exit "${PIPESTATUS[0]}"
fi
if [ "$what" = ws ]; then
  timeout ${WS_TIMEOUT:-560} python3 scripts/attention_ws_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/ws.log" | tail -40
  exit "${PIPESTATUS[0]}"
fi
if [ "$what" = serving ]; then
  timeout ${SERVING_TIMEOUT:-560} python3 -m bench.serving --out "$OUT" --timeout $((${SERVING_TIMEOUT:-560} / 3)) "$@" 2>&1 \
    | tee "$OUT/serving.log" | tail -40
  exit "${PIPESTATUS[0]}"
fi
