"""The frontend's socket calls (transport/wire.py): the compiled ones and pyzmq's keep one contract.

Every behaviour runs on both kinds, on a real ROUTER with ROUTER_MANDATORY as the frontend sets it,
over ipc (and inproc where the connection's descriptor matters)."""

from __future__ import annotations

import errno
import signal
import shutil
import sysconfig
from pathlib import Path
from typing import Callable, Iterator

import pytest
import zmq

from infermux.transport import wire
from infermux.transport.wire import BIG_FRAME, MAX_FRAMES, CompiledWire, PyzmqWire, Wire, choose

KINDS: dict[str, Callable[[zmq.Socket], Wire]] = {"python": PyzmqWire, "compiled": CompiledWire}


@pytest.fixture(params=list(KINDS))
def make(request: pytest.FixtureRequest) -> Callable[[zmq.Socket], Wire]:
    if request.param == "compiled" and not choose().compiled:
        pytest.skip(f"the compiled calls are not available here: {choose().detail}")
    return KINDS[request.param]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A ROUTER set as the frontend's, and a DEALER connected to it over ipc."""
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    endpoint = f"ipc://{tmp_path}/wire.sock"
    router.bind(endpoint)
    dealer.setsockopt(zmq.IDENTITY, b"client-1")
    dealer.connect(endpoint)
    yield router, dealer
    for sock in (router, dealer):
        sock.close(0)
    ctx.term()


def arrive(w: Wire, timeout_s: float = 5.0) -> None:
    """Wait until `w`'s socket has a message (a poll, as the frontend's loop waits)."""
    assert w.sock.poll(int(timeout_s * 1000)), "no message arrived"  # type: ignore[attr-defined]


def test_a_message_arrives_small_frames_as_bytes_large_ones_uncopied(make, pair) -> None:
    router, dealer = pair
    w = make(router)
    big = bytes(range(256)) * (BIG_FRAME // 256)
    dealer.send_multipart([b"", b'{"model": "m"}', big])
    arrive(w)
    frames, fd = w.recv()
    assert [type(f) for f in frames] == [bytes, bytes, bytes, memoryview]
    assert frames[:3] == [b"client-1", b"", b'{"model": "m"}']
    assert bytes(frames[3]) == big and not frames[3].readonly  # writable, as pyzmq's Frame.buffer is
    assert fd >= 0  # ipc: the connection's descriptor, what the connection guard counts


def test_a_large_frame_stays_valid_after_later_messages(make, pair) -> None:
    router, dealer = pair
    w = make(router)
    first, second = b"a" * BIG_FRAME, b"b" * BIG_FRAME
    dealer.send_multipart([b"", b"h", first])
    dealer.send_multipart([b"", b"h", second])
    arrive(w)
    kept, _ = w.recv()
    arrive(w)
    w.recv()
    assert bytes(kept[3]) == first


def test_nothing_waiting_is_zmq_again_and_waiting_says_so(make, pair) -> None:
    router, dealer = pair
    w = make(router)
    assert not w.waiting()
    with pytest.raises(zmq.Again):
        w.recv()
    dealer.send_multipart([b"", b"h"])
    arrive(w)
    assert w.waiting()
    w.recv()
    assert not w.waiting()


def test_a_reply_reaches_its_client_whole(make, pair) -> None:
    router, dealer = pair
    w = make(router)
    dealer.send_multipart([b"", b"h"])
    arrive(w)
    frames, _ = w.recv()
    body = [b'{"status": 200}', memoryview(b"x" * 100_000), bytearray(b"y" * 10)]
    w.send(frames[:2] + body)
    assert dealer.poll(5000)
    assert dealer.recv_multipart() == [b"", b'{"status": 200}', b"x" * 100_000, b"y" * 10]
    w.send(frames[:2] + [b"uncopied", b"z" * (2 << 20)], copy=False)  # as the frontend sends replies over 1 MiB
    assert dealer.poll(5000)
    assert dealer.recv_multipart() == [b"", b"uncopied", b"z" * (2 << 20)]


def test_a_reply_longer_than_one_call_takes_still_arrives(make, pair) -> None:
    router, dealer = pair
    w = make(router)
    tensors = [str(i).encode() for i in range(MAX_FRAMES + 5)]
    dealer.send_multipart([b"", b"h"])
    arrive(w)
    frames, _ = w.recv()
    w.send(frames[:2] + tensors)
    assert dealer.poll(5000)
    assert dealer.recv_multipart() == [b"", *tensors]


def test_a_frame_that_is_not_a_buffer_sends_nothing(make, pair) -> None:
    router, dealer = pair
    w = make(router)
    dealer.send_multipart([b"", b"h"])  # the ROUTER knows the client from here on
    arrive(w)
    w.recv()
    with pytest.raises(TypeError):
        w.send([b"client-1", b"", b"header", 42])  # type: ignore[list-item]
    w.send([b"client-1", b"", b"next"])  # half a message would have joined this one
    assert dealer.poll(5000)
    assert dealer.recv_multipart() == [b"", b"next"]


def test_a_client_that_is_gone_is_ehostunreach(make, pair) -> None:
    router, _ = pair
    w = make(router)
    with pytest.raises(zmq.ZMQError) as raised:
        w.send([b"nobody", b"", b"reply"])
    assert raised.value.errno == errno.EHOSTUNREACH and not isinstance(raised.value, zmq.Again)


def test_a_client_that_stops_reading_is_zmq_again_and_nothing_is_queued(make, tmp_path: Path) -> None:
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.SNDHWM, 2)
        dealer.setsockopt(zmq.RCVHWM, 2)
        dealer.setsockopt(zmq.IDENTITY, b"slow")
        router.bind(f"ipc://{tmp_path}/full.sock")
        dealer.connect(f"ipc://{tmp_path}/full.sock")
        w = make(router)
        dealer.send_multipart([b"", b"h"])
        arrive(w)
        w.recv()
        with pytest.raises(zmq.Again):  # the pipe fills within a few thousand replies the client never reads
            for _ in range(100_000):
                w.send([b"slow", b"", b"reply" * 1000])
    finally:
        router.close(0)
        dealer.close(0)
        ctx.term()


def test_inproc_has_no_descriptor(make) -> None:
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        router.bind("inproc://wire")
        dealer.connect("inproc://wire")
        w = make(router)
        dealer.send_multipart([b"", b"h"])
        arrive(w)
        assert w.recv()[1] == -1
    finally:
        router.close(0)
        dealer.close(0)
        ctx.term()


def test_a_closed_socket_raises_instead_of_crashing(make, pair) -> None:
    router, _ = pair
    w = make(router)
    router.close(0)
    for call in (w.recv, w.waiting, lambda: w.send([b"client-1", b"", b"h"])):
        with pytest.raises(zmq.ZMQError):
            call()


def test_the_environment_can_choose_pyzmqs_calls(monkeypatch) -> None:
    monkeypatch.setenv(wire.ENV, "python")
    choice = wire._check()
    assert not choice.compiled and wire.ENV in choice.describe()


def test_a_libzmq_that_is_not_loaded_is_refused_with_its_reason() -> None:
    if not choose().compiled:
        pytest.skip(f"the compiled calls are not available here: {choose().detail}")
    from infermux.transport import _wire

    with pytest.raises(OSError, match="not loaded"):
        _wire.load("/nonexistent/libzmq.so.5", zmq.Again, zmq.ZMQError)
    choice = choose()
    assert choice.compiled  # the working binding stays


def test_an_install_with_a_compiler_built_the_compiled_calls() -> None:
    """The editable install (the README's set-up) builds the extension wherever it can: a build that
    silently fell back would leave the daemon on the slower calls."""
    include = Path(sysconfig.get_paths()["include"])
    if shutil.which("cc") is None or not (include / "Python.h").is_file():
        pytest.skip("no C compiler or Python headers here: the extension is optional")
    assert choose().compiled or wire.ENV in choose().detail, choose().describe()


def test_signals_arriving_during_the_calls_are_handled_and_the_calls_go_on(make, pair) -> None:
    """The daemon's SIGHUP (reload) lands in the middle of these calls: libzmq then reports EINTR, and
    the call is made again after the Python handler ran, as pyzmq does; an EINTR that escaped ended
    the daemon in a reload storm."""
    router, dealer = pair
    w = make(router)
    seen: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: seen.append(signum))
    signal.setitimer(signal.ITIMER_REAL, 0.0001, 0.00005)  # a signal every 50 µs: many land inside a call
    try:
        for n in range(3000):
            dealer.send_multipart([b"", str(n).encode()])
            while not w.waiting():
                pass
            frames, _ = w.recv()
            w.send(frames[:2] + [b"reply", frames[2]])
            assert dealer.recv_multipart() == [b"", b"reply", str(n).encode()]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert len(seen) > 100  # the signals did arrive, and every handler ran

