"""A small stand-in for `tensorrt` and `cuda.bindings.runtime`, for contract tests.

It models only what infermux's TensorRT backend calls, and it is as strict as
the real bindings where we could check them against NVIDIA's sources: the
TensorRT Python bindings (python/src/infer/pyCore.cpp and
pyFoundationalTypes.cpp at v10.3.0), the headers (include/NvInfer*.h), trtexec
(samples/common/sampleInference.cpp, sampleDevice.h) and cuda-bindings 12.9.4
(cuda/bindings/runtime.pyx); each modelled behaviour cites its source. It also
checks how it is called (device pointers must be device allocations, copies
must go the right way and fit). Tests that use it check OUR CODE'S USE of those
APIs; they do not prove the APIs themselves: tests/gpu/ does that on a real GPU.

"Device" memory is host memory here, so the fake engine can compute real
outputs from what the backend copied in: one input `x` float32 [N, 4] with
profile 0 = [1,4] / [2,4] / [8,4]; outputs `total` float32 [N] = x.sum(1)
and `argmax` int32 [N] = x.argmax(1). `trt.profiles` gives the next engines
several profiles, `trt.fixed_batch = n` makes them fixed-shape ([n, 4], no
profile: the usual batch-1 camera detector). Shapes come back as `Dims`, a
sequence that is not a tuple. Copies and executions complete only at
cudaStreamSynchronize, as on a GPU, so ordering bugs show. CUDA graphs are
modelled with the failure modes trtexec handles: work queued while a stream
captures is recorded, not run; TensorRT refuses an enqueue under capture that
needs one-off set-up, and a capture can be invalidated (cudaStreamEndCapture
gives cudaErrorStreamCaptureInvalidated and no graph, and the error stays
pending until cudaGetLastError). Activation memory follows the context's
ExecutionContextAllocationStrategy.

Device models (`use_device(trt, gpu, "orin")`, or INFERMUX_FAKE_TRT_DEVICE=orin
in a process the site hook starts): the default is one discrete GPU without
DLA; "orin" is a Jetson Orin NX: integrated memory and 2 DLA cores, on which
a DLA build with a dynamic profile fails, or falls back to the GPU entirely
with GPU_FALLBACK, as the DLA supports no dynamic dimensions. The builder
(tensorrt_builder.py) is also driven across processes through a state folder
(INFERMUX_FAKE_TRT_STATE: see `BuildChild`), for builds run in a child process.
"""

from __future__ import annotations

import ctypes
import enum
import json
import os
import sys
import threading
import time
import warnings
import weakref
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pytest

from infermux.plugins.backends import cuda as cuda_layer
from infermux.plugins.backends import trtlib

PLAN_MAGIC = b"FAKEPLAN"
VC_PLAN_MAGIC = b"FAKEVCPLAN"  # a version-compatible plan (BuilderFlag.VERSION_COMPATIBLE)
DLA_MARK = b"DLA"  # after PLAN_MAGIC: a plan built for the DLA
ACTIVATION_BYTES = 4096  # device_memory_size_v2: the largest profile's activation memory
PROFILE = ((1, 4), (2, 4), (8, 4))
BINDINGS_VERSION = "12.9.1"  # the first 12.x cuda-bindings that releases the GIL
SITE = Path(__file__).resolve().parent / "tensorrt_site"  # the site hook that installs this in a new process


class Dims:
    """trt.Dims as the bindings return it (get_tensor_shape, get_tensor_profile_shape, ITensor.shape).

    pyFoundationalTypes.cpp (v10.3.0) 231-250: a sequence with __len__ and __getitem__ (an int, negative
    counted from the end, IndexError past the end: lines 96-103; a slice gives a tuple: 106-117), printed
    like a tuple, and __eq__ overloads for a tuple and a list only (dimsEqual, 50-65: element-wise). So
    `dims == (1, 3)` holds as on a device, but it is not a tuple: `Dims == Dims` finds no overload
    (TypeError), it is unhashable (__eq__ without __hash__), and `+`, json or isinstance(tuple) fail.
    """

    __hash__ = None  # type: ignore[assignment]  # pybind11: a class defining __eq__ only is unhashable

    def __init__(self, shape: Sequence[int]) -> None:
        self._d = tuple(int(d) for d in shape)

    def __len__(self) -> int:
        return len(self._d)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return self._d[index]
        if not isinstance(index, int):
            raise TypeError(f"__getitem__(): incompatible function arguments ({type(index).__name__})")
        if not -len(self._d) <= index < len(self._d):
            raise IndexError("Out of bounds")
        return self._d[index]

    def __eq__(self, other: object) -> bool:  # type: ignore[override]
        if isinstance(other, (tuple, list)):
            return len(other) == len(self._d) and all(int(a) == b for a, b in zip(other, self._d))
        raise TypeError(f"__eq__(): incompatible function arguments. The following argument types are "
                        f"supported: (self, arg0: list) -> bool, (self, arg0: tuple) -> bool; got "
                        f"{type(other).__name__}")

    def __repr__(self) -> str:
        return repr(self._d)


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
    """cuda.bindings.runtime: calls return (cudaError_t, *results) as cuda-python does, and on an error
    None for every result (cuda-bindings 12.9.4 runtime.pyx: cudaGetDeviceCount 15005-15028,
    cudaMemGetInfo 20841-20880, cudaMalloc 19616, cudaStreamCreateWithFlags 16323, ...)."""

    class cudaError_t(enum.IntEnum):
        cudaSuccess = 0
        cudaErrorInvalidValue = 1
        cudaErrorMemoryAllocation = 2
        cudaErrorInsufficientDriver = 35
        cudaErrorNoDevice = 100
        cudaErrorInvalidDevice = 101
        cudaErrorNotReady = 600
        cudaErrorLaunchFailure = 719
        cudaErrorStreamCaptureUnsupported = 900
        cudaErrorStreamCaptureInvalidated = 901

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
        self.invalidated: set[int] = set()  # streams whose capture is invalidated (it records nothing)
        self.invalidate_next_capture = False  # the next capture is invalidated (e.g. an illegal call in it)
        self.last_error = self.cudaError_t.cudaSuccess  # what cudaGetLastError returns and clears
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
        captures, it is recorded into the graph instead and does not run (nor is it recorded
        once the capture is invalidated)."""
        if stream in self.capturing:
            if stream not in self.invalidated:
                self.capturing[stream].append(work)
            return
        self.pending.setdefault(stream, []).append(work)

    # CUDA graphs: capture records a stream's work, launch queues a replay of it.
    def cudaStreamBeginCapture(self, stream: int, mode: Any) -> tuple:
        assert stream in self.streams and stream not in self.capturing, "capture on a bad or capturing stream"
        assert mode == self.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal, "use thread-local capture"
        err = self._error("cudaStreamBeginCapture")
        if not err:
            self.capturing[stream] = []
            if self.invalidate_next_capture:
                self.invalidate_next_capture = False
                self.invalidated.add(stream)
        return (err,)

    def cudaStreamEndCapture(self, stream: int) -> tuple:
        """sampleDevice.h (v10.3.0) 193-215, trtexec's endCaptureOnError: an invalidated capture ends
        with cudaErrorStreamCaptureInvalidated and no graph; a capture whose enqueue TensorRT refused
        ends with cudaSuccess and a graph that must be destroyed, not used."""
        work = self.capturing.pop(stream)  # the capture ends, whether or not it succeeded
        if stream in self.invalidated:
            self.invalidated.discard(stream)
            self.last_error = self.cudaError_t.cudaErrorStreamCaptureInvalidated
            return self.cudaError_t.cudaErrorStreamCaptureInvalidated, None
        err = self._error("cudaStreamEndCapture")
        if err:
            self.last_error = err
            return err, None
        graph = FakeGraph(work)
        self.graphs.add(graph)
        return err, graph

    def cudaGetLastError(self) -> tuple:
        """runtime.pyx 14897-14919: returns `(the last error,)` and resets it to cudaSuccess."""
        err, self.last_error = self.last_error, self.cudaError_t.cudaSuccess
        return (err,)

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
        err = self._error("cudaGetDeviceCount")
        return err, (None if err else self.device_count)  # runtime.pyx 15026-15028

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
        err = self._error("cudaDeviceGetAttribute")
        return err, (None if err else int(self.integrated))

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
        err = self._error("cudaHostGetDevicePointer")
        return err, (None if err else ptr)  # unified addressing: the same address

    def cudaFreeHost(self, ptr: int) -> tuple:
        self.mapped.pop(ptr, None)
        return self._release("cudaFreeHost", self.host, ptr)

    def cudaStreamCreateWithFlags(self, flags: int) -> tuple:
        err = self._error("cudaStreamCreateWithFlags")
        if err:
            return err, None
        self._next_stream += 1
        self.streams.add(self._next_stream)
        self.owner[self._next_stream] = self.current()
        return err, FakeStream(self._next_stream)

    def cudaStreamDestroy(self, stream: int) -> tuple:
        self._complete(stream)  # work queued before the destroy still completes
        self.streams.remove(stream)
        self.released("cudaStreamDestroy", stream)
        return (self._error("cudaStreamDestroy"),)

    def cudaStreamQuery(self, stream: int) -> tuple:
        """Not permitted on a capturing stream (cudaErrorStreamCaptureUnsupported, runtime.pyx 960-961):
        the capture is invalidated. Elsewhere: cudaErrorNotReady while work is queued."""
        assert stream in self.streams
        if stream in self.capturing:
            self.invalidated.add(stream)
            self.last_error = self.cudaError_t.cudaErrorStreamCaptureUnsupported
            return (self.cudaError_t.cudaErrorStreamCaptureUnsupported,)
        return (self.cudaError_t.cudaErrorNotReady if self.pending.get(stream) else self.cudaError_t.cudaSuccess,)

    def cudaStreamSynchronize(self, stream: int) -> tuple:
        assert stream in self.streams
        self._complete(stream)
        return (self._error("cudaStreamSynchronize"),)

    def cudaMemGetInfo(self) -> tuple:
        err = self._error("cudaMemGetInfo")
        return (err, None, None) if err else (err, self.free_bytes(), self.total)

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
    from support.fakes.tensorrt_builder import add_fake_builder

    trt = ModuleType("tensorrt")
    trt.__version__ = "10.3.0"
    trt.DataType = enum.Enum("DataType", "FLOAT HALF INT8 INT32 INT64 BOOL UINT8 BF16")
    trt.TensorIOMode = enum.Enum("TensorIOMode", "NONE INPUT OUTPUT")
    trt.TensorLocation = enum.Enum("TensorLocation", "DEVICE HOST")
    trt.TensorFormat = enum.Enum("TensorFormat", "LINEAR CHW2 HWC8 CHW4 CHW16 CHW32 DHWC8 CDHW32 HWC "
                                 "DLA_LINEAR DLA_HWC4 HWC16 DHWC")
    # NvInferRuntime.h (v10.3.0) 2521-2526; pyCore.cpp 1102-1108.
    trt.ExecutionContextAllocationStrategy = enum.IntEnum("ExecutionContextAllocationStrategy",
                                                          "STATIC ON_PROFILE_CHANGE USER_MANAGED", start=0)
    trt.Dims = Dims
    trt.formats = {}  # tensor name -> TensorFormat, for engines built with --inputIOFormats
    trt.load_overhead = 0  # device bytes a deserialization takes beyond the plan's size
    trt.verbose_per_load = 20  # VERBOSE messages each deserialization logs
    trt.host_load_bytes = 0  # host memory a deserialization keeps (TensorRT's libraries, the plan)
    trt.refuse_capture = False  # TensorRT refuses every enqueue under capture (a plugin that cannot be captured)

    class ILogger:
        # pybind11's arithmetic enum: int(severity) is 0 (INTERNAL_ERROR) .. 4 (VERBOSE).
        Severity = enum.IntEnum("Severity", "INTERNAL_ERROR ERROR WARNING INFO VERBOSE", start=0)

        def __init__(self) -> None:
            pass

    class Logger(ILogger):
        """trt.Logger, TensorRT's own logger (pyCore.cpp (v10.3.0) 757-760), its severities in its scope."""

        INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = ILogger.Severity

        def __init__(self, min_severity: Any = ILogger.Severity.WARNING) -> None:
            super().__init__()
            self.min_severity = min_severity

        def log(self, severity: Any, msg: str) -> None:
            if int(severity) <= int(self.min_severity):
                print(f"[TRT] {msg}", file=sys.stderr)

    trt.profiles = [PROFILE]   # the x ranges of the engines deserialized next, one per profile
    trt.fixed_batch = None     # an int: the next engines have fixed shapes x [n, 4] (no profile)

    def io_tensors() -> dict[str, tuple]:
        n = -1 if trt.fixed_batch is None else trt.fixed_batch
        return {"x": (trt.TensorIOMode.INPUT, trt.DataType.FLOAT, (n, 4)),
                "total": (trt.TensorIOMode.OUTPUT, trt.DataType.FLOAT, (n,)),
                "argmax": (trt.TensorIOMode.OUTPUT, trt.DataType.INT32, (n,))}

    strategies = trt.ExecutionContextAllocationStrategy

    class Context:
        """IExecutionContext; `gate` lets a test hold a request inside execute."""

        def __init__(self, engine: "Engine", strategy: Any) -> None:
            self.engine = engine
            self.strategy = strategies(strategy)
            self.profile = 0  # NvInferRuntime.h 2612-2614: a new context is assigned profile 0
            fixed = engine.tensors["x"][2]
            self.shapes: dict[str, tuple] = {} if -1 in fixed else {"x": fixed}
            self.addresses: dict[str, int] = {}
            self.address_calls = 0
            self.shape_calls: list[tuple] = []
            self.executions = 0
            # The first enqueue after the shapes change does one-off set-up that cannot be captured
            # (sampleInference.cpp (v10.3.0) 961-963: trtexec enqueues once before it captures).
            # Whether an identical set_input_shape also needs it is for tests/gpu/run.sh's graphs stage.
            self.needs_setup = True
            self.gate: Callable[[], None] | None = None
            self.memory: tuple[int, int] | None = None  # (pointer, size) given with set_device_memory
            # STATIC reserves the largest profile's activation memory (2523), ON_PROFILE_CHANGE the
            # current profile's (2524), USER_MANAGED nothing: the caller supplies it (2525).
            self.reserved = {strategies.STATIC: engine.device_memory_size_v2,
                             strategies.ON_PROFILE_CHANGE: engine.get_device_memory_size_for_profile_v2(0),
                             strategies.USER_MANAGED: 0}[self.strategy]
            gpu.reserved += self.reserved
            gpu.owner[id(self)] = gpu.current()

        def __del__(self) -> None:
            gpu.reserved -= self.reserved
            gpu.released("execution context release", id(self))

        def set_input_shape(self, name: str, shape: Any) -> bool:
            shape = tuple(shape)
            self.shape_calls.append(shape)
            if self.shapes.get(name) != shape:
                self.needs_setup = True
            fixed = self.engine.tensors["x"][2]
            low, _, high = (fixed, fixed, fixed) if -1 not in fixed else self.engine.profiles[self.profile]
            if name != "x" or len(shape) != 2 or not all(a <= s <= b for a, s, b in zip(low, shape, high)):
                self.engine.logger.log(ILogger.Severity.ERROR, f"shape {shape} outside profile")
                return False
            self.shapes[name] = shape
            return True

        def get_tensor_shape(self, name: str) -> Dims:
            batch = self.shapes.get("x", (-1,))[0]
            return Dims(self.shapes.get("x", (-1, 4)) if name == "x" else (batch,))

        def set_optimization_profile_async(self, index: int, stream_handle: int) -> bool:
            """pyCore.cpp (v10.3.0) 326-332: failure raises RuntimeError; it never returns False."""
            assert stream_handle in gpu.streams
            if gpu.fail.pop("set_optimization_profile_async", None) or \
                    not 0 <= index < self.engine.num_optimization_profiles:
                self.engine.logger.log(ILogger.Severity.ERROR, f"fake: IExecutionContext::setOptimizationProfile"
                                       f"Async: cannot switch to profile {index}")
                raise RuntimeError("Error in set optimization profile async.")
            self.profile, self.shapes, self.needs_setup = index, {}, True
            if self.strategy == strategies.ON_PROFILE_CHANGE:
                gpu.reserved -= self.reserved
                self.reserved = self.engine.get_device_memory_size_for_profile_v2(index)
                gpu.reserved += self.reserved
            return True

        def set_device_memory(self, memory: int, size: int) -> None:
            """pyCore.cpp 339-342, 1042: setDeviceMemoryV2(memory, size), for USER_MANAGED contexts."""
            gpu.check(memory, size, gpu.device)
            self.memory = (memory, size)

        def set_tensor_address(self, name: str, ptr: int) -> bool:
            self.address_calls += 1
            self.addresses[name] = ptr
            return True

        def execute_async_v3(self, stream_handle: int) -> bool:
            assert stream_handle in gpu.streams
            self.executions += 1
            refusal = self._refusal(stream_handle)
            if refusal:
                self.engine.logger.log(ILogger.Severity.ERROR, refusal)
                return False
            self.needs_setup = False
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

        def _refusal(self, stream_handle: int) -> str:
            """Why TensorRT would not enqueue now ("" if it would)."""
            if gpu.last_error:  # a stale CUDA error: trtexec clears it after a failed capture (sampleInference.cpp 983)
                return f"fake: a CUDA error is pending ({gpu.last_error.name}): call cudaGetLastError"
            if self.strategy == strategies.USER_MANAGED:
                need = self.engine.get_device_memory_size_for_profile_v2(self.profile)
                if self.memory is None or self.memory[1] < need:
                    return f"fake: USER_MANAGED context without {need} bytes of device memory (set_device_memory)"
            if stream_handle in gpu.capturing and (self.needs_setup or trt.refuse_capture):
                # sampleInference.cpp 971-972: under capture, enqueue may return false.
                return "fake: enqueueV3 is not permitted under CUDA graph capture now (one-off set-up)"
            return ""

    class Engine:
        """ICudaEngine for the toy model in the module docstring."""

        device_memory_size_v2 = ACTIVATION_BYTES  # the largest over all profiles (NvInferRuntime.h 2714-2725)

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

        def get_device_memory_size_for_profile_v2(self, profile: int) -> int:
            """In proportion to the profile's largest batch: the largest profile needs ACTIVATION_BYTES."""
            if not self.profiles:
                return ACTIVATION_BYTES
            largest = max(p[2][0] for p in self.profiles)
            return max(1, ACTIVATION_BYTES * self.profiles[profile][2][0] // largest)

        def get_tensor_name(self, index: int) -> str:
            return list(self.tensors)[index]

        def get_tensor_mode(self, name: str) -> Any:
            return self.tensors[name][0]

        def get_tensor_dtype(self, name: str) -> Any:
            return self.tensors[name][1]

        def get_tensor_shape(self, name: str) -> Dims:
            return Dims(self.tensors[name][2])

        def get_tensor_format(self, name: str) -> Any:
            return trt.formats.get(name, trt.TensorFormat.LINEAR)

        def get_tensor_components_per_element(self, name: str) -> int:
            digits = "".join(c for c in self.get_tensor_format(name).name if c.isdigit())
            return int(digits or 1)

        def get_tensor_location(self, name: str) -> Any:
            return trt.TensorLocation.DEVICE

        def get_tensor_profile_shape(self, name: str, profile: int) -> list[Dims]:
            """pyCore.cpp (v10.3.0) 177-184: a list of three Dims, min, opt and max."""
            assert self.tensors[name][0] == trt.TensorIOMode.INPUT
            if not self.profiles or not 0 <= profile < len(self.profiles):
                # A fixed-shape engine has no profile ranges to give (C++: Dims with nbDims -1).
                raise RuntimeError(f"fake: no optimization profile {profile} for {name!r}")
            return [Dims(shape) for shape in self.profiles[profile]]

        def create_execution_context(self, strategy: Any = strategies.STATIC) -> Context | None:
            """pyCore.cpp (v10.3.0) 1165-1166: the strategy defaults to STATIC."""
            if gpu.fail.pop("create_execution_context", None):
                self.logger.log(ILogger.Severity.ERROR, "fake: out of memory for activations")
                return None
            ctx = Context(self, strategy)
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
            self.DLA_core = -1  # NvInferRuntime.h (v10.3.0) 1391, 1406-1411: defaults to -1 (unset)

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

    trt.ILogger, trt.Logger = ILogger, Logger
    trt.dla_cores = 0          # DLA cores of the device (Jetson Orin AGX/NX: 2)
    trt.on_deserialize = None  # called inside deserialize_cuda_engine
    trt.DeviceType = enum.Enum("DeviceType", "GPU DLA")
    trt.engines, trt.contexts = [], []  # weak references to what was made, for the tests
    trt.Runtime, trt.ICudaEngine = Runtime, Engine
    trt.init_libnvinfer_plugins = lambda logger, namespace: True
    add_fake_builder(trt, gpu)
    return trt


DEVICES = ("discrete", "orin")


def use_device(trt: ModuleType, gpu: FakeCudart, model: str) -> None:
    """Make the stand-in one of DEVICES: "discrete" (the default: one GPU, no DLA), or "orin", a Jetson
    Orin NX 16 GB: integrated memory (host and GPU share the DRAM) and 2 DLA cores."""
    if model not in DEVICES:
        raise ValueError(f"INFERMUX_FAKE_TRT_DEVICE={model!r}: the stand-in knows {DEVICES}")
    if model == "orin":
        gpu.integrated, gpu.total, trt.dla_cores = True, 16 << 30, 2


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
    this in a daemon, its workers and build processes, started with INFERMUX_FAKE_TRT=1. The device model
    comes from INFERMUX_FAKE_TRT_DEVICE, the number of GPUs from INFERMUX_FAKE_TRT_GPUS, and a build
    process reports to (and is held by) the folder INFERMUX_FAKE_TRT_STATE names (BuildChild)."""
    gpu = FakeCudart()
    gpu.device_count = int(os.environ.get("INFERMUX_FAKE_TRT_GPUS", "1"))
    trt = make_fake_tensorrt(gpu)
    use_device(trt, gpu, os.environ.get("INFERMUX_FAKE_TRT_DEVICE", "discrete"))
    state = os.environ.get("INFERMUX_FAKE_TRT_STATE")
    trt.state_dir = Path(state) if state else None
    sys.modules.update({**_cuda_modules(gpu), "tensorrt": trt})
    return trt


class BuildChild:
    """The stand-in in the process a build runs in (tensorrt_build_process.py), driven through a folder:
    `hold()` keeps its builds waiting until `release()`, `fail()` makes them fail as TensorRT does,
    `crash()` kills the process with SIGSEGV mid-build, and `records()` lists what each build was asked
    (one JSON line per build: pid, device, flags, profiles, DLA settings, timing cache)."""

    def __init__(self, state: Path) -> None:
        self.state = state
        state.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        """The environment a process needs to run the stand-in and report here."""
        path = os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH")]))
        return {"INFERMUX_FAKE_TRT": "1", "INFERMUX_FAKE_TRT_STATE": str(self.state), "PYTHONPATH": path}

    def hold(self) -> None:
        (self.state / "hold").touch()

    def release(self) -> None:
        (self.state / "hold").unlink(missing_ok=True)

    def fail(self) -> None:
        (self.state / "fail").touch()

    def crash(self) -> None:
        (self.state / "crash").touch()

    def records(self) -> list[dict[str, Any]]:
        path = self.state / "builds.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def wait_started(self, timeout: float = 30) -> bool:
        """Wait until a build is held at the gate (its process is up and building)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.state / "building").exists():
                return True
            time.sleep(0.02)
        return False


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


@pytest.fixture
def build_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[BuildChild]:
    """Build processes started during this test (and their site hook) run the stand-in, reporting to
    a BuildChild; a build still held at the end is released."""
    child = BuildChild(tmp_path / "build-child")
    for name, value in child.env().items():
        monkeypatch.setenv(name, value)
    yield child
    child.release()
