"""Hardware proofs of what the TensorRT backend relies on, one run.sh stage each.

    python tests/gpu/stages.py STAGE WORKDIR     STAGE: cap memory formats vcompat teardown pycuda standin
                                                        budget rebuild profiles graphs dla zerocopy

Each stage prints what it did, then one `FIGURE: ...` line, and exits 0 when the fix holds on
this machine and 1 when it does not (a stage asserts what it proves; the figure only reports);
it prints `SKIP: reason` and exits 0 where it cannot run (no GPU, no TensorRT, one GPU only). The GIL probe (item 2) is gil_probe.py: it needs no
TensorRT. Plans come from gpu_support.build_plan (reused from $INFERMUX_GPU_PLANS).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gpu_support import BATCH, CLASSIFIER_ONNX, build_plan, gpu_missing, images

from infermux.config import ModelConfig
from infermux.plugins import backends
from infermux.plugins.backends import cuda, tensorrt_build, tensorrt_graphs, trtlib
from infermux.plugins.base import BackendError
from infermux.protocol import Request
from infermux.execution.executor import Executor, Queued
from infermux.execution.job import Job
from infermux.execution.hooks import FrontendHooks
from infermux.execution.scheduler import Scheduler
from infermux.execution.stats import ModelStats

MiB = 1 << 20
INPUT, OUTPUT = "images", "probs"  # the classifier's tensors (the stand-in test swaps in its own)


class Skip(Exception):
    """The stage cannot run here; the message says why."""


def _trt() -> Any:
    reason = gpu_missing()
    if reason:
        raise Skip(reason)
    try:
        import tensorrt
    except ImportError as exc:
        raise Skip(f"TensorRT is not installed for this Python ({exc})") from exc
    return tensorrt


def _load(plan: Path, **options: Any) -> Any:
    return backends.for_path(plan).load(plan, options)


def stage_cap(work: Path) -> int:
    """Item 1: max_batch 16 on an engine whose profile stops at 8 rows; two 5-row requests both served."""
    _trt()
    engine = _load(build_plan(work / "cap" / "model.plan"))
    try:
        scheduler = Scheduler(ModelConfig("classifier", engine.path, max_batch=16), engine, ModelStats("classifier", "1"),
                              FrontendHooks(lambda e, f, outcome=None: None, lambda job: None), "least_loaded")
        scheduler.stop(30)
        replies: list[dict] = []
        executor = Executor("classifier", "1", 0, engine.create_context(),
                            lambda envelope, frames, outcome=None: replies.append(json.loads(frames[0])), lambda job: None,
                            scheduler.policy)
        now = time.perf_counter_ns()
        for k in range(2):
            executor.queue.put(Job([b"c%d" % k], Request("classifier", {INPUT: images(5, k)}), [], now,
                                   now + 60 * 10**9))
        executor.row_us = 1.0  # Queued work runs only once a row time is known
        executor.compute(Queued(lambda batch_us, requests: True))
    finally:
        engine.close()
    statuses = [r["status"] for r in replies]
    print(f"FIGURE: max_batch 16 capped at {scheduler.policy.max_batch} (profile max {BATCH[2]}); "
          f"two 5-row requests answered {statuses}")
    return 0 if scheduler.policy.max_batch == BATCH[2] and statuses == [200, 200] else 1


def stage_memory(work: Path) -> int:
    """Item 4: the figure charged for a model on the last GPU, against what cudaMemGetInfo measured there."""
    _trt()
    device = cuda.device_count() - 1
    plan = build_plan(work / "memory" / "model.plan")
    engine = _load(plan, device=device)
    try:
        estimate = plan.stat().st_size + engine.context_bytes()
        measured, charged = engine.measured_load_bytes, engine.memory_bytes()
        engine.create_context(), engine.create_context()  # the first reuses the load's context
        two = engine.memory_bytes()
    finally:
        engine.close()
    integrated = engine.integrated
    print(f"FIGURE: GPU {device}{' (integrated)' if integrated else ''}: estimate {estimate / MiB:.1f} MiB, "
          f"measured {measured / MiB:.1f} MiB, charged {charged / MiB:.1f} MiB, with 2 contexts {two / MiB:.1f} MiB")
    want = estimate if integrated else max(estimate, measured)
    return 0 if engine.device == device and charged == want and two > charged else 1


def _build(trt: Any, out: Path, tweak: Callable[[Any, Any, Any], None]) -> Path | None:
    """The classifier built with TensorRT's API directly, `tweak(trt, network, config)` applied; None if refused."""
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(CLASSIFIER_ONNX)):
        raise RuntimeError(f"cannot parse {CLASSIFIER_ONNX}: {parser.get_error(0)}")
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    name = network.get_input(0).name
    profile.set_shape(name, *[(b, 3, 64, 64) for b in BATCH])
    config.add_optimization_profile(profile)
    tweak(trt, network, config)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(bytes(plan))
    return out


def _io_format(fmt: str, half: bool) -> Callable[[Any, Any, Any], None]:
    def tweak(trt: Any, network: Any, config: Any) -> None:
        tensor = network.get_input(0)
        if half:
            tensor.dtype = trt.float16
            if hasattr(trt.BuilderFlag, "FP16"):
                config.set_flag(trt.BuilderFlag.FP16)
        tensor.allowed_formats = 1 << int(getattr(trt.TensorFormat, fmt))
    return tweak


def stage_formats(work: Path) -> int:
    """Item 5: an engine whose input is bound vectorized (--inputIOFormats) is refused at load, clearly."""
    trt = _trt()
    for fmt, half in (("HWC8", True), ("CHW32", False), ("CHW4", True), ("HWC", False)):
        try:
            plan = _build(trt, work / "formats" / f"{fmt}.plan", _io_format(fmt, half))
        except (AttributeError, TypeError, RuntimeError) as exc:
            print(f"{fmt}: cannot build ({exc})")
            continue
        if plan is None:
            print(f"{fmt}: TensorRT would not build the input in this format")
            continue
        try:
            _load(plan).close()
        except BackendError as exc:
            print(f"FIGURE: {fmt} input refused at load: {str(exc)[:110]}")
            return 0 if "only LINEAR" in str(exc) else 1
        print(f"FIGURE: {fmt} input LOADED: its buffers would be sized for a dense layout")
        return 1
    raise Skip("this TensorRT built none of HWC8, CHW32, CHW4, HWC for the classifier's input")


def stage_vcompat(work: Path) -> int:
    """Item 6: a version-compatible plan loads (engine_host_code_allowed) and matches onnxruntime, and a
    runtime without engine_host_code_allowed refuses it (the reason the backend sets it)."""
    trt = _trt()
    if not hasattr(trt.BuilderFlag, "VERSION_COMPATIBLE"):
        raise Skip(f"TensorRT {trt.__version__} has no BuilderFlag.VERSION_COMPATIBLE")
    plan = _build(trt, work / "vcompat" / "model.plan",
                  lambda trt, network, config: config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE))
    if plan is None:
        raise Skip("TensorRT would not build the classifier version-compatible")
    strict = trt.Runtime(trt.Logger(trt.Logger.INTERNAL_ERROR))  # engine_host_code_allowed left False
    refused = strict.deserialize_cuda_engine(plan.read_bytes()) is None
    engine = _load(plan)
    try:
        x = images(4, seed=3)
        probs = engine.create_context().infer({INPUT: x})[OUTPUT]
    finally:
        engine.close()
    diff = _diff_from_onnxruntime(x, probs)
    print(f"FIGURE: version-compatible plan served (max |diff| vs onnxruntime {diff}); "
          f"a runtime without engine_host_code_allowed {'refuses' if refused else 'ALSO LOADS'} it")
    return 0 if refused and (diff == "n/a" or float(diff) < 1e-2) else 1


def _diff_from_onnxruntime(x: np.ndarray, probs: np.ndarray) -> str:
    try:
        import onnxruntime as ort
    except ImportError:
        return "n/a"
    session = ort.InferenceSession(str(CLASSIFIER_ONNX), providers=["CPUExecutionProvider"])
    return f"{float(np.abs(session.run(['probs'], {'images': x})[0] - probs).max()):.1e}"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.levels: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("TensorRT: "):  # TensorRT's own, not the backend's
            self.levels.append(record.levelno)


def stage_teardown(work: Path) -> int:
    """Item 7 on the last GPU: no DeprecationWarning for stream handles, no INFO/VERBOSE TensorRT
    record at the daemon's default level, the first max batch warm, and (with 2+ GPUs) GPU 0 untouched."""
    _trt()
    device = cuda.device_count() - 1
    cuda.set_device(device)
    plan = build_plan(work / "teardown" / "model.plan")
    records = _Records()
    tensorrt_log = logging.getLogger("infermux.tensorrt")
    tensorrt_log.addHandler(records)
    level = tensorrt_log.level
    try:
        first, steady = _warm_and_release(plan, device, tensorrt_log)
    finally:
        tensorrt_log.removeHandler(records)
        tensorrt_log.setLevel(level)
    quiet = sum(lv < logging.WARNING for lv in records.levels)
    on_gpu0 = _pid_on_gpu0() if device > 0 else None
    print(f"FIGURE: first max batch {first:.1f} ms, steady {steady:.1f} ms; {quiet} INFO/VERBOSE records; "
          f"GPU 0 {'not applicable (one GPU)' if on_gpu0 is None else ('TOUCHED' if on_gpu0 else 'untouched')}")
    return 0 if quiet == 0 and not on_gpu0 else 1


def _warm_and_release(plan: Path, device: int, tensorrt_log: logging.Logger) -> tuple[float, float]:
    """Load on `device`, time the first and steady max batches, close from another thread."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # int(cudaStream_t) would raise here
        trtlib.shared()  # created at the default level: the severity filter is WARNING
        tensorrt_log.setLevel(logging.DEBUG)  # whatever gets past the filter is now recorded
        engine = _load(plan, device=device)
        first, steady = _first_and_steady(engine.create_context())
        closer = threading.Thread(target=engine.close)  # as the unloader does: GPU 0 is current there
        closer.start()
        closer.join(60)
    return first, steady


def _first_and_steady(ctx: Any) -> tuple[float, float]:
    """ms of the first max-batch request after load, and the median of the next 20."""
    x = images(BATCH[2])
    times = []
    for _ in range(21):
        start = time.perf_counter()
        ctx.infer({INPUT: x})
        times.append((time.perf_counter() - start) * 1000)
    return times[0], statistics.median(times[1:])


def _pid_on_gpu0() -> bool:
    """Whether NVML lists this process on GPU 0 (run.sh sets CUDA_DEVICE_ORDER=PCI_BUS_ID to match)."""
    from infermux.models.budget import Nvml

    nvml = Nvml.open()
    if nvml is None:
        raise Skip("NVML is not readable here: cannot tell whether GPU 0 was touched")
    return os.getpid() in nvml.used_by()


def stage_budget(work: Path) -> int:
    """Per-GPU budget: NVML is read for every GPU CUDA sees, each total matching cudaMemGetInfo's there."""
    from infermux.models.budget import MemoryBudget

    reason = gpu_missing()
    if reason:
        raise Skip(reason)
    if cuda.is_integrated(0):
        raise Skip("integrated GPU (Jetson): the budget is the system's memory, one for all models")
    budget = MemoryBudget("80%", "run.sh")
    totals = []
    for device in range(cuda.device_count()):
        cuda.set_device(device)
        totals.append(cuda.mem_info().total)
    print(f"NVML totals {[t // MiB for t in budget.totals]} MiB, CUDA totals {[t // MiB for t in totals]} MiB")
    match = len(budget.totals) == len(totals) and all(0.9 * n <= c <= n for n, c in zip(budget.totals, totals))
    print(f"FIGURE: {len(budget.gpus)} GPU(s) in the budget for {len(totals)} CUDA device(s), limits "
          f"{[lim // MiB for lim in budget.limits]} MiB, totals {'match' if match else 'DIFFER'}")
    return 0 if match else 1


def stage_rebuild(work: Path) -> int:
    """Item 9: a plan TensorRT refuses is rebuilt from model.onnx with the stored settings while
    onnxruntime serves; then again from the timing cache the first rebuild left."""
    from infermux.plugins.backends import tensorrt_build, tensorrt_rebuild

    _trt()
    folder = work / "rebuild" / "1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(CLASSIFIER_ONNX.read_bytes())
    plan = folder / "model.plan"
    tensorrt_build.settings_path(plan).write_text(json.dumps({"min_batch": BATCH[0], "opt_batch": BATCH[1],
                                                     "max_batch": BATCH[2]}))
    seconds, served = [], []
    for attempt in range(2):  # the second starts from the timing cache the first wrote
        plan.write_bytes(b"a plan from another TensorRT version" + bytes(4096))
        start = time.monotonic()
        engine = _load(plan)
        try:
            ctx = engine.create_context()
            served.append(type(engine).__name__)
            x = images(4, seed=attempt)
            ctx.infer({INPUT: x})
            if isinstance(engine, tensorrt_rebuild.RebuildingEngine):
                if not engine.switched.wait(600):
                    print(f"FIGURE: rebuild {attempt + 1} did not finish: {engine.rebuild.progress()}")
                    return 1
            seconds.append(time.monotonic() - start)
            diff = _diff_from_onnxruntime(x, ctx.infer({INPUT: x})[OUTPUT])
            ctx.close()
        finally:
            engine.close()
        tensorrt_rebuild._rebuilds.clear()
    timing = folder / "model.plan.timing"
    print(f"FIGURE: rebuilt in {seconds[0]:.1f} s, again from the timing cache ({timing.stat().st_size // 1024} KiB) "
          f"in {seconds[1]:.1f} s; meanwhile {served[0]}; max |diff| vs onnxruntime {diff}")
    return 0 if diff == "n/a" or float(diff) < 1e-2 else 1


def stage_profiles(work: Path) -> int:
    """Item 12: an engine built with two profiles (1..4 and 5..16 rows) serves 2 and 12 rows each on
    its own profile, matches onnxruntime, and two contexts run the same profile at once."""
    _trt()
    plan = build_plan(work / "profiles" / "model.plan", "--profile", "1:2:4", "--profile", "5:8:16")
    engine = _load(plan)
    try:
        [spec] = engine.inputs
        contexts = [engine.create_context(), engine.create_context()]
        diffs, ms = [], {}
        for rows in (2, 12):
            x = images(rows, seed=rows)
            start = time.perf_counter()
            diffs.append(_diff_from_onnxruntime(x, contexts[0].infer({INPUT: x})[OUTPUT]))
            ms[rows] = (time.perf_counter() - start) * 1000
        errors: list[BaseException] = []

        def hammer(ctx: Any) -> None:
            try:
                for _ in range(20):
                    ctx.infer({INPUT: images(12)})
            except BaseException as exc:  # reported below: the stage fails on it
                errors.append(exc)
        threads = [threading.Thread(target=hammer, args=(c,)) for c in contexts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        engine.close()
    print(f"FIGURE: range {list(spec.min_shape or ())}..{list(spec.max_shape or ())}; 2 rows {ms[2]:.1f} ms, "
          f"12 rows {ms[12]:.1f} ms; max |diff| vs onnxruntime {diffs}; two contexts on one profile: "
          f"{'ok' if not errors else errors[0]}")
    close = all(d == "n/a" or float(d) < 1e-2 for d in diffs)
    return 0 if close and not errors and spec.max_shape and spec.max_shape[0] == 16 else 1


def stage_graphs(work: Path) -> int:
    """Item 11: a batch-1 fixed-shape profile served with and without cuda_graph = true: a graph is
    captured (after an identical set_input_shape per request) and gives the same outputs; a capture
    made to fail (cudaStreamQuery on the capturing stream invalidates it) falls back to plain
    execution, with the CUDA error cleared as trtexec does, and without clearing (which settles
    whether the clearing is needed). The latency saving is the figure; no threshold is asserted."""
    _trt()
    plan = build_plan(work / "graphs" / "model.plan", "--profile", "1:1:1")
    x = images(1, seed=11)
    medians, outputs = {}, {}
    for graphs in (False, True):
        engine = _load(plan, cuda_graph=graphs)
        try:
            ctx = engine.create_context()
            times = []
            for _ in range(200):
                start = time.perf_counter()
                outputs[graphs] = ctx.infer({INPUT: x})[OUTPUT]
                times.append((time.perf_counter() - start) * 1e6)
            captured = any(lane.graph is not None for lane in ctx.lanes())
            ctx.close()
        finally:
            engine.close()
        medians[graphs] = statistics.median(times[10:])
    diff = float(np.abs(outputs[True] - outputs[False]).max())
    fallback = {clear: _invalidated_capture(plan, x, outputs[False], clear) for clear in (True, False)}
    print(f"FIGURE: batch 1 median {medians[False]:.0f} us without a graph, {medians[True]:.0f} us with "
          f"({medians[False] - medians[True]:+.0f} us saved); graph captured: {captured}; max |diff| {diff:.1e}; "
          f"invalidated capture: fallback {fallback[True]}, without clearing the error {fallback[False]}")
    return 0 if captured and diff < 1e-5 and fallback[True] == "ok" else 1


def _invalidated_capture(plan: Path, x: np.ndarray, want: np.ndarray, clear: bool) -> str:
    """Serve with cuda_graph = true while the capture is invalidated (a cudaStreamQuery of the
    capturing stream, which CUDA forbids); "ok" if the request and the next ones are right."""
    from cuda.bindings import runtime as rt

    enqueue, clear_error = tensorrt_graphs._enqueue, cuda._clear_error

    def illegal_in_capture(lane: Any, stream: Any, shared: Any) -> None:
        enqueue(lane, stream, shared)
        rt.cudaStreamQuery(stream.handle)  # returns an error, and invalidates the capture

    engine = None
    try:
        tensorrt_graphs._enqueue = illegal_in_capture
        if not clear:
            cuda._clear_error = lambda api: None
        engine = _load(plan, cuda_graph=True)  # its warm-up ran the lane once, outside any capture
        ctx = engine.create_context()
        first = float(np.abs(ctx.infer({INPUT: x})[OUTPUT] - want).max())  # captured, invalidated, run plain
        tensorrt_graphs._enqueue = enqueue
        failed = [lane for lane in ctx.lanes() if lane.graph_failed]
        worst = max([first] + [float(np.abs(ctx.infer({INPUT: x})[OUTPUT] - want).max()) for _ in range(3)])
        return "ok" if failed and worst < 1e-5 else f"WRONG (fell back: {bool(failed)}, max |diff| {worst:.1e})"
    except BackendError as exc:
        return f"FAILED ({str(exc)[:80]})"
    finally:
        tensorrt_graphs._enqueue, cuda._clear_error = enqueue, clear_error
        if engine is not None:
            engine.close()


def stage_dla(work: Path) -> int:
    """Item 10: the classifier built for each DLA core with a static batch (FP16, GPU fallback, --profile
    4:4:4) has layers on the DLA (the builder's count, asserted), loads on that core under the shared
    runtime and matches onnxruntime within FP16's tolerance; the default dynamic batch is refused."""
    trt = _trt()
    cores = int(trt.Runtime(trt.Logger(trt.Logger.ERROR)).num_DLA_cores)
    if cores == 0:
        raise Skip("this device has no DLA (Jetson Orin AGX and NX have 2; Orin Nano and dGPUs none)")
    figures, worst, placed = [], 0.0, []
    try:
        tensorrt_build.build_engine(tensorrt_build.BuildOptions(CLASSIFIER_ONNX, work / "dla" / "dynamic.plan",
                                                                fp16=True, dla_core=0, gpu_fallback=True))
        refused = False
    except tensorrt_build.BuildError as exc:
        refused = "--profile N:N:N" in str(exc)
    for core in range(cores):
        report = tensorrt_build.build_engine(tensorrt_build.BuildOptions(
            CLASSIFIER_ONNX, work / "dla" / f"core{core}.plan", fp16=True, dla_core=core, gpu_fallback=True,
            profiles=((4, 4, 4),)))
        placed.append(report.dla_layers or 0)
        engine = _load(report.output, dla_core=core)
        try:
            x = images(4, seed=core)
            start = time.perf_counter()
            probs = engine.create_context().infer({INPUT: x})[OUTPUT]
            figures.append(f"core {core}: {report.dla_layers} of {report.layers} layers on the DLA, "
                           f"{(time.perf_counter() - start) * 1000:.1f} ms")
        finally:
            engine.close()
        diff = _diff_from_onnxruntime(x, probs)
        worst = max(worst, 0.0 if diff == "n/a" else float(diff))
    print(f"FIGURE: {cores} DLA core(s): {'; '.join(figures)}; max |diff| vs onnxruntime {worst:.1e}; "
          f"dynamic batch {'refused' if refused else 'NOT REFUSED'}")
    return 0 if all(placed) and worst < 5e-2 and refused else 1


def stage_zerocopy(work: Path) -> int:
    """Item 13: on an integrated GPU the engine binds mapped pinned memory (no device buffers, no
    copies), matches onnxruntime, and is charged half the I/O memory of the copying way."""
    _trt()
    if not cuda.is_integrated(0):
        raise Skip("not an integrated GPU (Jetson): zero-copy is used only where host and GPU share DRAM")
    plan = build_plan(work / "zerocopy" / "model.plan")
    timings, charged, outputs = {}, {}, {}
    x = images(BATCH[2], seed=13)
    for zero_copy in (False, True):
        engine = _load(plan, zero_copy=zero_copy)
        try:
            ctx = engine.create_context()
            times = []
            for _ in range(50):
                start = time.perf_counter()
                outputs[zero_copy] = ctx.infer({INPUT: x})[OUTPUT]
                times.append((time.perf_counter() - start) * 1000)
            timings[zero_copy], charged[zero_copy] = statistics.median(times[5:]), engine.context_bytes()
            mapped = all(lane.mapped for lane in ctx.lanes())
            ctx.close()
        finally:
            engine.close()
    diff = _diff_from_onnxruntime(x, outputs[True])
    print(f"FIGURE: batch {BATCH[2]} median {timings[False]:.2f} ms copying, {timings[True]:.2f} ms zero-copy; "
          f"context charged {charged[False] / MiB:.2f} -> {charged[True] / MiB:.2f} MiB; mapped {mapped}; "
          f"max |diff| vs onnxruntime {diff}")
    return 0 if mapped and charged[True] < charged[False] and (diff == "n/a" or float(diff) < 1e-2) else 1


def stage_pycuda(work: Path) -> int:
    """Item 3: nothing to run: the pycuda fallback was removed."""
    raise Skip("the pycuda fallback was removed (docs/tensorrt.md#why-not-pycuda): nothing to prove on a GPU")


def stage_standin(work: Path) -> int:
    """Item 8: the stand-in is CPU-only."""
    raise Skip("the stand-in (tests/support/fakes/tensorrt.py) is CPU-only: its tests run in `pytest tests`")


STAGES = {"cap": stage_cap, "memory": stage_memory, "formats": stage_formats, "vcompat": stage_vcompat,
          "teardown": stage_teardown, "pycuda": stage_pycuda, "standin": stage_standin,
          "budget": stage_budget, "rebuild": stage_rebuild, "profiles": stage_profiles,
          "graphs": stage_graphs, "dla": stage_dla, "zerocopy": stage_zerocopy}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in STAGES:
        print(f"usage: stages.py {{{','.join(STAGES)}}} WORKDIR", file=sys.stderr)
        return 2
    try:
        return STAGES[argv[0]](Path(argv[1]))
    except Skip as why:
        print(f"SKIP: {why}")
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
