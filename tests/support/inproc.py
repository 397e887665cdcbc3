"""An App built and started in the test's own process, for the frontend's unit tests: the same
composition the daemon makes, without a process or a socket of the test's in between."""

from __future__ import annotations

from pathlib import Path

from infermux import config as cfg
from infermux.app import App

# The inline gate as wide as it goes: on a busy box one slow call can raise a context's estimate past the
# default limits, and the tests that use this are about the paths, not that gate.
WIDE_INLINE_GATE = "inline_max_us = 1000000\ninline_busy_max_us = 1000000\n"

# One engine (support.models.add_one at engines/plain/1) served three ways: plainly, batched, and with
# a fallback; the paths a request may take differ for each.
PLAIN_MODELS = """
[[models]]
name = "plain"
version = "1"
engine = "plain/1/model.onnx"

[[models]]
name = "batched"
version = "1"
engine = "plain/1/model.onnx"
max_batch = 4

[[models]]
name = "guarded"
version = "1"
engine = "plain/1/model.onnx"
fallback = "plain"
"""


def started_app(tmp: Path, models: str, daemon: str = "") -> App:
    """An App serving `models` (TOML [[models]] over engines under tmp/engines), its sockets bound and
    every model loaded; `daemon` adds [daemon] keys."""
    text = (f'[daemon]\nlisten = ["ipc://infer.sock"]\nengine_dir = "{tmp / "engines"}"\nwatch = false\n'
            + WIDE_INLINE_GATE + daemon + models)
    app = App(cfg.parse(text, tmp / "infermux.toml"), tmp / "run")
    app.bind()
    app.start_models().join()
    return app
