#!/usr/bin/env bash
# Issue 17's training-step table on a two-GPU machine inside one 10-minute device call: the CUDA-graph
# group (opgraph captured, eager captured, torch.compile max-autotune) on GPU 0 and the execute group
# (opgraph, eager, torch.compile max-autotune-no-cudagraphs) on GPU 1, at the same time (each group's
# ratios are within its own process); GPU 1 also replays the fuzz cases given as arguments (beside the
# execute group's start) and then runs the vision rows (opgraph and eager, both modes) in the time left. Results under $OUT/gpt and $OUT/vision.
#     [BENCH_ARGS=--autotune] scripts/gpt_bench_two_gpus.sh [FUZZ_CASE ...]
set -u
OUT=${OUT:-/tmp/out}
T0=$(date +%s)
left() { echo $((570 - ($(date +%s) - T0))); }
# run "$@" under the time left, or skip it when under 30 s are left (timeout 0 would mean no limit)
limited() { local t; t=$(left); if [ "$t" -lt 30 ]; then echo "skipped (${t}s left): $*"; return 124; fi; timeout "$t" "$@"; }
# BENCH_ARGS: more options for the GPT-2 runs (e.g. --autotune; OPGRAPH_CACHE_DIR=$OUT/cache keeps the tuning)
# shellcheck disable=SC2206
common=(--warmup 3 --iters 10 --steps-profile ${BENCH_ARGS:-})
(export CUDA_VISIBLE_DEVICES=0; limited python3 -m bench.gpt gpt2 --modes opgraph-graph,eager-graph,compile-graph \
    "${common[@]}" --out "$OUT/gpt" > "$OUT/gpt-graph.txt" 2>&1; echo "graph group rc $?") &
(
  export CUDA_VISIBLE_DEVICES=1
  for case in "$@"; do
    timeout 90 python3 -m tests.fuzz.replay "$case" --device cuda >> "$OUT/replays.txt" 2>&1
    echo "replay $case rc $?" >> "$OUT/replays.txt"
  done &
  limited python3 -m bench.gpt gpt2 --modes opgraph,eager,compile "${common[@]}" --out "$OUT/gpt" \
      > "$OUT/gpt-execute.txt" 2>&1; echo "execute group rc $?"
  limited python3 -m bench.gpt resnet18 mobilenet_v2 --modes opgraph-graph,eager-graph,opgraph,eager \
      --warmup 3 --iters 10 --out "$OUT/vision" > "$OUT/vision.txt" 2>&1; echo "vision rc $?"
) &
wait
