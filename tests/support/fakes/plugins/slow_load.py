"""A backend plugin for tests: onnxruntime, but loading takes `load_delay_s`.

Lets tests see a model in state `loading` (503 + retry_after_ms) for as
long as they need, with real inference once it is ready.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend, OnnxRuntimeEngine


class SlowLoadBackend(OnnxRuntimeBackend):
    name = "slow_load"

    def load(self, path: Path, options: Mapping[str, Any]) -> OnnxRuntimeEngine:
        time.sleep(float(options.get("load_delay_s", 2.0)))
        return super().load(path, {k: v for k, v in options.items() if k != "load_delay_s"})
