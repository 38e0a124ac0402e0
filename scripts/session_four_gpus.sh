#!/usr/bin/env bash
# One 10-minute device call on a four-GPU machine: correctness on GPU 0 (the GPU test tier and the
# differential fuzzer at once: neither is timed), issue 17's training-step tables on GPUs 1-3 (GPT-2's
# CUDA-graph group on GPU 2 and execute group on GPU 3, each group's ratios within its own process;
# the vision CUDA-graph group on GPU 1, the vision execute group on GPU 3 after GPT-2's). Timed
# processes share the host's CPUs with the correctness runs (stated in the results).
#     [BENCH_ARGS=--autotune] [FUZZ_SEED=N] scripts/session_four_gpus.sh
# Results: $OUT/results.tgz (everything) and $OUT/summary.txt.
set -u
OUT=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1
T0=$(date +%s)
LIMIT=${SESSION_LIMIT:-560}
left() { echo $((LIMIT - ($(date +%s) - T0))); }
limited() { local t; t=$(left); if [ "$t" -lt 30 ]; then echo "skipped (${t}s left): $*"; return 124; fi; timeout "$t" "$@"; }
R=/tmp/results; mkdir -p "$R"
# shellcheck disable=SC2206
common=(--warmup 3 --iters 10 ${BENCH_ARGS:-})
(export CUDA_VISIBLE_DEVICES=0
 OPGRAPH_FAILURE_LOG=$R/failures.txt limited python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 150 -n 6 tests \
   > "$R/tier.log" 2>&1; echo "tier rc $?") &
(export CUDA_VISIBLE_DEVICES=0
 limited python3 scripts/fuzz_gpu.py --minutes "${FUZZ_MINUTES:-7.5}" --workers 12 --seed "${FUZZ_SEED:-20261126200000}" \
   --shrink-seconds 15 --out "$R/fuzz" > "$R/fuzz.log" 2>&1; echo "fuzz rc $?") &
(export CUDA_VISIBLE_DEVICES=1 OPGRAPH_CACHE_DIR=$R/cache-vision-graph
 limited python3 -m bench.gpt resnet18 mobilenet_v2 --modes opgraph-graph,eager-graph,compile-graph "${common[@]}" \
   --out "$R/vision" > "$R/vision-graph.txt" 2>&1; echo "vision graph rc $?") &
(export CUDA_VISIBLE_DEVICES=2 OPGRAPH_CACHE_DIR=$R/cache-gpt-graph
 limited python3 -m bench.gpt gpt2 --modes opgraph-graph,eager-graph,compile-graph "${common[@]}" --steps-profile \
   --out "$R/gpt" > "$R/gpt-graph.txt" 2>&1; echo "gpt graph rc $?") &
(export CUDA_VISIBLE_DEVICES=3 OPGRAPH_CACHE_DIR=$R/cache-gpt-exec
 limited python3 -m bench.gpt gpt2 --modes opgraph,eager,compile "${common[@]}" --steps-profile \
   --out "$R/gpt" > "$R/gpt-execute.txt" 2>&1; echo "gpt execute rc $?"
 OPGRAPH_CACHE_DIR=$R/cache-vision-exec limited python3 -m bench.gpt resnet18 mobilenet_v2 --modes opgraph,eager,compile \
   "${common[@]}" --out "$R/vision" > "$R/vision-execute.txt" 2>&1; echo "vision execute rc $?") &
wait
{ tail -3 "$R/tier.log"; grep -E '"(graphs|mismatches|untyped_errors_by_class)"' "$R/fuzz/fuzz_summary.json";
  for f in gpt-graph gpt-execute vision-graph vision-execute; do echo "== $f"; grep -E "ms|FAIL|Error" "$R/$f.txt" | tail -12; done
} > "$OUT/summary.txt" 2>&1
tar czf "$OUT/results.tgz" -C /tmp results
cat "$OUT/summary.txt"
