"""The snapshots' folder: names made safe, writes that follow no planted link, pruning by age and size;
and the writer's names for a hostile label."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from support.polling import eventually

from infermux.config import SnapshotConfig
from infermux.pipelines.seen import Drawn, Seen, in_mapping, inside, kept
from infermux.pipelines.snapfolder import NAME_CHARS, SnapFolder, safe_name
from infermux.pipelines.snapshots import NoFrame, Snapshots


@pytest.mark.parametrize("text", ["..", ".", "../../etc/passwd", "a/b", "/abs", "\x1b[31m", "ça", "", "x" * 500,
                                  ".hidden", "a\0b"])
def test_a_name_is_one_safe_component_and_apart_from_its_lookalikes(text: str) -> None:
    name = safe_name(text)
    assert name and len(name) <= NAME_CHARS and not name.startswith(".")
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in name)
    assert name != safe_name(text + "_")  # a hash of the original keeps two texts apart
    assert safe_name("gate-1") == "gate-1"  # a plain name is kept as it is


def test_a_write_replaces_a_planted_link_and_writes_nothing_through_it(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "victim.jpg"
    target.write_bytes(b"keep")
    folder = SnapFolder(tmp_path / "snaps", 1 << 20, 86_400)
    (tmp_path / "snaps" / "cam").mkdir(parents=True)
    os.symlink(target, tmp_path / "snaps" / "cam" / "x.jpg")
    folder.write("cam", "x.jpg", b"new")
    assert target.read_bytes() == b"keep"
    assert (tmp_path / "snaps" / "cam" / "x.jpg").read_bytes() == b"new"
    assert not (tmp_path / "snaps" / "cam" / "x.jpg").is_symlink()


def test_a_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "snaps").mkdir()
    os.symlink(outside, tmp_path / "snaps" / "cam")
    with pytest.raises(OSError, match="not a folder"):
        SnapFolder(tmp_path / "snaps", 1 << 20, 86_400).write("cam", "x.jpg", b"data")
    assert list(outside.iterdir()) == []


def test_pruning_removes_files_past_their_age_then_the_oldest_past_the_size(tmp_path: Path) -> None:
    folder = SnapFolder(tmp_path / "snaps", 3000, 86_400)
    now = time.time()
    for i in range(5):
        folder.write("cam", f"{i}.jpg", b"\0" * 1000)
        os.utime(tmp_path / "snaps" / "cam" / f"{i}.jpg", (now - 100 + i, now - 100 + i))
    aged = tmp_path / "snaps" / "cam" / "4.jpg"
    os.utime(aged, (now - 2 * 86_400, now - 2 * 86_400))
    outside = tmp_path / "kept.jpg"
    outside.write_bytes(b"x")
    os.symlink(outside, tmp_path / "snaps" / "cam" / "link.jpg")
    assert folder.prune(now) == 2  # 4.jpg by age, then 0.jpg: the three newest fit 3000 bytes
    assert sorted(p.name for p in (tmp_path / "snaps" / "cam").iterdir()) == ["1.jpg", "2.jpg", "3.jpg", "link.jpg"]
    assert outside.exists()


def test_a_hostile_label_names_a_file_inside_the_stream_folder(tmp_path: Path) -> None:
    pytest.importorskip("cv2", reason="snapshots are encoded with OpenCV")
    snaps = Snapshots(SnapshotConfig(), tmp_path / "snaps")
    try:
        image = np.zeros((40, 60, 3), np.uint8)
        box = np.array([[10, 5], [30, 5], [30, 25], [10, 25]], np.float32)
        seen = Seen("../../k", "p", image, "rgb", (Drawn(box, "../../../evil\x1b", 1),), time.time())
        snap = snaps.object_snapshot("01ABC", "../../../evil\x1b", seen, 0)
        assert snap is not None and snap["box"] == [10, 5, 30, 25]
        for key in ("path", "crop"):
            path = Path(snap[key])
            assert path.parent.parent == tmp_path / "snaps" and ".." not in path.parts
            eventually(path.exists, f"the {key} written")
        with pytest.raises(NoFrame):
            snaps.live("nothing")
    finally:
        snaps.stop()


def test_a_frame_in_a_mapping_is_copied_and_any_other_kept_by_reference(tmp_path: Path) -> None:
    import mmap

    region = mmap.mmap(-1, 300)
    data = np.frombuffer(memoryview(region)[0:300], np.uint8)
    image = data.reshape(10, 10, 3)
    assert in_mapping(image) and kept(image, data) is not image
    plain = np.zeros(300, np.uint8)
    assert kept(plain.reshape(10, 10, 3), plain).base is plain
    assert inside(np.array([[1, 1], [8, 1], [8, 8], [1, 8]]), 10, 10)
    assert not inside(np.array([[0, 1], [8, 1], [8, 8], [0, 8]]), 10, 10)


def test_a_full_queue_drops_the_snapshot_counted_and_the_event_names_none(tmp_path: Path) -> None:
    snaps = Snapshots(SnapshotConfig(queue=1), tmp_path / "snaps")
    snaps.stop()  # no writer: the queue fills
    box = np.array([[1, 1], [5, 1], [5, 5], [1, 5]], np.float32)
    seen = Seen("k", "p", np.zeros((8, 8, 3), np.uint8), "rgb", (Drawn(box, None, 1),), time.time())
    assert snaps.object_snapshot("01A", None, seen, 0) is not None
    assert snaps.object_snapshot("01B", None, seen, 0) is None
    assert snaps.view()["dropped"] == 1 and snaps.view()["queued"] == 1


def test_a_box_past_the_frames_edge_is_cropped_to_the_frame_and_named_so(tmp_path: Path) -> None:
    cv2 = pytest.importorskip("cv2", reason="snapshots are encoded with OpenCV")
    snaps = Snapshots(SnapshotConfig(), tmp_path / "snaps")
    try:
        box = np.array([[-5, 30], [70, 30], [70, 50], [-5, 50]], np.float32)  # wider than the frame, below it
        seen = Seen("k", "p", np.zeros((40, 60, 3), np.uint8), "rgb", (Drawn(box, None, 1),), time.time())
        snap = snaps.object_snapshot("01C", None, seen, 0)
        assert snap is not None and snap["box"] == [0, 30, 60, 40]
        crop = eventually(lambda: Path(snap["crop"]).exists() and Path(snap["crop"]), "the crop written")
        assert cv2.imread(str(crop)).shape[:2] == (10, 60)
    finally:
        snaps.stop()
