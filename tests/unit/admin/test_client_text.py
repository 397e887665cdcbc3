"""Text a client sends, on the way out: the metrics port, label values and what a terminal shows.

The metrics port here is the real one (admin/httpd.py) on a loopback port, with a page whose text
UTF-8 cannot carry; the daemon side (a key with a lone surrogate refused at the edge, the page and
`ctl streams` still answering) is tests/daemon/frontend/test_hostile_text.py.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Iterator

import pytest

from infermux.admin.httpd import HttpServer, Reply, Route
from infermux.admin.metrics import Exposition
from infermux.format import printable


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


@pytest.fixture
def pages() -> Iterator[tuple[HttpServer, list[str]]]:
    """A port whose slow page and probe answer the next text queued (or "fine")."""
    queued: list[str] = []

    def page() -> Reply:
        return 200, "text/plain; charset=utf-8", queued.pop(0) if queued else "fine\n"
    server = HttpServer("127.0.0.1", 0, {"/metrics": Route(page, slow=True), "/healthz": Route(page)})
    server.start()
    yield server, queued
    server.stop()


def test_a_page_that_utf8_cannot_carry_is_a_500_and_the_next_scrape_is_served(
        pages: tuple[HttpServer, list[str]]) -> None:
    server, queued = pages
    for path in ("/metrics", "/healthz"):
        queued.append('infermux_stream_served_total{key="cam\ud800"} 1\n')
        assert get(server.port, path)[0] == 500
        assert get(server.port, path) == (200, "fine\n")  # the thread that renders it is still there


def test_a_label_value_holding_a_lone_surrogate_is_written_as_its_escape() -> None:
    out = Exposition()
    out.family("infermux_x_total", "counter", "X.", [({"key": 'cam\ud800"\n'}, 1)])
    line = out.text().splitlines()[-1]
    assert line == 'infermux_x_total{key="cam\\\\ud800\\"\\n"} 1'
    line.encode()  # UTF-8 now


@pytest.mark.parametrize("text, shown", [
    ("cam-7", "cam-7"), ("cam\ud800", "cam\\ud800"), ("\x1b[2Jcam", "\\x1b[2Jcam"), ("k" * 100, "k" * 63 + "…"),
    (42, "42"),
])
def test_printable_escapes_what_a_terminal_cannot_show_and_cuts_long_text(text: object, shown: str) -> None:
    assert printable(text) == shown
