"""A client that sends requests for one model without pause on a thread of its own, for the tests
that change a daemon under load (publish, promote, pin, drain) and then read every reply in order."""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from infermux.client import Reply
from support.harness import Daemon
from support.polling import eventually


def normal_rows(rng: np.random.Generator) -> np.ndarray:
    """Inputs for the 4-wide add-one models of support.publish: two rows, fresh each request."""
    return rng.standard_normal((2, 4)).astype(np.float32)


class Traffic:
    """Requests for `model` until the `with` block ends; each reply is kept with the input it
    answered (`sent`). An exception that ends the thread is kept in `errors` and raised when the
    block ends (a thread's own exception would vanish)."""

    def __init__(self, daemon: Daemon, model: str,
                 inputs: Callable[[np.random.Generator], np.ndarray] = normal_rows) -> None:
        self.daemon, self.model, self.inputs = daemon, model, inputs
        self.sent: list[tuple[Reply, np.ndarray]] = []
        self.errors: list[Exception] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def replies(self) -> list[Reply]:
        """The replies so far, in the order they came."""
        return [reply for reply, _ in self.sent]

    def saw(self, version: str, timeout: float = 30.0) -> None:
        """Wait until this traffic has been served by `version` itself: another client seeing the
        switch says nothing of when this thread, starved on a busy box, sends its next request."""
        eventually(lambda: any(r.status == 200 and r.version == version for r in self.replies),
                   f"{self.model} version {version} in the traffic's replies", timeout)

    def __enter__(self) -> "Traffic":
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)  # the client's timeout (30 s) bounds the request in flight
        if self.errors and kind is None:
            raise AssertionError(f"the traffic for {self.model} stopped: {self.errors[0]!r}") from self.errors[0]

    def _run(self) -> None:
        rng = np.random.default_rng(1)
        try:
            with self.daemon.client(timeout_s=30) as client:
                while not self._stop.is_set():
                    x = self.inputs(rng)
                    self.sent.append((client.infer(self.model, {"x": x}), x))
        except Exception as exc:
            self.errors.append(exc)
