"""Two cold workers on one GPU, without and with MPS (`[daemon] mps`): the requests/s of each.

    python tests/gpu/mps_compare.py WORKDIR [SECONDS]

Builds the sample classifier's TensorRT plan (gpu_support.build_plan), serves it as two
`placement = "cold"` models from one daemon, keeps 16 requests in flight on each for SECONDS
(default 5), first with mps = "off", then with mps = "on" (infermux starts
nvidia-cuda-mps-control and quits it at the end). Prints one `FIGURE: ` line; `SKIP: reason` and
exit 0 where it cannot run (no GPU, no TensorRT, no nvidia-cuda-mps-control, or an MPS server
the driver refuses). The sources this project started from report +31 % for eight models.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path

from gpu_support import build_plan, gpu_missing, images

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the daemon harness
from support.harness import Daemon  # noqa: E402

MODELS = ("left", "right")
IN_FLIGHT = 16


def config(engines: Path, mode: str, pipes: Path) -> str:
    head = (f'[daemon]\nlisten = ["ipc://infer.sock"]\nengine_dir = "{engines}"\nwatch = false\n'
            f'spare_worker = false\nmps = "{mode}"\nmps_pipe_dir = "{pipes}"\n')
    return head + "".join(f'[[models]]\nname = "{m}"\nengine = "{m}/1/model.plan"\nplacement = "cold"\n'
                          f'preload = true\nmax_queue = 256\n' for m in MODELS)


def throughput(d: Daemon, seconds: float) -> float:
    """Requests/s answered 200 with IN_FLIGHT requests kept in flight on each model."""
    x = images(1)
    with d.pipeline(timeout_s=30) as p:
        for _ in range(IN_FLIGHT):
            for m in MODELS:
                p.submit(m, {"images": x})
        done, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            reply = p.next_reply()
            assert reply.status == 200, (reply.status, reply.error)
            done += 1
            p.submit(reply.model, {"images": x})
        elapsed = time.monotonic() - start
        for reply in p.replies():
            assert reply.status == 200, (reply.status, reply.error)
    return done / elapsed


def run(work: Path, mode: str, engines: Path, seconds: float) -> tuple[float | None, str]:
    workdir = work / f"daemon-{mode}"
    workdir.mkdir(parents=True, exist_ok=True)
    d = Daemon(workdir, config(engines, mode, work / "mps-pipes"))
    try:
        d.start(timeout=300)
    except AssertionError as exc:
        reason = re.findall(r"failed model=\S+ version=1 .*", str(exc)) or [str(exc)[-300:]]
        return None, reason[-1]
    try:
        with d.admin() as admin:
            mps = admin.call("status")["daemon"].get("mps", {})
        if mode == "on" and not mps.get("active"):
            return None, f"MPS not active: {mps.get('detail')}"
        throughput(d, 1.0)  # warm both workers
        return throughput(d, seconds), str(mps.get("detail", ""))
    finally:
        d.stop(timeout=60)


def main(argv: list[str]) -> int:
    work = Path(argv[1]) if len(argv) > 1 else Path("/tmp/infermux-mps")
    seconds = float(argv[2]) if len(argv) > 2 else 5.0
    missing = gpu_missing()
    if missing:
        print(f"SKIP: {missing}")
        return 0
    if shutil.which("nvidia-cuda-mps-control") is None:
        print("SKIP: nvidia-cuda-mps-control not on PATH")
        return 0
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        print("SKIP: TensorRT is not installed")
        return 0
    engines = work / "engines"
    plan = build_plan(work / "classifier.plan")
    for m in MODELS:
        (engines / m / "1").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plan, engines / m / "1" / "model.plan")
    plain, _ = run(work, "off", engines, seconds)
    if plain is None:
        print("FIGURE: two cold workers failed to serve without MPS")
        return 1
    shared, detail = run(work, "on", engines, seconds)
    print(f"without MPS: {plain:.0f} req/s; with MPS: {shared or 0:.0f} req/s ({detail})")
    if shared is None:
        print(f"SKIP: no MPS here ({detail}); without MPS {plain:.0f} req/s")
        return 0
    print(f"FIGURE: two cold workers, {IN_FLIGHT} in flight each: {plain:.0f} req/s without MPS, "
          f"{shared:.0f} with ({(shared / plain - 1) * 100:+.0f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
