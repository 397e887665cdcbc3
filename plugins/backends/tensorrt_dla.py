"""DLA, the deep-learning accelerators of Jetson Orin (AGX and NX have two; Orin Nano none).

Building: `infermux build --dla-core N [--gpu-fallback] --profile B:B:B`
makes DLA the default device of every layer (`default_device_type`), on
core N, and with `--gpu-fallback` lets layers the DLA cannot run go to the
GPU (without it such a network fails to build); tensorrt_build.py does it,
and says how many layers landed on the DLA. DLA runs FP16 or INT8 only, and
no dynamic dimensions: its profile must be static (min = opt = max).

Loading: the DLA core an engine runs on is a setting of the runtime that
deserializes it (`IRuntime.DLA_core`), and infermux has one runtime for the
process (trtlib.py). So the core is set and the plan deserialized under the
runtime's lock: two models loading at once onto different cores each get
theirs. The core is the model's `dla_core` option, else the one it was
built for (`model.plan.build.json`). docs/tensorrt.md#dla-jetson.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from infermux.plugins.backends import trtlib
from infermux.plugins.backends.tensorrt_build import stored_settings
from infermux.plugins.base import BackendError


def core_for(plan: Path, options: Mapping[str, Any]) -> int | None:
    """The DLA core `plan` is to run on, or None for a GPU-only engine."""
    value = options.get("dla_core", stored_settings(plan).get("dla_core"))
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BackendError(f"option dla_core of {plan} must be a DLA core number (0, 1, ...), not {value!r}")
    return value


def select(shared: trtlib.Shared, core: int, plan: Path) -> None:
    """Point the shared runtime at DLA `core` (call it holding `shared.runtime_lock`)."""
    available = int(getattr(shared.runtime, "num_DLA_cores", 0))
    if core >= available:
        raise BackendError(f"{plan} is to run on DLA core {core}, but this device has {available} DLA "
                           f"core(s) (Jetson Orin AGX and NX have 2, Orin Nano and discrete GPUs none): "
                           f"set dla_core to an existing core, or rebuild for the GPU without --dla-core")
    shared.runtime.DLA_core = core

