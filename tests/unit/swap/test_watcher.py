"""The watcher's file rules: which names count, when a file is complete, what a scan finds."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from infermux.swap.watcher import FileSig, Settler, ignored, scan


@pytest.mark.parametrize("name, skip", [
    ("model.onnx", False), ("model.plan", False), ("3", False), ("model.toml", False),
    (".model.onnx.tmp", True), ("model.onnx.tmp", True), ("model.onnx.part", True),
    ("model.plan.partial", True), ("model.onnx~", True), (".3", True), (".staging", True),
])
def test_temporary_and_hidden_names_are_ignored(name: str, skip: bool) -> None:
    assert ignored(name) is skip


def sig(size: int, age_s: float = 0.0, inode: int = 1) -> FileSig:
    return FileSig(size, int((time.time() - age_s) * 1e9), inode)


def test_a_file_written_in_place_is_complete_only_after_the_settle_window() -> None:
    settler, path = Settler(settle_s=0.5), Path("/e/m/1/model.onnx")
    first, grown = sig(100), sig(200)
    assert settler.observe(path, first, now=10.0) is False
    assert settler.observe(path, grown, now=10.4) is False  # grew: the window starts again
    assert settler.next_check(10.4) == pytest.approx(0.5)
    assert settler.observe(path, grown, now=10.8) is False
    assert settler.observe(path, grown, now=10.9) is True
    assert settler.next_check(10.9) is None


def test_a_file_renamed_into_place_is_complete_at_once_even_if_seen_before_its_event() -> None:
    settler, path = Settler(settle_s=5.0), Path("/e/m/2/model.onnx")
    s = sig(100)
    assert settler.observe(path, s, now=1.0) is False  # the scan got there before the event
    settler.renamed_into_place(path)
    assert settler.observe(path, s, now=1.01) is True
    other = Path("/e/m/3/model.onnx")
    settler.renamed_into_place(other)
    settler.written(other)  # written after the rename: back to the settle window
    assert settler.observe(other, s, now=1.02) is False


def test_an_old_file_is_complete_when_first_seen() -> None:
    settler = Settler(settle_s=1.0)
    assert settler.observe(Path("/e/m/1/model.onnx"), sig(100, age_s=30), now=0.0) is True


def test_a_changed_file_loses_its_complete_status() -> None:
    settler, path = Settler(settle_s=1.0), Path("/e/m/1/model.onnx")
    assert settler.observe(path, sig(100, age_s=30), now=0.0) is True
    assert settler.observe(path, sig(100, inode=2), now=0.1) is False  # replaced, just written


def test_scan_finds_the_layout_and_skips_what_does_not_belong(tmp_path: Path) -> None:
    old = time.time() - 60

    def put(rel: str, data: bytes = b"x") -> Path:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, (old, old))
        return path

    put("det/1/model.onnx")
    put("det/2/model.plan")
    put("det/2/model.onnx")  # a plan wins over an onnx in the same folder
    put("det/2/model.plan.sha256", b"0" * 64)
    put("det/model.toml", b"contexts = 2\n")
    put("det/3/.model.onnx.tmp")  # being written: no engine yet
    put("det/.4/model.onnx")  # a hidden staging folder
    put("det/5/notes.txt")
    put("det/model.onnx")  # not in a version folder
    put(".trash/1/model.onnx")
    snap = scan(tmp_path, Settler(settle_s=1.0))
    assert sorted(snap.engines) == [("det", "1"), ("det", "2")]
    two = snap.engines[("det", "2")]
    assert two.path.name == "model.plan" and two.checksum is not None and two.stable
    assert snap.engines[("det", "1")].checksum is None
    assert set(snap.settings) == {"det"} and snap.models() == {"det"}


def test_scan_of_a_missing_folder_is_an_error_not_an_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="does not exist"):
        scan(tmp_path / "gone", Settler(settle_s=1.0))
