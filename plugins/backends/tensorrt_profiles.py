"""Optimization profiles: one TensorRT execution context per profile, a request routed to one that admits it.

An engine built with several profiles (`infermux build --profile ...`, or
`trtexec` with several `--minShapes/--optShapes/--maxShapes` sets) holds
kernels tuned for each shape range. Every context the backend hands an
executor holds one TensorRT execution context per profile (a `Lane`), each
set to its profile once, when it is made, with its own buffers sized for that
profile's largest shapes, all on the executor context's one stream. A
request runs on the tightest lane whose profile admits all its input shapes.
docs/tensorrt.md#several-optimization-profiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from infermux.plugins.backends import cuda, trtlib
from infermux.plugins.base import BackendError, InputRejected

Shape = tuple[int, ...]


def nbytes(dtype: str, shape: Sequence[int]) -> int:
    """Bytes of a dense tensor of `dtype` and `shape`."""
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


@dataclass(frozen=True)
class Profile:
    """One optimization profile: (min, opt, max) shape per input. A fixed-shape engine has one
    profile, index 0, whose three shapes are its inputs' shapes."""

    index: int
    ranges: Mapping[str, tuple[Shape, Shape, Shape]]

    def admits(self, shapes: Mapping[str, Shape]) -> bool:
        """Whether every input shape lies within this profile's range."""
        for name, shape in shapes.items():
            low, _, high = self.ranges[name]
            if len(shape) != len(low) or not all(a <= d <= b for a, d, b in zip(low, shape, high)):
                return False
        return True

    def shapes(self, which: int) -> dict[str, Shape]:
        """Every input's min (0), opt (1) or max (2) shape."""
        return {name: r[which] for name, r in self.ranges.items()}

    def describe(self) -> str:
        ranges = ", ".join(f"{n} {list(lo)}..{list(hi)}" for n, (lo, _, hi) in self.ranges.items())
        return f"profile {self.index}: {ranges}"


def read_profiles(engine: Any, inputs: Sequence[str]) -> list[Profile]:
    """Every optimization profile of `engine` (ICudaEngine), from get_tensor_profile_shape."""
    if all(-1 not in tuple(engine.get_tensor_shape(n)) for n in inputs):  # fixed shapes: no profile to ask
        return [Profile(0, {n: (tuple(engine.get_tensor_shape(n)),) * 3 for n in inputs})]
    profiles = []
    for k in range(max(1, int(engine.num_optimization_profiles))):
        ranges = {}
        for name in inputs:
            shape = tuple(engine.get_tensor_shape(name))
            low, opt, high = ((shape,) * 3 if -1 not in shape
                              else (tuple(d) for d in engine.get_tensor_profile_shape(name, k)))
            ranges[name] = (tuple(low), tuple(opt), tuple(high))
        profiles.append(Profile(k, ranges))
    return profiles


def span(shapes: Sequence[Shape]) -> tuple[Shape, Shape]:
    """(element-wise min, element-wise max) of same-rank shapes: the range all profiles cover."""
    return tuple(min(d) for d in zip(*shapes)), tuple(max(d) for d in zip(*shapes))


class Lane:
    """One TensorRT execution context set to one profile, with pinned and device buffers sized for
    that profile's largest shapes. Owned by one TensorRTContext, used by its one thread."""

    def __init__(self, raw: Any, profile: Profile, dtypes: Mapping[str, str], outputs: Sequence[str],
                 stream: cuda.Stream, shared: trtlib.Shared, mapped: bool = False) -> None:
        self.raw, self.profile, self._shared = raw, profile, shared
        # Zero-copy (integrated GPUs): TensorRT reads and writes the pinned buffers in place.
        self.mapped = mapped
        # One shape only: a CUDA graph captured once replays every request (tensorrt_graphs.py).
        self.fixed = all(low == high for low, _, high in profile.ranges.values())
        self.graph: cuda.Graph | None = None
        self.graph_failed = False
        self.runs = 0
        self.host: dict[str, cuda.HostBuffer] = {}
        self.dev: dict[str, cuda.DeviceBuffer] = {}
        if profile.index:
            _switch(raw, profile, stream, shared)
        self.low = self.output_shapes(profile.shapes(0), outputs)
        self.high = self.output_shapes(profile.shapes(2), outputs)
        sizes = {**{n: nbytes(dtypes[n], s) for n, s in profile.shapes(2).items()},
                 **{n: nbytes(dtypes[n], self.high[n]) for n in outputs}}
        try:
            for name, size in sizes.items():
                self._bind(name, size)
        except BaseException:
            for buffer in self.buffers():  # the context never owned them: release them here
                buffer.close()
            raise
        self.io_bytes = sum(sizes.values())

    def _bind(self, name: str, size: int) -> None:
        self.host[name] = host = cuda.HostBuffer(size, mapped=self.mapped)
        if self.mapped:
            ptr = host.device_ptr
        else:
            self.dev[name] = dev = cuda.DeviceBuffer(size)
            ptr = dev.ptr
        if not self.raw.set_tensor_address(name, ptr):
            raise BackendError(f"TensorRT refused the buffer for tensor {name!r}: "
                               f"{self._shared.last_error() or 'no reason logged'}")

    def output_shapes(self, inputs: Mapping[str, Shape], outputs: Sequence[str]) -> dict[str, Shape]:
        """Set the input shapes; every output's shape for them (BackendError if data-dependent)."""
        for name, shape in inputs.items():
            if not self.raw.set_input_shape(name, shape):
                raise InputRejected(f"TensorRT rejected shape {list(shape)} for input {name!r}; the engine's "
                                    f"{self.profile.describe()}")
        shapes = {n: tuple(self.raw.get_tensor_shape(n)) for n in outputs}
        dynamic = [n for n, s in shapes.items() if any(d < 0 for d in s)]
        if dynamic:
            raise BackendError(f"outputs {dynamic} have no shape before execution ({[list(shapes[n]) for n in dynamic]}): "
                               f"data-dependent output shapes are not supported")
        return shapes

    def close_graph(self) -> None:
        """Destroy the captured graph, if any: before the TensorRT context whose kernels it replays."""
        graph, self.graph = self.graph, None
        if graph is not None:
            graph.close()

    def buffers(self) -> list[cuda.HostBuffer | cuda.DeviceBuffer]:
        """The buffers, emptied from this lane (to be released after the context)."""
        buffers: list[cuda.HostBuffer | cuda.DeviceBuffer] = [*self.dev.values(), *self.host.values()]
        self.dev.clear()
        self.host.clear()
        return buffers


def _switch(raw: Any, profile: Profile, stream: cuda.Stream, shared: trtlib.Shared) -> None:
    """Move a new TensorRT context (on profile 0) to `profile`, queued on `stream` (the _async call).
    The binding raises RuntimeError when TensorRT refuses; it never returns False."""
    try:
        raw.set_optimization_profile_async(profile.index, stream.handle)
    except RuntimeError as exc:
        raise BackendError(f"TensorRT refused to switch an execution context to optimization "
                           f"{profile.describe()}: {shared.last_error() or exc}") from exc


def by_tightness(lanes: list[Lane]) -> list[Lane]:
    """Lanes in the order to try them: the smallest largest-shape first, whose kernels are tuned
    closest to small requests."""
    return sorted(lanes, key=lambda lane: sum(int(np.prod(s[2])) for s in lane.profile.ranges.values()))


def choose(lanes: Sequence[Lane], shapes: Mapping[str, Shape]) -> Lane:
    """The first lane whose profile admits `shapes`; InputRejected naming every profile if none does
    (a shape inside the engine's overall range but in a gap between its profiles)."""
    for lane in lanes:
        if lane.profile.admits(shapes):
            return lane
    profiles = "; ".join(lane.profile.describe() for lane in sorted(lanes, key=lambda lane: lane.profile.index))
    raise InputRejected(f"input shapes {({n: list(s) for n, s in shapes.items()})} fit none of the engine's "
                        f"optimization profiles ({profiles})")
