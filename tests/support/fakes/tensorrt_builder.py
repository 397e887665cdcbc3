"""The stand-in's builder: ONNX parser, builder config, timing cache and builder (tests/support/fakes/tensorrt.py).

It records what `infermux build` asks for. The parser "reads" a model whose inputs are
`trt.onnx_inputs` and whose layers are `trt.onnx_layers`; a file that starts with b"BAD" fails to
parse; `trt.fail_build = True` makes the build return None; `trt.build_gate` (an Event) holds builds
until it is set. Where the builder runs in a child process, a state folder drives it instead
(tensorrt.BuildChild). Modelled as the real bindings behave:

- a serialized timing cache has a header: `create_timing_cache` gives None for a blob it cannot read
  (another TensorRT version's, or a corrupt one), since the binding hands back createTimingCache's
  pointer (pyCore.cpp (v10.3.0) 239-242), and `set_timing_cache(None, ...)` is a TypeError: pybind11
  cannot bind None to its `ITimingCache const&` (NvInfer.h 9286) and finds no other overload. A cache
  whose body starts with b"OTHERGPU" was made on another device: refused unless ignore_mismatch
  (NvInfer.h 9268-9286).
- DLA: a layer runs on the DLA only with FP16 or INT8 and static shapes ("DLA does not support dynamic
  dimensions, so the profile's min, max, and opt values must be equal": TensorRT's DLA restrictions).
  With DLA as the default device, a layer it cannot run fails the build, or goes to the GPU with
  GPU_FALLBACK; a plan with no layer on the DLA is an ordinary GPU plan. `trt.not_on_dla` names layers
  the DLA cannot run at all.
- a builder builds for the CUDA device current when it was made; VERSION_COMPATIBLE gives a plan
  that embeds its lean runtime (VC_PLAN_MAGIC), which a runtime loads only with host code allowed.
"""

from __future__ import annotations

import enum
import json
import os
import signal
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from support.fakes.tensorrt import DLA_MARK, PLAN_MAGIC, VC_PLAN_MAGIC, Dims, FakeCudart

TIMING_MAGIC = b"FAKETC1:"  # the header of a timing cache this stand-in serialized


def add_fake_builder(trt: ModuleType, gpu: FakeCudart) -> None:
    """Add Builder, OnnxParser and the builder config to the fake `trt` module."""
    trt.BuilderFlag = enum.Enum("BuilderFlag", "FP16 INT8 TF32 GPU_FALLBACK VERSION_COMPATIBLE")
    trt.MemoryPoolType = enum.Enum("MemoryPoolType", "WORKSPACE")
    trt.onnx_inputs, trt.fail_build, trt.configs = [("x", (-1, 4))], False, []
    trt.onnx_layers = ["reduce_sum", "argmax"]
    trt.not_on_dla: set[str] = set()  # layers the DLA cannot run, whatever the shapes
    trt.build_gate = None          # a threading.Event: builds wait for it
    trt.timing_caches_seen = []    # the timing cache each build started from (its body)
    trt.builds = []                # what each build was asked (the records BuildChild reads)
    trt.verbose_per_build = 50     # VERBOSE messages each build logs, from a builder thread
    trt.state_dir = None           # a BuildChild's folder (set by tensorrt.install)

    class Base:  # IProgressMonitor and IInt8EntropyCalibrator2: subclassed by the code under test
        def __init__(self) -> None:
            pass

    trt.IProgressMonitor, trt.IInt8EntropyCalibrator2 = type("IProgressMonitor", (Base,), {}), \
        type("IInt8EntropyCalibrator2", (Base,), {})

    class Layer:
        def __init__(self, name: str) -> None:
            self.name = name

    class Network:
        def __init__(self) -> None:
            self.inputs: list[Any] = []
            self.layers: list[Layer] = []

        num_inputs = property(lambda self: len(self.inputs))
        num_layers = property(lambda self: len(self.layers))

        def get_input(self, index: int) -> Any:
            return self.inputs[index]

        def get_layer(self, index: int) -> Layer:
            return self.layers[index]

    class OnnxParser:
        def __init__(self, network: Network, logger: Any) -> None:
            self.network, self.num_errors = network, 0

        def parse_from_file(self, path: str) -> bool:
            if Path(path).read_bytes().startswith(b"BAD"):
                self.num_errors = 1
                return False
            self.network.inputs = [type("ITensor", (), {"name": n, "shape": Dims(s)})() for n, s in trt.onnx_inputs]
            self.network.layers = [Layer(name) for name in trt.onnx_layers]
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

        def __init__(self, body: bytes) -> None:
            self.body = bytes(body)

        def serialize(self) -> bytes:
            return TIMING_MAGIC + self.body

    class Config:
        def __init__(self, logger: Any) -> None:
            self.logger = logger
            self.flags, self.pools, self.profiles = set(), {}, []
            self.progress_monitor = self.int8_calibrator = self.calibration_profile = None
            self.timing_cache: TimingCache | None = None
            # NvInfer.h (v10.3.0) 8965, 8985: the DLA core defaults to -1 (unset).
            self.default_device_type, self.DLA_core = trt.DeviceType.GPU, -1
            trt.configs.append(self)

        def create_timing_cache(self, serialized: bytes) -> TimingCache | None:
            data = bytes(serialized)
            if not data:  # NvInfer.h 9257: size 0 means a new cache from scratch
                return TimingCache(b"")
            if not data.startswith(TIMING_MAGIC):
                self.logger.log(trt.ILogger.Severity.ERROR, "fake: the serialized timing cache is corrupt "
                                "or from another TensorRT version")
                return None
            return TimingCache(data[len(TIMING_MAGIC):])

        def set_timing_cache(self, cache: TimingCache, ignore_mismatch: bool) -> bool:
            if not isinstance(cache, TimingCache):
                raise TypeError("set_timing_cache(): incompatible function arguments. The following argument "
                                "types are supported: (self, cache: tensorrt.ITimingCache, ignore_mismatch: "
                                f"bool) -> bool; invoked with {cache!r}")
            if cache.body.startswith(b"OTHERGPU") and not ignore_mismatch:
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

        def get_device_type(self, layer: Layer) -> Any:
            return self.default_device_type

        def can_run_on_DLA(self, layer: Layer) -> bool:
            precise = {trt.BuilderFlag.FP16, trt.BuilderFlag.INT8} & self.flags
            static = all(low == high for p in self.profiles for low, _, high in p.shapes.values())
            return bool(precise) and static and layer.name not in trt.not_on_dla

    class Builder:
        def __init__(self, logger: Any) -> None:
            self.logger = logger
            self.device = gpu.current()  # a builder builds for the device current when it was made

        num_DLA_cores = property(lambda self: trt.dla_cores)

        def create_network(self, flags: int) -> Network:
            return Network()

        def create_builder_config(self) -> Config:
            return Config(self.logger)

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network: Network, config: Config) -> bytes | None:
            _wait_at_gate(trt)
            narrator = threading.Thread(target=self._narrate)  # TensorRT logs from its own threads
            narrator.start()
            narrator.join()
            if config.timing_cache is not None:  # every build times a tactic more
                trt.timing_caches_seen.append(config.timing_cache.body)
            dla = [layer.name for layer in network.layers
                   if config.get_device_type(layer) == trt.DeviceType.DLA and config.can_run_on_DLA(layer)]
            self._record(config, dla)
            if trt.fail_build or _flag(trt, "fail"):
                self.logger.log(trt.ILogger.Severity.ERROR, "fake: no implementation for layer conv1")
                return None
            if config.default_device_type == trt.DeviceType.DLA and trt.BuilderFlag.GPU_FALLBACK not in config.flags:
                for layer in network.layers:
                    if layer.name not in dla:
                        self.logger.log(trt.ILogger.Severity.ERROR, f"fake: Default DLA is enabled but layer "
                                        f"{layer.name} is not supported on DLA, falling back to GPU is not enabled.")
                        return None
            if config.timing_cache is not None:
                config.timing_cache.body += b"t"
            monitor = config.progress_monitor
            if monitor is not None:
                monitor.phase_start("Building engine", None, 2)
                assert monitor.step_complete("Building engine", 0) is True
                monitor.phase_finish("Building engine")
            magic = VC_PLAN_MAGIC if trt.BuilderFlag.VERSION_COMPATIBLE in config.flags else PLAN_MAGIC
            return magic + (DLA_MARK + bytes(100 - len(DLA_MARK)) if dla else bytes(100))

        def _narrate(self) -> None:
            for i in range(trt.verbose_per_build):
                self.logger.log(trt.ILogger.Severity.VERBOSE, f"fake: timing tactic {i}")

        def _record(self, config: Config, dla: list[str]) -> None:
            record = {"pid": os.getpid(), "device": gpu.current(), "builder_device": self.device,
                      "flags": sorted(flag.name for flag in config.flags),
                      "profiles": [[list(s) for s in p.shapes["x"]] for p in config.profiles if "x" in p.shapes],
                      "default_device_type": config.default_device_type.name, "DLA_core": config.DLA_core,
                      "dla_layers": dla, "timing_cache": None if config.timing_cache is None
                      else config.timing_cache.body.decode("latin-1")}
            trt.builds.append(record)
            if trt.state_dir is not None:
                with open(trt.state_dir / "builds.jsonl", "a") as f:
                    f.write(json.dumps(record) + "\n")

    trt.Builder, trt.OnnxParser = Builder, OnnxParser


def _flag(trt: ModuleType, name: str) -> bool:
    return trt.state_dir is not None and (trt.state_dir / name).exists()


def _wait_at_gate(trt: ModuleType) -> None:
    """Hold the build while a test says so (a real one takes minutes); crash it if told to."""
    if trt.build_gate is not None:
        assert trt.build_gate.wait(30), "fake: build_gate never opened"
    if trt.state_dir is not None:
        (trt.state_dir / "building").touch()  # BuildChild.wait_started
        deadline = time.monotonic() + 30
        while _flag(trt, "hold") and time.monotonic() < deadline:
            time.sleep(0.02)
    if _flag(trt, "crash"):
        os.kill(os.getpid(), signal.SIGSEGV)  # as a builder crash in native code would end the process
