#!/usr/bin/env bash
# NVIDIA's cudnn-frontend tests and notebooks against opgraph.cudnn on the GPU machine (issue 41).
# Carry .nvfe/ (NVIDIA's test/python and samples/python; never committed) and, for the cudnn engine,
# .whl/ with the cuDNN frontend wheel. One part per device call keeps each call within 10 minutes:
#   scripts/nvfe_run.sh mhas 0/4     (then 1/4, 2/4, 3/4: a deterministic sample of 4000 test ids)
#   scripts/nvfe_run.sh v2 0/3       (then 1/3, 2/3: test_mhas_v2.py's L0 tests in three shards)
#   scripts/nvfe_run.sh rest         (thd, chunked prefill, flexible, kernel cache, the notebooks)
# Results under $OUT: nvfe_results*.md / .json (per-file counts), pytest logs, junit files.
# NVFE_ENGINES=torch,reference runs every graph on the torch engine (no kernel compilation).
set -uo pipefail
OUT=${OUT:-/tmp/nvfe-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" OPGRAPH_CACHE_DIR=/tmp/opgraph-cache OPGRAPH_PROGRESS=0
if ls .whl/nvidia_cudnn_frontend*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/nvidia_cudnn_frontend*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
python3 -c "import looseversion" 2>/dev/null || echo "(looseversion missing: the harness provides a stand-in)"
part=${1:-rest}; shard=${2:-0/1}; eng=${NVFE_ENGINES:-}
common=(--out "$OUT" --budget "${NVFE_BUDGET:-560}" --jobs "${NVFE_JOBS:-8}" ${eng:+--engines "$eng"})
case "$part" in
  mhas) python3 scripts/nvfe_run.py --parts mhas --shard "$shard" "${common[@]}" ;;
  v2)   python3 scripts/nvfe_run.py --parts v2 --shard "$shard" "${common[@]}" ;;
  rest) python3 scripts/nvfe_run.py --parts thd,chunked,flexible,kernel_cache,samples "${common[@]}" ;;
  *)    python3 scripts/nvfe_run.py --parts "$part" --shard "$shard" "${common[@]}" ;;
esac
