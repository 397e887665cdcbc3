"""Rebuilding a TensorRT plan that no longer loads, from the ONNX model beside it.

A JetPack or TensorRT upgrade invalidates every plan. When a plan fails to
deserialize and its ONNX source is known (`model.onnx` beside the plan, or
the model's `onnx` option, relative to the plan's folder), the backend builds
a new plan in the background with the settings the old one was built with
(`model.plan.build.json`, written by `infermux build`; its defaults without
one) and a persistent timing cache (the stored one, else `model.plan.timing`
beside the plan), on the model's own GPU (`device`), in a child process
(tensorrt_build_process.py: TensorRT's logging, memory and crashes stay out
of the daemon), and meanwhile:

- serves the ONNX model through onnxruntime where it is installed
  (`RebuildingEngine`), switching every context to the new plan atomically
  once it is built and loaded: each context moves on its next request, on
  its own executor thread, and a request in flight finishes where it began;
- else keeps the load waiting until the plan is built, so the version stays
  `loading` and requests get 503 with a time to retry.

One build runs per plan path, however often the load is retried.
docs/tensorrt.md#rebuilding-after-an-upgrade.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence, TypeVar

import numpy as np

from infermux.plugins import backends
from infermux.plugins.backends import tensorrt_build as build
from infermux.plugins.backends.tensorrt_build_process import build_isolated
from infermux.plugins.base import BackendError, Context, Engine, TensorSpec

log = logging.getLogger("infermux.tensorrt")

# progress(kind, reason): kind is "rebuilding", "progress", "rebuilt" or "rebuild_failed".
Progress = Callable[[str, str], None]


class _Serves(Protocol):
    """What a RebuildingEngine needs of the engine it serves through (onnxruntime's, then the plan's)."""

    def create_context(self) -> Context: ...
    def memory_bytes(self) -> int: ...
    def close(self) -> None: ...


Plan = TypeVar("Plan", bound=_Serves)


def source_for(plan: Path, options: Mapping[str, Any]) -> Path | None:
    """The ONNX model `plan` can be rebuilt from, or None."""
    named = options.get("onnx")
    candidates = [plan.parent / str(named)] if named else [plan.with_name("model.onnx"), plan.with_suffix(".onnx")]
    return next((path for path in candidates if path.is_file()), None)


class Rebuild:
    """One background build of `plan` from `onnx` on CUDA device `device`; `done` is set when it
    ended (see `error`)."""

    def __init__(self, plan: Path, onnx: Path, device: int = 0) -> None:
        self.plan, self.onnx = plan, onnx
        settings = build.stored_settings(plan)
        if not settings.get("timing_cache"):  # the cache persists beside the plan for the next upgrade
            settings = {**settings, "timing_cache": str(plan.with_name(plan.name + ".timing"))}
        self.options = dataclasses.replace(build.BuildOptions.from_settings(onnx, plan, settings), device=device)
        self.started = time.monotonic()
        self.seconds = 0.0
        self.error = ""
        self.done = threading.Event()
        self._listeners: list[Progress] = []
        self._lock = threading.Lock()
        self._announce = ("rebuilding", f"rebuilding {plan.name} from {onnx.name} with TensorRT")
        self._last = self._announce
        self._thread = threading.Thread(target=self._run, name=f"rebuild-{plan.parent.name}", daemon=True)

    def start(self) -> "Rebuild":
        self._thread.start()
        return self

    def watch(self, listener: Progress) -> None:
        """Call `listener` on every change from now on, and at once with the start and the latest one."""
        with self._lock:
            self._listeners.append(listener)
            replay = [self._announce] + ([self._last] if self._last != self._announce else [])
        for kind, reason in replay:
            listener(kind, reason)

    def _say(self, kind: str, reason: str) -> None:
        with self._lock:
            self._last = (kind, reason)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(kind, reason)
            except Exception:  # a listener's failure must not end the build
                log.exception("rebuild progress listener")

    def _phase(self, phase: str) -> None:
        self._say("progress", f"rebuilding {self.plan.name} from {self.onnx.name}: {phase}, "
                              f"{time.monotonic() - self.started:.0f} s")

    def progress(self) -> str:
        """What the build is doing, for status lines and errors."""
        return self._last[1]

    def _run(self) -> None:
        log.warning("rebuilding %s from %s on GPU %d in a child process (stored settings: %s)", self.plan,
                    self.onnx, self.options.device, self.options.settings())
        try:
            build_isolated(self.options, self._phase)
        except Exception as exc:  # BuildError, or anything else: reported, never raised
            self.error = f"rebuilding {self.plan} from {self.onnx} failed: {exc}"
            log.error("%s", self.error)
            self._say("rebuild_failed", self.error)
        else:
            _refresh_checksum(self.plan)
            self.seconds = time.monotonic() - self.started
            log.warning("rebuilt %s in %.1f s", self.plan, self.seconds)
            self._say("rebuilt", f"rebuilt {self.plan.name} from {self.onnx.name} in {self.seconds:.1f} s")
        finally:
            self.done.set()


def _refresh_checksum(plan: Path) -> None:
    """Rewrite `model.plan.sha256` for the rebuilt plan where one was kept beside the old plan
    (docs/hot-swap.md): a stale one would make the engine watcher, and the next start, refuse it."""
    checksum = plan.with_name(plan.name + ".sha256")
    if not checksum.exists():
        return
    digest = hashlib.sha256(plan.read_bytes()).hexdigest()
    tmp = checksum.with_name(f".{checksum.name}.partial")
    tmp.write_text(f"{digest}  {plan.name}\n")
    os.replace(tmp, checksum)


_lock = threading.Lock()
_rebuilds: dict[Path, Rebuild] = {}


def rebuild(plan: Path, onnx: Path, device: int = 0) -> Rebuild:
    """The build of `plan` (on `device`) under way, or a new one started (after the last one ended)."""
    key = plan.resolve()
    with _lock:
        current = _rebuilds.get(key)
        if current is None or current.done.is_set():
            current = _rebuilds[key] = Rebuild(plan, onnx, device).start()
        return current


def _bounded(specs: Sequence[TensorSpec], opts: build.BuildOptions) -> list[TensorSpec]:
    """onnxruntime's specs with the batch range the plan will have: the same requests are refused
    (400) and batched (at most max rows) before and after the switch."""
    low, _, high = opts.batch_range()
    out = []
    for spec in specs:
        rest = spec.shape[1:]
        if spec.shape and spec.shape[0] == -1 and all(d >= 0 for d in rest):
            spec = TensorSpec(spec.name, spec.dtype, spec.shape, (low, *rest), (high, *rest))
        out.append(spec)
    return out


class _SwitchingContext:
    """A context of whichever engine serves now; moves to the rebuilt plan on its next request."""

    def __init__(self, owner: "RebuildingEngine") -> None:
        self._owner = owner
        self._generation = -1
        self._inner: Context | None = None
        self._follow()

    def _follow(self) -> Context:
        generation, engine = self._owner.serving()
        if generation != self._generation or self._inner is None:
            old, self._inner = self._inner, engine.create_context()  # on this thread: executors own contexts
            self._generation = generation
            if old is not None:
                old.close()
        return self._inner

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on the engine serving now (the rebuilt plan once it is in)."""
        return self._follow().infer(inputs)

    def close(self) -> None:
        """Close the inner context."""
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.close()


class RebuildingEngine:
    """The ONNX model through onnxruntime while the plan rebuilds, then the new plan (base.Engine).

    `watch(progress)` reports the build's progress (the registry turns it into events and the
    version's status reason); `rebuild.done` is set once the build ended.
    """

    def __init__(self, plan: Path, options: Mapping[str, Any], stand_in: Engine, job: Rebuild,
                 load_plan: Callable[[Path, Mapping[str, Any]], _Serves]) -> None:
        self.path, self.rebuild = plan, job
        self.device = int(options.get("device", 0))  # base.OnDevice: the plan's device
        self._options, self._load_plan = dict(options), load_plan
        self.inputs = _bounded(stand_in.inputs, job.options)
        self.outputs = list(stand_in.outputs)
        self._serving: tuple[int, _Serves] = (0, stand_in)  # replaced in one assignment
        self._closed = False
        self.switched = threading.Event()
        job.watch(self._on_progress)

    def serving(self) -> tuple[int, _Serves]:
        """(generation, engine) serving now."""
        return self._serving

    def _on_progress(self, kind: str, reason: str) -> None:
        if kind == "rebuilt" and not self._closed:
            try:
                engine = self._load_plan(self.path, self._options)
            except BackendError as exc:
                log.error("the rebuilt %s does not load either: %s (onnxruntime keeps serving)", self.path, exc)
                return
            old = self._serving[1]
            self._serving = (1, engine)
            self.switched.set()
            old.close()  # its contexts close as each executor moves on

    def watch(self, progress: Progress) -> None:
        """Report the build's progress to `progress` (at once with the latest state)."""
        self.rebuild.watch(progress)

    def create_context(self) -> _SwitchingContext:
        return _SwitchingContext(self)

    def memory_bytes(self) -> int:
        return self._serving[1].memory_bytes()

    def close(self) -> None:
        """Close the engine serving now; a build still under way finishes and writes its plan."""
        self._closed = True
        self._serving[1].close()


def serve_while_rebuilding(plan: Path, options: Mapping[str, Any], rejected: BackendError,
                           load_plan: Callable[[Path, Mapping[str, Any]], Plan]) -> "Plan | RebuildingEngine":
    """What to serve when `plan` did not deserialize: a RebuildingEngine, or the rebuilt plan once
    built (no onnxruntime), or `rejected` again where there is no ONNX source or the build failed."""
    onnx = source_for(plan, options)
    if onnx is None:
        raise rejected
    try:
        job = rebuild(plan, onnx, int(options.get("device", 0)))
    except build.BuildError as exc:  # the stored settings are broken
        raise BackendError(f"{rejected}; it cannot be rebuilt from {onnx}: {exc}") from rejected
    try:
        stand_in = backends.get("onnxruntime").load(onnx, options)
    except (BackendError, ImportError) as exc:  # onnxruntime is imported at the load
        log.warning("onnxruntime cannot serve %s while %s rebuilds (%s): the model waits for the build",
                    onnx, plan, exc)
        job.done.wait()
        if job.error:
            raise BackendError(f"{rejected}; {job.error}") from rejected
        return load_plan(plan, options)
    return RebuildingEngine(plan, options, stand_in, job, load_plan)
