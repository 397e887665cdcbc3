"""Daemons with cold models (worker processes): their settings, a clean stop, and waiting for a 200."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from infermux.client import Client, Reply
from infermux.workers import slots
from support.harness import Daemon
from support.polling import eventually

HEAD = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"
max_message_bytes = 8388608
watch = false
worker_hang_s = {hang}
memory_budget = "{budget}"
"""


def head(hang: float = 10.0, budget: str = "80%") -> str:
    """The [daemon] table of a worker test: `hang` is worker_hang_s, `budget` the memory budget."""
    return HEAD.replace("{hang}", str(hang)).replace("{budget}", budget)


def start(make_daemon: Callable[..., Daemon], models: str, hang: float = 10.0, budget: str = "80%",
          **kw: Any) -> Daemon:
    return make_daemon(models, head=head(hang, budget), **kw)


def until_200(client: Client, model: str, x: np.ndarray, timeout_s: float = 20.0) -> Reply:
    """Retry as a client would (after retry_after_ms, capped to keep tests short) until a 200.

    Anything but a 200 or a 503 with a retry time fails at once."""
    def served() -> Reply | None:
        reply = client.infer(model, {"x": x})
        if reply.status == 200:
            return reply
        assert reply.status == 503 and reply.retry_after_ms, reply.header
        return None

    return eventually(served, f"a 200 from {model}", timeout_s, interval_s=0.05)


def worker(d: Daemon, name: str) -> dict | None:
    """Admin `models`' worker entry of model `name` (None while it has no worker)."""
    with d.admin() as admin:
        row = next(m for m in admin.call("models")["models"] if m["name"] == name)
    return row.get("worker")


def stop_clean(d: Daemon) -> None:
    """Stop the daemon; none of its shared memory may be left behind."""
    pid = d.proc.pid
    assert d.stop() == 0, d.log()
    assert slots.leftovers(pid) == []
