#!/usr/bin/env bash
# tests/stress.sh N: run the timing-sensitive tests N times (default 20) under load.
#
# The tests marked `timing` (pytest -m timing: batching, deadlines, wake-ups,
# crashes, sweeps; pyproject.toml declares the marker) once depended on how
# the box scheduled threads and processes. Each round runs them all with one
# busy-looping process per core (`nproc` of them), so that every thread the
# tests start competes for a CPU; the hogs stop when the round ends, also on
# Ctrl-C or a failure (trap). How long a round takes: tests/benchmarks/
# RESULTS.md, "Test suite wall time". The last line counts the rounds:
#
#     20 passed, 0 failed in 2400 s
#
# and the exit status is 0 only if every round passed. Each failing round's
# output is kept in $STRESS_LOGS (default: a fresh directory under /tmp).
#
# Environment:
#   PYTHON       the interpreter with infermux and the test extras
#                (default: .venv/bin/python when there is one, else python3)
#   STRESS_LOCK  a file to flock for each round, so that rounds on a shared
#                box do not overlap other timing-sensitive work (default: none)
#   STRESS_ARGS  more pytest arguments, e.g. "-k batch" to stress a subset
set -u

rounds=${1:-20}
case $rounds in
    '' | *[!0-9]*) echo "usage: tests/stress.sh [ROUNDS]  (ROUNDS: a whole number, default 20)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.." || exit 2
python=${PYTHON:-}
if [ -z "$python" ]; then
    if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
logs=${STRESS_LOGS:-$(mktemp -d /tmp/infermux-stress.XXXXXX)}
mkdir -p "$logs"

hogs=()
start_hogs() {
    local _
    for _ in $(seq "$(nproc)"); do
        python3 -c 'while True: pass' &
        hogs+=("$!")
    done
}
stop_hogs() {
    local pid
    for pid in "${hogs[@]}"; do
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    hogs=()
}
trap stop_hogs EXIT
trap 'stop_hogs; exit 130' INT TERM

one_round() {  # $1: the round's number; its output goes to $logs/round-N.log
    local log="$logs/round-$1.log" status
    start_hogs
    # shellcheck disable=SC2086  # STRESS_ARGS is a list of words
    timeout 900 "$python" -m pytest -q -p no:cacheprovider -m timing ${STRESS_ARGS:-} tests >"$log" 2>&1
    status=$?
    stop_hogs
    return "$status"
}

passed=0 failed=0 started=$(date +%s)
for round in $(seq "$rounds"); do
    if [ -n "${STRESS_LOCK:-}" ]; then
        exec {lock}>>"$STRESS_LOCK"
        flock "$lock"
    fi
    round_started=$(date +%s)
    if one_round "$round"; then
        passed=$((passed + 1))
        result=passed
        rm -f "$logs/round-$round.log"
    else
        failed=$((failed + 1))
        result="FAILED (see $logs/round-$round.log)"
    fi
    if [ -n "${STRESS_LOCK:-}" ]; then
        exec {lock}>&-
    fi
    echo "round $round/$rounds: $result in $(($(date +%s) - round_started)) s"
    [ -f "$logs/round-$round.log" ] && grep -E '^(FAILED|ERROR) ' "$logs/round-$round.log"
done
echo "$passed passed, $failed failed in $(($(date +%s) - started)) s"
[ "$failed" -eq 0 ]
