#!/usr/bin/env bash
# The bench v2 suite over several 10-minute device calls on one warm machine: each call goes on with the
# run in $SUITE_DIR (`bench.run --resume` of its raw folder: finished workloads kept, caches still warm),
# or starts it when there is none (WARM_FIRST=1: a warm-up pass first, `--warm-first`). Call it again, within the machine's idle
# window, until it prints "suite complete"; every call leaves the tables so far in $OUT.
#     [GPUS=4] [SUITE="all"] [REPEATS=3] [SUITE_DIR=/tmp/suite] [WARM_FIRST=1] [ALLOW_NO_FE=1] scripts/suite_session.sh
# or one run for the session, detached from the calls (DETACH=1 TIME_LIMIT=<seconds the machine has left>
# [POLL=540]): every call after the first only waits for it and reports
# (the device call carries [".whl"]: without the cuDNN frontend it stops, unless ALLOW_NO_FE=1)
set -u
OUT=${OUT:-/tmp/out}
DIR=${SUITE_DIR:-/tmp/suite}
mkdir -p "$DIR"
export PYTHONUNBUFFERED=1
# the cuDNN frontend peer and opgraph's cudnn engine need the wheel the repo carries (.whl/, see the
# device notes): installed once per machine, before anything is timed
if ! python3 -c "import cudnn" 2>/dev/null; then
  wheels=(.whl/nvidia_cudnn_frontend*.whl)
  if [ -e "${wheels[0]}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "${wheels[@]}"
    export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  if ! python3 -c "import cudnn" 2>/dev/null; then
    # a run without it has no cuDNN FE peer rows and no cudnn engine in opgraph's plans: not the suite
    echo "suite_session: no cuDNN frontend (carry .whl: the device call's carry [\".whl\"]; the folder is git-ignored)"
    if [ "${ALLOW_NO_FE:-0}" != 1 ]; then echo "suite_session: stopping (ALLOW_NO_FE=1 runs without it)"; exit 2; fi
  fi
fi
raw=$(ls -d "$DIR"/raw-* 2>/dev/null | tail -1)
# shellcheck disable=SC2086
args=(--gpus "${GPUS:-4}" --repeats "${REPEATS:-3}" --time-limit "${TIME_LIMIT:-540}" --out "$DIR" ${SUITE:-all})
resume=()
[ -n "$raw" ] && resume=(--resume "$raw")
# No separate warm-up pass unless WARM_FIRST=1: on four H200s (2026-11-26) the cold setups took ~4,600
# worker-seconds and a timed round ~1,000, so warm-up + 3 repeats is ~32 minutes of the machine, more than a
# session; repeat 1 with cold caches instead is ~27 (its setup times are the cold ones, reported apart).
# (with --resume, only the jobs not yet finished run)
warm=()
[ "${WARM_FIRST:-0}" = 1 ] && warm=(--warm-first)
if [ "${DETACH:-0}" = 1 ]; then
  # One bench.run for the whole session, however many calls: started by the first call in a process
  # session of its own (setsid), which the device leaves running when a call returns (it ends a call's
  # other processes), so no job is cut at a call's end; from a private copy of the tree, since each
  # call replaces the working tree (a worker started later would import the new one). Give TIME_LIMIT
  # as the seconds the machine has left; every call waits up to POLL seconds for it, then reports.
  if [ ! -e "$DIR/pid" ]; then
    mkdir -p "$DIR/repo"
    tar cf - --exclude=./.git . | tar xf - -C "$DIR/repo"
    (cd "$DIR/repo" && PYTHONPATH="$DIR/repo${PYTHONPATH:+:$PYTHONPATH}" setsid bash -c \
      'echo $$ > "$0/pid"; exec python3 -m bench.run "${@}"' "$DIR" "${args[@]}" "${warm[@]}" "${resume[@]}" \
      >>"$DIR/log.txt" 2>&1 </dev/null &)
    sleep 2
  fi
  end=$((SECONDS + ${POLL:-540}))
  while kill -0 "$(cat "$DIR/pid")" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 5; done
  grep -E "^bench:|not started" "$DIR/log.txt" | tail -n "${LINES_SHOWN:-40}"
else
  python3 -m bench.run "${args[@]}" "${warm[@]}" "${resume[@]}" 2>&1 | tee -a "$DIR/log.txt" | grep -E "^bench|^== |not started"
fi
if tail -20 "$DIR/log.txt" | grep -q "^bench: run complete"; then echo "suite complete"; else echo "suite not complete: call again"; fi
tar czf "$OUT/suite.tgz" -C "$DIR" --exclude='raw-*/*.tmp' --exclude=./repo . 
ls -la "$OUT"
