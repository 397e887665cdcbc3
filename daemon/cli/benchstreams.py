"""Open-loop streams for `infermux bench --streams N --fps F`: N cameras at a fixed rate each.

A camera sends its frames at its rate whatever the daemon does with them
(open loop): frame k of stream s goes at start + (k + s/N) / fps, until
--duration is over (a frame not sent by then is not sent: the run stops on
time even when the sender fell behind), each with
the stream's key, on ONE DEALER socket driven by ONE thread (as bench.py's
closed loop, so the generator takes as little CPU from a 2-core box as it
can). Replies are read between sends. Per stream: frames sent, served
(200), superseded (409), refused (429, 503, 504), other; and the age of
each served frame, from its send to its reply.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import zmq

from infermux.execution.stats import percentiles
from infermux.protocol import Frame, encode_request, parse_header

# inputs(stream, frame number): what frame `n` of stream `s` sends (prepared ahead: sending costs no encoding)
InputsFn = Callable[[int, int], Mapping[str, Any]]
REFUSED = (429, 503, 504)


@dataclass
class StreamTally:
    """What one stream sent and what came back."""

    key: str
    sent: int = 0
    served: int = 0
    superseded: int = 0
    refused: int = 0
    other: int = 0
    ages_ms: list[float] = field(default_factory=list)  # of served frames, send to reply

    @property
    def answered(self) -> int:
        return self.served + self.superseded + self.refused + self.other

    def view(self, seconds: float) -> dict[str, Any]:
        p50, p99 = percentiles(self.ages_ms, (50, 99))
        return {"key": self.key, "sent": self.sent, "served": self.served, "superseded": self.superseded,
                "refused": self.refused, "other": self.other, "unanswered": self.sent - self.answered,
                "fps_sent": round(self.sent / seconds, 2) if seconds else 0.0,
                "fps_served": round(self.served / seconds, 2) if seconds else 0.0,
                "age_ms": {"p50": None if p50 is None else round(p50, 2), "p99": None if p99 is None else round(p99, 2)}}


@dataclass
class StreamsResult:
    """One open-loop run: its settings and each stream's tally."""

    endpoint: str
    model: str
    fps: float
    duration_s: float
    streams: list[StreamTally]

    def as_json(self) -> dict[str, Any]:
        total = StreamTally("all")
        for s in self.streams:
            for name in ("sent", "served", "superseded", "refused", "other"):
                setattr(total, name, getattr(total, name) + getattr(s, name))
            total.ages_ms += s.ages_ms
        return {"endpoint": self.endpoint, "model": self.model, "streams": len(self.streams), "fps": self.fps,
                "duration_s": round(self.duration_s, 3), "per_stream": [s.view(self.duration_s) for s in self.streams],
                "all": total.view(self.duration_s)}

    def summary(self) -> str:
        """A table: a line per stream, then all of them."""
        data = self.as_json()

        def line(v: dict[str, Any]) -> str:
            age = {q: "-" if ms is None else f"{ms:.1f}" for q, ms in v["age_ms"].items()}
            return (f"{v['key']:<14} {v['sent']:>6} {v['fps_sent']:>8.2f} {v['fps_served']:>10.2f} {v['served']:>7} "
                    f"{v['superseded']:>6} {v['refused']:>8} {v['other']:>6} {age['p50']:>10} {age['p99']:>10}")

        head = (f"{self.model}: {len(self.streams)} streams at {self.fps:g} fps each for {self.duration_s:.1f} s "
                f"(open loop)\n{'STREAM':<14} {'SENT':>6} {'FPS SENT':>8} {'FPS SERVED':>10} {'SERVED':>7} "
                f"{'409':>6} {'REFUSED':>8} {'OTHER':>6} {'AGE P50 MS':>10} {'AGE P99 MS':>10}")
        return "\n".join([head, *(line(v) for v in data["per_stream"]), line(data["all"])])


class _Sender:
    """The frames of every (stream, frame) encoded once; each send re-serialises only the header."""

    def __init__(self, socket: zmq.Socket, model: str, inputs: InputsFn, keys: Sequence[str],
                 fields: Mapping[str, Any]) -> None:
        self._socket, self._model, self._inputs, self._keys, self._fields = socket, model, inputs, keys, fields
        self._cache: dict[tuple[int, int], tuple[dict[str, Any], list[bytes]]] = {}

    def prepare(self, stream: int, n: int) -> tuple[dict[str, Any], list[bytes]]:
        """Distinct frame `n` of `stream`, encoded (once)."""
        found = self._cache.get((stream, n))
        if found is None:
            frames = encode_request(self._model, self._inputs(stream, n), id=0, key=self._keys[stream], **self._fields)
            found = self._cache[(stream, n)] = (parse_header(frames[0]), [bytes(f) for f in frames[1:]])
        return found

    def send(self, stream: int, n: int, ident: int) -> None:
        """Distinct frame `n` of `stream` with request id `ident`."""
        header, tensors = self.prepare(stream, n)
        header["id"] = ident
        self._socket.send_multipart([b"", json.dumps(header, separators=(",", ":")).encode(), *tensors])


def run_streams(endpoint: str, model: str, inputs: InputsFn, *, streams: int, fps: float, duration_s: float,
                key_prefix: str = "stream", timeout_s: float = 10.0, fields: Mapping[str, Any] | None = None,
                curve: Mapping[str, bytes] | None = None, progress: Callable[[int, float], None] | None = None,
                distinct_frames: int = 8) -> StreamsResult:
    """Drive `streams` open-loop streams at `fps` each for `duration_s`, then wait (up to `timeout_s`)
    for the replies still due. `inputs(stream, n)` is called for n < `distinct_frames` only: frames cycle."""
    if streams < 1 or fps <= 0 or duration_s <= 0:
        raise ValueError("--streams, --fps and --duration must be positive")
    keys = [f"{key_prefix}-{s}" for s in range(streams)]
    tallies = [StreamTally(k) for k in keys]
    socket = _dealer(endpoint, curve)
    sender = _Sender(socket, model, inputs, keys, fields or {})
    for s in range(streams):  # every distinct frame made and encoded now, not while the clock runs
        for n in range(distinct_frames):
            sender.prepare(s, n)
    sent_at: dict[int, tuple[int, float]] = {}  # id -> (stream, when sent)
    period = 1.0 / fps
    try:
        start = time.perf_counter()
        end = start + duration_s
        total = int(duration_s * fps) * streams
        next_report = start + 1.0
        for i in range(total):
            n, stream = divmod(i, streams)
            due = start + (n + stream / streams) * period
            _read(socket, sent_at, tallies, until=min(due, end))
            if time.perf_counter() >= end:  # --duration is over: a sender that fell behind stops here too
                break
            sent_at[i + 1] = (stream, time.perf_counter())
            sender.send(stream, n % distinct_frames, i + 1)
            tallies[stream].sent += 1
            if progress is not None and time.perf_counter() >= next_report:
                progress(sum(t.answered for t in tallies), time.perf_counter() - start)
                next_report += 1.0
        elapsed = time.perf_counter() - start
        _await_replies(socket, sent_at, tallies, timeout_s)
    finally:
        socket.close(0)
    return StreamsResult(endpoint, model, fps, max(elapsed, duration_s), tallies)


def _dealer(endpoint: str, curve: Mapping[str, bytes] | None) -> zmq.Socket:
    """The one socket every stream sends on, connected."""
    socket: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, 0)  # open loop: never block a send behind the daemon
    for option, value in (curve or {}).items():
        setattr(socket, option, value)
    socket.connect(endpoint)
    return socket


def _await_replies(socket: zmq.Socket, sent_at: dict[int, tuple[int, float]], tallies: list[StreamTally],
                   timeout_s: float) -> None:
    """The replies still due after the last send, for up to `timeout_s`."""
    deadline = time.perf_counter() + timeout_s
    while sent_at and time.perf_counter() < deadline:
        _read(socket, sent_at, tallies, until=min(deadline, time.perf_counter() + 0.1))


def _read(socket: zmq.Socket, sent_at: dict[int, tuple[int, float]], tallies: list[StreamTally], until: float) -> None:
    """Take replies until `until` (perf_counter), counting each on its stream."""
    while True:
        left_ms = (until - time.perf_counter()) * 1000
        if left_ms <= 0 and not socket.poll(0):
            return
        if left_ms > 0 and not socket.poll(max(1, int(left_ms))):
            continue
        frames = socket.recv_multipart(copy=False)
        now = time.perf_counter()
        header = parse_header(frames[1].buffer if len(frames[0]) == 0 else frames[0].buffer)
        ident = header.get("id")
        found = sent_at.pop(ident, None) if isinstance(ident, int) else None
        if found is None:
            continue
        stream, when = found
        tally, status = tallies[stream], header.get("status")
        if status == 200:
            tally.served += 1
            tally.ages_ms.append((now - when) * 1000)
        elif status == 409:
            tally.superseded += 1
        elif status in REFUSED:
            tally.refused += 1
        else:
            tally.other += 1


def synthetic_frames(streams: int, width: int, height: int, count: int = 8) -> Callable[[int, int], Frame]:
    """Raw BGR frames a camera could send: per stream a gradient and bars that move from frame to frame,
    with the stream and frame drawn in text where OpenCV is installed (a text pipeline then reads them)."""
    opencv: Any = None  # the daemon needs OpenCV for pipelines; a client box may not have it
    try:
        import cv2 as opencv
    except ImportError:
        pass
    made: dict[tuple[int, int], Frame] = {}

    def frame(stream: int, n: int) -> Frame:
        if (stream, n) not in made:
            y, x = np.mgrid[0:height, 0:width]
            image = np.empty((height, width, 3), np.uint8)
            image[..., 0] = (x * 255 // max(1, width - 1) + 40 * stream) % 256
            image[..., 1] = (y * 255 // max(1, height - 1) + 60 * n) % 256
            image[..., 2] = 200
            bar = (n * width // count) % width
            image[:, bar:bar + max(1, width // 16)] = 30
            if opencv is not None:
                opencv.putText(image, f"CAM {stream} FRAME {n}", (width // 16, height // 2),
                               opencv.FONT_HERSHEY_SIMPLEX, max(0.4, width / 640), (0, 0, 0), max(1, width // 320),
                               opencv.LINE_AA)
            made[(stream, n)] = Frame.of(image)
        return made[(stream, n)]

    return frame
