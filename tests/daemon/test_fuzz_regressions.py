"""One test per bug the fuzzers found (tests/support/fuzz_messages.py, test_protocol_properties.py).

Each of these messages stopped the daemon (frontend thread) or an executor
thread before the fix; the daemon must answer it and go on serving.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from support.harness import Daemon

X4 = np.ones((1, 4), np.float32)
X512 = np.ones((1, 512), np.float32)


def header(**fields) -> bytes:
    base = {"model": "addone", "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}]}
    # ensure_ascii: a lone surrogate travels as the JSON escape "\ud800", which is valid UTF-8
    return json.dumps({**base, **fields}, ensure_ascii=True).encode()


def still_serving(daemon: Daemon) -> None:
    with daemon.client() as client:
        assert client.infer("addone", {"x": X4}).status == 200
    assert daemon.alive() and "Traceback" not in daemon.log()


def test_deeply_nested_header_is_a_400(daemon: Daemon) -> None:
    # json.loads raised RecursionError, which no handler caught: the daemon exited.
    deep = b'{"model": "addone", "id": 5, "x": ' + b"[" * 20000 + b"]" * 20000 + b"}"
    with daemon.client() as client:
        reply = client.send_raw([deep, X4.tobytes()])
    assert reply.status == 400 and "nests too deeply" in reply.error
    still_serving(daemon)


def test_lone_surrogate_id_is_echoed_on_an_error_reply(daemon: Daemon) -> None:
    # encode_reply raised UnicodeEncodeError on the frontend thread: the daemon exited.
    with daemon.client() as client:
        reply = client.send_raw([header(model="nope", id="\ud800"), X4.tobytes()])
    assert reply.status == 404 and reply.header["id"] == "\ud800"
    still_serving(daemon)


def test_lone_surrogate_id_is_echoed_on_a_served_reply(daemon: Daemon) -> None:
    # The same on an executor thread killed that context: its queue was never served again.
    with daemon.client() as client:
        replies = [client.send_raw([header(id=f"cam\udfff{i}"), X4.tobytes()]) for i in range(4)]
    assert [r.status for r in replies] == [200] * 4
    assert [r.header["id"] for r in replies] == [f"cam\udfff{i}" for i in range(4)]
    np.testing.assert_array_equal(replies[0].outputs["y"], X4 + 2)  # version 2 adds 2
    still_serving(daemon)


def test_lone_surrogate_version_is_echoed_in_the_fallback_header(daemon: Daemon) -> None:
    # An unknown version falls back to the default and names the version asked for.
    with daemon.client() as client:
        reply = client.send_raw([header(version="\ud83d", id=9), X4.tobytes()])
    assert reply.status == 200 and reply.fallback["version"] == "\ud83d"
    still_serving(daemon)


def test_enormous_timeout_is_refused_not_overflowed(daemon: Daemon) -> None:
    # 10**310 ms made job.remaining_us() raise OverflowError on a model with a fallback.
    fields = {"model": "slow_fb", "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 512]}]}
    with daemon.client() as client:
        huge = client.send_raw([header(**fields, timeout_ms=10**310), X512.tobytes()])
        longest = client.send_raw([header(**fields, timeout_ms=2**31 - 1), X512.tobytes()])
    assert huge.status == 400 and "timeout_ms" in huge.error and str(2**31 - 1) in huge.error
    assert longest.status == 200
    still_serving(daemon)


@pytest.mark.parametrize("dtype", [["float32"], {"float32": 1}])
def test_unhashable_dtype_is_a_400(daemon: Daemon, dtype) -> None:
    # `dtype not in DTYPES` raised TypeError (unhashable) on the frontend thread: the daemon exited.
    with daemon.client() as client:
        reply = client.send_raw([header(inputs=[{"name": "x", "dtype": dtype, "shape": [1, 4]}], id=3),
                                 X4.tobytes()])
    assert reply.status == 400 and "dtype" in reply.error and reply.header["id"] == 3
    still_serving(daemon)
