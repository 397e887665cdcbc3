"""Snapshots on a real daemon: tracked objects' best frames, `infermux ctl snapshot`, the folder's bounds.

One daemon serves a detector pipeline with a `track` step and events with
`snapshots = true` (tests/support/tracking.py's generated crossing, sent as
PNG on a keyed stream); its events go to a `jsonl` sink. Its snapshots'
folder was filled before the start with files of an hour ago (and one of
two days ago, past `keep_days`) beyond `max_mb`. The tests read the JPEGs
back with OpenCV: each object's best frame (the reply that scored it
highest with its box inside the frame) with its box drawn in green where
the reply put it, its crop the box's size; the folder under `max_mb`, old
files gone; hostile stream keys kept inside the folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from support import models, tracking  # noqa: E402
from support.camera_files import camera, write_clip, write_frames  # noqa: E402
from support.drawn_boxes import bounds, green_share, jpeg  # noqa: E402
from support.harness import Daemon, dealer  # noqa: E402
from support.polling import eventually  # noqa: E402
from support.sinks import events_daemon, jsonl, jsonl_events  # noqa: E402
from support.harness import REPO  # noqa: E402
from support.tracking import Replay, classifying, detecting, replay  # noqa: E402

MAX_MB, KEEP_DAYS, MIN_SCORE = 0.5, 1, 0.5
FILLER = 100_000  # bytes of each file put in the folder before the start
HOSTILE = ("../../outside", "a/b", "..", ".hidden", "ça/été ☃", "x" * 250)


def config_text(workdir: Path) -> str:
    pipeline = detecting("tracked", min_frames=3, min_score=MIN_SCORE, end_after_s=1.0, update_every_s=0.0,
                         snapshots="true")
    clip = write_clip(workdir / "clip.mp4")
    more = f"[snapshots]\nmax_mb = {MAX_MB}\nkeep_days = {KEEP_DAYS}\n\n" + camera("gate-off", str(clip), pipeline="tracked",
                                                                           enabled=False)
    return events_daemon(workdir / "engines", pipeline, jsonl(workdir / "out" / "events.jsonl"), more=more)


def fill(folder: Path) -> tuple[list[Path], Path]:
    """Files of an hour ago, together past max_mb, and one of two days ago (past keep_days)."""
    folder.mkdir(parents=True)
    hour_ago, days_ago = time.time() - 3600, time.time() - 2 * 86_400
    filler = []
    for i in range(7):
        path = folder / f"filler-{i}.jpg"
        path.write_bytes(b"\0" * FILLER)
        os.utime(path, (hour_ago + i, hour_ago + i))
        filler.append(path)
    old = folder / "old.jpg"
    old.write_bytes(b"\0" * 10)
    os.utime(old, (days_ago, days_ago))
    return filler, old


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("snapshots")
    models.brightness_map(workdir / "engines" / "det" / "1" / "model.onnx")
    d = Daemon(workdir, config_text(workdir))
    filler, old = fill(d.state_dir / "snapshots" / "earlier")
    d.start()
    seq = tracking.crossing()
    with dealer(d.endpoint) as sock:
        sent = replay(sock, "tracked", seq, "cam-a")
    yield {"daemon": d, "replay": sent, "seq": seq, "filler": filler, "old": old,
           "folder": d.state_dir / "snapshots"}
    assert d.stop() == 0, d.log()[-4000:]
    assert "Traceback" not in d.log(), d.log()[-6000:]


def events(d: Daemon) -> list[dict[str, Any]]:
    return jsonl_events(d.workdir / "out" / "events.jsonl")


def ends(d: Daemon, tracks: int) -> list[dict[str, Any]]:
    return eventually(lambda: [e for e in events(d) if e["type"] == "end"] if sum(
        e["type"] == "end" for e in events(d)) >= tracks else None, "every object's end", timeout_s=60)


def best_region(sent: Replay, track_id: int) -> dict[str, Any]:
    """The track's region that scored highest with its box inside the frame (the first such), as the
    snapshot picks it (docs/events.md#snapshots)."""
    def rank(region: dict[str, Any]) -> tuple[bool, float]:
        x0, y0, x1, y1 = bounds(region["box"])
        inside = x0 >= 1 and y0 >= 1 and x1 <= tracking.W - 1 and y1 <= tracking.H - 1
        return inside, region["score"]
    regions = [r for r in sent.by_track()[track_id] if r["score"] >= MIN_SCORE]
    best = regions[0]
    for region in regions[1:]:
        if rank(region) > rank(best):
            best = region
    return best


def test_each_object_has_its_best_frame_with_its_box_drawn_and_its_crop(setup: dict[str, Any]) -> None:
    d, sent = setup["daemon"], setup["replay"]
    tracks = {r["track_id"] for h in sent.headers for r in h["regions"] if r["score"] >= MIN_SCORE}
    found = {e["track_id"]: e for e in ends(d, 1)}
    eventually(lambda: len({e["track_id"] for e in events(d) if e["type"] == "end"}) >= len(
        {e["track_id"] for e in events(d) if e["type"] == "new"}), "an end for every new", timeout_s=60)
    found = {e["track_id"]: e for e in events(d) if e["type"] == "end"}
    assert found and set(found) <= tracks
    folder = (setup["folder"] / "cam-a").resolve()
    for track_id, end in found.items():
        snap = end["snapshot"]
        best = best_region(sent, track_id)
        assert snap["box"] == list(bounds(best["box"])), (track_id, snap, best)
        frame, crop = jpeg(snap["path"]), jpeg(snap["crop"])
        assert Path(snap["path"]).parent.resolve() == folder
        assert frame.shape == (tracking.H, tracking.W, 3)
        x0, y0, x1, y1 = snap["box"]
        assert crop.shape[:2] == (y1 - y0, x1 - x0), (track_id, crop.shape, snap["box"])
        assert green_share(frame, (x0, y0, x1, y1)) > 0.8, (track_id, snap)
        news = [e for e in events(d) if e["track_id"] == track_id and e["type"] == "new"]
        assert news[0]["snapshot"]["path"] == snap["path"]  # one pair of files per object, rewritten


def test_ctl_snapshot_draws_the_newest_frames_boxes(setup: dict[str, Any], tmp_path: Path) -> None:
    d, sent = setup["daemon"], setup["replay"]
    out = tmp_path / "newest.jpg"
    proc = ctl(d, "snapshot", "cam-a", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    written = proc.stdout.split()[0]
    assert Path(written).parent.resolve() == (setup["folder"] / "cam-a").resolve()
    image = cv2.imread(str(out))
    assert image.shape == (tracking.H, tracking.W, 3)
    assert np.array_equal(image, cv2.imread(written))
    last = sent.headers[-1]["regions"]
    assert last, "the sequence's last frame has objects"
    for region in last:
        x0, y0, x1, y1 = bounds(region["box"])
        if x1 - x0 > 8:
            assert green_share(image, (x0, y0, x1, y1)) > 0.8, region


@pytest.mark.parametrize("words, says, code", [
    (["snapshot", "nowhere"], "unknown camera or stream 'nowhere'", 1),
    (["snapshot", "gate-off"], "camera 'gate-off' has no frame yet", 1),
    (["snapshot", "cam-a", "--out", "/nonexistent/folder/x.jpg"], "cannot write '/nonexistent/folder/x.jpg'", 2),
    (["snapshot"], "name the camera", 2),
])
def test_ctl_snapshot_says_what_is_wrong_in_one_line(setup: dict[str, Any], words: list[str], says: str,
                                                     code: int) -> None:
    proc = ctl(setup["daemon"], *words)
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_hostile_stream_keys_stay_inside_the_folder(setup: dict[str, Any]) -> None:
    d, seq, folder = setup["daemon"], setup["seq"], setup["folder"]
    with dealer(d.endpoint) as sock:
        for key in HOSTILE:
            replay(sock, "tracked", seq, key, frames=3)
    for key in HOSTILE:
        proc = ctl(d, "snapshot", key)
        assert proc.returncode == 0, proc.stderr
        written = Path(proc.stdout.split()[0]).resolve()
        assert written.parent.parent == folder.resolve() and written.is_file(), written
        assert not written.parent.name.startswith("."), written
    outside = [p for p in d.workdir.rglob("*.jpg") if folder not in p.parents]
    assert not outside, outside


def test_the_folder_stays_under_max_mb_and_old_files_go(setup: dict[str, Any]) -> None:
    d, folder, old = setup["daemon"], setup["folder"], setup["old"]
    eventually(lambda: not old.exists(), "the file past keep_days removed")

    def size() -> int:
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())

    eventually(lambda: size() <= MAX_MB * (1 << 20), f"the folder under {MAX_MB} MiB (now {size()} bytes)")
    assert not setup["filler"][0].exists()  # the oldest went first
    ends(d, 1)
    objects = [p for p in folder.rglob("*.jpg") if "earlier" not in p.parts and not p.name.startswith("live-")]
    newest = max(objects, key=lambda p: p.stat().st_mtime)  # an object's: `ctl snapshot` never writes it again
    aged = time.time() - (KEEP_DAYS + 1) * 86_400
    os.utime(newest, (aged, aged))
    assert ctl(d, "snapshot", "cam-a").returncode == 0  # a write: the folder is pruned after it
    eventually(lambda: not newest.exists(), "a file aged past keep_days removed")


def test_a_cameras_objects_get_their_snapshots_too(tmp_path: Path) -> None:
    """The crossing as a video file read by a camera of the daemon (its frames in shared memory, copied
    when kept): every object that ended has its frame with its box drawn green and its crop."""
    pytest.importorskip("av", reason="cameras decode with PyAV: pip install -e '.[cameras]'")
    models.brightness_map(tmp_path / "engines" / "det" / "1" / "model.onnx")
    seq = tracking.crossing()
    clip = write_frames(tmp_path / "crossing.mp4", [seq.frame(i) for i in range(seq.length)])
    pipeline = detecting("tracked", min_frames=3, min_score=MIN_SCORE, end_after_s=1.0, snapshots="true")
    d = Daemon(tmp_path, f"""
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{tmp_path / 'engines'}"

[[models]]
name = "det"
engine = "det/1/model.onnx"
{pipeline}
[[sinks]]
name = "files"
kind = "jsonl"
options = {{ path = "{tmp_path / 'out' / 'events.jsonl'}" }}

{camera("door", str(clip), pipeline="tracked", loop=False)}
""").start()
    try:
        done = eventually(lambda: [e for e in events(d) if e["type"] == "end"], "an object's end", timeout_s=60)
        for end in done:
            snap = end["snapshot"]
            frame, crop = jpeg(snap["path"]), jpeg(snap["crop"])
            assert Path(snap["path"]).parent.name == "door" and frame.shape == (tracking.H, tracking.W, 3)
            x0, y0, x1, y1 = snap["box"]
            assert crop.shape[:2] == (y1 - y0, x1 - x0)
            assert green_share(frame, (x0, y0, x1, y1)) > 0.8, snap
    finally:
        assert d.stop() == 0, d.log()[-4000:]
    assert "Traceback" not in d.log(), d.log()[-6000:]


def test_hostile_labels_name_files_inside_the_stream_folder(tmp_path: Path) -> None:
    """A classifier's labels file whose names are paths, dots and escapes: each object's files are still
    one name inside its stream's folder, and nothing is written outside it."""
    engines = tmp_path / "engines"
    models.brightness_map(engines / "det" / "1" / "model.onnx")
    hostile = ["../../../evil", "a/b", ".hidden", "..", "/etc/passwd", "x" * 200, "c\\d", "ç ☃", "%2F", "-"]
    (engines / "labels.txt").write_text("\n".join(hostile) + "\n")
    pipeline = classifying("named", "cls").replace('processor = "classify"\nfor_each = "regions"\n',
                                                  'processor = "classify"\nfor_each = "regions"\n'
                                                  'options = { labels = "labels.txt" }\n')
    pipeline = pipeline.replace('name = "named"\n', 'name = "named"\nevents = { min_frames = 3, end_after_s = 1.0, '
                                'snapshots = true }\n', 1)
    d = Daemon(tmp_path, f"""
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"

[[models]]
name = "det"
engine = "det/1/model.onnx"

[[models]]
name = "cls"
engine = "{REPO / 'engines/classifier/1/model.onnx'}"
{pipeline}
[[sinks]]
name = "files"
kind = "jsonl"
options = {{ path = "{tmp_path / 'out' / 'events.jsonl'}" }}
""").start()
    try:
        with dealer(d.endpoint) as sock:
            replay(sock, "named", tracking.crossing(), "cam-b", frames=40)
        done = eventually(lambda: [e for e in events(d) if e["type"] == "end"], "an object's end", timeout_s=60)
        folder = (d.state_dir / "snapshots" / "cam-b").resolve()
        assert {e["label"] for e in done} <= set(hostile) and all(e["label"] for e in done)
        for end in done:
            for key in ("path", "crop"):
                written = Path(jpeg(end["snapshot"][key]) is not None and end["snapshot"][key])
                assert written.resolve().parent == folder and not written.name.startswith("."), written
    finally:
        assert d.stop() == 0, d.log()[-4000:]
    snapshots = d.state_dir / "snapshots"
    assert not [p for p in tmp_path.rglob("*.jpg") if snapshots not in p.parents]
    assert "Traceback" not in d.log(), d.log()[-6000:]


def ctl(d: Daemon, *words: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infermux", "ctl", *words, "--admin", d.admin_endpoint],
                          capture_output=True, text=True, timeout=60, cwd=d.workdir)
