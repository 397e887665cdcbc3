"""Finding TensorRT, and the process-wide objects every engine shares.

TensorRT is imported on first use, not when this package is imported, so
backend discovery works on machines without it, and a model that needs it
fails to load with a `BackendError` that says what to install.

One logger and one runtime serve the whole process and are never released:
every engine must be destroyed before the runtime that deserialized it, and
holding the runtime here, for the life of the process, guarantees that.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Iterator

from infermux.plugins.base import BackendError

log = logging.getLogger("infermux.tensorrt")

MIN_MAJOR = 10  # the named-tensor API; JetPack 6.1 and 6.2 ship 10.3

INSTALL_HINT = ("on Jetson (JetPack 6) install the system package: `apt install python3-libnvinfer` "
                "and use the system python3; on a discrete GPU `pip install tensorrt` for your CUDA "
                "version (see docs/tensorrt.md)")

# numpy dtype name for each TensorRT DataType member the wire protocol can carry.
_DTYPES = {"FLOAT": "float32", "HALF": "float16", "INT8": "int8", "UINT8": "uint8",
           "INT32": "int32", "INT64": "int64", "BOOL": "bool"}


def import_tensorrt() -> ModuleType:
    """The `tensorrt` module, or a BackendError that says how to install it."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise BackendError(f"TensorRT is not installed for {sys.executable} ({exc}); "
                           f"{INSTALL_HINT}") from exc
    version = str(getattr(trt, "__version__", "0"))
    # device_memory_size_v2 arrived in 10.1; 10.0 and 8.x (JetPack 6.0) lack it.
    if int(version.split(".")[0]) < MIN_MAJOR or not hasattr(trt.ICudaEngine, "device_memory_size_v2"):
        raise BackendError(f"TensorRT {version} is too old: infermux needs TensorRT 10.1 or newer "
                           f"(JetPack 6.1 or newer); {INSTALL_HINT}")
    return trt


def numpy_dtype(trt: ModuleType, dtype: Any) -> str | None:
    """The numpy dtype name for a TensorRT DataType, or None if it has none (BF16, FP8, INT4)."""
    for member, name in _DTYPES.items():
        if dtype == getattr(trt.DataType, member, None):
            return name
    return None


def _new_logger(trt: ModuleType) -> Any:
    """An ILogger that forwards to `logging` and remembers the last error per thread.

    TensorRT calls `log` for every message, VERBOSE ones included (hundreds per engine load),
    and the bindings' ILogger filters nothing itself: so `log` first drops, by comparing the
    severity's number, every message `logging` would discard, before any logging call.
    """
    sev = trt.ILogger.Severity
    levels = {sev.INTERNAL_ERROR: logging.ERROR, sev.ERROR: logging.ERROR,
              sev.WARNING: logging.WARNING, sev.INFO: logging.DEBUG, sev.VERBOSE: logging.DEBUG}
    # Severities are numbered INTERNAL_ERROR 0 .. VERBOSE 4: pass up to WARNING, or all when
    # the daemon logs at DEBUG (`--log-level debug`, read when the first engine loads).
    highest = int(sev.VERBOSE if log.isEnabledFor(logging.DEBUG) else sev.WARNING)

    class Logger(trt.ILogger):  # type: ignore[name-defined]  # a base taken from the module object
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self._local = threading.local()
            self._last = ""  # for errors TensorRT logs from its own threads

        def log(self, severity: Any, msg: str) -> None:
            if int(severity) > highest:
                return
            level = levels.get(severity, logging.DEBUG)
            if level >= logging.ERROR:
                self._local.last = self._last = msg
                if getattr(self._local, "held", False):
                    return  # the caller reports it (errors_held)
            log.log(level, "TensorRT: %s", msg)

        @contextlib.contextmanager
        def errors_held(self) -> Iterator[None]:
            """Errors TensorRT logs on this thread meanwhile are kept for take_error, not logged."""
            self._local.held = True
            try:
                yield
            finally:
                self._local.held = False

        def take_error(self) -> str:
            """The last error logged on this thread (else on any), cleared."""
            msg = getattr(self._local, "last", "") or self._last
            self._local.last = self._last = ""
            return msg

    return Logger()


@dataclass(frozen=True)
class Shared:
    """The process-wide TensorRT module, logger and runtime."""

    trt: ModuleType
    logger: Any
    runtime: Any
    # Held while a runtime setting (DLA_core) is set and the plan it applies to deserialized.
    runtime_lock: threading.Lock = field(default_factory=threading.Lock)

    def last_error(self) -> str:
        """TensorRT's last logged error on this thread, for error messages ("" if none)."""
        return self.logger.take_error()

    def errors_held(self) -> Any:
        """A context in which TensorRT's errors on this thread are not logged, only kept for
        last_error(): for a call whose failure the caller handles and reports itself."""
        return self.logger.errors_held()


_lock = threading.Lock()
_shared: Shared | None = None


def shared() -> Shared:
    """The process-wide TensorRT objects, created on first use."""
    global _shared
    with _lock:
        if _shared is None:
            trt = import_tensorrt()
            logger = _new_logger(trt)
            # Plugin layers (NMS and friends) must be registered before an
            # engine that uses them is deserialized.
            trt.init_libnvinfer_plugins(logger, "")
            _shared = Shared(trt, logger, _new_runtime(trt, logger))
        return _shared


def _new_runtime(trt: ModuleType, logger: Any) -> Any:
    """The one IRuntime. Version-compatible plans (built with VERSION_COMPATIBLE, to run on later
    TensorRT releases of the same major) embed their lean runtime as host code, which a runtime
    refuses unless `engine_host_code_allowed`: engine files are the operator's, trusted like the
    config (docs/tensorrt.md#engines-belong-to-one-device)."""
    runtime = trt.Runtime(logger)
    runtime.engine_host_code_allowed = True
    return runtime
