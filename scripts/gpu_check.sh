#!/usr/bin/env bash
# The GPU tier and the attention benchmark in one device call (10 minutes at most):
#   scripts/gpu_check.sh [test-seconds] [bench-seconds]
# SHARD=i/n runs the i-th of n shards of the GPU tier's test files (every n-th file, from i = 0), for a tier
# longer than one call (2026-12-02: the whole tier passed 440 s on an H200 at 16 workers), and
# BENCH=0 leaves the benchmark out.
# Carry .whl/ with the wheels the device image lacks: the cuDNN frontend's and jsonschema's (jsonschema,
# jsonschema-specifications, referencing, rpds-py; without them every plan-file test fails on the import).
# Results under $OUT: gpu_tests.log (one line per test), attention_bench.json and its log.
set -uo pipefail
OUT=${OUT:-/tmp/opgraph-gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" OPGRAPH_CACHE_DIR=/tmp/opgraph-cache
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
python3 -c "import jsonschema" || echo "jsonschema is missing: the plan-file tests will fail (carry its wheels)"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" | tee -a "$OUT/env.txt"
python3 -c "import cudnn; print('cudnn frontend', cudnn.__version__)" 2>&1 | tail -1 | tee -a "$OUT/env.txt"
files=(tests)
if [ -n "${SHARD:-}" ]; then
  i=${SHARD%/*}; n=${SHARD#*/}
  mapfile -t files < <(grep -rlE "pytest\.mark\.gpu|pytestmark.*gpu" tests --include="test_*.py" | sort | awk -v i="$i" -v n="$n" 'NR % n == i')
fi
timeout "${1:-370}" python3 -m pytest -v -m gpu -p no:cacheprovider --timeout 150 --timeout-method=thread --durations=25 \
  -n "${WORKERS:-8}" "${files[@]}" > "$OUT/gpu_tests.log" 2>&1
echo "tests rc=$?"
# the slowest tests (for balancing the shards: 2026-12-02, shard 0 of 2 took 379 s at 16 workers, shard 1 181 s)
sed -n '/slowest .*durations/,/^=/p' "$OUT/gpu_tests.log" | head -12
grep -cE " PASSED" "$OUT/gpu_tests.log" | sed 's/^/passed: /'
grep -E " (FAILED|ERROR)" "$OUT/gpu_tests.log" | head -40
tail -3 "$OUT/gpu_tests.log"
[ "${BENCH:-1}" = 0 ] && exit 0
timeout "${2:-170}" python3 scripts/attention_bench.py --out "$OUT" > "$OUT/attention_bench.log" 2>&1
echo "bench rc=$?"; tail -45 "$OUT/attention_bench.log"
