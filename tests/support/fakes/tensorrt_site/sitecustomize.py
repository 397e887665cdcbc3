"""Puts the TensorRT and cuda-python stand-in (tests/support/fakes/tensorrt.py) into a process Python starts
with this folder on PYTHONPATH and INFERMUX_FAKE_TRT=1: a daemon a contract test starts, and the
worker processes it spawns (they inherit both). Elsewhere it does nothing."""

import os
import sys
from pathlib import Path

if os.environ.get("INFERMUX_FAKE_TRT") == "1":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # tests/, for support.fakes
    from support.fakes import tensorrt as fakes_tensorrt

    fakes_tensorrt.install()
