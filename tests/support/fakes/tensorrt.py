"""A small stand-in for `tensorrt` and `cuda.bindings.runtime`, for contract tests.

It models only what infermux's TensorRT backend calls, as the TensorRT 10
and cuda-python docs describe it, and it checks how it is called (device
pointers must be device allocations, copies must go the right way and fit).
Tests that use it check OUR CODE'S USE of those APIs; they do not prove the
APIs themselves: tests/gpu/ does that on a real GPU.

"Device" memory is host memory here, so the fake engine can compute real
outputs from what the backend copied in: one input `x` float32 [N, 4] with
profile 0 = [1,4] / [2,4] / [8,4]; outputs `total` float32 [N] = x.sum(1)
and `argmax` int32 [N] = x.argmax(1). `trt.profiles` gives the next engines
several profiles, `trt.fixed_batch = n` makes them fixed-shape ([n, 4], no
profile: the usual batch-1 camera detector). Copies and executions complete
only at cudaStreamSynchronize, as on a GPU, so ordering bugs show. CUDA graphs are modelled:
work queued while a stream captures is recorded, not run, and each cudaGraphLaunch replays it;
an enqueue captured right after a shape change fails, as TensorRT's one-off set-up would.
"""

from __future__ import annotations

import ctypes
import enum
import sys
import threading
import warnings
import weakref
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np
import pytest

from infermux.plugins.backends import cuda as cuda_layer
from infermux.plugins.backends import trtlib

PLAN_MAGIC = b"FAKEPLAN"
VC_PLAN_MAGIC = b"FAKEVCPLAN"
DLA_MARK = b"DLA"  # after PLAN_MAGIC: a plan built for the DLA  # a version-compatible plan (BuilderFlag.VERSION_COMPATIBLE)
ACTIVATION_BYTES = 4096
PROFILE = ((1, 4), (2, 4), (8, 4))
BINDINGS_VERSION = "12.9.1"  # the first 12.x cuda-bindings that releases the GIL


class FakeStream:
    """cudaStream_t: a handle object; int() of it is deprecated in favour of
    cuda.bindings.utils.get_cuda_native_handle (cuda-bindings 12.9.1+)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __int__(self) -> int:
        warnings.warn("int(cudaStream_t) is deprecated: use get_cuda_native_handle", DeprecationWarning,
                      stacklevel=2)
        return self.handle


def get_cuda_native_handle(obj: Any) -> int:
    """cuda.bindings.utils.get_cuda_native_handle."""
    return obj.handle


class FakeGraph:
    """cudaGraph_t / cudaGraphExec_t: the work a capture recorded."""

    def __init__(self, work: list[Callable[[], None]]) -> None:
        self.work = list(work)


class FakeCudart:
    """cuda.bindings.runtime: calls return (cudaError_t, *results) as cuda-python does."""

    class cudaError_t(enum.IntEnum):
        cudaSuccess = 0
        cudaErrorInvalidValue = 1
        cudaErrorMemoryAllocation = 2
        cudaErrorNoDevice = 100
        cudaErrorInvalidDevice = 101
        cudaErrorLaunchFailure = 719

    class cudaMemcpyKind(enum.IntEnum):
        cudaMemcpyHostToDevice = 1
        cudaMemcpyDeviceToHost = 2

    class cudaDeviceAttr(enum.IntEnum):
        cudaDevAttrIntegrated = 18

    class cudaStreamCaptureMode(enum.IntEnum):
        cudaStreamCaptureModeGlobal = 0
        cudaStreamCaptureModeThreadLocal = 1
        cudaStreamCaptureModeRelaxed = 2

    cudaStreamNonBlocking = 1
    cudaHostAllocMapped = 2

    def __init__(self, total: int = 1 << 30) -> None:
        self.total = total
        self.device_count = 1
        self._current = threading.local()  # CUDA's current device is per thread (0 until set)
        self.owner: dict[int, int] = {}    # pointer or stream -> the device current when it was made
        self.wrong_device: list[str] = []  # releases made while another device was current
        self.device: dict[int, ctypes.Array] = {}
        self.host: dict[int, ctypes.Array] = {}
        self.streams: set[int] = set()
        self.reserved = 0            # memory the fake TensorRT holds (engines, contexts)
        self.integrated = False
        self.fail: dict[str, FakeCudart.cudaError_t] = {}   # call name -> error, once
        self.copies: list[tuple[str, int]] = []             # ("H2D"|"D2H", nbytes)
        self.pageable: dict[int, ctypes.Array] = {}          # ordinary host memory a test hands over
        self.mapped: dict[int, ctypes.Array] = {}            # pinned host memory mapped for the device
        self._next_stream = 0x1000
        # Work queued per stream: copies and executions happen only at synchronize (or at a free,
        # which synchronises implicitly), as on a GPU, so reading results early shows.
        self.pending: dict[int, list[Callable[[], None]]] = {}
        self.capturing: dict[int, list[Callable[[], None]]] = {}  # stream -> work captured so far
        self.graphs: set[FakeGraph] = set()
        self.graph_execs: set[FakeGraph] = set()
        self.launches = 0

    def _error(self, call: str) -> "FakeCudart.cudaError_t":
        return self.fail.pop(call, self.cudaError_t.cudaSuccess)

    def free_bytes(self) -> int:
        return self.total - self.reserved - sum(len(b) for b in self.device.values())

    def _alloc(self, call: str, table: dict[int, ctypes.Array], nbytes: int) -> tuple:
        err = self._error(call)
        if err == 0 and table is self.device and nbytes > self.free_bytes():
            err = self.cudaError_t.cudaErrorMemoryAllocation
        if err:
            return err, None
        buf = ctypes.create_string_buffer(nbytes)
        table[ctypes.addressof(buf)] = buf
        self.owner[ctypes.addressof(buf)] = self.current()
        return err, ctypes.addressof(buf)

    def enqueue(self, stream: int, work: Callable[[], None]) -> None:
        """Queue `work` on `stream`: it runs at the stream's next synchronize; while the stream
        captures, it is recorded into the graph instead and does not run."""
        if stream in self.capturing:
            self.capturing[stream].append(work)
            return
        self.pending.setdefault(stream, []).append(work)

    # CUDA graphs: capture records a stream's work, launch queues a replay of it.
    def cudaStreamBeginCapture(self, stream: int, mode: Any) -> tuple:
        assert stream in self.streams and stream not in self.capturing, "capture on a bad or capturing stream"
        assert mode == self.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal, "use thread-local capture"
        self.capturing[stream] = []
        return (self._error("cudaStreamBeginCapture"),)

    def cudaStreamEndCapture(self, stream: int) -> tuple:
        work = self.capturing.pop(stream)  # the capture ends, whether or not it succeeded
        err = self._error("cudaStreamEndCapture")
        if err:
            return err, None
        graph = FakeGraph(work)
        self.graphs.add(graph)
        return err, graph

    def cudaGraphInstantiate(self, graph: "FakeGraph", flags: int) -> tuple:
        assert graph in self.graphs
        err = self._error("cudaGraphInstantiate")
        if err:
            return err, None
        graph_exec = FakeGraph(graph.work)
        self.graph_execs.add(graph_exec)
        return err, graph_exec

    def cudaGraphLaunch(self, graph_exec: "FakeGraph", stream: int) -> tuple:
        assert graph_exec in self.graph_execs and stream in self.streams
        self.launches += 1
        for work in graph_exec.work:
            self.enqueue(stream, work)
        return (self._error("cudaGraphLaunch"),)

    def cudaGraphExecDestroy(self, graph_exec: "FakeGraph") -> tuple:
        self.graph_execs.remove(graph_exec)
        return (self._error("cudaGraphExecDestroy"),)

    def cudaGraphDestroy(self, graph: "FakeGraph") -> tuple:
        self.graphs.remove(graph)
        return (self._error("cudaGraphDestroy"),)

    def _complete(self, stream: int) -> None:
        for work in self.pending.pop(stream, []):
            work()

    def _release(self, call: str, table: dict[int, ctypes.Array], ptr: int) -> tuple:
        for stream in list(self.pending):  # cudaFree waits for the device's queued work
            self._complete(stream)
        err = self._error(call)
        if not err:
            assert ptr in table, f"{call} of a pointer that {call} did not allocate"
            del table[ptr]
            self.released(call, ptr)
        return (err,)

    def cudaGetDeviceCount(self) -> tuple:
        return self._error("cudaGetDeviceCount"), self.device_count

    def cudaSetDevice(self, device: int) -> tuple:
        err = self._error("cudaSetDevice")
        if not err and not 0 <= device < self.device_count:
            err = self.cudaError_t.cudaErrorInvalidDevice
        if not err:
            self._current.device = device
        return (err,)

    def current(self) -> int:
        return getattr(self._current, "device", 0)

    def released(self, what: str, key: int) -> None:
        """Note a release made while the device that owns `key` was not current."""
        device = self.owner.pop(key, self.current())
        if device != self.current():
            self.wrong_device.append(f"{what} of device {device} with device {self.current()} current")

    def cudaDeviceGetAttribute(self, attr: Any, device: int) -> tuple:
        return self._error("cudaDeviceGetAttribute"), int(self.integrated)

    def cudaMalloc(self, nbytes: int) -> tuple:
        return self._alloc("cudaMalloc", self.device, nbytes)

    def cudaFree(self, ptr: int) -> tuple:
        return self._release("cudaFree", self.device, ptr)

    def cudaMallocHost(self, nbytes: int) -> tuple:
        return self._alloc("cudaMallocHost", self.host, nbytes)

    def cudaHostAlloc(self, nbytes: int, flags: int) -> tuple:
        err, ptr = self._alloc("cudaHostAlloc", self.host, nbytes)
        if not err and flags & self.cudaHostAllocMapped:
            self.mapped[ptr] = self.host[ptr]  # the device may read and write it in place
        return err, ptr

    def cudaHostGetDevicePointer(self, ptr: int, flags: int) -> tuple:
        if ptr not in self.mapped:
            return self.cudaError_t.cudaErrorInvalidValue, None
        return self._error("cudaHostGetDevicePointer"), ptr  # unified addressing: the same address

    def cudaFreeHost(self, ptr: int) -> tuple:
        self.mapped.pop(ptr, None)
        return self._release("cudaFreeHost", self.host, ptr)

    def cudaStreamCreateWithFlags(self, flags: int) -> tuple:
        self._next_stream += 1
        self.streams.add(self._next_stream)
        self.owner[self._next_stream] = self.current()
        return self._error("cudaStreamCreateWithFlags"), FakeStream(self._next_stream)

    def cudaStreamDestroy(self, stream: int) -> tuple:
        self._complete(stream)  # work queued before the destroy still completes
        self.streams.remove(stream)
        self.released("cudaStreamDestroy", stream)
        return (self._error("cudaStreamDestroy"),)

    def cudaStreamSynchronize(self, stream: int) -> tuple:
        assert stream in self.streams
        self._complete(stream)
        return (self._error("cudaStreamSynchronize"),)

    def cudaMemGetInfo(self) -> tuple:
        return self._error("cudaMemGetInfo"), self.free_bytes(), self.total

    def cudaMemcpyAsync(self, dst: int, src: int, nbytes: int, kind: Any, stream: int) -> tuple:
        assert stream in self.streams, "copy on a stream that does not exist"
        to_device = kind == self.cudaMemcpyKind.cudaMemcpyHostToDevice
        # Like CUDA, device-to-host copies may also land in ordinary (pageable) memory.
        self.check(dst, nbytes, self.device if to_device else {**self.host, **self.pageable})
        self.check(src, nbytes, self.host if to_device else self.device)
        err = self._error("cudaMemcpyAsync")
        if not err:
            self.enqueue(stream, lambda: ctypes.memmove(dst, src, nbytes))
            self.copies.append(("H2D" if to_device else "D2H", nbytes))
        return (err,)

    def allow_pageable(self, array: np.ndarray) -> None:
        """Let device-to-host copies write into `array` (as they may into any host memory)."""
        self.pageable[array.ctypes.data] = (ctypes.c_char * array.nbytes).from_address(array.ctypes.data)

    @staticmethod
    def check(ptr: int, nbytes: int, table: dict[int, ctypes.Array]) -> None:
        """Assert [ptr, ptr+nbytes) lies inside one allocation of `table`."""
        assert any(base <= ptr and ptr + nbytes <= base + len(buf) for base, buf in table.items()), \
            f"{nbytes} bytes at {ptr:#x} are not inside one allocation of the expected kind"

    def read(self, ptr: int, nbytes: int) -> np.ndarray:
        """What a kernel reads: device memory, or mapped pinned host memory (zero-copy)."""
        self.check(ptr, nbytes, {**self.device, **self.mapped})
        return np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), np.uint8).copy()

    def write(self, ptr: int, array: np.ndarray) -> None:
        self.check(ptr, array.nbytes, {**self.device, **self.mapped})
        ctypes.memmove(ptr, array.ctypes.data, array.nbytes)


def make_fake_tensorrt(gpu: FakeCudart) -> ModuleType:
    """A `tensorrt` module with just the calls the backend makes."""
    trt = ModuleType("tensorrt")
    trt.__version__ = "10.3.0"
    trt.DataType = enum.Enum("DataType", "FLOAT HALF INT8 INT32 INT64 BOOL UINT8 BF16")
    trt.TensorIOMode = enum.Enum("TensorIOMode", "NONE INPUT OUTPUT")
    trt.TensorLocation = enum.Enum("TensorLocation", "DEVICE HOST")
    trt.TensorFormat = enum.Enum("TensorFormat", "LINEAR CHW2 HWC8 CHW4 CHW16 CHW32 DHWC8 CDHW32 HWC "
                                 "DLA_LINEAR DLA_HWC4 HWC16 DHWC")
    trt.formats = {}  # tensor name -> TensorFormat, for engines built with --inputIOFormats
    trt.load_overhead = 0  # device bytes a deserialization takes beyond the plan's size
    trt.verbose_per_load = 20  # VERBOSE messages each deserialization logs
    trt.host_load_bytes = 0  # host memory a deserialization keeps (TensorRT's libraries, the plan)

    class ILogger:
        # pybind11's arithmetic enum: int(severity) is 0 (INTERNAL_ERROR) .. 4 (VERBOSE).
        Severity = enum.IntEnum("Severity", "INTERNAL_ERROR ERROR WARNING INFO VERBOSE", start=0)

        def __init__(self) -> None:
            pass

    trt.profiles = [PROFILE]   # the x ranges of the engines deserialized next, one per profile
    trt.fixed_batch = None     # an int: the next engines have fixed shapes x [n, 4] (no profile)

    def io_tensors() -> dict[str, tuple]:
        n = -1 if trt.fixed_batch is None else trt.fixed_batch
        return {"x": (trt.TensorIOMode.INPUT, trt.DataType.FLOAT, (n, 4)),
                "total": (trt.TensorIOMode.OUTPUT, trt.DataType.FLOAT, (n,)),
                "argmax": (trt.TensorIOMode.OUTPUT, trt.DataType.INT32, (n,))}

    class Context:
        """IExecutionContext; `gate` lets a test hold a request inside execute."""

        def __init__(self, engine: "Engine") -> None:
            self.engine = engine
            self.profile = 0  # a new context starts on profile 0
            fixed = engine.tensors["x"][2]
            self.shapes: dict[str, tuple] = {} if -1 in fixed else {"x": fixed}
            self.addresses: dict[str, int] = {}
            self.address_calls = 0
            self.shape_calls: list[tuple] = []
            self.executions = 0
            self.settled = False  # an enqueue ran since the last shape change
            self.gate: Callable[[], None] | None = None
            gpu.reserved += ACTIVATION_BYTES
            gpu.owner[id(self)] = gpu.current()

        def __del__(self) -> None:
            gpu.reserved -= ACTIVATION_BYTES
            gpu.released("execution context release", id(self))

        def set_input_shape(self, name: str, shape: Any) -> bool:
            shape = tuple(shape)
            self.shape_calls.append(shape)
            if self.shapes.get(name) != shape:
                self.settled = False  # the next enqueue does one-off set-up, which cannot be captured
            fixed = self.engine.tensors["x"][2]
            low, _, high = (fixed, fixed, fixed) if -1 not in fixed else self.engine.profiles[self.profile]
            if name != "x" or len(shape) != 2 or not all(a <= s <= b for a, s, b in zip(low, shape, high)):
                self.engine.logger.log(ILogger.Severity.ERROR, f"shape {shape} outside profile")
                return False
            self.shapes[name] = shape
            return True

        def get_tensor_shape(self, name: str) -> tuple:
            batch = self.shapes.get("x", (-1,))[0]
            return self.shapes.get("x", (-1, 4)) if name == "x" else (batch,)

        def set_optimization_profile_async(self, index: int, stream_handle: int) -> bool:
            assert stream_handle in gpu.streams
            if not 0 <= index < self.engine.num_optimization_profiles:
                return False
            self.profile, self.shapes = index, {}
            return True

        def set_tensor_address(self, name: str, ptr: int) -> bool:
            self.address_calls += 1
            self.addresses[name] = ptr
            return True

        def execute_async_v3(self, stream_handle: int) -> bool:
            assert stream_handle in gpu.streams
            self.executions += 1
            if stream_handle in gpu.capturing and not self.settled:
                self.engine.logger.log(ILogger.Severity.ERROR, "fake: enqueueV3 captured right after a "
                                       "shape change (run it once outside the capture first)")
                return False
            self.settled = True
            if gpu.fail.pop("execute_async_v3", None):
                self.engine.logger.log(ILogger.Severity.ERROR, "fake kernel launch failure")
                return False
            if self.gate:
                self.gate()
            n, addresses = self.shapes["x"][0], dict(self.addresses)  # as enqueued

            def kernel() -> None:
                x = gpu.read(addresses["x"], n * 16).view(np.float32).reshape(n, 4)
                gpu.write(addresses["total"], x.sum(axis=1, dtype=np.float32))
                gpu.write(addresses["argmax"], x.argmax(axis=1).astype(np.int32))

            gpu.enqueue(stream_handle, kernel)
            return True

    class Engine:
        """ICudaEngine for the toy model in the module docstring."""

        device_memory_size_v2 = ACTIVATION_BYTES

        def __init__(self, logger: Any, plan_bytes: int) -> None:
            self.logger = logger
            self.tensors = io_tensors()
            self.profiles = [] if trt.fixed_batch is not None else list(trt.profiles)
            self.num_optimization_profiles = max(1, len(self.profiles))
            self.num_io_tensors = len(self.tensors)
            # Real TensorRT also loads kernels and libraries onto the device (`trt.load_overhead`).
            self.plan_bytes = plan_bytes + trt.load_overhead
            gpu.reserved += self.plan_bytes
            self.host = np.ones(trt.host_load_bytes, np.uint8)  # touched: it shows in the RSS
            gpu.owner[id(self)] = gpu.current()

        def __del__(self) -> None:
            gpu.reserved -= self.plan_bytes
            gpu.released("engine release", id(self))

        def get_tensor_name(self, index: int) -> str:
            return list(self.tensors)[index]

        def get_tensor_mode(self, name: str) -> Any:
            return self.tensors[name][0]

        def get_tensor_dtype(self, name: str) -> Any:
            return self.tensors[name][1]

        def get_tensor_shape(self, name: str) -> tuple:
            return self.tensors[name][2]

        def get_tensor_format(self, name: str) -> Any:
            return trt.formats.get(name, trt.TensorFormat.LINEAR)

        def get_tensor_components_per_element(self, name: str) -> int:
            digits = "".join(c for c in self.get_tensor_format(name).name if c.isdigit())
            return int(digits or 1)

        def get_tensor_location(self, name: str) -> Any:
            return trt.TensorLocation.DEVICE

        def get_tensor_profile_shape(self, name: str, profile: int) -> list:
            assert self.tensors[name][0] == trt.TensorIOMode.INPUT
            if not self.profiles or not 0 <= profile < len(self.profiles):
                # A fixed-shape engine has no profile ranges to give (C++: Dims with nbDims -1).
                raise RuntimeError(f"fake: no optimization profile {profile} for {name!r}")
            return list(self.profiles[profile])

        def create_execution_context(self) -> Context | None:
            if gpu.fail.pop("create_execution_context", None):
                self.logger.log(ILogger.Severity.ERROR, "fake: out of memory for activations")
                return None
            ctx = Context(self)
            trt.contexts.append(weakref.ref(ctx))
            return ctx

    class Runtime:
        instances = 0

        def __init__(self, logger: Any) -> None:
            assert isinstance(logger, ILogger)
            Runtime.instances += 1
            self.logger = logger
            self.engine_host_code_allowed = False  # IRuntime's default
            self.device = gpu.current()  # creating a runtime initialises CUDA on the current device
            self.DLA_core = 0

        num_DLA_cores = property(lambda self: trt.dla_cores)

        def deserialize_cuda_engine(self, plan: bytes) -> Engine | None:
            for i in range(trt.verbose_per_load):  # real TensorRT narrates every load
                self.logger.log(ILogger.Severity.VERBOSE, f"fake: deserializing layer {i}")
            if bytes(plan).startswith(VC_PLAN_MAGIC):  # version-compatible: embeds its lean runtime
                if not self.engine_host_code_allowed:
                    self.logger.log(ILogger.Severity.ERROR, "Error Code 1: Serialization (Cannot deserialize "
                                    "version compatible engine without engine host code allowed)")
                    return None
                plan = PLAN_MAGIC + bytes(plan)[len(VC_PLAN_MAGIC):]
            if not bytes(plan).startswith(PLAN_MAGIC):
                self.logger.log(ILogger.Severity.ERROR, "Error Code 6: The engine plan file is not "
                                "compatible with this version of TensorRT")
                return None
            dla = bytes(plan)[len(PLAN_MAGIC):].startswith(DLA_MARK)
            if dla and not trt.dla_cores:
                self.logger.log(ILogger.Severity.ERROR, "fake: the engine needs a DLA and this device has none")
                return None
            if trt.on_deserialize is not None:  # a test looks at what else happens meanwhile
                trt.on_deserialize()
            engine = Engine(self.logger, len(plan))
            engine.dla_core = self.DLA_core if dla else None  # the core the runtime was set to
            trt.engines.append(weakref.ref(engine))
            return engine

    trt.ILogger = ILogger
    trt.dla_cores = 0          # DLA cores of the device (Jetson Orin AGX/NX: 2)
    trt.on_deserialize = None  # called inside deserialize_cuda_engine
    trt.DeviceType = enum.Enum("DeviceType", "GPU DLA")
    trt.engines, trt.contexts = [], []  # weak references to what was made, for the tests
    trt.Runtime, trt.ICudaEngine = Runtime, Engine
    trt.init_libnvinfer_plugins = lambda logger, namespace: True
    _add_fake_builder(trt)
    return trt


def _add_fake_builder(trt: ModuleType) -> None:
    """Builder, ONNX parser and builder config: records what `infermux build` asks for.

    The parser "reads" a model whose inputs are `trt.onnx_inputs`; a file that starts
    with b"BAD" fails to parse; `trt.fail_build = True` makes the build return None;
    `trt.build_gate` (an Event) holds builds until it is set. A timing cache whose bytes start
    with b"OTHERGPU" is refused as TensorRT refuses one from another device.
    """
    trt.BuilderFlag = enum.Enum("BuilderFlag", "FP16 INT8 TF32 GPU_FALLBACK")
    trt.MemoryPoolType = enum.Enum("MemoryPoolType", "WORKSPACE")
    trt.onnx_inputs, trt.fail_build, trt.configs = [("x", (-1, 4))], False, []
    trt.build_gate = None          # a threading.Event: builds wait for it
    trt.timing_caches_seen = []    # the timing cache each build started from

    class Base:  # IProgressMonitor and IInt8EntropyCalibrator2: subclassed by the code under test
        def __init__(self) -> None:
            pass

    trt.IProgressMonitor, trt.IInt8EntropyCalibrator2 = type("IProgressMonitor", (Base,), {}), \
        type("IInt8EntropyCalibrator2", (Base,), {})

    class Network:
        def __init__(self) -> None:
            self.inputs: list[Any] = []

        num_inputs = property(lambda self: len(self.inputs))

        def get_input(self, index: int) -> Any:
            return self.inputs[index]

    class OnnxParser:
        def __init__(self, network: Network, logger: Any) -> None:
            self.network, self.num_errors = network, 0

        def parse_from_file(self, path: str) -> bool:
            if Path(path).read_bytes().startswith(b"BAD"):
                self.num_errors = 1
                return False
            self.network.inputs = [type("ITensor", (), {"name": n, "shape": s})() for n, s in trt.onnx_inputs]
            return True

        def get_error(self, index: int) -> str:
            return "fake: unsupported operator"

    class Profile:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple] = {}

        def set_shape(self, name: str, low: Any, opt: Any, high: Any) -> None:
            self.shapes[name] = (tuple(low), tuple(opt), tuple(high))

    class TimingCache:
        """ITimingCache: kernel timings; serialize() gives what create_timing_cache takes back."""

        def __init__(self, data: bytes) -> None:
            self.data = bytes(data)

        def serialize(self) -> bytes:
            return self.data

    class Config:
        def __init__(self) -> None:
            self.flags, self.pools, self.profiles = set(), {}, []
            self.progress_monitor = self.int8_calibrator = self.calibration_profile = None
            self.timing_cache: TimingCache | None = None
            self.default_device_type, self.DLA_core = trt.DeviceType.GPU, -1
            trt.configs.append(self)

        def create_timing_cache(self, serialized: bytes) -> TimingCache:
            return TimingCache(serialized)

        def set_timing_cache(self, cache: TimingCache, ignore_mismatch: bool) -> bool:
            # A cache made on another GPU or TensorRT version is refused unless mismatches are ignored.
            if cache.data.startswith(b"OTHERGPU") and not ignore_mismatch:
                return False
            self.timing_cache = cache
            return True

        def get_timing_cache(self) -> TimingCache:
            assert self.timing_cache is not None, "get_timing_cache without set_timing_cache"
            return self.timing_cache

        def set_flag(self, flag: Any) -> None:
            self.flags.add(flag)

        def set_memory_pool_limit(self, pool: Any, nbytes: int) -> None:
            self.pools[pool] = nbytes

        def add_optimization_profile(self, profile: Profile) -> int:
            self.profiles.append(profile)
            return len(self.profiles) - 1

        def set_calibration_profile(self, profile: Profile) -> None:
            self.calibration_profile = profile

    class Builder:
        def __init__(self, logger: Any) -> None:
            self.logger = logger

        num_DLA_cores = property(lambda self: trt.dla_cores)

        def create_network(self, flags: int) -> Network:
            return Network()

        def create_builder_config(self) -> Config:
            return Config()

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network: Network, config: Config) -> bytes | None:
            if trt.build_gate is not None:  # a test holds the build here (a real one takes minutes)
                assert trt.build_gate.wait(30), "fake: build_gate never opened"
            if config.timing_cache is not None:  # every build times a tactic more
                trt.timing_caches_seen.append(config.timing_cache.data)
                config.timing_cache.data += b"t"
            if trt.fail_build:
                self.logger.log(trt.ILogger.Severity.ERROR, "fake: no implementation for layer conv1")
                return None
            monitor = config.progress_monitor
            if monitor is not None:
                monitor.phase_start("Building engine", None, 2)
                assert monitor.step_complete("Building engine", 0) is True
                monitor.phase_finish("Building engine")
            if config.default_device_type == trt.DeviceType.DLA:
                return PLAN_MAGIC + DLA_MARK + bytes(100 - len(DLA_MARK))
            return PLAN_MAGIC + bytes(100)

    trt.Builder, trt.OnnxParser = Builder, OnnxParser


def write_plan(directory: Path, name: str = "model.plan", size: int = 1000, magic: bytes = PLAN_MAGIC) -> Path:
    """A plan file the fake runtime accepts (`magic=VC_PLAN_MAGIC`: a version-compatible one)."""
    path = directory / name
    path.write_bytes(magic + bytes(size - len(magic)))
    return path


def _cuda_modules(gpu: FakeCudart) -> dict[str, Any]:
    """`cuda`, `cuda.bindings`, `cuda.bindings.runtime` (the fake) and `cuda.bindings.utils`."""
    package, bindings, utils = ModuleType("cuda"), ModuleType("cuda.bindings"), ModuleType("cuda.bindings.utils")
    package.bindings, bindings.runtime, bindings.utils = bindings, gpu, utils
    utils.get_cuda_native_handle = get_cuda_native_handle
    bindings.__version__ = BINDINGS_VERSION  # cuda.bindings.__version__, as cuda-bindings sets it
    return {"cuda": package, "cuda.bindings": bindings, "cuda.bindings.runtime": gpu, "cuda.bindings.utils": utils}


def install() -> ModuleType:
    """Install the stand-in for the whole process: tests/support/fakes/tensorrt_site/sitecustomize.py does
    this in a daemon, and its workers, started with INFERMUX_FAKE_TRT=1."""
    gpu = FakeCudart()
    trt = make_fake_tensorrt(gpu)
    sys.modules.update({**_cuda_modules(gpu), "tensorrt": trt})
    return trt


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> FakeCudart:
    """The fake CUDA runtime, installed as `cuda.bindings.runtime` for this test."""
    gpu = FakeCudart()
    for name, module in _cuda_modules(gpu).items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(cuda_layer, "_api_cache", None)
    return gpu


@pytest.fixture
def fake_trt(fake_gpu: FakeCudart, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The fake TensorRT, installed as `tensorrt` for this test (with the fake CUDA)."""
    trt = make_fake_tensorrt(fake_gpu)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(trtlib, "_shared", None)
    return trt
