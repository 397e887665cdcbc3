"""A broken worker for tests: onnxruntime whose worker process sends the daemon a message that does
not decode, as a corrupted worker would, and then never answers.

On a marked input, the first input's first value chooses the way: -1 a truncated REPLY on the fast
lane (read by the daemon's frontend thread), -2 a BEAT that is not JSON on the ZeroMQ pipe (read by
the proxy's reader thread). Any other input is served as onnxruntime serves it. With the option
`garble_load = true` the worker answers its LOAD with a READY that is not JSON instead.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import zmq

from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend, OnnxRuntimeContext, OnnxRuntimeEngine
from infermux.workers.lane import Lane

ON_LANE, ON_PIPE = -1.0, -2.0


def _argument(name: str) -> str:
    """A command-line value of the worker process (`python -m infermux.workers.child --lane 7 ...`)."""
    return sys.argv[sys.argv.index(name) + 1]


def _garble(way: float) -> None:
    if way == ON_LANE:
        lane = Lane.from_fd(os.dup(int(_argument("--lane"))))  # a second end on the worker's own socket
        assert lane.send([b"R\x00\x01"])  # a REPLY cut short: its fixed-size head is 39 bytes
        lane.close()
    else:
        _send_up(b"H{not json")


def _send_up(frame: bytes) -> None:
    """`frame` to the daemon on the worker's ZeroMQ pipe, delivered before this returns."""
    with zmq.Context() as ctx:  # leaving it waits until the message went out
        up = ctx.socket(zmq.PUSH)
        up.connect(_argument("--up"))
        up.send(frame)
        up.close(linger=5000)


class _GarblingContext(OnnxRuntimeContext):
    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        way = float(next(iter(inputs.values())).flat[0])
        if way in (ON_LANE, ON_PIPE):
            _garble(way)
            time.sleep(60)  # the daemon stops this worker long before
        return super().infer(inputs)


class _GarblingEngine(OnnxRuntimeEngine):
    def create_context(self) -> OnnxRuntimeContext:
        good = super().create_context()
        bad = _GarblingContext.__new__(_GarblingContext)
        bad.__dict__.update(good.__dict__)
        return bad


class GarblingBackend(OnnxRuntimeBackend):
    name = "garbling"

    def load(self, path: Path, options: Mapping[str, Any]) -> OnnxRuntimeEngine:
        options = dict(options)
        if options.pop("garble_load", False):
            _send_up(b"r{not json")  # ahead of the worker's own STAGE and READY
        engine = super().load(path, options)
        engine.__class__ = _GarblingEngine
        return engine
