"""The express lane (frontend/express.py): a hot model's repeated plain requests are received, looked
up and answered from C with the replies, statistics and estimates of the general path; every request
that needs a decision, and every burst while something the general path does for each request is
pending, goes down the general path instead. A real App on a real ipc socket, its loop on a thread."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from infermux import config as cfg
from infermux.frontend import parsecache
from infermux.app import App
from infermux.frontend.server import Server
from infermux.protocol import decode_reply, encode_request
from infermux.transport.wire import choose
from support.models import add_one, two_outputs
from support.inproc import PLAIN_MODELS, started_app
from support.polling import eventually

pytestmark = pytest.mark.skipif(not choose().compiled, reason="the express lane needs the compiled socket calls")

MODELS = PLAIN_MODELS + """
[[models]]
name = "wide"
version = "1"
engine = "wide/1/model.onnx"

[[models]]
name = "pair"
version = "1"
engine = "pair/1/model.onnx"

[[models]]
name = "cams"
version = "1"
engine = "plain/1/model.onnx"
queue_policy = "newest_per_key"
"""
X = np.arange(4, dtype=np.float32).reshape(1, 4)
WIDE = np.ones((1, 2048), dtype=np.float32)  # an 8 KiB reply: over the daemon's max_reply_bytes below
OVERSIZE_MEMORY_S = 0.3
TIMING = re.compile(rb'"timing_us":\{"queue":\d+,"compute":\d+,"total":\d+\}')


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    tmp = tmp_path_factory.mktemp("express")
    add_one(tmp / "engines" / "plain" / "1" / "model.onnx")
    add_one(tmp / "engines" / "wide" / "1" / "model.onnx", width=2048)
    two_outputs(tmp / "engines" / "pair" / "1" / "model.onnx")
    s = started_app(tmp, MODELS, f"max_reply_bytes = 4096\noversize_memory_s = {OVERSIZE_MEMORY_S}\n")
    loop = threading.Thread(target=s.serve_forever, daemon=True)
    loop.start()
    yield s
    s.stop()
    loop.join(10)


@pytest.fixture
def client(server: App) -> Iterator[zmq.Socket]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.connect(server.endpoints[0])
    yield sock
    sock.close()


def ask(sock: zmq.Socket, model: str, inputs: dict[str, np.ndarray], **fields: Any) -> list[bytes]:
    """One request, its reply's frames after the delimiter."""
    sock.send_multipart([b"", *encode_request(model, inputs, **fields)])
    frames = sock.recv_multipart()
    assert frames[0] == b""
    return frames[1:]


def lane(server: App) -> int:
    assert server.frontend.express is not None
    return server.frontend.express.served


def taught(server: App, sock: zmq.Socket, model: str, inputs: dict[str, np.ndarray], **fields: Any) -> None:
    """Send until the lane takes this kind of request (the first ones teach the layout and its acceptance)."""
    def taken() -> bool:
        before = lane(server)
        ask(sock, model, inputs, **fields)
        return lane(server) > before
    eventually(taken, "the lane to take the request", timeout_s=10, interval_s=0)


def without_timing(frames: list[bytes]) -> list[bytes]:
    """The frames with each reply header's timings, which differ from any run to the next, blanked."""
    return [TIMING.sub(b"T", frame) for frame in frames]


def test_the_lane_takes_a_repeated_plain_request_and_answers_it(server: App, client: zmq.Socket) -> None:
    taught(server, client, "plain", {"x": X}, id=0)
    before = lane(server)
    replies = [decode_reply(ask(client, "plain", {"x": X}, id=n)) for n in range(1, 21)]
    assert lane(server) - before == 20
    for n, reply in enumerate(replies, 1):
        assert (reply.status, reply.header["id"], reply.header["model"], reply.header["version"]) == \
            (200, n, "plain", "1"), reply.header
        np.testing.assert_array_equal(reply.outputs["y"], X + 1)


# Plain ids (parsecache.py): others are never cut out of a header, so their requests take the general path.
IDS = st.one_of(st.integers(-(10 ** 18) + 1, 10 ** 18 - 1),
                st.text(st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters='"\\'), max_size=40))


@settings(max_examples=40, deadline=None)
@given(ids=st.lists(IDS, min_size=1, max_size=4), asked=st.sampled_from([None, ["sum"], ["prod", "sum"]]))
def test_the_lanes_replies_are_the_general_paths_byte_for_byte_but_for_the_timing(
        server: App, ids: list[Any], asked: list[str] | None) -> None:
    a = np.float32([[1, 2, 3]])
    b = np.float32([[4, 5, 6]])
    with zmq.Context.instance().socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.RCVTIMEO, 10_000)
        sock.connect(server.endpoints[0])
        taught(server, sock, "pair", {"a": a, "b": b}, id=0, outputs=asked)
        before = lane(server)
        fast = [ask(sock, "pair", {"a": a, "b": b}, id=i, outputs=asked) for i in ids]
        assert lane(server) - before == len(ids)
        lane_off(server)
        try:
            general = [ask(sock, "pair", {"a": a, "b": b}, id=i, outputs=asked) for i in ids]
        finally:
            lane_on(server)
        assert lane(server) - before == len(ids)
    assert [without_timing(f) for f in fast] == [without_timing(f) for f in general]


_lanes: dict[int, Any] = {}


def lane_off(server: App) -> None:
    """Take the lane away between two requests (the loop reads `server.frontend.express` at each burst)."""
    _lanes[id(server)], server.frontend.express = server.frontend.express, None


def lane_on(server: App) -> None:
    server.frontend.express = _lanes.pop(id(server))


HEADERS = st.one_of(
    st.builds(lambda d: json.dumps(d, separators=(",", ":")).encode(),
              st.dictionaries(st.sampled_from(["id", "model", "x", "ID", "i d"]),
                              st.one_of(st.integers(), st.text(max_size=12), st.none(), st.booleans(),
                                        st.dictionaries(st.just("id"), st.integers(), max_size=1)), max_size=4)),
    st.builds(lambda head, token, tail: head + b'"id":' + token + tail, st.binary(max_size=8),
              st.sampled_from([b"-0", b"0", b"01", b"-", b"-7", b"1" * 19, b'"a"', b'"' + b"x" * 128 + b'"',
                               b'"' + b"x" * 129 + b'"', b'"a\\"', b'"\x7f"', b'"\xc3\xa9"', b"", b'"']),
              st.binary(max_size=8)),
    st.binary(max_size=64),
)


@settings(max_examples=400, deadline=None)
@given(raw=HEADERS)
def test_the_compiled_id_cut_is_the_parse_caches(raw: bytes) -> None:
    from infermux.transport import _wire

    assert _wire.split_id(raw) == parsecache._split(raw)


def test_the_compiled_lane_looks_up_headers_as_long_as_the_parse_cache_keeps() -> None:
    from infermux.transport import _wire

    assert _wire.MAX_HEADER == parsecache.MAX_CACHED_HEADER


@pytest.mark.parametrize("model, fields", [
    ("plain", {"version": "1"}),  # a version asked for
    ("cams", {"key": "cam-1"}),  # a stream to count
    ("batched", {}),  # a batching hold
    ("guarded", {}),  # a fallback to decide
])
def test_a_request_that_needs_a_decision_goes_down_the_general_path(
        server: App, client: zmq.Socket, model: str, fields: dict[str, Any]) -> None:
    for n in range(6):
        before = lane(server)
        reply = decode_reply(ask(client, model, {"x": X}, id=n, **fields))
        assert reply.status == 200, reply.header
        np.testing.assert_array_equal(reply.outputs["y"], X + 1)
        assert lane(server) == before


def test_frames_that_do_not_fit_the_layout_get_the_general_paths_error(server: App, client: zmq.Socket) -> None:
    taught(server, client, "plain", {"x": X}, id=0)
    header = encode_request("plain", {"x": X}, id=7)[0]
    before = lane(server)
    client.send_multipart([b"", header, b"\0" * 12])  # 12 bytes where [1, 4] float32 is 16
    reply = decode_reply(client.recv_multipart()[1:])
    assert reply.status == 400 and reply.header["id"] == 7, reply.header
    assert lane(server) == before
    taught(server, client, "plain", {"x": X}, id=8)  # and the lane goes on


def test_the_lane_counts_statistics_and_estimates_as_the_general_path(server: App, client: zmq.Socket) -> None:
    taught(server, client, "plain", {"x": X}, id=0)
    mv = server.registry.model("plain").default()
    executor = mv.placement.executors[0]
    stats, served = mv.stats.snapshot().total.served, executor.served
    requests, layouts = server.requests, server.frontend.parses.hits + lane(server)
    executor.row_us = 200.0  # far above add_one's compute, under the inline gate's 250 µs: the estimate must fall
    for n in range(10):
        ask(client, "plain", {"x": X}, id=n)
    # A reading counts every reply sent, though the lane settles its records only once its burst ends.
    assert mv.stats.snapshot().total.served - stats == 10
    assert executor.served - served == 10
    eventually(lambda: executor.row_us < 200.0, "the lane's compute times folded into the estimate")
    # The burst's count is added once it returns, after its last reply: wait for it.
    eventually(lambda: server.requests - requests == 10, "the frontend's count of the lane's requests")
    assert server.frontend.parses.hits + lane(server) - layouts == 10


def test_a_reply_the_lane_computes_forgives_its_connection_a_refusal_held_back(server: App) -> None:
    """A refusal held back (pacing.py) makes its connection's next one wait longer, until a request of
    that connection is computed: also when the lane computes it, which asks the pacer once a burst."""
    identity = b"forgiven-peer"
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.setsockopt(zmq.ROUTING_ID, identity)
    sock.connect(server.endpoints[0])
    try:
        taught(server, sock, "plain", {"x": X}, id=0)
        header = encode_request("plain", {"x": X}, id=7)[0]
        sock.send_multipart([b"", header, *([bytes(1 << 16)] * 40)])  # 2.6 MB and too many frames: held, then 400
        assert decode_reply(sock.recv_multipart()[1:]).status == 400
        assert server.frontend.pacer.remembers(identity)
        before = lane(server)
        reply = decode_reply(ask(sock, "plain", {"x": X}, id=8))
        assert reply.status == 200, reply.header
        eventually(lambda: lane(server) > before, "the lane to compute the request")
        assert not server.frontend.pacer.remembers(identity)
    finally:
        sock.close()


def test_a_reply_over_max_reply_bytes_is_413_and_the_next_like_it_is_refused_uncomputed(
        server: App, client: zmq.Socket) -> None:
    """Each 413 "computed" keeps its kind (oversize.py), which closes the lane; waited out, the next
    request (the general path's look at the kinds forgets it) opens it again. The layout and its
    acceptance are learnt from the first of these rounds, then the lane computes one."""
    for n in range(6):
        time.sleep(2 * OVERSIZE_MEMORY_S + 0.1)  # a kind is forgotten once it is twice that old
        assert decode_reply(ask(client, "plain", {"x": X}, id=n)).status == 200
        before, computed = lane(server), mv_served(server, "wide")
        first = decode_reply(ask(client, "wide", {"x": WIDE}, id=n))
        assert first.status == 413 and "it was computed" in first.error, first.header
        assert mv_served(server, "wide") - computed == 1
        if lane(server) - before == 1:  # the lane computed it, and Sender.send answered 413 in its place
            break
    else:
        raise AssertionError("the lane never took the wide request")
    again = decode_reply(ask(client, "wide", {"x": WIDE}, id=11))  # the lane is closed while the kind is kept
    assert again.status == 413 and again.error.startswith("refused without computing it"), again.header
    assert lane(server) - before == 1 and mv_served(server, "wide") - computed == 1


def mv_served(server: App, model: str) -> int:
    return sum(ex.served for ex in server.registry.model(model).default().placement.executors)


def test_a_drained_daemon_refuses_what_the_lane_would_have_taken(server: App, client: zmq.Socket) -> None:
    taught(server, client, "plain", {"x": X}, id=0)
    before = lane(server)
    server.draining = True
    try:
        reply = decode_reply(ask(client, "plain", {"x": X}, id=1))
    finally:
        server.draining = False
    assert reply.status == 503 and "draining" in reply.error, reply.header
    assert lane(server) == before
    taught(server, client, "plain", {"x": X}, id=2)


@pytest.fixture
def idle(tmp_path: Path) -> Iterator[Server]:
    """A bound server whose loop does not run: its frontend's state is the test's alone."""
    add_one(tmp_path / "engines" / "plain" / "1" / "model.onnx")
    text = (f'[daemon]\nlisten = ["ipc://infer.sock"]\nengine_dir = "{tmp_path / "engines"}"\nwatch = false\n'
            '[[models]]\nname = "plain"\nversion = "1"\nengine = "plain/1/model.onnx"\n')
    s = App(cfg.parse(text, tmp_path / "infermux.toml"), tmp_path / "run")
    s.bind()
    yield s.frontend
    s.close()


class Shadowing:
    """What the frontend reads of its rollouts while a candidate shadows model "plain"."""

    by_model = {"plain": None}


@pytest.mark.parametrize("condition", ["refusing", "draining", "stopping", "stalled peer", "recorder", "rollout",
                                       "oversize kind", "reply in the outbox"])
def test_each_pending_per_request_duty_closes_the_lane_for_the_burst(idle: Server, condition: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert idle.express is not None and idle._express_open(False)
    refuse = condition == "refusing"
    if condition in ("draining", "stopping"):
        setattr(idle, condition, True)
    elif condition == "stalled peer":
        idle.peers.stalled[b"peer"] = 0.0
    elif condition == "recorder":
        idle.recorder.start("plain", 10, 1 << 20)
    elif condition == "rollout":
        monkeypatch.setattr(idle, "rollouts", Shadowing())
    elif condition == "oversize kind":
        idle.oversize.over(((b"peer",), "plain", None, (), None), 1 << 20)
    elif condition == "reply in the outbox":
        idle._outbox.append(([b"peer"], [b"reply"]))
    assert not idle._express_open(refuse)


def test_a_bug_on_the_lane_answers_500_and_the_lane_goes_on(server: App, client: zmq.Socket,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    taught(server, client, "plain", {"x": X}, id=0)
    before = lane(server)
    monkeypatch.setattr(server.router, "idle", lambda name, rows: 1 / 0)  # a bug in the lane's checks
    reply = decode_reply(ask(client, "plain", {"x": X}, id=5))
    assert reply.status == 500 and reply.header["id"] == 5 and "internal error" in reply.error, reply.header
    monkeypatch.undo()
    assert lane(server) - before == 1
    taught(server, client, "plain", {"x": X}, id=6)


def test_a_backend_failure_on_the_lane_is_answered_as_the_general_path_answers_it(
        server: App, client: zmq.Socket, monkeypatch: pytest.MonkeyPatch) -> None:
    taught(server, client, "plain", {"x": X}, id=0)
    executor = server.registry.model("plain").default().placement.executors[0]
    context = executor._context

    def broken(inputs: Any) -> Any:
        raise RuntimeError("the device fell off the bus")

    monkeypatch.setattr(context, "infer", broken)
    before = lane(server)
    reply = decode_reply(ask(client, "plain", {"x": X}, id=9))
    monkeypatch.undo()
    assert reply.status == 500 and reply.header["id"] == 9, reply.header
    assert reply.error.startswith("backend error: the device fell off the bus"), reply.header
    assert lane(server) - before == 1 and not executor.in_flight and not executor._busy.locked()
    taught(server, client, "plain", {"x": X}, id=10)


def mutated(frames: list[bytes], how: str, n: int) -> list[bytes]:
    """A valid request's frames ([b"", header, tensor]) changed as `how` says."""
    delimiter, header, tensor = frames
    if how == "no tensor":
        return [delimiter, header]
    if how == "one tensor more":
        return [*frames, tensor]
    if how == "tensor shorter":
        return [delimiter, header, tensor[:max(0, len(tensor) - n)]]
    if how == "tensor longer":
        return [delimiter, header, tensor + b"\0" * n]
    if how == "no delimiter":
        return [header, tensor]
    if how == "an envelope frame more":
        return [b"hop", delimiter, header, tensor]
    token = {"id 1.5": b"1.5", "id null": b"null", "id true": b"true", "id quoted": b'"a\\"b"',
             "id of 19 digits": b"1" * 19, "id -0": b"-0", "id with a tail": b"12 "}[how]
    return [delimiter, re.sub(rb'"id":-?\d+', b'"id":' + token, header, count=1), tensor]


HOW = ["no tensor", "one tensor more", "tensor shorter", "tensor longer", "no delimiter", "an envelope frame more",
       "id 1.5", "id null", "id true", "id quoted", "id of 19 digits", "id -0", "id with a tail"]


@settings(max_examples=60, deadline=None)
@given(how=st.sampled_from(HOW), n=st.integers(1, 16), ident=st.integers(0, 10 ** 6))
def test_a_malformed_or_unusual_message_gets_the_general_paths_answer_with_the_lane_on(
        server: App, how: str, n: int, ident: int) -> None:
    frames = mutated([b"", *encode_request("plain", {"x": X}, id=ident)], how, n)
    with zmq.Context.instance().socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.RCVTIMEO, 10_000)
        sock.connect(server.endpoints[0])
        taught(server, sock, "plain", {"x": X}, id=0)
        sock.send_multipart(frames)
        on = sock.recv_multipart()
        lane_off(server)
        try:
            sock.send_multipart(frames)
            off = sock.recv_multipart()
        finally:
            lane_on(server)
    assert without_timing(on) == without_timing(off)


def test_the_lane_hears_a_connection_before_it_answers_it(tmp_path: Path) -> None:
    # Once it has its reply, a client may send a frame over the cap, and libzmq then drops the
    # connection and frees its descriptor: the peer guard must have kept its duplicate by then
    # (transport/oversize.py), as the general path does by hearing each message as it is read.
    add_one(tmp_path / "engines" / "plain" / "1" / "model.onnx")
    s = started_app(tmp_path, '[[models]]\nname = "plain"\nversion = "1"\nengine = "plain/1/model.onnx"\n')
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.connect(s.endpoints[0])
    try:
        for n in range(3):  # the general path, stepped here: it teaches the layout
            sock.send_multipart([b"", *encode_request("plain", {"x": X}, id=n)])
            deadline = time.monotonic() + 10
            while not sock.poll(0) and time.monotonic() < deadline:  # the first reply comes through the outbox
                s.frontend.step()
            sock.recv_multipart()
        assert s.frontend.express is not None and s.frontend.parses.express, "the layout was not learned"
        events: list[str] = []
        answer = s.frontend.express.serve
        s.frontend.express.serve = lambda *request: (events.append("answer"), answer(*request))[1]  # type: ignore[method-assign]
        sock.send_multipart([b"", *encode_request("plain", {"x": X}, id=9)])
        assert s.frontend.socket is not None and s.frontend.socket.poll(10_000)
        served, message = s.frontend.express.run(1, 1, s.frontend._outbox, lambda fd: events.append("hear"), s.peers.dropped)
        assert (served, message) == (1, None)
        assert events == ["hear", "answer"]
        assert decode_reply(sock.recv_multipart()[1:]).header["id"] == 9
    finally:
        sock.close()
        s.stop()
