#!/usr/bin/env bash
# GPU checks on a fresh machine: environment report, offline install, the
# tests marked `gpu`, a short TensorRT benchmark and the device-to-slot
# copies (bench_slot_d2h.py), then a summary.
#
#   tests/gpu/run.sh [PYTHON]        (default: $PYTHON, else python3)
#
# Needs no package index: the project is installed with pip's --no-index
# --no-deps editable install, or, where that fails (old setuptools without
# `wheel`, an externally managed system Python), made importable through a
# PYTHONPATH shim. Every stage has a time limit (about 5 minutes in all);
# TensorRT or onnxruntime missing means skipped tests, not a failure.
set -u

cd "$(dirname "$0")/../.." || exit 2
REPO=$PWD
PY=${1:-${PYTHON:-python3}}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/infermux-gpu.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1

ROWS=()
FAILED=0
command -v timeout >/dev/null || { echo "run.sh: needs coreutils timeout" >&2; exit 2; }

# stage NAME LIMIT_S CMD...: run CMD with a time limit, output to a log file
# (a pipe could be held open by a stray child and hang us), then show it.
stage() {
    local name=$1 limit=$2 start rc status secs
    shift 2
    echo "=== $name (limit ${limit} s)"
    start=$(date +%s.%N)
    timeout -k 5 "$limit" "$@" >"$WORK/$name.log" 2>&1 </dev/null
    rc=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    cat "$WORK/$name.log"
    case $rc in
        0) status=ok ;;
        124|137) status="TIMEOUT after ${limit} s"; FAILED=1 ;;
        *) status="FAILED (exit $rc)"; FAILED=1 ;;
    esac
    ROWS+=("$(printf '%-8s %-26s %7s s' "$name" "$status" "$secs")")
    return $rc
}

report_env() {
    "$PY" - <<'EOF'
import importlib, platform, sys, warnings
warnings.simplefilter("ignore")
print(f"python     {sys.version.split()[0]} ({sys.executable}), {platform.machine()}")
for label, names in [("numpy", ["numpy"]), ("pyzmq", ["zmq"]), ("onnxruntime", ["onnxruntime"]),
                     ("pytest", ["pytest"]),
                     ("cuda-py", ["cuda.bindings.runtime", "cuda.cudart", "pycuda.driver"]),
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
ROWS+=("$(printf '%-8s %-26s %7s s' install "$install_status" \
    "$(awk -v a="$install_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')")")

TESTS_LINE="not run"
if [ "$install_status" != ok ]; then
    echo "cannot import infermux: skipping tests and benchmark"
elif ! "$PY" -c "import numpy" 2>/dev/null; then
    echo "numpy is missing: install python3-numpy; skipping tests and benchmark"; FAILED=1
else
    if "$PY" -c "import pytest" 2>/dev/null; then
        stage tests 180 "$PY" -m pytest tests/gpu -m gpu -v -rs -p no:cacheprovider
        TESTS_LINE=$(grep -E '(passed|failed|skipped|error)' "$WORK/tests.log" | tail -n 1 | tr -d '=' | xargs)
    else
        echo "pytest is missing (python3-pytest): GPU tests not run"; TESTS_LINE="not run: no pytest"
    fi
    stage bench 75 "$PY" tests/gpu/bench_trt.py --seconds 3 --contexts 1,2
    stage slot 60 "$PY" tests/gpu/bench_slot_d2h.py
fi

TRT=$("$PY" -c "import tensorrt; print(tensorrt.__version__)" 2>/dev/null || echo "skipped (not installed)")
echo
echo "================ infermux GPU summary ================"
printf '%s\n' "${ROWS[@]}"
echo "TensorRT: $TRT"
echo "tests:    $TESTS_LINE"
grep -hE '^(BENCH|bench:|[0-9]+ -> [0-9]+ contexts)' "$WORK/bench.log" 2>/dev/null | sed 's/^/bench:    /'
grep -hE '^\| (pinned|pageable|registered|register)' "$WORK/slot.log" 2>/dev/null | sed 's/^/slot:     /'
exit $FAILED
