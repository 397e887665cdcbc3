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
the rows is the daemon's own code per request.

A second table adds the sockets: one request sent by a DEALER over inproc
and its reply read back, served by one turn of the daemon's loop
(`Server.step`: the poll, the burst's reads, `_handle`, the send, the
ticks when due) against the bare loop's recv_multipart, handler and
send_multipart on a ROUTER of the same kind. inproc keeps ZeroMQ's I/O
thread out of it (and has no descriptor for the connection guard to read,
which costs the daemon a caught error a request here only).

The best of `rounds` rounds is shown (the least disturbed by the box's
other tenants). Writes the "## Frontend Python per request" section of
RESULTS.md.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from baselines import handler_for  # noqa: E402
from results import markdown_table, print_and_write, stamp  # noqa: E402

from infermux import config as cfg  # noqa: E402
from infermux.protocol import encode_request  # noqa: E402
from infermux.app import App  # noqa: E402
from infermux.frontend.server import Server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "engines" / "classifier" / "1" / "model.onnx"
SECTION = "Frontend Python per request"
# Each measurement binds endpoints of its own: a closed socket's inproc name is released later, on
# libzmq's reaper thread, so a name used again at once may still be taken.
TURN_ENDPOINTS = itertools.count()
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


Results = dict[str, tuple[float, float]]  # row label -> (bare µs, daemon µs)


def measure(calls: int, rounds: int, tmp: Path) -> tuple[Results, Results]:
    """µs per request, bare and daemon, for each backend: handling alone, then one loop turn with sockets."""
    (tmp / "daemon.toml").write_text(CONFIG.format(engines=ROOT / "engines"))
    app = App(cfg.load(tmp / "daemon.toml"), tmp / "run")
    app.bind()
    server = app.frontend
    try:
        app.start_models().join()
        server.bell.thread = threading.get_ident()
        image = np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32)
        body = [bytes(memoryview(f)) for f in encode_request("classifier", {"images": image}, id=1)]
        version = app.registry.model("classifier").default()
        executor = version.placement.executors[0]
        real = executor._context
        outputs = real.infer({"images": image})
        handling, turns = {}, {}
        for label, ctx in (("with onnxruntime", real), ("instant backend", Instant(outputs))):
            executor._context = ctx
            handling[label] = _handling(server, body, ctx.infer, calls, rounds)
            turns[label] = _turns(server, body, ctx.infer, calls, rounds)
        executor._context = real
        return handling, turns
    finally:
        app.registry.close(10)
        app.close()


def _handling(server: Server, body: list[bytes], infer: Callable[[Any], dict[str, np.ndarray]],
              calls: int, rounds: int) -> tuple[float, float]:
    """`Server._handle` with its send a no-op, against the bare handler: no socket at all."""
    sent: list[list[Any]] = []
    send = server.sender.send
    server.sender.send = server.bell.send = lambda frames, envelope=None: sent.append(frames)  # type: ignore[method-assign]
    try:
        frames: list[Any] = [b"peer", b"", *body]
        bare = handler_for(infer)
        bare_us = best_us(lambda: bare(body), calls, rounds, sent.clear)
        daemon_us = best_us(lambda: server._handle(frames, False), calls, rounds, sent.clear)
        server._handle(frames, False)
        reply = bytes(sent.pop()[2])  # envelope (2 frames), then the header: what was measured served
        assert b'"status":200' in reply, reply[:300]
        return bare_us, daemon_us
    finally:
        server.sender.send = server.bell.send = send  # type: ignore[method-assign]


def _turns(server: Server, body: list[bytes], infer: Callable[[Any], dict[str, np.ndarray]],
           calls: int, rounds: int) -> tuple[float, float]:
    """A request and its reply over inproc: one turn of the daemon's loop against the bare loop's."""
    assert server.socket is not None
    ctx = server.ctx  # inproc: the same context as the daemon's ROUTER
    endpoint = f"inproc://turn-{next(TURN_ENDPOINTS)}"
    server.socket.bind(endpoint)
    client, router, bare_client = ctx.socket(zmq.DEALER), ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.bind(endpoint + "-bare")
    client.connect(endpoint)
    bare_client.connect(endpoint + "-bare")
    handle = handler_for(infer)
    message = [b"", *body]

    def daemon_once() -> list[bytes]:
        client.send_multipart(message)
        while not client.poll(0):  # answered inline within the turn that read it; a turn may find only a tick
            server.step()
        return client.recv_multipart()

    def bare_once() -> list[bytes]:
        bare_client.send_multipart(message)
        frames = router.recv_multipart(copy=False)
        router.send_multipart([frames[0], b"", *handle([f.buffer for f in frames[2:]])])
        return bare_client.recv_multipart()

    try:
        assert b'"status":200' in daemon_once()[1] and b'"status":200' in bare_once()[1]
        return best_us(bare_once, calls, rounds, lambda: None), best_us(daemon_once, calls, rounds, lambda: None)
    finally:
        for sock in (client, router, bare_client):
            sock.close(0)
        server.socket.unbind(endpoint)


def _table(results: Results) -> str:
    rows = [[label, f"{bare:,.1f}", f"{daemon:,.1f}", f"{daemon - bare:,.1f}", f"{daemon / bare:.2f}×"]
            for label, (bare, daemon) in results.items()]
    return markdown_table(["backend", "bare µs/req", "daemon µs/req", "daemon − bare µs", "daemon ÷ bare"], rows)


def report(handling: Results, turns: Results, calls: int, rounds: int) -> str:
    return "\n".join([
        stamp(), "",
        f"One process, no sockets; {calls:,} calls a round, best of {rounds} rounds. bare = parse_request + "
        "the backend + encode_reply (the bare loop's handler); daemon = `Server._handle` on a loaded "
        "1-context Server with its send a no-op (routing, admission, inline compute, statistics, reply "
        "header). The instant backend returns a ready output, leaving only the Python around the model.",
        "", _table(handling), "",
        "With the sockets, one process: a DEALER sends each request over inproc and reads its reply; bare = "
        "the bare loop's recv_multipart, handler and send_multipart on a ROUTER; daemon = one turn of the "
        "daemon's loop (`Server.step`: poll, reads, `_handle`, send, ticks when due). Same calls and rounds.",
        "", _table(turns), "",
        "Reproduce: `python tests/benchmarks/bench_handling.py`.",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls per round (default 3000)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the best is shown (default 7)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="imx-handle-") as tmp:
        handling, turns = measure(args.calls, args.rounds, Path(tmp))
        body = report(handling, turns, args.calls, args.rounds)
    print_and_write(SECTION, body, write=not args.no_write, titled=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
