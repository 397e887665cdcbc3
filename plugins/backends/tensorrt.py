"""The TensorRT backend: serialized engines (`.plan`, `.engine`) on NVIDIA GPUs.

Only the TensorRT 10 named-tensor API, as of 10.3 (JetPack 6), and nothing
that is deprecated or gone in 11: tensors are found by name, shapes are set
per request with `set_input_shape`, buffers bound with `set_tensor_address`,
work queued with `execute_async_v3`; memory sizes come from the `_v2` calls.

Each context owns a CUDA stream and one TensorRT execution context per
optimization profile (tensorrt_profiles.py), each with, for every input and
output, a pinned host buffer and a device buffer sized for its profile's
largest shapes. Its TensorRT contexts share one activation buffer
(USER_MANAGED memory): they run one at a time on the one stream, so a context
costs one activation buffer however many profiles the engine has. They are
bound once and reused by every request, so serving a request allocates
nothing on the GPU.

Engines are specific to the GPU model and TensorRT version that built them,
so every load failure says how to rebuild.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from infermux.plugins.backends import cuda, tensorrt_dla, tensorrt_graphs, tensorrt_rebuild, trtlib
from infermux.plugins.backends.tensorrt_profiles import Lane, Profile, by_tightness, choose, nbytes, read_profiles, span
from infermux.plugins.base import BackendError, InputRejected, OutputsMismatch, TensorSpec

log = logging.getLogger("infermux.tensorrt")

REBUILD = "rebuild the engine on this device with `infermux build MODEL.onnx -o {path}`"


class PlanRejected(BackendError):
    """TensorRT read the file and refused it: another TensorRT version or GPU built it, or it is
    not a plan. With its ONNX source at hand the backend rebuilds it (tensorrt_rebuild.py)."""


_nbytes = nbytes


def _cuda_advice(exc: cuda.CudaError) -> str:
    if exc.out_of_memory:
        return ("not enough GPU memory: unload other models or lower `contexts` "
                "(on Jetson the GPU shares the system RAM with every process)")
    if exc.name in cuda.NO_GPU_ERRORS:
        return "this machine has no usable NVIDIA GPU or driver"
    return "the GPU or its driver is in a bad state: check `nvidia-smi` (`tegrastats` on Jetson) and `dmesg`"


def _read_plan(path: Path) -> bytes:
    try:
        plan = path.read_bytes()
    except OSError as exc:
        raise BackendError(f"cannot read engine file {path}: {exc.strerror or exc}") from exc
    if not plan:
        raise BackendError(f"engine file {path} is empty (still being written?)")
    return plan


class TensorRTContext:
    """One executor's context: a TensorRT execution context per optimization profile (a Lane, each
    with its own buffers), all on one CUDA stream (tensorrt_profiles.py).

    Used by one thread at a time: a second thread calling `infer` while a
    request runs gets a BackendError instead of corrupting the buffers.
    """

    def __init__(self, raws: Sequence[Any], profiles: Sequence[Profile], inputs: Sequence[TensorSpec],
                 outputs: Sequence[tuple[str, str]], device: int, shared: trtlib.Shared,
                 on_close: Callable[["TensorRTContext"], None], mapped: bool = False,
                 activation_bytes: int = 0) -> None:
        self._inputs = list(inputs)
        self._dtypes = {**{s.name: s.dtype for s in inputs}, **dict(outputs)}
        self._output_names = [name for name, _ in outputs]
        self._device = device
        self._shared = shared
        self._on_close = on_close
        self._owner = threading.Lock()
        self._stream: cuda.Stream | None = None
        self._lanes: list[Lane] = []
        self._activations: cuda.DeviceBuffer | None = None
        self._closed = False
        self.graphs = False  # cuda_graph: set by the engine (tensorrt_graphs.py)
        try:
            self._stream = cuda.Stream()
            self._activations = _share_activations(raws, activation_bytes)
            for raw, profile in zip(raws, profiles):
                self._lanes.append(Lane(raw, profile, self._dtypes, self._output_names, self._stream, shared,
                                        mapped))
            self._lanes = by_tightness(self._lanes)
        except BaseException:
            self._release()
            raise

    def lanes(self) -> list[Lane]:
        """The lanes, tightest profile first."""
        return list(self._lanes)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one request; InputRejected if the tensors fit no optimization profile."""
        return self._serve(inputs, None)

    def infer_into(self, inputs: Mapping[str, np.ndarray],
                   outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`infer` with the named outputs copied from the device straight into `outputs`' arrays
        (base.WritesOutputs: a cold worker's slot), skipping the pinned buffers and two host
        copies; OutputsMismatch, before anything runs, if they are not this run's shapes."""
        return self._serve(inputs, outputs)

    def _serve(self, inputs: Mapping[str, np.ndarray], into: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        if not self._owner.acquire(blocking=False):
            raise BackendError("execution context used by two threads at once: each executor "
                               "thread must own its own context (engine.create_context())")
        try:
            if self._closed:
                raise BackendError("execution context used after close")
            arrays = self._checked(inputs)
            try:
                return self._run(arrays, into or {})
            except BaseException:
                self._drain()
                raise
        finally:
            self._owner.release()

    def _checked(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [s.name for s in self._inputs]
        missing = [n for n in names if n not in inputs]
        unknown = sorted(set(inputs) - set(names))
        if missing or unknown:
            raise InputRejected(f"engine inputs are {names}; missing {missing}, unknown {unknown}")
        arrays = {}
        for spec in self._inputs:
            arrays[spec.name] = array = np.asarray(inputs[spec.name])
            reason = spec.accepts(array.dtype.name, array.shape)
            if reason:
                raise InputRejected(reason)
        return arrays

    def _run(self, arrays: dict[str, np.ndarray], into: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self._stream is not None
        cuda.set_device(self._device)  # CUDA's current device is per thread
        lane = choose(self._lanes, {n: a.shape for n, a in arrays.items()})
        shapes = lane.output_shapes({n: a.shape for n, a in arrays.items()}, self._output_names)
        _check_into(into, self._dtypes, shapes)
        for name, array in arrays.items():
            host = lane.host[name]
            # "equiv" allows only byte-order changes: the wire is little-endian anyway.
            np.copyto(host.view(self._dtypes[name], array.shape), array, casting="equiv")
            if not lane.mapped:  # zero-copy: TensorRT reads the pinned buffer itself
                cuda.copy_to_device(lane.dev[name], host, array.nbytes, self._stream)
        tensorrt_graphs.execute(lane, self._stream, self._shared, self.graphs)
        for name in self._output_names if not lane.mapped else ():
            if name in into:
                cuda.copy_to_array(into[name], lane.dev[name], self._stream)
            else:
                size = _nbytes(self._dtypes[name], shapes[name])
                cuda.copy_to_host(lane.host[name], lane.dev[name], size, self._stream)
        self._stream.synchronize()
        return {name: self._result(lane, name, shapes[name], into) for name in self._output_names}

    def _result(self, lane: Lane, name: str, shape: tuple[int, ...], into: Mapping[str, np.ndarray]) -> np.ndarray:
        view = lane.host[name].view(self._dtypes[name], shape)
        if name not in into:
            return view.copy()  # a copy: the pinned buffer is overwritten by the next request
        if lane.mapped:  # zero-copy wrote the output in the pinned buffer, not in `into`
            np.copyto(into[name], view)
        return into[name]

    def _drain(self) -> None:
        # After a failed request, wait for copies already queued: the next
        # request rewrites the pinned buffers they may still be reading.
        try:
            if self._stream is not None:
                self._stream.synchronize()
        except BackendError:
            log.exception("TensorRT context: stream did not drain after a failed request")

    def close(self) -> None:
        """Release the stream, the buffers and the TensorRT contexts (idempotent)."""
        with self._owner:  # waits for a request running on another thread
            if self._lanes or self._stream is not None:
                _use_device(self._device)
            self._release()
        self._on_close(self)

    def _release(self) -> None:
        self._drain()
        self._closed = True
        buffers: list[cuda.HostBuffer | cuda.DeviceBuffer] = []
        for lane in self._lanes:
            try:
                lane.close_graph()  # the graph replays the context's kernels: it goes first
            except BackendError:
                log.exception("TensorRT context: destroying its CUDA graph failed")
            lane.raw = None  # the TensorRT context goes before the memory it points at
            buffers += lane.buffers()
        self._lanes = []
        if self._activations is not None:
            buffers.append(self._activations)
            self._activations = None
        stream, self._stream = self._stream, None
        for resource in (*buffers, *([stream] if stream else [])):
            try:
                resource.close()
            except BackendError:
                log.exception("TensorRT context: releasing %s failed", type(resource).__name__)


def _share_activations(raws: Sequence[Any], nbytes: int) -> cuda.DeviceBuffer:
    """One activation buffer for all of a context's TensorRT contexts (created USER_MANAGED), of the
    engine's largest need over its profiles (device_memory_size_v2). TensorRT uses it only from an
    enqueue until that execution completes (NvInferRuntime.h, setDeviceMemoryV2), and these contexts
    run one after another on one stream, so sharing it is safe. With the default STATIC allocation each
    would hold that much itself: a context would cost it once per profile."""
    buffer = cuda.DeviceBuffer(nbytes)
    assert buffer.ptr is not None
    for raw in raws:
        raw.set_device_memory(buffer.ptr, max(nbytes, 1))
    return buffer


def _zero_copy_option(options: Mapping[str, Any], path: Path) -> bool:
    """The `zero_copy` option (default true: used only on integrated GPUs), checked to be a bool."""
    value = options.get("zero_copy", True)
    if not isinstance(value, bool):
        raise BackendError(f"option zero_copy of {path} must be true or false, not {value!r}")
    return value


def _use_device(device: int) -> None:
    """Make `device` current before releasing memory on it: freeing from a thread whose current
    device is another (GPU 0 by default) would create a CUDA context there."""
    try:
        cuda.set_device(device)
    except BackendError:
        log.exception("TensorRT: cannot make device %d current to release its memory", device)


def _check_into(into: Mapping[str, np.ndarray], dtypes: Mapping[str, str],
                shapes: dict[str, tuple[int, ...]]) -> None:
    """OutputsMismatch unless every array in `into` is an output of this run's shape and dtype."""
    for name, array in into.items():
        if name not in shapes or array.shape != shapes[name] or array.dtype.name != dtypes[name] \
                or not (array.flags.c_contiguous and array.flags.writeable):
            raise OutputsMismatch(f"output {name!r} of this run is {dtypes.get(name)}{list(shapes.get(name, ()))}; "
                                  f"the array given is {array.dtype.name}{list(array.shape)}")


class TensorRTEngine:
    """A deserialized engine: read-only and thread-safe; one context per executor thread.

    `measured_load_bytes` is how much cudaMemGetInfo's free figure fell while
    loading (engine, first context and its buffers). On Jetson that figure
    is system RAM and moves with every process, so treat it as a hint there.
    """

    def __init__(self, path: Path, options: Mapping[str, Any]) -> None:
        self.path = path
        self.device = self._device = int(options.get("device", 0))  # base.OnDevice
        self._options = dict(options)
        self._lock = threading.Lock()
        self._contexts: set[TensorRTContext] = set()
        self._spare: TensorRTContext | None = None
        self._engine: Any = None
        self.measured_load_bytes = 0
        plan = _read_plan(path)
        try:
            self._load(plan)
        except cuda.CudaError as exc:
            self.close()
            raise BackendError(f"cannot load {path}: {exc}; {_cuda_advice(exc)}") from exc
        except BaseException:
            self.close()
            raise

    def _load(self, plan: bytes) -> None:
        trtlib.import_tensorrt()  # a missing TensorRT says so before CUDA is asked anything
        cuda.set_device(self._device)  # before the runtime is created, which would touch GPU 0
        self._shared = trtlib.shared()
        self.integrated = cuda.is_integrated(self._device)
        self.zero_copy = self.integrated and _zero_copy_option(self._options, self.path)
        free_before = cuda.mem_info().free
        self._engine = self._deserialize(plan)
        self._plan_bytes = len(plan)
        self._activation_bytes = int(self._engine.device_memory_size_v2)
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        is_input = {n: self._engine.get_tensor_mode(n) == self._shared.trt.TensorIOMode.INPUT for n in names}
        inputs = [n for n in names if is_input[n]]
        self._outputs = [(n, self._dtype(n)) for n in names if not is_input[n]]
        self._profiles = read_profiles(self._engine, inputs)
        self._graphs = tensorrt_graphs.wanted(self._options, self._profiles, self.path)
        self.inputs = [self._input_spec(n) for n in inputs]
        self._spare = self._wrap()
        self.outputs = self._output_specs(self._spare)
        self._io_bytes = sum(lane.io_bytes for lane in self._spare.lanes())
        self._warm(self._spare)
        self.measured_load_bytes = free_before - cuda.mem_info().free
        log.info("loaded %s: TensorRT %s, activation %.1f MiB per context, measured %.1f MiB",
                 self.path, self._shared.trt.__version__, self._activation_bytes / 2**20,
                 self.measured_load_bytes / 2**20)

    def _deserialize(self, plan: bytes) -> Any:
        shared = self._shared
        shared.last_error()  # drop anything stale
        core = tensorrt_dla.core_for(self.path, self._options)
        try:
            with shared.runtime_lock:  # the DLA core is the shared runtime's: set and used together
                if core is not None:
                    tensorrt_dla.select(shared, core, self.path)
                engine = shared.runtime.deserialize_cuda_engine(plan)
        except BackendError:
            raise
        except Exception as exc:  # some builds raise instead of returning None
            log.debug("deserialize_cuda_engine raised", exc_info=exc)
            engine = None
        if engine is None:
            reason = shared.last_error() or ("not a TensorRT engine, or one built by another "
                                             "TensorRT version or for another GPU")
            raise PlanRejected(f"TensorRT {shared.trt.__version__} cannot load {self.path}: {reason}. "
                               f"Engines only run on the GPU model and TensorRT version that built "
                               f"them: {REBUILD.format(path=self.path)}")
        return engine

    def _dtype(self, name: str) -> str:
        trt = self._shared.trt
        if self._engine.get_tensor_location(name) == trt.TensorLocation.HOST:
            raise BackendError(f"tensor {name!r} lives in host memory (a shape tensor); "
                               f"infermux serves only engines whose inputs and outputs are on the GPU")
        self._check_linear(name)
        dtype = trtlib.numpy_dtype(trt, self._engine.get_tensor_dtype(name))
        if dtype is None:
            raise BackendError(f"tensor {name!r} has TensorRT type {self._engine.get_tensor_dtype(name)}, "
                               f"which the wire protocol cannot carry; cast it in the ONNX model")
        return dtype

    def _check_linear(self, name: str) -> None:
        # Clients send and receive dense row-major tensors; a vectorized or channel-last
        # binding (--inputIOFormats/--outputIOFormats, some DLA builds) would need a buffer
        # padded to its components per element and a reformat the backend does not do.
        fmt = self._engine.get_tensor_format(name)
        if fmt != self._shared.trt.TensorFormat.LINEAR:
            per = self._engine.get_tensor_components_per_element(name)
            raise BackendError(f"tensor {name!r} is bound in TensorRT format {getattr(fmt, 'name', fmt)} "
                               f"({per} components per element); infermux serves only LINEAR (row-major) "
                               f"I/O tensors: rebuild the engine without --inputIOFormats/--outputIOFormats "
                               f"or with a linear format (`infermux build` does), {REBUILD.format(path=self.path)}")

    def _input_spec(self, name: str) -> TensorSpec:
        """The input over every profile: the range from the smallest min to the largest max."""
        low, _ = span([p.ranges[name][0] for p in self._profiles])
        _, high = span([p.ranges[name][2] for p in self._profiles])
        return TensorSpec(name, self._dtype(name), tuple(self._engine.get_tensor_shape(name)), low, high)

    def _output_specs(self, ctx: TensorRTContext) -> list[TensorSpec]:
        lanes = ctx.lanes()
        specs = []
        for name, dtype in self._outputs:
            low, _ = span([lane.low[name] for lane in lanes])
            _, high = span([lane.high[name] for lane in lanes])
            specs.append(TensorSpec(name, dtype, tuple(self._engine.get_tensor_shape(name)), low, high))
        return specs

    def _warm(self, ctx: TensorRTContext) -> None:
        """Run every profile's opt and max shapes once: kernels load lazily (CUDA_MODULE_LOADING=LAZY)
        and differ by shape and profile, so the first large batch would otherwise pay for loading them.
        The registry's own warm-up runs the smallest shape (docs/tensorrt.md#what-the-backend-does)."""
        dtypes = {s.name: s.dtype for s in self.inputs}
        for profile in self._profiles:
            for shapes in [profile.shapes(1)] + ([profile.shapes(2)] if profile.shapes(2) != profile.shapes(1) else []):
                zeros = {name: np.zeros(shape, dtypes[name]) for name, shape in shapes.items()}
                try:
                    ctx.infer(zeros)
                except BackendError as exc:  # the load stands; the registry's warm-up decides
                    log.warning("warming %s at %s failed: %s", self.path,
                                {n: list(v.shape) for n, v in zeros.items()}, exc)
                    return

    def _new_raw_context(self) -> Any:
        # USER_MANAGED: the context's activation memory is the one buffer TensorRTContext shares.
        raw = self._engine.create_execution_context(self._shared.trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        if raw is None:
            raise BackendError(f"TensorRT could not create an execution context for {self.path} "
                               f"({self._shared.last_error() or 'no reason logged'}): unload other "
                               f"models or lower `contexts`")
        return raw

    def _wrap(self) -> TensorRTContext:
        """A context with one TensorRT execution context per profile, sharing one activation buffer."""
        raws = [self._new_raw_context() for _ in self._profiles]
        ctx = TensorRTContext(raws, self._profiles, self.inputs, self._outputs, self._device, self._shared,
                              self._forget, self.zero_copy, self._activation_bytes)
        ctx.graphs = self._graphs
        with self._lock:
            self._contexts.add(ctx)
        return ctx

    def _forget(self, ctx: TensorRTContext) -> None:
        with self._lock:
            self._contexts.discard(ctx)

    def create_context(self) -> TensorRTContext:
        """A context for one executor thread (the first reuses the one made at load)."""
        with self._lock:
            if self._engine is None:
                raise BackendError(f"engine {self.path} is closed")
            spare, self._spare = self._spare, None
        if spare is not None:
            return spare
        cuda.set_device(self._device)
        return self._wrap()

    def context_bytes(self) -> int:
        """GPU memory one context costs: one activation buffer, shared by its profiles, plus per profile
        the I/O buffers at that profile's max. On Jetson the pinned host buffers come from the same
        DRAM, so they count too."""
        # On Jetson a buffer pair (pinned + device) is twice the DRAM; zero-copy binds one buffer.
        pair = self.integrated and not self.zero_copy
        return self._activation_bytes + self._io_bytes * (2 if pair else 1)

    def memory_bytes(self) -> int:
        """Device memory of this engine on `device`: its plan size plus `context_bytes()` per open
        context, or, where more, what the load measured (`measured_load_bytes`: engine and first
        context, plus the libraries and kernels TensorRT loads lazily) plus the later contexts.
        On Jetson the measured drop moves with every process's RAM use, so only the estimate counts."""
        with self._lock:
            contexts = len(self._contexts)
        estimate = self._plan_bytes + contexts * self.context_bytes()
        if self.integrated or not contexts:
            return estimate
        return max(estimate, self.measured_load_bytes + (contexts - 1) * self.context_bytes())

    def close(self) -> None:
        """Close every context still open, then drop the engine (idempotent)."""
        with self._lock:
            contexts = list(self._contexts)
            self._spare = None
        for ctx in contexts:
            ctx.close()
        if self._engine is not None:
            _use_device(self._device)
        self._engine = None  # TensorRT frees it with the last reference


class TensorRTBackend:
    """Loads TensorRT engines (`.plan`, `.engine`); options: `device` (CUDA device index, default 0)."""

    name = "tensorrt"
    suffixes = (".plan", ".engine")

    def load(self, path: Path, options: Mapping[str, Any]) -> "TensorRTEngine | tensorrt_rebuild.RebuildingEngine":
        """The engine; a plan TensorRT refuses is rebuilt from its ONNX model where one is known
        (docs/tensorrt.md#rebuilding-after-an-upgrade)."""
        try:
            return TensorRTEngine(Path(path), options)
        except PlanRejected as exc:
            return tensorrt_rebuild.serve_while_rebuilding(Path(path), options, exc, TensorRTEngine)
