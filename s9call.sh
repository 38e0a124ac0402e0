#!/usr/bin/env bash
# session 9, device call 1 (not committed)
S=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site OPGRAPH_COMMIT=$1
nvidia-smi -L
OPGRAPH_TEST_GPUS=0,1 OPGRAPH_FAILURE_LOG=$OUT/failures.txt timeout 220 python3 -m pytest -q -m gpu -p no:cacheprovider \
  --timeout 150 -n 8 tests/engines/test_triton_conv_merge.py tests/engines/test_triton_conv.py tests/bench > $OUT/gpu.txt 2>&1
tail -4 $OUT/gpu.txt; echo "tests done at $((SECONDS-S)) s"
mkdir -p /tmp/diag
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m bench.run --repeats 1 --no-compile --describe --time-limit 190 --out /tmp/diag/stem \
  'conv.stem_7x7s2_c3.*' > /tmp/diag/stem.txt 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m bench.run --repeats 1 --no-compile --steps --time-limit 190 --out /tmp/diag/r18 \
  'training.resnet18.b64' > /tmp/diag/r18.txt 2>&1 &
wait
tar czf $OUT/diag.tgz -C /tmp diag; echo "diagnostics done at $((SECONDS-S)) s"
tail -5 /tmp/diag/stem.txt /tmp/diag/r18.txt
DETACH=1 SUITE="networks attention-block" NAME=2026-11-26-h100-suite-f-models GPUS=2 REPEATS=3 \
  TIME_LIMIT=$((1720-SECONDS)) POLL=$((545-SECONDS)) scripts/suite_session.sh 2>&1 | tail -30
