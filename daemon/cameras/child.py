"""One camera's process: forked from the cameras' zygote (cameras/zygote.py, which calls `serve`) and
watched by the daemon (cameras/supervisor.py; docs/architecture.md#cameras); `python -m
infermux.cameras.child` runs one on its own.

Two threads. The decoder thread reads the camera (source.py) and keeps only the newest decoded frame;
on a failure it reports the camera lost and opens it again with capped backoff. The main thread takes
the newest frame `fps` times a second, runs the motion gate, and sends the frame to the camera's
pipeline as a client of the daemon: the pixels in a shared-memory region registered with the daemon,
the request naming them, with the camera's name as its stream key, the capture time in `captured` and
the gate's boxes in `motion` (where the frame changed: a pipeline's `roi` step cuts the frame to them).
Replies 429 and 503 (the daemon draining, busy, loading the model) are counted `refused`, not `failed`.
At most one request is in flight; a frame that finds one waiting replaces the frame kept to go next
(`superseded`). The main thread also writes the status line (one JSON object per line, on the status
pipe) every HEARTBEAT_S: a process that stops writing it is killed by the daemon as hung.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import zmq

from infermux.cameras.config import CameraConfig
from infermux.cameras.gate import Box, MotionGate, parse_gate
from infermux.cameras.source import CameraEnded, CameraError, CameraRefused, Decoded, open_source
from infermux.client.shared_memory import SharedMemory
from infermux.protocol import Frame, MalformedReply, SharedTensor, decode_reply, encode_request

HEARTBEAT_S = 0.25
# A lost camera is opened again after these, doubling up to the cap: a camera back is seen within the cap,
# and its frames flow after its next key frame (cameras send one every second or two).
RETRY_FIRST_S, RETRY_CAP_S = 0.25, 1.0
REFUSED_RETRY_S = 30.0  # a refused stream (over max_pixels) is tried again this seldom
REPLY_TIMEOUT_S = 10.0  # a request unanswered this long is given up, so that frames go on
ERROR_CHARS = 300
# Statuses that say the daemon did not take a frame for now (it drains, its queue is full, the model loads):
# nothing is wrong with the camera, so they are counted apart and do not become its last error.
REFUSED = frozenset((429, 503))


@dataclass
class Counts:
    """What the camera did so far (the daemon turns them into rates)."""

    decoded: int = 0
    taken: int = 0  # frames taken at `fps`
    gated: int = 0  # taken, but the gate kept them back (no motion)
    sent: int = 0
    superseded: int = 0  # passed the gate, but a newer frame replaced them before they were sent
    served: int = 0  # replies 200
    refused: int = 0  # replies REFUSED: the daemon did not take the frame (draining, busy, its model loading)
    failed: int = 0  # replies of any other status
    reconnects: int = 0
    decode_ms_sum: float = 0.0


class Newest:
    """The newest decoded frame, handed from the decoder thread to the main thread: one slot, never a queue."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._frame: Decoded | None = None
        self.state, self.reason = "starting", ""
        self.changed = threading.Event()  # the state changed: report it now, not at the next beat

    def put(self, frame: Decoded) -> None:
        with self._lock:
            self._frame = frame

    def take(self) -> Decoded | None:
        with self._lock:
            frame, self._frame = self._frame, None
        return frame

    def set_state(self, state: str, reason: str = "") -> None:
        if (state, reason) != (self.state, self.reason):
            self.state, self.reason = state, reason
            self.changed.set()


def decode_forever(camera: CameraConfig, newest: Newest, counts: Counts, stop: threading.Event) -> None:
    """The decoder thread: frames into `newest` until the camera ends or `stop`; reopens a lost camera."""
    failures = 0
    while not stop.is_set():
        source = open_source_or_error(camera)
        try:
            if isinstance(source, CameraError):
                raise source
            for frame in source.frames():
                counts.decoded += 1
                counts.decode_ms_sum += frame.decode_ms
                newest.put(frame)
                if newest.state != "streaming":
                    newest.set_state("streaming")
                    failures = 0
                if stop.is_set():
                    return
        except CameraEnded as exc:
            newest.set_state("ended", exc.reason)
            return
        except CameraError as exc:
            refused = isinstance(exc, CameraRefused)
            newest.set_state("refused" if refused else "lost", exc.reason)
            failures += 1
            counts.reconnects += 1
            stop.wait(REFUSED_RETRY_S if refused else min(RETRY_CAP_S, RETRY_FIRST_S * 2 ** (failures - 1)))
        finally:
            if not isinstance(source, CameraError):
                source.close()


def open_source_or_error(camera: CameraConfig) -> Any:
    try:
        return open_source(camera)
    except CameraError as exc:
        return exc


class Sender:
    """The camera's requests to its pipeline: one in flight, the newest frame next."""

    def __init__(self, camera: CameraConfig, endpoint: str, regions: str, input_name: str, counts: Counts,
                 identity: str = "") -> None:
        self.camera, self.input, self.counts = camera, input_name, counts
        self.regions, self.endpoint, self.identity = regions, endpoint, identity
        self.socket = self._connect()
        self.shm: SharedMemory | None = None
        self.slot = 0  # which half of the region the next frame goes to: the other may be in flight
        self.waiting: Decoded | None = None
        self.waiting_boxes: list[Box] = []  # where the waiting frame changed, by the gate (none: no gate)
        self.in_flight: tuple[int, float] | None = None  # (id, when sent)
        self.ids = itertools.count(1)
        self.last_error = ""
        self.replaced = 0  # frames superseded here since the last request sent

    def _connect(self) -> zmq.Socket:
        socket: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        if self.identity:  # the daemon's for this camera, the same after a restart: its key stays its own (bound keys)
            socket.setsockopt(zmq.IDENTITY, f"camera-{self.identity}".encode()[:255])
        socket.connect(self.endpoint)
        return socket

    def offer(self, frame: Decoded, boxes: list[Box] | None = None) -> None:
        """Send `frame` now if nothing is in flight, else keep it (replacing the one kept); `boxes`: where the
        gate saw it change, sent with it as the request's `motion` for the pipeline's `roi` step."""
        if self.waiting is not None:
            self.counts.superseded += 1
            self.replaced += 1  # told to the daemon with the next request: its stream counts every frame lost
        self.waiting, self.waiting_boxes = frame, boxes or []
        self.send_waiting()

    def send_waiting(self) -> None:
        if self.in_flight is not None or self.waiting is None:
            return
        frame, self.waiting = self.waiting, None
        motion = [[int(v) for v in box] for box in self.waiting_boxes]
        image = np.ascontiguousarray(frame.image)
        height, width = image.shape[:2]
        ident = next(self.ids)
        geometry = {"format": "rgb", "width": width, "height": height, "stride": width * 3}
        ref = self._into_region(image)
        if ref is None:
            frames = encode_request(self.camera.pipeline, {self.input: Frame.of(image, "rgb")}, id=ident,
                                    key=self.camera.name, captured=frame.captured, replaced=self.replaced,
                                    motion=motion)
        else:
            frames = encode_request(self.camera.pipeline, {self.input: ref}, id=ident, key=self.camera.name,
                                    captured=frame.captured, described={self.input: geometry},
                                    replaced=self.replaced, motion=motion)
        self.replaced = 0
        self.socket.send_multipart([b"", *frames])
        self.in_flight = (ident, time.monotonic())
        self.counts.sent += 1

    def _into_region(self, image: np.ndarray) -> SharedTensor | None:
        """The frame copied into the free half of the region (made, or made larger, as frames need)."""
        if not self.regions:
            return None
        if self.shm is None or self.shm.size < 2 * image.nbytes:
            if self.shm is not None:
                self.shm.close()
                self.shm = None
            try:
                self.shm = SharedMemory(self.regions, 2 * image.nbytes, name=f"camera-{self.camera.name}"[:64])
            except (ConnectionError, OSError, ValueError) as exc:  # refused (too many regions): frames inline
                self.last_error, self.regions = f"shared memory: {str(exc)[:ERROR_CHARS]}; frames go inline", ""
                return None
        self.slot ^= 1
        target = self.shm.ndarray((image.nbytes,), "uint8", offset=self.slot * image.nbytes)
        target[:] = image.reshape(-1)
        return self.shm.ref(target)

    def receive(self) -> None:
        """Read the replies that came; a request unanswered for REPLY_TIMEOUT_S is given up."""
        while self.socket.poll(0):
            frames = self.socket.recv_multipart()
            try:
                reply = decode_reply(frames[1:])
            except MalformedReply:
                continue
            if self.in_flight is None or reply.header.get("id") != self.in_flight[0]:
                continue
            self.in_flight = None
            if reply.status == 200:
                self.counts.served += 1
            elif reply.status in REFUSED:
                self.counts.refused += 1
            else:
                self.counts.failed += 1
                self.last_error = f"{reply.status} {str(reply.error or '')[:ERROR_CHARS]}"
        if self.in_flight is not None and time.monotonic() - self.in_flight[1] > REPLY_TIMEOUT_S:
            self.in_flight = None
            self.counts.failed += 1
            self.last_error = f"no reply within {REPLY_TIMEOUT_S:.0f} s; connected again"
            # A new connection: the daemon's ROUTER takes no request from a connection that came while one
            # of the same identity (this camera's previous process, its request still unread) was there.
            self.socket.close(0)
            self.socket = self._connect()
        self.send_waiting()


def run(camera: CameraConfig, endpoint: str, regions: str, input_name: str, status_fd: int,
        identity: str = "") -> int:
    """Take, gate and send frames until the camera ends; the status line every HEARTBEAT_S."""
    counts, newest, stop = Counts(), Newest(), threading.Event()
    sender = Sender(camera, endpoint, regions, input_name, counts, identity)
    gate = MotionGate(camera.gate) if camera.gate is not None else None
    decoder = threading.Thread(target=decode_forever, args=(camera, newest, counts, stop), name="decoder",
                               daemon=True)
    decoder.start()
    status = os.fdopen(status_fd, "w", buffering=1)
    interval = 1.0 / camera.fps
    next_take = next_beat = time.monotonic()
    while True:
        now = time.monotonic()
        if now >= next_take:
            next_take = max(next_take + interval, now - interval)
            frame = newest.take()
            if frame is not None:
                take(frame, gate, sender, counts)
        if now >= next_beat or newest.changed.is_set():
            newest.changed.clear()
            next_beat = now + HEARTBEAT_S
            report(status, newest, counts, sender)
        if newest.state == "ended" and not decoder.is_alive():
            report(status, newest, counts, sender)
            return 0
        wait = max(0.0, min(next_take, next_beat) - time.monotonic())
        sender.socket.poll(int(wait * 1000) + 1)
        sender.receive()


def take(frame: Decoded, gate: MotionGate | None, sender: Sender, counts: Counts) -> None:
    counts.taken += 1
    if gate is None:
        sender.offer(frame)
        return
    decision = gate.decide(frame.image, frame.captured)
    if not decision.send:
        counts.gated += 1
        return
    sender.offer(frame, decision.boxes)


def report(status: Any, newest: Newest, counts: Counts, sender: Sender) -> None:
    """One status line: the state, why, the counters and the last error a reply gave."""
    line = {"state": newest.state, "reason": newest.reason, "last_error": sender.last_error, **asdict(counts)}
    try:
        status.write(json.dumps(line) + "\n")
    except BrokenPipeError:  # the daemon is gone: so is the reason to run
        os._exit(0)


def _watch_lifeline(fd: int) -> None:
    """Exit when the daemon's end of the lifeline closes (the daemon ended, however it ended)."""
    def watch() -> None:
        try:
            os.read(fd, 1)
        finally:
            os._exit(0)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


def serve(settings: dict[str, Any], endpoint: str, regions: str, input_name: str, status_fd: int,
          lifeline: int) -> int:
    """Run the camera `settings` describe (its configuration as JSON, and the daemon's `identity` for it):
    until the camera ends, or the daemon's end of `lifeline` closes."""
    _watch_lifeline(lifeline)
    raw = dict(settings)
    raw["size"] = tuple(raw["size"]) if raw.get("size") else None
    raw["gate"] = parse_gate(raw["gate"], "gate") if raw.get("gate") else None
    identity = str(raw.pop("identity", ""))
    camera = CameraConfig(**raw)
    return run(camera, endpoint, regions, input_name, status_fd, identity)


def main(argv: list[str] | None = None) -> int:
    """A camera process started on its own (the daemon forks them from cameras/zygote.py, which calls
    `serve`): the settings as JSON on stdin (not in argv: a URL may hold a password)."""
    parser = argparse.ArgumentParser(prog="python -m infermux.cameras.child")
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--regions", default="", help="the daemon's shared-memory socket; empty: frames inline")
    parser.add_argument("--input", default="image", help="the pipeline's input")
    parser.add_argument("--status-fd", type=int, required=True)
    parser.add_argument("--lifeline", type=int, required=True)
    args = parser.parse_args(argv)
    return serve(json.loads(sys.stdin.read()), args.endpoint, args.regions, args.input, args.status_fd,
                 args.lifeline)


if __name__ == "__main__":
    sys.exit(main())
