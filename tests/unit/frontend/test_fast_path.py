"""The fast path (Router.admit_fast): a request that needs no decision is computed and answered
at once, with the reply and statistics the general path gives; anything that needs a decision
(a version asked for, batching, a fallback, a busy context, bad input) takes the general path."""

from __future__ import annotations

import threading
from typing import Any, Iterator

import numpy as np
import pytest

from infermux.frontend.oversize import kind_of
from infermux.app import App
from infermux.protocol import Request, decode_reply, encode_request
from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend
from support.models import add_one
from support.inproc import PLAIN_MODELS, started_app
from support.polling import eventually

MODELS = PLAIN_MODELS + """
[[models]]
name = "cams"
version = "1"
engine = "plain/1/model.onnx"
contexts = 2
queue_policy = "newest_per_key"
"""
X = np.arange(4, dtype=np.float32).reshape(1, 4)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    tmp = tmp_path_factory.mktemp("fast")
    add_one(tmp / "engines" / "plain" / "1" / "model.onnx")
    s = started_app(tmp, MODELS)
    s.frontend.bell.thread = threading.get_ident()  # this thread reads requests, as the loop would
    yield s
    s.registry.close(5.0)
    s.close()


class Sent:
    """What the server sent, and how many requests went to the general path."""

    def __init__(self, server: App, monkeypatch: pytest.MonkeyPatch) -> None:
        self.frames: list[list[Any]] = []
        self.general = 0
        admit = server.router.admit

        def counted(job: Any) -> Any:
            self.general += 1
            return admit(job)

        def send(frames: list[Any], envelope: Any = None) -> None:
            self.frames.append(frames)

        monkeypatch.setattr(server.frontend.sender, "send", send)
        monkeypatch.setattr(server.frontend.bell, "send", send)  # a reply on the loop's own thread
        monkeypatch.setattr(server.router, "admit", counted)

    def reply(self, timeout_s: float = 5.0) -> dict[str, Any]:
        for _ in range(int(timeout_s * 100)):
            if self.frames:
                break
            threading.Event().wait(0.01)
        frames = self.frames.pop()
        return decode_reply([bytes(f) for f in frames[2:]]).header


@pytest.fixture
def sent(server: App, monkeypatch: pytest.MonkeyPatch) -> Sent:
    # Each test starts with every context idle: the general path's executor thread may still be
    # finishing the last test's request (its reply is out before its count drops).
    executors = [ex for mv in server.registry.all_versions() for ex in getattr(mv.placement, "executors", [])]
    eventually(lambda: all(ex.load == 0 for ex in executors), "every context idle", 10)
    return Sent(server, monkeypatch)


def ask(server: App, model: str, x: np.ndarray = X, **options: Any) -> None:
    body = [bytes(memoryview(f)) for f in encode_request(model, {"x": x}, id=7, **options)]
    server.frontend._handle([b"peer", b"", *body], False)


def drain_outbox(server: App) -> None:
    server.frontend._forward_replies()


def test_a_plain_request_is_answered_at_once_without_the_general_path(server: App, sent: Sent) -> None:
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


def test_the_fast_reply_is_the_general_one(server: App, sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    ask(server, "plain")
    fast = sent.reply()
    monkeypatch.setattr(server.router, "admit_fast", lambda job, layout=None: False)
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
def test_a_request_that_needs_a_decision_takes_the_general_path(server: App, sent: Sent, model: str,
                                                                options: dict[str, Any]) -> None:
    ask(server, model, **options)
    server.frontend._run_held()  # the end of the burst, for the batched model's held request
    drain_outbox(server)
    assert sent.general == 1
    assert sent.reply()["status"] == 200


def test_a_busy_context_sends_the_request_to_the_general_path(server: App, sent: Sent) -> None:
    executor = server.registry.model("plain").default().placement.executors[0]
    with executor._busy:  # another thread computes on it
        ask(server, "plain")
        assert sent.general == 1
    threading.Event().wait(0.2)
    drain_outbox(server)
    assert sent.reply()["status"] == 200


class Wrapped:
    """A placement of another class that answers as the one it wraps: what the fast path asks is
    the placement's own answer (Placement.idle_context), never which class it is."""

    def __init__(self, inner: Any, idle: bool = True) -> None:
        self._inner, self._idle = inner, idle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def idle_context(self, rows: int, key: Any = None) -> Any:
        return self._inner.idle_context(rows, key) if self._idle else None


@pytest.mark.parametrize("idle", [True, False], ids=["offers-a-context", "offers-none"])
def test_the_fast_path_is_what_the_placement_offers_whatever_its_class(server: App, sent: Sent,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       idle: bool) -> None:
    version = server.registry.model("plain").default()
    monkeypatch.setattr(version, "placement", Wrapped(version.placement, idle))
    ask(server, "plain")
    # Offering none (as a cold placement does), the general path computes it, inline or on the executor.
    eventually(lambda: drain_outbox(server) or bool(sent.frames), "the reply", 10)
    assert sent.general == (0 if idle else 1)
    assert sent.reply()["status"] == 200


def test_bad_input_gets_the_general_paths_error(server: App, sent: Sent) -> None:
    ask(server, "plain", x=np.zeros((1, 5), np.float32))
    header = sent.reply()
    assert sent.general == 1
    assert header["status"] == 400 and "dimension 1 must be 4" in header["error"], header


def test_a_layout_accepted_by_one_engine_is_checked_again_against_the_next(server: App, sent: Sent,
                                                                        tmp_path: Any) -> None:
    # The third request of a header read from its layout: the first two taught the layout, the third
    # let the router remember that this engine accepts its tensors.
    for _ in range(3):
        ask(server, "plain")
        assert sent.reply()["status"] == 200
    assert server.frontend.parses.layout is not None and sent.general == 0
    mv = server.registry.model("plain").default()
    wider = OnnxRuntimeBackend().load(add_one(tmp_path / "wider.onnx", width=5), {})
    engine, mv.engine = mv.engine, wider  # what a swap brings: another engine, which takes [N, 5]
    try:
        ask(server, "plain")
        header = sent.reply()
    finally:
        mv.engine = engine
    assert sent.general == 1 and header["status"] == 400 and "dimension 1 must be 5" in header["error"], header
    ask(server, "plain")  # the engine that accepts the layout again: served on the fast path
    assert sent.reply()["status"] == 200 and sent.general == 1


def stream_row(server: App, model: str, key: str) -> dict[str, Any]:
    from infermux.admin.commands import cmd_streams

    return next(r for r in cmd_streams(server, {"model": model})["streams"] if r["key"] == key)


@pytest.mark.parametrize("model", ["plain", "cams"])  # fifo, and newest_per_key with nothing of the key waiting
def test_a_keyed_request_served_on_the_fast_path_is_counted_on_its_stream(server: App, sent: Sent,
                                                                          model: str) -> None:
    key = f"fast-{model}"
    ask(server, model, key=key)
    assert sent.general == 0 and sent.reply()["status"] == 200  # computed inside _handle
    row = stream_row(server, model, key)
    assert (row["received"], row["served"]) == (1, 1), row
    ask(server, model, key=key)
    sent.reply()
    assert (stream_row(server, model, key)["received"], stream_row(server, model, key)["served"]) == (2, 2)


def test_a_keyed_request_the_fast_path_declines_is_counted_once(server: App, sent: Sent) -> None:
    executor = server.registry.model("plain").default().placement.executors[0]
    with executor._busy:  # the fast path counts it, declines, and the general path must not count it again
        ask(server, "plain", key="declined")
        assert sent.general == 1
    threading.Event().wait(0.2)
    drain_outbox(server)
    assert sent.reply()["status"] == 200
    row = stream_row(server, "plain", "declined")
    assert (row["received"], row["served"]) == (1, 1), row


def test_a_newer_frame_of_a_stream_with_one_waiting_takes_the_general_path(server: App, sent: Sent) -> None:
    # Under newest_per_key an older frame of the key waiting on one context must be replaced (409) by
    # the newer one, not overtaken by it on an idle context: the placement offers no idle context for it (Placement.idle_context), and the general path takes it.
    placement = server.registry.model("cams").default().placement
    waiting = placement.executors[0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(placement, "_home", lambda executors, key: waiting if key == "cam-w" else None)
        ask(server, "cams", key="cam-w")
        assert sent.general == 1
    threading.Event().wait(0.2)
    drain_outbox(server)
    assert sent.reply()["status"] == 200
    ask(server, "cams", key="cam-x")  # no frame of it waiting: the fast path
    assert sent.general == 1 and sent.reply()["status"] == 200


def test_a_request_of_a_kind_whose_reply_was_just_too_large_is_refused_before_the_fast_path(
        server: App, sent: Sent) -> None:
    server.frontend.oversize.over(kind_of([b"peer", b""], "plain", None, Request("plain", {"x": X})), 5_000_000)
    stats = server.registry.model("plain").default().stats
    before = stats.snapshot().total.served
    ask(server, "plain")
    assert not sent.frames  # held back a moment (a client looping on it cannot spin), then sent
    server.frontend.sender.send_paused(every=True)
    header = sent.reply()
    assert header["status"] == 413 and header["error"].startswith("refused without computing it"), header
    assert sent.general == 0 and stats.snapshot().total.served == before  # neither path computed it
    ask(server, "plain", np.zeros((2, 4), np.float32))  # other shapes: computed as ever
    for _ in range(500):  # inside _handle, or by an executor if the fast path declined it
        drain_outbox(server)
        if sent.frames:
            break
        threading.Event().wait(0.01)
    assert sent.reply()["status"] == 200


def test_a_malformed_message_of_a_megabyte_is_refused_a_moment_late_and_a_small_one_at_once(
        server: App, sent: Sent) -> None:
    header = bytes(memoryview(encode_request("plain", {"x": X}, id=7)[0]))
    server.frontend._handle([b"peer", b"", header, *([bytes(1 << 16)] * 40)], False)  # 2.6 MB, too many frames
    assert not sent.frames  # held back: a client looping on it sends a few a second
    server.frontend.sender.send_paused(every=True)
    assert sent.reply()["status"] == 400
    server.frontend._handle([b"peer", b"", header, *([bytes(16)] * 40)], False)  # the same mistake, small
    assert sent.frames and sent.reply()["status"] == 400  # answered at once
