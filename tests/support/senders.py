"""Streams sent at a steady rate: a thread per key, each sending the tracking sequences' frames in a loop
(tests/support/tracking.py), so that a daemon's tracked pipeline makes object events at a rate the test
chooses by the frame rate."""

from __future__ import annotations

import threading
import time

from support.harness import dealer
from support.tracking import png, sequences

from infermux.pipelines.wire import send_frame


def segments(frames_each: int) -> list[bytes]:
    """The first `frames_each` frames of every shipped sequence, one after another, as PNG: at each jump
    from one sequence to the next the objects are elsewhere, so the old tracks end and new ones start."""
    return [png(seq.frame(i)) for seq in sequences() for i in range(frames_each)]


class Senders:
    """One thread per key sending `frames` in a loop to `pipeline` at `fps`, each waiting for its reply;
    `stop` ends them after the frame under way. Every reply must be 200: `failures` keeps any other."""

    def __init__(self, endpoint: str, pipeline: str, keys: list[str], frames: list[bytes], fps: float) -> None:
        self.endpoint, self.pipeline, self.frames, self.fps = endpoint, pipeline, frames, fps
        self.sent = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, args=(key, k * len(frames) // max(1, len(keys))),
                                          name=f"sender-{key}", daemon=True) for k, key in enumerate(keys)]
        for thread in self._threads:
            thread.start()

    def _send(self, key: str, first: int) -> None:
        with dealer(self.endpoint) as sock:
            start, i = time.monotonic(), 0
            while not self._stop.wait(max(0.0, start + i / self.fps - time.monotonic())):
                try:
                    reply = send_frame(sock, self.pipeline, self.frames[(first + i) % len(self.frames)], "png",
                                       key=key, timeout_s=20)
                    failed = "" if reply.header.get("status") == 200 else f"{key}: {reply.header}"
                except TimeoutError as exc:
                    failed = f"{key}: {exc}"
                with self._lock:
                    self.sent += 1
                    if failed:
                        self.failures.append(failed)
                i += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
