#!/usr/bin/env bash
# Run `make test` N times in a row, each from a fresh clone of this checkout's HEAD, and record
# the verdict and the wall time of each run: the "green N times in a row" check of issues 39,
# 40 and 44. With --hog K, run K holds one busy-loop process beside the tests for its whole
# length (another CPU-heavy job on the same 2 cores, as CI machines often have).
#
#   scripts/repeat_ci.sh 5 --hog 3            # five runs, the third with a CPU hog
#   scripts/repeat_ci.sh 1 --out /tmp/runs    # one run, logs elsewhere
#
# The clones go under $OUT (default .cache/repeat-ci, ignored by git); the data is
# $PARITYSERVE_DATA or ../shared/data. It stops at the first red run and says which.
# Writes $OUT/runs.md: one row per run (clone, commit, hog, exit code, minutes, pytest's
# summary line), and each run's full log as $OUT/run-N.log.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

case "${1:-}" in -h|--help) usage 0 ;; esac
runs="${1:-}"; shift || true
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "repeat_ci.sh: the first argument is how many runs (got '${runs}')" >&2; usage; }
hog=0; out="$ROOT/.cache/repeat-ci"
while [ $# -gt 0 ]; do
  case "$1" in
    --hog) hog="${2:?--hog takes a run number}"; shift 2 ;;
    --out) out="${2:?--out takes a folder}"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "repeat_ci.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
data="${PARITYSERVE_DATA:-$ROOT/../shared/data}"
[ -d "$data" ] || { echo "repeat_ci.sh: no data folder at $data (set PARITYSERVE_DATA)" >&2; exit 2; }
data="$(cd "$data" && pwd)"
commit="$(git -C "$ROOT" rev-parse --short HEAD)"
mkdir -p "$out"
table="$out/runs.md"
{
  echo "# make test, $runs runs in a row from fresh clones of this checkout (from $commit)"
  echo
  echo "| run | commit | CPU hog beside it | exit | minutes | pytest's summary |"
  echo "|---|---|---|---|---|---|"
} > "$table"

hog_pid=""
stop_hog() { [ -n "$hog_pid" ] && kill "$hog_pid" 2>/dev/null; hog_pid=""; }
trap stop_hog EXIT

for n in $(seq 1 "$runs"); do
  work="$out/run-$n"
  rm -rf "$work"
  mkdir -p "$work"
  git clone --quiet "$ROOT" "$work/main"
  commit="$(git -C "$work/main" rev-parse --short HEAD)"  # this run's own: HEAD may move on
  with_hog="no"
  if [ "$n" = "$hog" ]; then
    python3 -c 'while True: pass' & hog_pid=$!
    with_hog="yes (pid $hog_pid)"
  fi
  start=$(date +%s)
  code=0
  (cd "$work/main" && PARITYSERVE_DATA="$data" CI=true make test) > "$out/run-$n.log" 2>&1 || code=$?
  minutes=$(python3 -c "print(f'{($(date +%s) - $start) / 60:.1f}')")
  stop_hog
  summary="$(grep -E '^=+ .*(passed|failed).* in [0-9.]+s' "$out/run-$n.log" | tail -1 | tr -d '=' | sed 's/^ *//;s/ *$//')"
  echo "| $n | $commit | $with_hog | $code | $minutes | ${summary:-none (see run-$n.log)} |" >> "$table"
  echo "run $n: exit $code, $minutes min, ${summary:-no summary}"
  if [ "$code" != 0 ]; then
    echo "repeat_ci.sh: run $n failed; its log is $out/run-$n.log" >&2
    exit 1
  fi
  rm -rf "$work"  # a clone with its venv is ~2 GB
done
echo "all $runs runs green: $table"
