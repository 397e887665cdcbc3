"""Chaos under load: a steady client load, a fault in the middle, and an account of every request.

`Load` runs client threads that send requests back to back, each waiting
at most `hang_s` for its reply. A reply that never comes within that time
is *hung*; the goal for every scenario is 0 hung and 0 accepted requests
lost (every request gets an answer: served, or refused with a status).
Clients may retry on a fresh socket (`retries`), as a camera pipeline
would: a request written into a connection that then broke never reached
the daemon, and only a resend gets it answered.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from infermux.client import Client

# A daemon watching an engine folder, as the chaos scenarios run it.
WATCHED = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{root}"
watch_settle_s = 0.3
watch_debounce_s = 0.02
"""


@dataclass
class Tally:
    """What happened to the requests of one scenario."""

    sent: int = 0
    answered: int = 0
    hung: int = 0
    by_status: Counter = field(default_factory=Counter)
    wrong: int = 0  # answered 200 with outputs that do not match the model

    def as_row(self) -> dict[str, Any]:
        return {"sent": self.sent, "answered": self.answered, "hung": self.hung, "wrong": self.wrong,
                "by_status": dict(sorted(self.by_status.items()))}


class Load:
    """`clients` threads sending `model` requests until stopped."""

    def __init__(self, endpoint: str, model: str, inputs: dict[str, np.ndarray],
                 check: Callable[[dict[str, np.ndarray]], bool], clients: int = 4, hang_s: float = 10.0,
                 retries: int = 0) -> None:
        self.endpoint, self.model, self.inputs, self.check = endpoint, model, inputs, check
        self.hang_s, self.retries = hang_s, retries
        self.tally = Tally()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> Tally:
        self._stop.set()
        for t in self._threads:
            t.join(self.hang_s + 5)
        return self.tally

    def wait_for(self, answered: int, timeout_s: float = 30.0) -> None:
        """Block until `answered` more replies have come in (the load is really flowing)."""
        target = self.tally.answered + answered
        deadline = time.monotonic() + timeout_s
        while self.tally.answered < target and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.tally.answered >= target, f"load stalled: {self.tally.as_row()}"

    def _client(self) -> None:
        new = lambda: Client(self.endpoint, timeout_s=self.hang_s, retries=self.retries)  # noqa: E731
        client = new()
        try:
            while not self._stop.is_set():
                if not self._one(client):
                    client.close()  # a fresh socket: a late reply must not pair with the next request
                    client = new()
        finally:
            client.close()

    def _one(self, client: Client) -> bool:
        """One request; False if it hung."""
        with self._lock:
            self.tally.sent += 1
        try:
            reply = client.infer(self.model, self.inputs)
        except TimeoutError:
            with self._lock:
                self.tally.hung += 1
            return False
        with self._lock:
            self.tally.answered += 1
            self.tally.by_status[reply.status] += 1
            if reply.status == 200 and not self.check(reply.outputs):
                self.tally.wrong += 1
        if reply.status != 200:
            time.sleep(min(0.05, (reply.retry_after_ms or 10) / 1000))  # honour Retry-After, briefly
        return True
