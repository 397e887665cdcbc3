"""The daemon's Python per request, without sockets, against the bare loop's.

    python tests/benchmarks/bench_handling.py [--calls 3000] [--rounds 7] [--no-write]

In one process, on the sample classifier (one [1,3,64,64] image a request):

  bare     protocol.parse_request + onnxruntime + protocol.encode_reply: the
           bare loop's handler (baselines.py) less its socket calls
  daemon   Server._handle on a real Server (1 context, its model loaded and
           warmed), its reply send replaced by a no-op: parse, route, admit,
           compute inline, statistics, reply header
  instant  both again with a backend call that returns a ready output at
           once, so that only the Python around the model remains

No socket, no second process, no thread hand-off: what is left between
the rows is the daemon's own code per request. The best of `rounds` rounds
is shown (the least disturbed by the box's other tenants). Writes the
"## Frontend Python per request" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import markdown_table, stamp, write_section  # noqa: E402

from infermux import config as cfg  # noqa: E402
from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from infermux.protocol import Status, encode_reply, encode_request, parse_request  # noqa: E402
from infermux.frontend.server import Server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "engines" / "classifier" / "1" / "model.onnx"
SECTION = "Frontend Python per request"
CONFIG = """\
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"
watch = false

[[models]]
name = "classifier"
version = "1"
engine = "classifier/1/model.onnx"
contexts = 1
"""


class Instant:
    """A context whose call returns a ready output at once: only the Python around it is left."""

    def __init__(self, outputs: dict[str, np.ndarray]) -> None:
        self._outputs = outputs

    def infer(self, inputs: Any) -> dict[str, np.ndarray]:
        return self._outputs

    def close(self) -> None:
        pass


def best_us(fn: Callable[[], object], calls: int, rounds: int, between: Callable[[], None]) -> float:
    """The fastest round's µs per call, after a warm-up of a tenth of `calls`."""
    for _ in range(max(1, calls // 10)):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
        between()
    return min(times)


def measure(calls: int, rounds: int, tmp: Path) -> dict[str, tuple[float, float]]:
    """µs per request, (with onnxruntime, with the instant backend), for bare and daemon."""
    (tmp / "daemon.toml").write_text(CONFIG.format(engines=ROOT / "engines"))
    server = Server(cfg.load(tmp / "daemon.toml"), tmp / "run")
    server.bind()
    try:
        server.start_models().join()
        sent: list[list[Any]] = []
        server._send = lambda frames, envelope=None: sent.append(frames)  # the socket is what is left out
        server._frontend_thread = threading.get_ident()
        image = np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32)
        body = [bytes(memoryview(f)) for f in encode_request("classifier", {"images": image}, id=1)]
        frames: list[Any] = [b"peer", b"", *body]
        context = OnnxRuntimeBackend().load(ENGINE, {"intra_op_num_threads": 1}).create_context()
        outputs = context.infer({"images": image})

        def bare(infer: Callable[[Any], dict[str, np.ndarray]]) -> Callable[[], object]:
            def once() -> object:
                request = parse_request(body)
                return encode_reply({"id": request.id, "status": int(Status.OK), "model": request.model},
                                    infer(request.inputs))
            return once

        version = server.registry.model("classifier").default()
        executor = version.placement.executors[0]
        real = executor._context
        results = {}
        for label, ctx in (("with onnxruntime", real), ("instant backend", Instant(outputs))):
            executor._context = ctx
            infer = context.infer if ctx is real else ctx.infer
            bare_us = best_us(bare(infer), calls, rounds, sent.clear)
            daemon_us = best_us(lambda: server._handle(frames, False), calls, rounds, sent.clear)
            server._handle(frames, False)
            reply = bytes(sent.pop()[2])  # envelope (2 frames), then the header: what was measured served
            assert b'"status":200' in reply, reply[:300]
            results[label] = (bare_us, daemon_us)
        executor._context = real
        return results
    finally:
        server.registry.close(10)
        server.close()


def report(results: dict[str, tuple[float, float]], calls: int, rounds: int) -> str:
    rows = [[label, f"{bare:,.1f}", f"{daemon:,.1f}", f"{daemon - bare:,.1f}", f"{daemon / bare:.2f}×"]
            for label, (bare, daemon) in results.items()]
    table = markdown_table(["backend", "bare µs/req", "daemon µs/req", "daemon − bare µs", "daemon ÷ bare"], rows)
    return "\n".join([
        stamp(), "",
        f"One process, no sockets; {calls:,} calls a round, best of {rounds} rounds. bare = parse_request + "
        "the backend + encode_reply (the bare loop's handler); daemon = `Server._handle` on a loaded "
        "1-context Server with its send a no-op (routing, admission, inline compute, statistics, reply "
        "header). The instant backend returns a ready output, leaving only the Python around the model.",
        "", table, "",
        "Reproduce: `python tests/benchmarks/bench_handling.py`.",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls per round (default 3000)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the best is shown (default 7)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="imx-handle-") as tmp:
        body = report(measure(args.calls, args.rounds, Path(tmp)), args.calls, args.rounds)
    print(f"\n## {SECTION}\n\n{body}")
    if not args.no_write:
        write_section(SECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
