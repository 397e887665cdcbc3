"""The frontend loop polls other fds beside its socket (App.watch): the workers' fast lanes."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Iterator

import pytest

from infermux import config as cfg
from infermux.app import App


@pytest.fixture
def server(tmp_path: Path) -> Iterator[App]:
    (tmp_path / "engines").mkdir()
    text = f'[daemon]\nlisten = ["ipc://infer.sock"]\nengine_dir = "{tmp_path / "engines"}"\nwatch = false\n'
    s = App(cfg.parse(text, tmp_path / "infermux.toml"), tmp_path / "run")
    s.bind()
    yield s
    s.registry.close(1.0)
    s.close()


def turns(server: App, n: int = 3) -> None:
    for _ in range(n):
        server.frontend._turn(10)


def test_a_watched_fd_is_handled_on_the_loop_until_its_handler_says_done(server: App) -> None:
    mine, theirs = socket.socketpair()
    seen: list[bytes] = []

    def on_ready() -> bool:
        data = mine.recv(100)
        seen.append(data)
        return data != b"bye"

    server.frontend.watch(mine.fileno(), on_ready)
    turns(server)
    theirs.send(b"one")
    turns(server)
    theirs.send(b"bye")
    turns(server)
    theirs.send(b"after")  # no longer watched: nobody reads it
    turns(server)
    assert seen == [b"one", b"bye"]
    assert mine.fileno() not in server.frontend.watched.fds
    mine.close()
    theirs.close()


def test_a_handler_that_raises_is_dropped_and_the_loop_goes_on(server: App, caplog) -> None:
    bad_mine, bad_theirs = socket.socketpair()
    good_mine, good_theirs = socket.socketpair()
    seen: list[bytes] = []

    def broken() -> bool:
        raise RuntimeError("a bug in a reply handler")

    def good() -> bool:
        seen.append(good_mine.recv(100))
        return True

    server.frontend.watch(bad_mine.fileno(), broken)
    server.frontend.watch(good_mine.fileno(), good)
    turns(server)
    bad_theirs.send(b"x")
    turns(server)  # must not raise
    good_theirs.send(b"still served")
    turns(server)
    assert seen == [b"still served"]
    assert bad_mine.fileno() not in server.frontend.watched.fds and good_mine.fileno() in server.frontend.watched.fds
    assert "no longer watching it" in caplog.text
    for s in (bad_mine, bad_theirs, good_mine, good_theirs):
        s.close()
