"""CUDA graphs for fixed-shape TensorRT contexts (`[models.options] cuda_graph = true`).

A context whose profile admits one shape only (a batch-1 camera detector, or
a profile with min = max) runs the same kernels with the same buffers for
every request. Its `execute_async_v3` is captured into a CUDA graph once,
on the second request of that lane (the first, the load's warm-up, runs
outside the capture, as TensorRT needs after a shape is set), and every
later request replays the graph: one launch instead of one per kernel. The
copies in and out stay outside the graph (a cold worker's outputs go to a
different slot each time). A capture that fails (TensorRT refusing the
enqueue under capture, or the capture invalidated: cuda.Graph ends it and
clears the error it left, as trtexec does) is logged once and that lane
keeps running without a graph. docs/tensorrt.md#cuda-graphs.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from infermux.plugins.backends import cuda, trtlib
from infermux.plugins.backends.tensorrt_profiles import Lane, Profile
from infermux.plugins.base import BackendError

log = logging.getLogger("infermux.tensorrt")


def wanted(options: Mapping[str, Any], profiles: list[Profile], path: object) -> bool:
    """The `cuda_graph` option, checked: a bool, and only for engines with a fixed-shape profile."""
    value = options.get("cuda_graph", False)
    if not isinstance(value, bool):
        raise BackendError(f"option cuda_graph of {path} must be true or false, not {value!r}")
    if value and not any(all(lo == hi for lo, _, hi in p.ranges.values()) for p in profiles):
        ranges = "; ".join(p.describe() for p in profiles)
        raise BackendError(f"cuda_graph = true needs a fixed-shape engine or a profile with min = max "
                           f"shapes, and {path} has none ({ranges}): build one with `--profile N:N:N` "
                           f"or set cuda_graph = false")
    return value


def execute(lane: Lane, stream: cuda.Stream, shared: trtlib.Shared, graphs: bool) -> None:
    """Queue the lane's inference on `stream`: a graph replay where one is (or can now be) captured."""
    if graphs and lane.fixed and not lane.graph_failed:
        if lane.graph is None and lane.runs > 0:
            lane.graph = _capture(lane, stream, shared)
        if lane.graph is not None:
            lane.graph.launch(stream)
            lane.runs += 1
            return
    _enqueue(lane, stream, shared)
    lane.runs += 1


def _enqueue(lane: Lane, stream: cuda.Stream, shared: trtlib.Shared) -> None:
    if not lane.raw.execute_async_v3(stream.handle):
        raise BackendError(f"TensorRT execution failed: {shared.last_error() or 'no reason logged'}")


def _capture(lane: Lane, stream: cuda.Stream, shared: trtlib.Shared) -> cuda.Graph | None:
    try:
        graph = cuda.Graph(stream, lambda: _enqueue(lane, stream, shared))
    except BackendError as exc:  # not capturable (some plugins, or a CUDA error): run without
        lane.graph_failed = True
        log.warning("CUDA graph capture failed for %s, which runs without a graph: %s",
                    lane.profile.describe(), exc)
        return None
    log.info("captured a CUDA graph for %s", lane.profile.describe())
    return graph
