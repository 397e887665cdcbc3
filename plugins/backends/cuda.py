"""CUDA streams, memory and copies, as the TensorRT backend needs them.

The binding is cuda-python's `cuda.bindings.runtime`, 12.9.1 or newer (older
releases hold the GIL through every call). Its runtime API talks to the
device's primary CUDA context, the one TensorRT's runtime uses too, so
pointers and streams made here are valid for TensorRT. pycuda is not used:
docs/tensorrt.md says why.

Every CUDA failure surfaces as `CudaError` (a `BackendError`) that names
the CUDA error, so the daemon answers 500 or marks the model failed instead
of crashing. This module knows nothing about TensorRT, so it can be proven
on a GPU machine on its own (tests/gpu/test_gpu_cuda.py).

Jetson: the GPU has no memory of its own. Device buffers, pinned host
buffers and the free figure of `mem_info()` all come from the one system
DRAM, and other processes' use of RAM moves that figure too.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import threading
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, Protocol

import numpy as np

from infermux.plugins.base import BackendError

log = logging.getLogger("infermux.cuda")

# Error names that mean "this machine has no usable GPU", not "something broke".
NO_GPU_ERRORS = frozenset({"cudaErrorNoDevice", "cudaErrorInsufficientDriver"})

INSTALL_HINT = ("install cuda-python for this Python: `pip install 'cuda-python>=12.9.1,<13'` "
                "(the 13.x line, >= 13.0.0, needs NVIDIA driver >= 580, which JetPack 6 does not have); "
                "pycuda is not used (docs/tensorrt.md)")


class CudaError(BackendError):
    """A CUDA call failed; `name` is the CUDA error name (e.g. cudaErrorMemoryAllocation)."""

    def __init__(self, op: str, name: str) -> None:
        super().__init__(f"CUDA {op} failed: {name}")
        self.op = op
        self.name = name

    @property
    def out_of_memory(self) -> bool:
        return "MemoryAllocation" in self.name or "out of memory" in self.name.lower()


@dataclass(frozen=True)
class MemInfo:
    """Free and total memory of the current device, in bytes (cudaMemGetInfo)."""

    free: int
    total: int


class _Api(Protocol):
    """The handful of CUDA runtime calls this module needs; one class per binding."""

    name: str

    def device_count(self) -> int: ...
    def set_device(self, device: int) -> None: ...
    def integrated(self, device: int) -> bool: ...
    def malloc(self, nbytes: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def malloc_host(self, nbytes: int) -> int: ...
    def free_host(self, ptr: int) -> None: ...
    def stream_create(self) -> int: ...
    def stream_destroy(self, stream: int) -> None: ...
    def stream_sync(self, stream: int) -> None: ...
    def copy_async(self, dst: int, src: int, nbytes: int, to_device: bool, stream: int) -> None: ...
    def mem_info(self) -> MemInfo: ...
    def host_alloc_mapped(self, nbytes: int) -> tuple[int, int]: ...
    def begin_capture(self, stream: int) -> None: ...
    def end_capture(self, stream: int) -> Any: ...
    def clear_error(self) -> str: ...
    def instantiate(self, graph: Any) -> Any: ...
    def launch(self, graph_exec: Any, stream: int) -> None: ...
    def destroy_graph(self, graph: Any, graph_exec: Any) -> None: ...


class _CudaPython:
    """cuda-python: every call returns `(cudaError_t, *results)`."""

    def __init__(self, rt: Any, name: str, native: Callable[[Any], int] = int) -> None:
        self._rt = rt
        self._ok = rt.cudaError_t.cudaSuccess
        self.name = name
        self._native = native  # handle object -> int: cuda.bindings.utils.get_cuda_native_handle

    def _call(self, op: str, result: Any) -> Any:
        err, *values = result
        if err != self._ok:
            raise CudaError(op, getattr(err, "name", str(err)))
        return values[0] if len(values) == 1 else values

    def device_count(self) -> int:
        err, count = self._rt.cudaGetDeviceCount()
        if getattr(err, "name", "") in NO_GPU_ERRORS:
            return 0
        return int(self._call("cudaGetDeviceCount", (err, count)))

    def set_device(self, device: int) -> None:
        self._call("cudaSetDevice", self._rt.cudaSetDevice(device))

    def integrated(self, device: int) -> bool:
        attr = self._rt.cudaDeviceAttr.cudaDevAttrIntegrated
        return bool(self._call("cudaDeviceGetAttribute", self._rt.cudaDeviceGetAttribute(attr, device)))

    def malloc(self, nbytes: int) -> int:
        return int(self._call("cudaMalloc", self._rt.cudaMalloc(nbytes)))

    def free(self, ptr: int) -> None:
        self._call("cudaFree", self._rt.cudaFree(ptr))

    def malloc_host(self, nbytes: int) -> int:
        return int(self._call("cudaMallocHost", self._rt.cudaMallocHost(nbytes)))

    def free_host(self, ptr: int) -> None:
        self._call("cudaFreeHost", self._rt.cudaFreeHost(ptr))

    def stream_create(self) -> int:
        # Non-blocking: never implicitly synchronises with the legacy default
        # stream, so contexts on other threads do not serialise each other.
        flags = self._rt.cudaStreamNonBlocking
        # int(cudaStream_t) is deprecated; the native-handle accessor is the supported way.
        return self._native(self._call("cudaStreamCreateWithFlags", self._rt.cudaStreamCreateWithFlags(flags)))

    def stream_destroy(self, stream: int) -> None:
        self._call("cudaStreamDestroy", self._rt.cudaStreamDestroy(stream))

    def stream_sync(self, stream: int) -> None:
        self._call("cudaStreamSynchronize", self._rt.cudaStreamSynchronize(stream))

    def copy_async(self, dst: int, src: int, nbytes: int, to_device: bool, stream: int) -> None:
        kinds = self._rt.cudaMemcpyKind
        kind = kinds.cudaMemcpyHostToDevice if to_device else kinds.cudaMemcpyDeviceToHost
        self._call("cudaMemcpyAsync", self._rt.cudaMemcpyAsync(dst, src, nbytes, kind, stream))

    def mem_info(self) -> MemInfo:
        free, total = self._call("cudaMemGetInfo", self._rt.cudaMemGetInfo())
        return MemInfo(int(free), int(total))

    def host_alloc_mapped(self, nbytes: int) -> tuple[int, int]:
        """(host pointer, device pointer) of pinned host memory the GPU reads and writes in place."""
        ptr = int(self._call("cudaHostAlloc", self._rt.cudaHostAlloc(nbytes, self._rt.cudaHostAllocMapped)))
        try:
            device = int(self._call("cudaHostGetDevicePointer", self._rt.cudaHostGetDevicePointer(ptr, 0)))
        except CudaError:
            self.free_host(ptr)
            raise
        return ptr, device

    def begin_capture(self, stream: int) -> None:
        # Thread-local: another thread's cudaMalloc (a model loading) does not break this capture.
        mode = self._rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        self._call("cudaStreamBeginCapture", self._rt.cudaStreamBeginCapture(stream, mode))

    def end_capture(self, stream: int) -> Any:
        return self._call("cudaStreamEndCapture", self._rt.cudaStreamEndCapture(stream))

    def clear_error(self) -> str:
        """Reset the runtime's last error (cudaGetLastError returns it, `(err,)`); its name, "" if none."""
        err, = self._rt.cudaGetLastError()
        return "" if err == self._ok else getattr(err, "name", str(err))

    def instantiate(self, graph: Any) -> Any:
        return self._call("cudaGraphInstantiate", self._rt.cudaGraphInstantiate(graph, 0))

    def launch(self, graph_exec: Any, stream: int) -> None:
        self._call("cudaGraphLaunch", self._rt.cudaGraphLaunch(graph_exec, stream))

    def destroy_graph(self, graph: Any, graph_exec: Any) -> None:
        if graph_exec is not None:
            self._call("cudaGraphExecDestroy", self._rt.cudaGraphExecDestroy(graph_exec))
        self._call("cudaGraphDestroy", self._rt.cudaGraphDestroy(graph))


def _bytes_at(ptr: int, nbytes: int) -> np.ndarray:
    """A uint8 numpy view of `nbytes` of host memory at `ptr` (no copy)."""
    if nbytes == 0:
        return np.empty(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))


# The first cuda-bindings releases that drop the GIL around their C calls (12.x line, 13.x line).
# Older ones hold it through every cudaStreamSynchronize, freezing every other Python thread.
GIL_FREE = (12, 9, 1)


def _version(text: str) -> tuple[int, ...]:
    """(12, 9, 1) from "12.9.1", "12.9.1.post2" or "13.0.0rc1": the leading numbers."""
    parts = []
    for part in text.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def bindings_version() -> str:
    """The installed cuda-bindings version ("" if it cannot be told)."""
    try:
        import cuda.bindings as bindings
        return str(getattr(bindings, "__version__", "") or metadata.version("cuda-bindings"))
    except (ImportError, metadata.PackageNotFoundError):
        return ""


def check_releases_gil(version: str) -> None:
    """BackendError unless cuda-bindings `version` releases the GIL during CUDA calls."""
    if not version:
        log.warning("cannot tell the cuda-bindings version: if it is older than 12.9.1, every CUDA "
                    "synchronisation stalls the daemon's other threads")
        return
    if _version(version) < GIL_FREE:
        raise BackendError(f"cuda-python (cuda-bindings) {version} holds the Python GIL during every CUDA "
                           f"call, so one synchronising request would freeze the whole daemon: "
                           f"{INSTALL_HINT}")


def _load_api() -> _Api:
    try:
        from cuda.bindings import runtime as rt  # cuda-python >= 12.6 (>= 12.9.1 checked below)
    except ImportError:
        pass
    else:
        check_releases_gil(bindings_version())
        return _CudaPython(rt, "cuda-python (cuda.bindings.runtime)", _native_handle())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "cuda.cudart is deprecated"
            from cuda import cudart  # noqa: F401  (cuda-python < 12.6: holds the GIL)
    except ImportError:
        pass
    else:
        check_releases_gil(_distribution_version("cuda-python") or "12.5 or older")
    # No pycuda fallback: docs/tensorrt.md ("Why not pycuda") says why.
    raise BackendError(f"no CUDA binding for Python found: {INSTALL_HINT}")


def _native_handle() -> Callable[[Any], int]:
    """cuda.bindings.utils.get_cuda_native_handle (12.9.1+, 13.0.0+), else int() for a build that lacks it."""
    try:
        from cuda.bindings.utils import get_cuda_native_handle
    except ImportError:
        return int
    return lambda handle: int(get_cuda_native_handle(handle))


def _distribution_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


_api_lock = threading.Lock()
_api_cache: _Api | None = None


def _api() -> _Api:
    """The binding, chosen once per process on first use."""
    global _api_cache
    if _api_cache is not None:  # every CUDA call passes here: no lock once chosen
        return _api_cache
    with _api_lock:
        if _api_cache is None:
            _api_cache = _load_api()
        return _api_cache


def binding_name() -> str:
    """Which Python binding this process uses for CUDA."""
    return _api().name


def device_count() -> int:
    """Number of usable CUDA devices; 0 where there is no GPU or no driver."""
    return _api().device_count()


def set_device(device: int) -> None:
    """Make `device` current for the calling thread (CUDA's current device is per thread)."""
    _api().set_device(device)


def is_integrated(device: int = 0) -> bool:
    """True on Jetson-style GPUs that share the system's DRAM."""
    return _api().integrated(device)


def mem_info() -> MemInfo:
    """cudaMemGetInfo for the current device."""
    return _api().mem_info()


class Stream:
    """A CUDA stream owned by one execution context; `handle` is what TensorRT takes."""

    def __init__(self) -> None:
        self.handle: int | None = _api().stream_create()

    def synchronize(self) -> None:
        """Wait until all work queued on this stream is done."""
        _api().stream_sync(self._live())

    def _live(self) -> int:
        if self.handle is None:
            raise BackendError("CUDA stream used after close")
        return self.handle

    def close(self) -> None:
        """Destroy the stream (idempotent)."""
        handle, self.handle = self.handle, None
        if handle is not None:
            _api().stream_destroy(handle)


class Graph:
    """A CUDA graph captured from the work one call queues on a stream, replayed by `launch`."""

    def __init__(self, stream: Stream, enqueue: Callable[[], None]) -> None:
        """Capture what `enqueue()` queues on `stream` (it does not run); CudaError, or `enqueue`'s own
        error, if capture fails, with the stream no longer capturing and no CUDA error left pending."""
        api, handle = _api(), stream._live()
        api.begin_capture(handle)
        try:
            enqueue()
        except BaseException:
            _abandon_capture(api, handle)
            raise
        try:
            self._graph: Any = api.end_capture(handle)
        except CudaError:  # cudaErrorStreamCaptureInvalidated: no graph was made
            _clear_error(api)
            raise
        try:
            self._exec: Any = api.instantiate(self._graph)
        except BaseException:
            api.destroy_graph(self._graph, None)
            raise

    def launch(self, stream: Stream) -> None:
        """Queue one replay of the captured work on `stream`."""
        if self._graph is None:
            raise BackendError("CUDA graph used after close")
        _api().launch(self._exec, stream._live())

    def close(self) -> None:
        """Destroy the graph (idempotent)."""
        graph, self._graph = self._graph, None
        if graph is not None:
            _api().destroy_graph(graph, self._exec)


def _abandon_capture(api: _Api, handle: int) -> None:
    """End a capture whose enqueue failed, as trtexec does (sampleDevice.h, endCaptureOnError): the graph
    it made, if any, is destroyed unused; an invalidated capture made none."""
    try:
        api.destroy_graph(api.end_capture(handle), None)
    except CudaError:
        pass
    _clear_error(api)


def _clear_error(api: _Api) -> None:
    """A failed capture leaves its error as the runtime's last error, which a later launch (TensorRT's)
    could report as its own: clear it, as trtexec does after one (sampleInference.cpp)."""
    name = api.clear_error()
    if name:
        log.debug("cleared the CUDA error a failed graph capture left: %s", name)


class DeviceBuffer:
    """`nbytes` of device memory at `ptr`."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        # At least one byte: TensorRT rejects null tensor addresses.
        self.ptr: int | None = _api().malloc(max(nbytes, 1))

    def close(self) -> None:
        """Free the memory (idempotent)."""
        ptr, self.ptr = self.ptr, None
        if ptr is not None:
            _api().free(ptr)


class HostBuffer:
    """`nbytes` of pinned (page-locked) host memory: the staging area for async copies.

    `mapped`: memory the GPU reads and writes in place at `device_ptr` (zero-copy: on an
    integrated GPU host and device memory are the same DRAM, so no copy is needed)."""

    def __init__(self, nbytes: int, mapped: bool = False) -> None:
        self.nbytes = nbytes
        self.device_ptr: int | None = None
        self.ptr: int | None
        if mapped:
            ptr, self.device_ptr = _api().host_alloc_mapped(max(nbytes, 1))
        else:
            ptr = _api().malloc_host(max(nbytes, 1))
        self.ptr = ptr
        self._bytes = _bytes_at(ptr, nbytes)

    def view(self, dtype: np.dtype | str, shape: tuple[int, ...]) -> np.ndarray:
        """A numpy view of the first bytes as `dtype` and `shape` (no copy; valid until close)."""
        if self.ptr is None:
            raise BackendError("pinned buffer used after close")
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if count * dtype.itemsize > self.nbytes:
            raise BackendError(f"{list(shape)} {dtype} needs {count * dtype.itemsize} bytes; "
                               f"the buffer has {self.nbytes}")
        return self._bytes[: count * dtype.itemsize].view(dtype).reshape(shape)

    def close(self) -> None:
        """Free the memory (idempotent); views taken earlier must not be used after this."""
        ptr, self.ptr, self.device_ptr = self.ptr, None, None
        self._bytes = np.empty(0, np.uint8)
        if ptr is not None:
            _api().free_host(ptr)


def _copy(dst: int | None, src: int | None, nbytes: int, limit: int, to_device: bool, stream: Stream) -> None:
    if dst is None or src is None:
        raise BackendError("CUDA copy with a closed buffer")
    if nbytes > limit:
        raise BackendError(f"CUDA copy of {nbytes} bytes overruns a {limit}-byte buffer")
    if nbytes:
        _api().copy_async(dst, src, nbytes, to_device, stream._live())


def copy_to_device(dst: DeviceBuffer, src: HostBuffer, nbytes: int, stream: Stream) -> None:
    """Queue an async copy of `nbytes` from pinned host memory to the device on `stream`."""
    _copy(dst.ptr, src.ptr, nbytes, min(dst.nbytes, src.nbytes), True, stream)


def copy_to_host(dst: HostBuffer, src: DeviceBuffer, nbytes: int, stream: Stream) -> None:
    """Queue an async copy of `nbytes` from the device to pinned host memory on `stream`."""
    _copy(dst.ptr, src.ptr, nbytes, min(dst.nbytes, src.nbytes), False, stream)


def copy_to_array(dst: np.ndarray, src: DeviceBuffer, stream: Stream) -> None:
    """Copy the device's bytes into a C-contiguous, writable array (any host memory: a worker's
    shared-memory slot). For pageable memory the driver stages the copy and the call returns
    when it is done (tests/benchmarks/RESULTS.md, "GPU: device to a worker's slot")."""
    if not (dst.flags.c_contiguous and dst.flags.writeable):
        raise BackendError("CUDA copy into an array that is not C-contiguous and writable")
    _copy(dst.ctypes.data, src.ptr, dst.nbytes, src.nbytes, False, stream)
