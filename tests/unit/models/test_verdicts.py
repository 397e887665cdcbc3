"""Rollout verdicts kept in the state directory (models/verdicts.py): round trip, bounds, links, retry."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from infermux.events import EventLog
from infermux.models.verdicts import NAME, Decisions, file_digest

DIGEST = "a" * 64


def test_verdicts_round_trip_and_a_retry_takes_back_only_refusals(tmp_path: Path) -> None:
    decisions = Decisions(tmp_path, EventLog())
    decisions.record("det", "1", DIGEST, "served")
    decisions.record("det", "2", "b" * 64, "refused", "rollout failed: 10.00% of 200 agree")
    again = Decisions(tmp_path, EventLog())
    assert again.good("det", "1", DIGEST) and not again.good("det", "2", "b" * 64)
    assert again.refused("det", "2", "b" * 64) == "rollout failed: 10.00% of 200 agree"
    assert again.refused("det", "2", "c" * 64) == ""  # another file of version 2 is news
    assert again.take_back("det", "1") == 0 and again.take_back("det", "2") == 1
    assert not Decisions(tmp_path, EventLog()).refused("det", "2", "b" * 64)
    assert stat.S_IMODE((tmp_path / NAME).stat().st_mode) == 0o600


@pytest.mark.parametrize("content", [b"{", json.dumps({"format": 1, "verdicts": [{"model": "det"}]}).encode(),
                                     json.dumps({"format": 1, "verdicts": [
                                         {"model": "det", "version": "1", "digest": "x", "outcome": "passed",
                                          "reason": "", "time": 1}]}).encode(),
                                     b"[" * 100_000, b" " * (5 << 20)],
                         ids=["truncated", "missing fields", "short digest", "deep", "huge"])
def test_a_verdicts_file_that_a_daemon_did_not_write_is_set_aside_whole(tmp_path: Path, content: bytes) -> None:
    (tmp_path / NAME).write_bytes(content)
    events = EventLog()
    decisions = Decisions(tmp_path, events)
    assert not decisions.good("det", "1", DIGEST)
    assert [e.kind for e in events.recent(10)] == ["state_set_aside"]
    assert [p.name.split("-")[0] for p in tmp_path.iterdir()] == [f"{NAME}.unreadable"]


def test_the_verdicts_file_is_never_read_or_written_through_a_symlink(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("keep")
    folder = tmp_path / "state"
    folder.mkdir()
    (folder / NAME).symlink_to(secret)
    decisions = Decisions(folder, EventLog())  # the link is set aside, not followed
    decisions.record("det", "1", DIGEST, "passed")
    assert secret.read_text() == "keep"
    assert not (folder / NAME).is_symlink() and json.loads((folder / NAME).read_text())["verdicts"][0]["model"] == "det"


def test_the_digest_is_the_files_sha256_and_empty_when_unreadable(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    assert file_digest(tmp_path / "f") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert file_digest(tmp_path / "missing") == ""
    decisions = Decisions(None, EventLog())
    decisions.record("det", "1", "", "refused", "why")  # nothing to key it by: not kept
    assert decisions.refused("det", "1", "") == ""
