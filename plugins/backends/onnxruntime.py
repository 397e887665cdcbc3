"""The onnxruntime backend: runs everywhere, and on GPU boxes through the
CUDA or TensorRT execution providers.

On the CPU, one `InferenceSession` serves all of a version's contexts:
`run` is thread-safe and, with `intra_op_num_threads = 1` (the default), runs
on the calling executor thread, so the contexts still compute side by side
while the weights are held once (each run's activations come from the
session's arena). With GPU execution providers each context keeps a session
of its own (the TensorRT and CUDA providers serialise runs of one session on
one stream); `share_session = true | false` overrides either default.
With onnxruntime's default thread pool, p99 spikes to several ms under
concurrency on small boxes, hence one intra-op thread by default.
A large model may take more threads per context; `allow_spinning = false`
then lets them sleep between operators instead of spinning on cores that the
other models and the pipelines' processors need (measured on PP-OCR's detector:
tests/benchmarks/RESULTS.md, "Pipelines").

On a GPU box, `[models.options]` chooses execution providers in order of
preference; each entry is a name or `[name, {option = value}]`, and the
ones this onnxruntime build lacks are skipped (with a warning):

    providers = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    providers = [["CUDAExecutionProvider", {device_id = 0}], "CPUExecutionProvider"]
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from infermux.plugins.base import BackendError, InputRejected, OutputsMismatch, TensorSpec

log = logging.getLogger("infermux.onnxruntime")

Provider = str | tuple[str, dict[str, Any]]  # onnxruntime's own `providers=` entry forms

_ORT_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(uint8)": "uint8",
    "tensor(int8)": "int8",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(bool)": "bool",
}


def _spec(node: Any) -> TensorSpec:
    dtype = _ORT_DTYPES.get(node.type)
    if dtype is None:
        raise BackendError(f"tensor {node.name!r} has unsupported type {node.type}")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in node.shape)
    return TensorSpec(node.name, dtype, shape)


def select_providers(requested: Any, available: list[str]) -> list[Provider]:
    """The requested execution providers this onnxruntime has, in order, with their options.

    Each entry is a provider name or a `[name, {options}]` pair.
    """
    if isinstance(requested, str) or not isinstance(requested, (list, tuple)):
        raise BackendError(f"`providers` must be a list, got {requested!r}")
    chosen: list[Provider] = []
    for entry in requested:
        if isinstance(entry, str):
            name, opts = entry, {}
        elif (isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str)
              and isinstance(entry[1], Mapping)):
            name, opts = entry[0], dict(entry[1])
        else:
            raise BackendError(f"`providers` entries are names or [name, {{options}}] pairs, got {entry!r}")
        if name not in available:
            log.warning("execution provider %s is not in this onnxruntime build (%s); skipped",
                        name, ", ".join(available))
            continue
        chosen.append((name, opts) if opts else name)
    if not chosen:
        raise BackendError(f"none of the execution providers {list(requested)} is available; "
                           f"this onnxruntime has {available}")
    return chosen


class OnnxRuntimeContext:
    """One executor thread's handle on a session (its own, or the version's shared one)."""

    def __init__(self, session: Any, output_names: list[str], options: Any, quiet: Any,
                 on_close: Callable[[], None] = lambda: None, direct: bool = False) -> None:
        self._session = session
        self._output_names = output_names
        self._options = options  # made once: `run` without them makes a default set on every call
        self._quiet = quiet
        self._on_close = on_close
        # The binding's own `run`, where nothing the wrapper adds applies (direct_run).
        self._run = session._sess.run if direct else session.run

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            values = self._run(self._output_names, inputs if type(inputs) is dict else dict(inputs), self._options)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise _translated(exc) from exc
        return dict(zip(self._output_names, values))

    def infer_into(self, inputs: Mapping[str, np.ndarray],
                   outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`infer` through an IOBinding whose outputs are the caller's arrays (base.WritesOutputs)."""
        binding = self._session.io_binding()
        try:
            for name, array in inputs.items():
                binding.bind_cpu_input(name, np.ascontiguousarray(array))
            for name, array in outputs.items():
                binding.bind_output(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
            self._session.run_with_iobinding(binding, self._quiet)
        except Exception as exc:
            if "output OrtValue provided" in str(exc) or "bind_output" in str(exc):
                raise OutputsMismatch(str(exc).splitlines()[0][:300]) from exc
            raise _translated(exc) from exc
        return dict(outputs)

    def close(self) -> None:
        if self._session is not None:
            self._session = None
            self._on_close()


def direct_run(session: Any, providers: list[str]) -> bool:
    """Whether a context may call the session's binding (`session._sess.run`) instead of
    `InferenceSession.run`: on the CPU provider alone, where none of what the wrapper adds
    applies (a CUDA graph's checks, a failed provider's retry on the next one). The wrapper's
    own check, that every input is fed, the daemon makes before a request reaches a context
    (a missing input is a 400 there). It is on the path that caps the daemon's QPS at high
    concurrency; what it is worth: docs/performance.md, "onnxruntime's run options made once"."""
    binding = getattr(session, "_sess", None)
    return providers == ["CPUExecutionProvider"] and callable(getattr(binding, "run", None))


def _translated(exc: Exception) -> BackendError:
    """onnxruntime's own exception types as ours: bad input (400) or a backend failure (500)."""
    text = str(exc)
    if "INVALID_ARGUMENT" in text or "Invalid rank" in text or "Got invalid dimensions" in text:
        return InputRejected(text.splitlines()[0][:500])
    return BackendError(f"onnxruntime failed: {text[:500]}")


class OnnxRuntimeEngine:
    """An ONNX model file: one session shared by every context, or one per context."""

    def __init__(self, path: Path, options: Mapping[str, Any]) -> None:
        # onnxruntime ships neither stubs nor py.typed: its calls are checked by the tests.
        import onnxruntime as ort  # type: ignore[import-untyped]

        self._ort = ort
        self.path = path
        self._threads = int(options.get("intra_op_num_threads", 1))
        self._spinning = options.get("allow_spinning", True)
        if not isinstance(self._spinning, bool):
            raise BackendError(f"`allow_spinning` is true or false, got {self._spinning!r}")
        # onnxruntime's CPU arena keeps its high-water mark for the session's life: where a client can
        # make outputs huge (a model that tiles its input), `cpu_arena = false` gives them back.
        self._arena = options.get("cpu_arena", True)
        if not isinstance(self._arena, bool):
            raise BackendError(f"`cpu_arena` is true or false, got {self._arena!r}")
        self._providers = select_providers(options.get("providers") or ["CPUExecutionProvider"],
                                           ort.get_available_providers())
        self._bytes = path.stat().st_size
        first = self._new_session()  # validates the file once, at load
        self.providers: list[str] = first.get_providers()  # what onnxruntime actually uses
        self.shared = options.get("share_session", self.providers == ["CPUExecutionProvider"])
        if not isinstance(self.shared, bool):
            raise BackendError(f"`share_session` is true or false, got {self.shared!r}")
        self.inputs = [_spec(i) for i in first.get_inputs()]
        self.outputs = [_spec(o) for o in first.get_outputs()]
        self._session: Any = first  # the shared session, or the spare for the first context
        self._lock = threading.Lock()
        self._live = 0  # contexts made and not closed
        self._sessions = 1  # sessions held: one shared, or one per live context (the first kept)

    def _new_session(self) -> Any:
        opts = self._ort.SessionOptions()
        opts.intra_op_num_threads = self._threads
        opts.inter_op_num_threads = 1
        opts.enable_cpu_mem_arena = self._arena
        if not self._spinning:  # idle pool threads sleep instead of spinning on a core others need
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        try:
            return self._ort.InferenceSession(os.fspath(self.path), opts, providers=self._providers)
        except Exception as exc:
            raise BackendError(f"onnxruntime cannot load {self.path}: {str(exc)[:500]}") from exc

    def create_context(self) -> OnnxRuntimeContext:
        with self._lock:
            if self.shared:
                session = self._session
            else:
                session, self._session = (self._session or self._new_session()), None
                self._sessions = max(1, self._live + 1)
            self._live += 1
        # A mismatch in infer_into is the caller's to handle (it falls back to `infer`):
        # onnxruntime need not also print it to stderr.
        quiet = self._ort.RunOptions()
        quiet.log_severity_level = 4
        return OnnxRuntimeContext(session, [o.name for o in self.outputs], self._ort.RunOptions(), quiet,
                                  self._closed, direct_run(session, self.providers))

    def _closed(self) -> None:
        with self._lock:
            self._live -= 1
            if not self.shared:
                self._sessions = max(1, self._live)

    def context_bytes(self) -> int:
        """What one context adds when the weights are shared: its inputs and outputs at one row
        (dynamic dimensions counted as 1). Intermediate tensors are not known before a run;
        for the small models served on the CPU they are of the same order."""
        return sum(_tensor_bytes(spec) for spec in (*self.inputs, *self.outputs))

    def memory_bytes(self) -> int:
        """The weights (the model file's size) once per session held, plus each live context's
        activations: so a shared session counts its weights once, however many contexts."""
        with self._lock:
            return self._bytes * self._sessions + self.context_bytes() * self._live

    def close(self) -> None:
        self._session = None


def _tensor_bytes(spec: TensorSpec) -> int:
    count = 1
    for dim in spec.shape:
        count *= max(1, dim)
    return count * np.dtype(spec.dtype).itemsize


class OnnxRuntimeBackend:
    """Loads `.onnx` files."""

    name = "onnxruntime"
    suffixes = (".onnx",)

    def load(self, path: Path, options: Mapping[str, Any]) -> OnnxRuntimeEngine:
        return OnnxRuntimeEngine(path, options)
