"""A backend plugin for tests: onnxruntime, but loading takes `load_delay_s`, or, given `gate`,
lasts until the file at that path exists (at most a minute).

Lets tests see a model in state `loading` (503 + retry_after_ms) for as
long as they need, with real inference once it is ready. The gate lets a test
decide when a load ends instead of racing a clock.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

from gates import opened

from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend, OnnxRuntimeEngine

OWN_OPTIONS = ("load_delay_s", "gate")


class SlowLoadBackend(OnnxRuntimeBackend):
    name = "slow_load"

    def load(self, path: Path, options: Mapping[str, Any]) -> OnnxRuntimeEngine:
        if "gate" in options:
            opened(Path(str(options["gate"])), limit_s=60.0)  # not opened in time: load anyway
        else:
            time.sleep(float(options.get("load_delay_s", 2.0)))
        return super().load(path, {k: v for k, v in options.items() if k not in OWN_OPTIONS})
