"""Load that keeps a daemon busy while a test changes it: pipelined clients that record every answer."""

from __future__ import annotations

import threading

import numpy as np

from infermux.client import Pipeline


class LoadClient(threading.Thread):
    """Keeps `in_flight` requests outstanding on one DEALER until told to stop, and records each
    request's input and its answer: status, the version that served it, output `y`, error."""

    def __init__(self, endpoint: str, index: int, model: str, width: int = 4, in_flight: int = 8) -> None:
        super().__init__(name=f"load-{index}", daemon=True)
        self.endpoint, self.index, self.model, self.width, self.in_flight = endpoint, index, model, width, in_flight
        self.sent: dict[int, np.ndarray] = {}
        self.answers: dict[int, tuple[int, str, np.ndarray | None, str]] = {}  # id -> status, version, y, error
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = np.random.default_rng(self.index)
        try:
            with Pipeline(self.endpoint, timeout_s=10.0) as pipe:
                while not self.stopping.is_set() or pipe.in_flight:
                    while not self.stopping.is_set() and pipe.in_flight < self.in_flight:
                        x = rng.random((1, self.width), dtype=np.float32)
                        self.sent[pipe.submit(self.model, {"x": x})] = x
                    reply = pipe.next_reply()
                    self.answers[reply.header["id"]] = (reply.status, reply.version or "",
                                                        reply.outputs.get("y"), reply.error or "")
        except BaseException as exc:  # reported by the test thread
            self.error = exc

    def finish(self, timeout_s: float = 20.0) -> None:
        """Stop sending, wait for the answers still due."""
        self.stopping.set()
        self.join(timeout_s)
