"""Does cuda-python release the GIL while it waits for the GPU? (needs no TensorRT)

    python tests/gpu/gil_probe.py [--kernel-ms 400]

A kernel that spins for about --kernel-ms (cupy's RawKernel, else torch.cuda._sleep, whichever is
installed) is queued on a stream, and one thread waits for it in cuda-python's
cudaStreamSynchronize while another thread counts. With a binding that releases the GIL the
counter keeps its free-running rate; with one that holds it (cuda-bindings < 12.9.1) it stops.
The verdict also checks that infermux's version rule (cuda.check_releases_gil) agrees with
what was measured. Prints `FIGURE: ...`; `SKIP: ...` (exit 0) where a piece is missing.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Callable

from infermux.plugins.backends import cuda
from infermux.plugins.base import BackendError

SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def _cupy_launcher() -> tuple[str, Callable[[int], int]] | None:
    try:
        import cupy
    except ImportError:
        return None
    kernel = cupy.RawKernel(SPIN, "spin")
    stream = cupy.cuda.Stream(non_blocking=True)

    def launch(cycles: int) -> int:
        with stream:  # RawKernel launches on the current stream (it takes no stream argument)
            kernel((1,), (1,), (cupy.int64(cycles),))
        return int(stream.ptr)

    return f"cupy {cupy.__version__}", launch


def _torch_launcher() -> tuple[str, Callable[[int], int]] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    stream = torch.cuda.Stream()

    def launch(cycles: int) -> int:
        with torch.cuda.stream(stream):
            torch.cuda._sleep(cycles)  # a spin kernel torch's own tests use
        return int(stream.cuda_stream)

    return f"torch {torch.__version__}", launch


def _sync(handle: int) -> float:
    """Seconds cuda-python's cudaStreamSynchronize took on the foreign stream `handle`."""
    try:
        from cuda.bindings import runtime as rt
    except ImportError:  # cuda-python before 12.6: the probe shows it holding the GIL
        from cuda import cudart as rt

    start = time.perf_counter()
    err, = rt.cudaStreamSynchronize(handle)
    if err != rt.cudaError_t.cudaSuccess:
        raise RuntimeError(f"cudaStreamSynchronize failed: {err}")
    return time.perf_counter() - start


def _counted(body: Callable[[], float]) -> tuple[int, float]:
    """(increments another thread made, seconds) while `body` runs on this thread."""
    count, stop = [0], threading.Event()

    def counter() -> None:
        while not stop.is_set():
            count[0] += 1

    thread = threading.Thread(target=counter)
    thread.start()
    try:
        time.sleep(0.05)  # let the counter start
        before = count[0]
        seconds = body()
        during = count[0] - before
    finally:
        stop.set()
        thread.join()
    return during, seconds


def _cycles_for(launch: Callable[[int], int], ms: float) -> int:
    """Spin cycles that take about `ms` on this GPU, from one timed 10 M-cycle spin."""
    trial = 10_000_000
    handle = launch(trial)
    took = _sync(handle)
    return max(trial, int(trial * ms / 1000 / max(took, 1e-6)))


def _calibrated(ms: float) -> tuple[str, Callable[[int], int], int] | None:
    """The first of cupy, torch that can spin a kernel here, with the cycles for about `ms`."""
    for make in (_cupy_launcher, _torch_launcher):
        try:
            found = make()
            if found is not None:
                return (*found, _cycles_for(found[1], ms))
        except Exception as exc:  # no NVRTC for cupy, a torch built for another CUDA, ...
            print(f"{make.__name__.strip('_')}: cannot run a kernel: {exc}")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel-ms", type=float, default=400.0)
    args = parser.parse_args(argv)
    version = cuda.bindings_version()
    try:
        if cuda.device_count() == 0:
            print("SKIP: no NVIDIA GPU or driver")
            return 0
    except BackendError as exc:  # refused by the version rule, or no binding at all
        if "holds the Python GIL" not in str(exc):
            print(f"SKIP: {exc}")
            return 0
    found = _calibrated(args.kernel_ms)
    if found is None:
        print("SKIP: neither cupy nor torch (with CUDA) could run a kernel here: nothing to spin with")
        return 0
    name, launch, cycles = found
    free_count, free_s = _counted(lambda: (time.sleep(args.kernel_ms / 1000), args.kernel_ms / 1000)[1])
    handle = launch(cycles)
    sync_count, sync_s = _counted(lambda: _sync(handle))
    ratio = (sync_count / max(sync_s, 1e-9)) / max(free_count / max(free_s, 1e-9), 1e-9)
    released = ratio >= 0.25
    try:
        cuda.check_releases_gil(version)
        accepted = True
    except BackendError:
        accepted = False
    print(f"kernel via {name}; cuda-bindings {version or '?'}; sync waited {sync_s * 1000:.0f} ms; "
          f"counter {sync_count} during it, {free_count} in {free_s * 1000:.0f} ms free-running")
    print(f"FIGURE: GIL {'released' if released else 'HELD'}: counter at {ratio:.0%} of its free rate "
          f"during a {sync_s * 1000:.0f} ms sync (cuda-bindings {version or '?'})")
    if sync_s < args.kernel_ms / 4000:
        print("FAIL: the kernel finished before the sync began: the probe measured nothing")
        return 1
    if released != accepted:
        print(f"FAIL: infermux's version rule {'accepts' if accepted else 'refuses'} {version} but the GIL "
              f"was {'released' if released else 'held'}: fix GIL_FREE in plugins/backends/cuda.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
