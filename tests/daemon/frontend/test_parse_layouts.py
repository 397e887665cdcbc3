"""A running daemon reads a client's repeated header from its layout (frontend/parsecache.py): each
reply carries its own request's id and outputs, the count shows in the status, and a header that only
looks like a known one is still refused."""

from __future__ import annotations

import json

import numpy as np
import zmq

from infermux.protocol import decode_reply, encode_request
from support.harness import TWO_VERSIONS_AND_FAST, exchange
from support.polling import eventually

X = np.arange(4, dtype=np.float32).reshape(1, 4)


def headers_from_layout(d) -> int:
    with d.admin() as admin:
        return admin.call("status")["daemon"]["headers_from_layout"]


def test_a_clients_repeated_header_is_read_from_its_layout_and_each_reply_is_its_own(make_daemon):
    d = make_daemon(TWO_VERSIONS_AND_FAST)

    def twenty_from_layout() -> bool:
        before = headers_from_layout(d)
        with d.client() as client:
            for n in range(20):
                reply = client.infer("addone", {"x": X + n})
                assert reply.status == 200 and np.array_equal(reply.outputs["y"], X + n + 2)
        return headers_from_layout(d) - before >= 18  # all but the two that taught the daemon the layout

    # A round of 20 can meet a layout forgotten on its way (a version finishing its load on a busy box):
    # then the next round, on a daemon that has settled, reads them from the layout.
    eventually(twenty_from_layout, "18 of 20 repeated headers read from their layout", timeout_s=20, interval_s=0)


def test_a_header_that_matches_a_layout_but_for_broken_id_bytes_is_a_400_and_the_next_is_served(make_daemon):
    d = make_daemon(TWO_VERSIONS_AND_FAST)
    good = [bytes(memoryview(f)) for f in encode_request("addone", {"x": X}, id=7)]
    for ident in (b"1", b"2", b"3"):  # the layout is kept by now
        replies = exchange(d.endpoint, zmq.REQ, [good[0].replace(b'"id":7', b'"id":' + ident), good[1]])
        assert decode_reply(replies).header["id"] == int(ident)
    broken = exchange(d.endpoint, zmq.REQ, [good[0].replace(b'"id":7', b'"id":'), good[1]])
    header = json.loads(broken[0])
    assert header["status"] == 400 and "not UTF-8 JSON" in header["error"], header
    assert decode_reply(exchange(d.endpoint, zmq.REQ, good)).header["id"] == 7
    assert headers_from_layout(d) >= 2
