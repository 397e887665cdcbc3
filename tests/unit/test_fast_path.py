"""The fast path (Router.admit_fast): a request that needs no decision is computed and answered
at once, with the reply and statistics the general path gives; anything that needs a decision
(a version asked for, batching, a fallback, a busy context, bad input) takes the general path."""

from __future__ import annotations

import threading
from typing import Any, Iterator

import numpy as np
import pytest

from infermux import config as cfg
from infermux.frontend.server import Server
from infermux.protocol import decode_reply, encode_request
from support.models import add_one

MODELS = """
[[models]]
name = "plain"
version = "1"
engine = "plain/1/model.onnx"

[[models]]
name = "batched"
version = "1"
engine = "plain/1/model.onnx"
max_batch = 4

[[models]]
name = "guarded"
version = "1"
engine = "plain/1/model.onnx"
fallback = "plain"
"""
X = np.arange(4, dtype=np.float32).reshape(1, 4)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("fast")
    add_one(tmp / "engines" / "plain" / "1" / "model.onnx")
    text = (f'[daemon]\nlisten = ["ipc://infer.sock"]\nengine_dir = "{tmp / "engines"}"\nwatch = false\n'
            + MODELS)
    s = Server(cfg.parse(text, tmp / "infermux.toml"), tmp / "run")
    s.bind()
    s.start_models().join()
    s._frontend_thread = threading.get_ident()  # this thread reads requests, as the loop would
    yield s
    s.registry.close(5.0)
    s.close()


class Sent:
    """What the server sent, and how many requests went to the general path."""

    def __init__(self, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
        self.frames: list[list[Any]] = []
        self.general = 0
        admit = server.router.admit

        def counted(job: Any) -> Any:
            self.general += 1
            return admit(job)

        monkeypatch.setattr(server, "_send", self.frames.append)
        monkeypatch.setattr(server.router, "admit", counted)

    def reply(self, timeout_s: float = 5.0) -> dict[str, Any]:
        for _ in range(int(timeout_s * 100)):
            if self.frames:
                break
            threading.Event().wait(0.01)
        frames = self.frames.pop()
        return decode_reply([bytes(f) for f in frames[2:]]).header


@pytest.fixture
def sent(server: Server, monkeypatch: pytest.MonkeyPatch) -> Sent:
    return Sent(server, monkeypatch)


def ask(server: Server, model: str, x: np.ndarray = X, **options: Any) -> None:
    body = [bytes(memoryview(f)) for f in encode_request(model, {"x": x}, id=7, **options)]
    server._handle([b"peer", b"", *body], False)


def drain_outbox(server: Server) -> None:
    server._forward_replies()


def test_a_plain_request_is_answered_at_once_without_the_general_path(server: Server, sent: Sent) -> None:
    stats = server.registry.model("plain").default().stats
    before = stats.snapshot().total
    ask(server, "plain")
    assert sent.general == 0 and len(sent.frames) == 1  # answered inside _handle
    header = sent.reply()
    assert header["status"] == 200 and header["id"] == 7 and header["model"] == "plain" and header["version"] == "1"
    assert set(header["timing_us"]) == {"queue", "compute", "total"}
    after = stats.snapshot().total  # counted as the general path counts: one 200, one call of 1 row
    assert after.by_status.get(200, 0) == before.by_status.get(200, 0) + 1
    assert after.batches.get(1, 0) == before.batches.get(1, 0) + 1


def test_the_fast_reply_is_the_general_one(server: Server, sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    ask(server, "plain")
    fast = sent.reply()
    monkeypatch.setattr(server.router, "admit_fast", lambda job: False)
    ask(server, "plain")
    drain_outbox(server)
    general = sent.reply()
    assert sent.general == 1
    assert {k: v for k, v in fast.items() if k != "timing_us"} == {k: v for k, v in general.items() if k != "timing_us"}


@pytest.mark.parametrize("model, options", [
    ("plain", {"version": "1"}),  # a version asked for: it may be missing, or fall back
    ("batched", {}),  # its request waits for company
    ("guarded", {}),  # a fallback: the deadline decision is the general path's
])
def test_a_request_that_needs_a_decision_takes_the_general_path(server: Server, sent: Sent, model: str,
                                                                options: dict[str, Any]) -> None:
    ask(server, model, **options)
    server._run_held()  # the end of the burst, for the batched model's held request
    drain_outbox(server)
    assert sent.general == 1
    assert sent.reply()["status"] == 200


def test_a_busy_context_sends_the_request_to_the_general_path(server: Server, sent: Sent) -> None:
    executor = server.registry.model("plain").default().placement.executors[0]
    with executor._busy:  # another thread computes on it
        ask(server, "plain")
        assert sent.general == 1
    threading.Event().wait(0.2)
    drain_outbox(server)
    assert sent.reply()["status"] == 200


def test_bad_input_gets_the_general_paths_error(server: Server, sent: Sent) -> None:
    ask(server, "plain", x=np.zeros((1, 5), np.float32))
    header = sent.reply()
    assert sent.general == 1
    assert header["status"] == 400 and "dimension 1 must be 4" in header["error"], header
