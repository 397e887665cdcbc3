"""Shared pieces of the GPU tests and the benchmark: paths, GPU detection, engine builds."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from infermux.plugins.backends import cuda
from infermux.plugins.base import BackendError

REPO = Path(__file__).resolve().parents[2]
CLASSIFIER_ONNX = REPO / "engines" / "classifier" / "1" / "model.onnx"
BATCH = (1, 4, 8)   # min, opt, max batch of the engines built here


@functools.lru_cache(maxsize=None)
def gpu_missing() -> str | None:
    """Why GPU tests cannot run here, or None if they can."""
    try:
        count = cuda.device_count()
    except cuda.CudaError:
        raise  # a GPU that answers with an unexpected error is a failure, not a skip
    except BackendError as exc:
        return str(exc)  # no CUDA binding for this Python
    return None if count else "no NVIDIA GPU or driver on this machine"


def build_plan(out: Path, *extra: str) -> Path:
    """Run `infermux build` on the sample classifier, as an operator would.

    Where $INFERMUX_GPU_PLANS names a folder (run.sh sets one), a plan built there with the same
    arguments is copied instead: a Jetson takes a minute or more per build.
    """
    cache = os.environ.get("INFERMUX_GPU_PLANS")
    key = Path(cache, "classifier" + "".join(extra).replace("-", "_") + ".plan") if cache else None
    if key is not None and key.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(key, out)
        return out
    cmd = [sys.executable, "-m", "infermux.cli.build", str(CLASSIFIER_ONNX), "-o", str(out),
           "--min-batch", str(BATCH[0]), "--opt-batch", str(BATCH[1]), "--max-batch", str(BATCH[2]), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    if key is not None:
        shutil.copyfile(out, key)
    return out


def images(batch: int, seed: int = 0) -> np.ndarray:
    """Sample input for the classifier."""
    return np.random.default_rng(seed).normal(size=(batch, 3, 64, 64)).astype(np.float32)
