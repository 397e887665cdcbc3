#!/usr/bin/env bash
# The cold-worker benchmark on a machine with more CPUs, run twice in a row:
# held to 2 CPUs with taskset (the shape of the 2-vCPU development VMs) and
# on every CPU, so that one machine shows what the CPU count alone changes.
#
#   tests/benchmarks/bench_workers_cpus.sh [PYTHON]
#
# Each run writes its own RESULTS.md section, "Cold workers, N
# CPUs of M"; the ordinary section (the VMs' figures) is left alone. Needs
# infermux, onnx and onnxruntime importable by PYTHON (default python3).
set -eu
cd "$(dirname "$0")/../.."
PY=${1:-${PYTHON:-python3}}
ALL=$(nproc --all)
[ "$ALL" -gt 2 ] || { echo "only $ALL CPUs here: nothing to compare" >&2; exit 2; }

run() {  # run LABEL_CPUS [taskset args...]
    local label=$1
    shift
    echo "=== $label of $ALL CPUs"
    "$@" "$PY" tests/benchmarks/bench_workers.py --section "Cold workers, $label of $ALL CPUs"
}

run 2 taskset -c 0,1
run "$ALL" env
