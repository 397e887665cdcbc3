"""Cold workers on a GPU: how a TensorRT output could reach a worker's shared-memory slot.

    python tests/gpu/bench_slot_d2h.py [--repeat 50] [--out FILE]

A cold model's outputs go back to the daemon through the request's slot in
/dev/shm. onnxruntime computes straight into it (workers/slotoutputs.py);
the TensorRT backend still copies its outputs from the device into its own
pinned buffers, and the worker then copies them into the slot. This
measures the ways to get 49 KB and 4.9 MB from the device into a slot, so
that the next step is chosen on figures:

- pinned:          device -> pinned buffer (what the backend does today, without the slot)
- pinned + memcpy: device -> pinned buffer -> slot (what a cold TensorRT model costs today)
- pageable slot:   device -> the slot's mapping directly (the driver stages it)
- registered slot: device -> the slot after cudaHostRegister (pinned in place)
- register + unregister: what pinning one slot costs, once per slot

Medians of `--repeat` copies on one stream, each synchronised, after 5
warm-up copies. Prints a markdown section; `--out` also writes it to FILE.
Needs an NVIDIA GPU and cuda-python; exits 0 with a message without them.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_support import gpu_missing  # noqa: E402

from infermux.plugins.backends import cuda  # noqa: E402
from infermux.workers.slots import Slot  # noqa: E402

SIZES = {"49 KB": 12288 * 4, "4.9 MB": 1225000 * 4}


def timed(fn, repeat: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - start) / 1000)
    return statistics.median(times)


def runtime():
    """cuda-python's runtime module, for cudaHostRegister (None where it is missing)."""
    try:
        from cuda.bindings import runtime as rt
    except ImportError:
        try:
            from cuda import cudart as rt  # type: ignore[no-redef]
        except ImportError:
            return None
    return rt


def check(result) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"CUDA call failed: {err}")


def measure(nbytes: int, repeat: int) -> dict[str, float | None]:
    api = cuda._api()
    stream = cuda.Stream()
    device = cuda.DeviceBuffer(nbytes)
    pinned = cuda.HostBuffer(nbytes)
    slot = Slot.create(f"infermux-gpubench-{os.getpid()}-{nbytes}", nbytes)
    view = np.frombuffer(slot.mm, np.uint8)
    slot_ptr = view.ctypes.data
    pinned_view = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(pinned.ptr))
    out: dict[str, float | None] = {}
    try:
        def d2h(dst: int) -> None:
            api.copy_async(dst, device.ptr, nbytes, False, stream.handle)
            stream.synchronize()

        out["pinned"] = timed(lambda: d2h(pinned.ptr), repeat)

        def pinned_then_memcpy() -> None:
            d2h(pinned.ptr)
            np.copyto(view, pinned_view)

        out["pinned + memcpy"] = timed(pinned_then_memcpy, repeat)
        out["pageable slot"] = timed(lambda: d2h(slot_ptr), repeat)
        out["registered slot"] = out["register + unregister"] = None
        rt = runtime()
        if rt is None:
            print("bench_slot_d2h: no cuda-python runtime module: cudaHostRegister not measured")
            return out

        def register_cycle() -> None:
            check(rt.cudaHostRegister(slot_ptr, nbytes, 0))
            check(rt.cudaHostUnregister(slot_ptr))

        try:
            out["register + unregister"] = timed(register_cycle, max(5, repeat // 5))
            check(rt.cudaHostRegister(slot_ptr, nbytes, 0))
        except RuntimeError as exc:  # some platforms refuse to pin a shared mapping
            print(f"bench_slot_d2h: cudaHostRegister on a /dev/shm mapping failed: {exc}")
            return out
        try:
            out["registered slot"] = timed(lambda: d2h(slot_ptr), repeat)
        finally:
            check(rt.cudaHostUnregister(slot_ptr))
    finally:
        view = pinned_view = None  # the closures' references too: the mapping closes below
        slot.unlink()
        slot.close()
        pinned.close()
        device.close()
        stream.close()
    return out


def report(results: dict[str, dict[str, float | None]], repeat: int) -> str:
    cases = list(next(iter(results.values())))
    rows = ["| case | " + " | ".join(f"{size} µs" for size in results) + " |",
            "|---|" + "---:|" * len(results)]
    for case in cases:
        cells = [f"{results[size][case]:,.0f}" if results[size][case] is not None else "n/a" for size in results]
        rows.append(f"| {case} | " + " | ".join(cells) + " |")
    binding = cuda.binding_name()
    return "\n".join([
        f"Measured {time.strftime('%Y-%m-%d')} with {binding}; medians of {repeat} synchronised copies on one "
        "stream after 5 warm-up copies.", "", *rows, "",
        "Reproduce on a GPU machine: `python tests/gpu/bench_slot_d2h.py`.",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--out", type=Path, help="also write the markdown section here")
    args = parser.parse_args(argv)
    why = gpu_missing()
    if why:
        print(f"SKIP: bench_slot_d2h: {why}")
        return 0
    results = {size: measure(nbytes, args.repeat) for size, nbytes in SIZES.items()}
    body = report(results, args.repeat)
    print(body)
    size = list(results)[-1]  # the largest: where the ways differ most
    print(f"FIGURE: {size}: " + ", ".join(f"{case} {us:.0f} µs" for case, us in results[size].items()
                                         if us is not None and case in ("pinned", "pageable slot", "registered slot")))
    if args.out:
        args.out.write_text(body + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
