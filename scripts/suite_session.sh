#!/usr/bin/env bash
# The bench v2 suite over several 10-minute device calls on one warm machine: each call goes on with the
# run in $SUITE_DIR (`bench.run --resume` of its raw folder: finished workloads kept, caches still warm),
# or starts it when there is none (WARM_FIRST=1: a warm-up pass first, `--warm-first`). Call it again, within the machine's idle
# window, until it prints "suite complete"; every call leaves the tables so far in $OUT.
#     [GPUS=4] [SUITE="all"] [NAME=<results name, after the date and device>] [REPEATS=3] [SUITE_DIR=/tmp/suite] [WARM_FIRST=1] [ALLOW_NO_FE=1] \
#     scripts/suite_session.sh
# or one run for the session, detached from the calls (DETACH=1 TIME_LIMIT=<seconds the machine has left>
# [POLL=480] [LINES_SHOWN=40]): every call after the first only waits for it and reports; a run that
# ended is not started again (remove $SUITE_DIR/pid to start another, e.g. with --resume in SUITE)
# (the device call carries [".whl"]: without the cuDNN frontend it stops, unless ALLOW_NO_FE=1)
set -u
OUT=${OUT:-/tmp/out}
DIR=${SUITE_DIR:-/tmp/suite}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
export PYTHONUNBUFFERED=1
detached=0
[ "${DETACH:-0}" = 1 ] && [ -e "$DIR/pid" ] && detached=1  # a later call: the run has what it needs
if [ "${DETACH:-0}" = 1 ] && [ $detached = 0 ] && [ -z "${TIME_LIMIT:-}" ]; then
  echo "suite_session: DETACH=1 needs TIME_LIMIT, the seconds the machine has left for the run"; exit 2
fi
# the cuDNN frontend peer and opgraph's cudnn engine need the wheel the repo carries (.whl/, see the
# device notes): installed once per machine, before anything is timed
if [ $detached = 0 ] && ! python3 -c "import cudnn" 2>/dev/null; then
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
args=(--gpus "${GPUS:-4}" --repeats "${REPEATS:-3}" --time-limit "${TIME_LIMIT:-540}" --out "$DIR" ${NAME:+--name "$NAME"} ${SUITE:-all})
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
    # (every descriptor of the detached run, and of the subshell that execs it, goes to the log: a shell
    # left holding this script's stdout would keep a caller's `| tail` waiting until the run ends)
    (cd "$DIR/repo" && PYTHONPATH="$DIR/repo${PYTHONPATH:+:$PYTHONPATH}" exec setsid bash -c \
      'echo $$ > "$0/pid"; exec python3 -m bench.run "${@}"' "$DIR" "${args[@]}" "${warm[@]}" "${resume[@]}") \
      >>"$DIR/log.txt" 2>&1 </dev/null &
    sleep 2
  fi
  # (POLL: keep the call's whole command, the first call's setup included, well inside its limit)
  t0=$SECONDS
  end=$((SECONDS + ${POLL:-480}))
  running() { kill -0 "$(cat "$DIR/pid")" 2>/dev/null && ! tail -3 "$DIR/log.txt" | grep -q "^bench: run "; }
  while running && [ $SECONDS -lt $end ]; do sleep 5; done
  grep -E "^bench:|not started" "$DIR/log.txt" | tail -n "${LINES_SHOWN:-40}"
  echo "suite_session: waited $((SECONDS - t0)) s"
else
  python3 -m bench.run "${args[@]}" "${warm[@]}" "${resume[@]}" 2>&1 | tee -a "$DIR/log.txt" | grep -E "^bench|^== |not started"
fi
last=$(grep -E "^bench: run (complete|incomplete)" "$DIR/log.txt" | tail -1)
if [[ $last == "bench: run complete"* ]]; then echo "suite complete"
elif [ "${DETACH:-0}" = 1 ] && ! running; then
  if [ -n "$last" ]; then
    echo "suite ended incomplete (its time limit; the lines above say what did not run): the tables so far are in suite.tgz"
  else
    echo "suite_session: the run ended without its last line (it failed); the end of its log:"; tail -n 25 "$DIR/log.txt"
  fi
else echo "suite not complete: call again"; fi
tar czf "$OUT/suite.tgz" -C "$DIR" --exclude='raw-*/*.tmp' --exclude=./repo . 
ls -la "$OUT"
