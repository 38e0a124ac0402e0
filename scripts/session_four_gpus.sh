#!/usr/bin/env bash
# One 10-minute device call on a four-GPU machine: GPT-2's training-step tables on GPUs 0 and 1 (the
# CUDA-graph group on GPU 0, the execute group on GPU 1; each group's ratios within its own process), the
# benchmark suite spread over GPUs 2 and 3 (`bench.run --gpus 2`, SUITE_ARGS, default a --quick smoke of
# every group) after the GPU tests named in GPU_TESTS (on GPU 2). Timed processes share the host's
# CPUs (stated in the results).
#     [BENCH_ARGS=--autotune] [SUITE_ARGS="--quick"] [GPU_TESTS="tests/x.py ..."] scripts/session_four_gpus.sh
# Results: $OUT/results.tgz (logs, JSON and tables; tuning and compile caches left out) and $OUT/summary.txt.
set -u
OUT=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1
T0=$(date +%s)
LIMIT=${SESSION_LIMIT:-560}
left() { echo $((LIMIT - ($(date +%s) - T0))); }
limited() { local t; t=$(left); if [ "$t" -lt 30 ]; then echo "skipped (${t}s left): $*"; return 124; fi; timeout "$t" "$@"; }
R=/tmp/results; mkdir -p "$R"
# shellcheck disable=SC2206
common=(--warmup 3 --iters 10 --steps-profile ${BENCH_ARGS:-})
(export CUDA_VISIBLE_DEVICES=0 OPGRAPH_CACHE_DIR=/tmp/cache-gpt-graph
 limited python3 -m bench.gpt gpt2 --modes opgraph-graph,eager-graph,compile-graph "${common[@]}" \
   --out "$R/gpt" > "$R/gpt-graph.txt" 2>&1; echo "gpt graph rc $?") &
(export CUDA_VISIBLE_DEVICES=1 OPGRAPH_CACHE_DIR=/tmp/cache-gpt-exec
 limited python3 -m bench.gpt gpt2 --modes opgraph,eager,compile "${common[@]}" \
   --out "$R/gpt" > "$R/gpt-execute.txt" 2>&1; echo "gpt execute rc $?") &
# the GPU tests first on GPU 2, then the suite on GPUs 2 and 3 (no test beside a timed worker)
# shellcheck disable=SC2086
(if [ -n "${GPU_TESTS:-}" ]; then
   CUDA_VISIBLE_DEVICES=2 OPGRAPH_FAILURE_LOG=$R/failures.txt limited python3 -m pytest -q -m gpu -p no:cacheprovider \
     --timeout 300 $GPU_TESTS > "$R/tests.log" 2>&1; echo "tests rc $?"
 fi
 export CUDA_VISIBLE_DEVICES=2,3 OPGRAPH_CACHE_DIR=/tmp/cache-suite
 limited python3 -m bench.run --gpus 2 --time-limit $(($(left) - 25)) ${SUITE_ARGS:---quick} --out "$R/suite" \
   > "$R/suite.txt" 2>&1; echo "suite rc $?") &
wait
{ [ -f "$R/tests.log" ] && tail -3 "$R/tests.log"
  for f in gpt-graph gpt-execute suite; do echo "== $f"; grep -E "ms|FAIL|Error|rc " "$R/$f.txt" | tail -25; done
} > "$OUT/summary.txt" 2>&1
tar czf "$OUT/results.tgz" -C /tmp results
ls -la "$OUT"
cat "$OUT/summary.txt"
