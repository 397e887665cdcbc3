"""A sink's durable spool: order, acknowledgement, bounds, and what a restart finds on disk."""

from __future__ import annotations

import os
import resource
import signal
import stat
from pathlib import Path

from infermux.sinks.spool import Spool


def payloads(spool: Spool, n: int = 1000) -> list[bytes]:
    return [data for _, data in spool.peek(n)]


def test_events_wait_in_order_until_acknowledged(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", max_events=100, max_bytes=1 << 20)
    for i in range(5):
        spool.append(b"event %d" % i)
    first = spool.peek(2)
    assert [d for _, d in first] == [b"event 0", b"event 1"]
    assert payloads(spool) == [b"event %d" % i for i in range(5)]  # a peek takes nothing away
    spool.ack(first[-1][0])
    assert payloads(spool) == [b"event %d" % i for i in range(2, 5)]
    assert spool.backlog()[0] == 3
    spool.close()


def test_a_restart_resends_what_was_not_acknowledged_and_nothing_that_was(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", max_events=100, max_bytes=1 << 20)
    for i in range(10):
        spool.append(b"e%d" % i)
    spool.ack(spool.peek(4)[-1][0])
    spool.sync()
    spool.append(b"e10")  # written, not yet fsynced: a daemon that dies now still has it in the file
    os.close(spool._writer)  # as a crash leaves it: no close(), no sync
    again = Spool(tmp_path / "s", max_events=100, max_bytes=1 << 20)
    assert payloads(again) == [b"e%d" % i for i in range(4, 11)]
    again.close()


def test_a_record_cut_short_by_a_crash_ends_what_is_read_and_is_cut_off(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", max_events=100, max_bytes=1 << 20)
    spool.append(b"whole")
    spool.append(b"cut short")
    spool.close()
    segment = next((tmp_path / "s").glob("*.seg"))
    os.truncate(segment, segment.stat().st_size - 3)
    again = Spool(tmp_path / "s", max_events=100, max_bytes=1 << 20)
    assert payloads(again) == [b"whole"]
    again.append(b"after")
    assert payloads(again) == [b"whole", b"after"]
    again.close()
    assert payloads(Spool(tmp_path / "s", max_events=100, max_bytes=1 << 20)) == [b"whole", b"after"]


def test_past_its_bound_the_oldest_events_go_and_are_counted(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", max_events=3, max_bytes=1 << 20)
    for i in range(5):
        spool.append(b"e%d" % i)
    assert payloads(spool) == [b"e2", b"e3", b"e4"] and spool.dropped == 2
    by_size = Spool(tmp_path / "b", max_events=100, max_bytes=25)
    for i in range(5):
        by_size.append(b"0123456789")
    assert by_size.backlog()[:2] == (2, 20) and by_size.dropped == 3
    assert not by_size.append(b"x" * 26) and by_size.dropped == 4  # one event over the bound alone
    spool.close()
    by_size.close()


def test_acknowledged_segments_are_deleted_and_files_are_private(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", max_events=100_000, max_bytes=1 << 20)  # segments of 128 KiB
    for _ in range(400):
        spool.append(b"x" * 1000)
    assert len(list((tmp_path / "s").glob("*.seg"))) >= 3
    spool.ack(spool.peek(400)[-1][0])
    spool.sync()
    assert len(list((tmp_path / "s").glob("*.seg"))) == 1
    for path in (tmp_path / "s").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE((tmp_path / "s").stat().st_mode) == 0o700
    spool.close()


def test_a_symlink_in_place_of_a_segment_is_not_followed(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    (folder / "1.seg").symlink_to(target)
    try:
        Spool(folder, max_events=10, max_bytes=1 << 20)
    except OSError as exc:
        assert exc.errno in (40, 31)  # ELOOP: O_NOFOLLOW refused it
    else:
        raise AssertionError("the spool opened a symlinked segment")
    assert target.read_bytes() == b""


def test_an_append_the_disk_refuses_is_dropped_counted_and_leaves_the_file_readable(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", max_events=100, max_bytes=1 << 20)
    spool.append(b"before")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    segment = next((tmp_path / "s").glob("*.seg"))
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past RLIMIT_FSIZE: EFBIG, as a full disk's ENOSPC
    resource.setrlimit(resource.RLIMIT_FSIZE, (segment.stat().st_size + 10, hard))
    try:
        assert not spool.append(b"x" * 100)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert spool.dropped == 1 and spool.write_error
    spool.append(b"after")
    spool.close()
    assert payloads(Spool(tmp_path / "s", max_events=100, max_bytes=1 << 20)) == [b"before", b"after"]
