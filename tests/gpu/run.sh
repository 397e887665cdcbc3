#!/usr/bin/env bash
# GPU checks on a fresh machine: environment report, offline install, the
# tests marked `gpu`, a short TensorRT benchmark, the device-to-slot copies
# (bench_slot_d2h.py), the GIL probe (gil_probe.py), two cold workers without
# and with MPS (mps_compare.py) and one stage per behaviour of the TensorRT
# backend that needs the hardware (stages.py), then a table: stage, status, seconds, figure.
#
#   tests/gpu/run.sh [PYTHON]        (default: $PYTHON, else python3)
#
# Needs no package index: the project is installed with pip's --no-index
# --no-deps editable install, or, where that fails (old setuptools without
# `wheel`, an externally managed system Python), made importable through a
# PYTHONPATH shim. Every stage has a time limit sized for a Jetson Orin, and
# the whole run a budget ($INFERMUX_GPU_BUDGET seconds, default 840): a stage
# gets at most what is left of it, so the script ends within 15 minutes there
# (about 3 on a discrete GPU). TensorRT, cupy/torch or a second GPU missing
# means skipped stages, not failures.
set -u

cd "$(dirname "$0")/../.." || exit 2
REPO=$PWD
PY=${1:-${PYTHON:-python3}}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/infermux-gpu.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
# One engine build per set of options for the whole run (a Jetson takes a minute or more each);
# CUDA numbers GPUs as NVML does, so "GPU 0" means the same to both.
export INFERMUX_GPU_PLANS="$WORK/plans" CUDA_DEVICE_ORDER=PCI_BUS_ID
mkdir -p "$INFERMUX_GPU_PLANS"
BUDGET=${INFERMUX_GPU_BUDGET:-840}
STARTED=$(date +%s)

ROWS=()
FAILED=0
command -v timeout >/dev/null || { echo "run.sh: needs coreutils timeout" >&2; exit 2; }

row() {  # row NAME STATUS SECONDS FIGURE (cut to 110 characters: the full line is in the stage's output)
    ROWS+=("$(printf '%-9s %-28s %7s s  %s' "$1" "$2" "$3" "${4:0:110}")")
}

# stage NAME LIMIT_S CMD...: run CMD with a time limit (capped by what is left of the budget),
# output to a log file (a pipe could be held open by a stray child and hang us), then show it.
# The stage's figure is its last `FIGURE: ` line; a `SKIP: ` line with exit 0 makes it skipped.
stage() {
    local name=$1 limit=$2 start rc status secs figure left
    shift 2
    left=$((BUDGET - ($(date +%s) - STARTED)))
    if [ "$left" -lt 10 ]; then
        echo "=== $name: not run, the ${BUDGET} s budget is spent"
        row "$name" "not run (budget spent)" 0 ""; FAILED=1
        return 1
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== $name (limit ${limit} s)"
    start=$(date +%s.%N)
    timeout -k 5 "$limit" "$@" >"$WORK/$name.log" 2>&1 </dev/null
    rc=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    cat "$WORK/$name.log"
    figure=$(grep -E '^FIGURE: ' "$WORK/$name.log" | tail -n 1 | cut -c 9-)
    [ -n "$figure" ] || figure=$(grep -v '^[[:space:]]*$' "$WORK/$name.log" | tail -n 1 | tr -d '=' | xargs | cut -c 1-90)
    case $rc in
        0) if grep -qE '^SKIP: ' "$WORK/$name.log"; then
               status=skipped; figure=$(grep -E '^SKIP: ' "$WORK/$name.log" | tail -n 1 | cut -c 7-)
           else status=ok; fi ;;
        124|137) status="TIMEOUT after ${limit} s"; FAILED=1 ;;
        *) status="FAILED (exit $rc)"; FAILED=1 ;;
    esac
    echo "--- $name: $status${figure:+: $figure}"
    row "$name" "$status" "$secs" "$figure"
    return $rc
}

report_env() {
    "$PY" - <<'EOF'
import importlib, platform, sys, warnings
warnings.simplefilter("ignore")
print(f"python     {sys.version.split()[0]} ({sys.executable}), {platform.machine()}")
for label, names in [("numpy", ["numpy"]), ("pyzmq", ["zmq"]), ("onnxruntime", ["onnxruntime"]),
                     ("pytest", ["pytest"]),
                     ("cuda-py", ["cuda.bindings.runtime", "cuda.cudart"]),
                     ("tensorrt", ["tensorrt"])]:
    found = "missing"
    for name in names:
        try:
            mod = importlib.import_module(name)
        except Exception as exc:  # ImportError, or a binding that fails to load
            found = f"missing ({type(exc).__name__}: {exc})"[:120]
            continue
        parent = importlib.import_module(name.rsplit(".", 1)[0]) if "." in name else mod
        found = f"{getattr(mod, '__version__', '') or getattr(parent, '__version__', '?')} ({name})"
        break
    print(f"{label:<10} {found}")
EOF
    if command -v nvidia-smi >/dev/null; then
        timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    else
        echo "nvidia-smi not found (normal on Jetson: see tegrastats)"
    fi
}

importable() {
    # The module must come from this checkout (the shim's symlinks resolve into it).
    "$PY" -c "import os, sys, infermux.plugins.backends.cuda as m
sys.exit(0 if os.path.realpath(m.__file__).startswith('$REPO/') else 1)" 2>/dev/null
}

make_shim() {
    # infermux = daemon/, infermux.plugins = plugins/, infermux.tui = tui/ (pyproject's package-dir)
    mkdir -p "$WORK/shim/infermux"
    for f in "$REPO"/daemon/*; do ln -s "$f" "$WORK/shim/infermux/"; done
    ln -s "$REPO/plugins" "$WORK/shim/infermux/plugins"
    ln -s "$REPO/tui" "$WORK/shim/infermux/tui"
    export PYTHONPATH="$WORK/shim${PYTHONPATH:+:$PYTHONPATH}"
}

install() {
    if importable; then
        echo "infermux already importable from $REPO"
        return 0
    fi
    if timeout 60 "$PY" -m pip install --no-index --no-deps --no-build-isolation -e "$REPO" >"$WORK/pip.log" 2>&1 \
            && importable; then
        echo "installed with pip (editable, offline)"
        return 0
    fi
    echo "pip editable install not possible here: $(grep -m 1 -iE 'error|externally' "$WORK/pip.log" | cut -c 1-120)"
    echo "using a PYTHONPATH shim instead"
    make_shim
    importable && echo "infermux importable through $WORK/shim"
}

stage env 20 bash -c "$(declare -f report_env); PY='$PY' report_env"
echo "=== install"
install_start=$(date +%s.%N)
if install; then install_status=ok; else install_status=FAILED; FAILED=1; fi
row install "$install_status" \
    "$(awk -v a="$install_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')" ""

TESTS_LINE="not run"
if [ "$install_status" != ok ]; then
    echo "cannot import infermux: skipping tests and benchmark"
elif ! "$PY" -c "import numpy" 2>/dev/null; then
    echo "numpy is missing: install python3-numpy; skipping tests and benchmark"; FAILED=1
else
    if "$PY" -c "import pytest" 2>/dev/null; then
        stage tests 420 "$PY" -m pytest tests/gpu -m gpu -v -rs -p no:cacheprovider
        TESTS_LINE=$(grep -E '(passed|failed|skipped|error)' "$WORK/tests.log" | tail -n 1 | tr -d '=' | xargs)
    else
        echo "pytest is missing (python3-pytest): GPU tests not run"; TESTS_LINE="not run: no pytest"
    fi
    stage bench 120 "$PY" tests/gpu/bench_trt.py --seconds 3 --contexts 1,2
    stage slot 60 "$PY" tests/gpu/bench_slot_d2h.py
    # One stage per behaviour: cap, gil, pycuda, memory, formats, vcompat, teardown, standin
    # (stages.py and gil_probe.py say what each proves).
    stage gil 60 "$PY" tests/gpu/gil_probe.py
    # Then the features: budget (one per GPU), rebuild, profiles, graphs, dla, zerocopy.
    for item in cap pycuda memory formats vcompat teardown standin budget rebuild profiles graphs dla zerocopy; do
        case $item in formats|rebuild|dla) limit=240 ;; cap|vcompat|profiles|graphs|zerocopy) limit=180 ;; *) limit=90 ;; esac
        stage "$item" "$limit" "$PY" tests/gpu/stages.py "$item" "$WORK/stages"
    done
    # Two cold workers without and with MPS ([daemon] mps; mps_compare.py).
    stage mps 120 "$PY" tests/gpu/mps_compare.py "$WORK/mps" 5
fi

TRT=$("$PY" -c "import tensorrt; print(tensorrt.__version__)" 2>/dev/null || echo "skipped (not installed)")
echo
echo "================ infermux GPU summary ================"
printf '%-9s %-28s %9s  %s\n' stage status seconds figure
printf '%s\n' "${ROWS[@]}"
echo "TensorRT: $TRT"
echo "tests:    $TESTS_LINE"
grep -hE '^(BENCH|bench:|[0-9]+ -> [0-9]+ contexts)' "$WORK/bench.log" 2>/dev/null | sed 's/^/bench:    /'
grep -hE '^\| (pinned|pageable|registered|register)' "$WORK/slot.log" 2>/dev/null | sed 's/^/slot:     /'
exit $FAILED
