#!/usr/bin/env bash
# System calls per request: the daemon (one context of the sample classifier)
# against the bare ROUTER + onnxruntime loop (baselines.py), same load.
#
#   tests/benchmarks/syscalls_per_request.sh [CONCURRENCY] [REQUESTS]   # default 1 and 3000
#
# Each server gets 500 warm-up requests from `infermux bench`, then
# `strace -c -f` counts every system call of its process (all threads) while
# REQUESTS more are sent. Counts, unlike times, do not depend on what else
# the box runs, so this is the one frontend figure a busy 2-core box gives
# exactly; strace slows the servers, so the QPS it prints mean nothing.
# Prints the calls per request of each server, the busiest first. Needs
# strace (`apt install strace`); runs from the checkout's .venv.
set -eu
concurrency=${1:-1}
requests=${2:-3000}
cd "$(dirname "$0")/../.."
command -v strace >/dev/null || { echo "strace is not installed: apt install strace" >&2; exit 2; }
python=${PYTHON:-.venv/bin/python}
work=$(mktemp -d /tmp/infermux-syscalls.XXXXXX)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

cat >"$work/daemon.toml" <<EOF
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "$PWD/engines"

[[models]]
name = "classifier"
version = "1"
engine = "classifier/1/model.onnx"
contexts = 1
EOF
"$python" -m infermux serve --config "$work/daemon.toml" --runtime-dir "$work/run" >"$work/daemon.log" 2>&1 &
pids+=("$!")
daemon_pid=$!
"$python" tests/benchmarks/baselines.py bare "ipc://$work/bare.sock" engines/classifier/1/model.onnx \
    >"$work/bare.log" 2>&1 &
pids+=("$!")
bare_pid=$!

load() {  # load ENDPOINT N
    "$python" -m infermux bench classifier -e "$1" --shape images=1x3x64x64 --concurrency "$concurrency" \
        --requests "$2" --wait 60 >/dev/null 2>"$work/load.err" || { echo "infermux bench failed against $1: $(tail -1 "$work/load.err")" >&2; exit 3; }
}

count() {  # count NAME PID ENDPOINT
    load "$3" 500
    strace -c -f -p "$2" -o "$work/$1.strace" 2>"$work/$1.err" &
    local tracer=$!
    sleep 1  # strace attaches to every thread
    load "$3" "$requests"
    kill -INT "$tracer" 2>/dev/null || true
    wait "$tracer" || true
    if ! grep -q total "$work/$1.strace" 2>/dev/null; then
        echo "strace could not attach to the $1 (pid $2): $(head -1 "$work/$1.err"); run as root or allow ptrace" >&2
        exit 2
    fi
    echo "== $1: system calls per request (c=$concurrency, $requests requests)"
    awk -v n="$requests" '$NF != "total" && $4 ~ /^[0-9]+$/ && $1 ~ /^[0-9.]+$/ {
        printf "  %-16s %6.2f\n", $NF, $4 / n }' "$work/$1.strace" | sort -k2 -nr | head -8
    awk -v n="$requests" '$NF == "total" { printf "  %-16s %6.2f\n", "all", $4 / n }' "$work/$1.strace"
}

count daemon "$daemon_pid" "ipc://$work/run/infer.sock"
count bare "$bare_pid" "ipc://$work/bare.sock"
