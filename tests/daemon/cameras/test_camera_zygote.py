"""Camera processes are forked from the cameras' zygote (cameras/zygote.py): a restart is a fork of the
process that imported everything once, never a new interpreter; a zygote killed takes its cameras with
it, and they come back from a new one; nothing is left running once the daemon stops.

One daemon for the file, two file cameras; the tests run in order (the last stops the daemon)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from support.camera_files import camera, camera_events, cameras, write_clip
from support.harness import DAEMON_HEAD, Daemon
from support.pipelines import CLASSIFIER_MODEL, camera_pipeline
from support.polling import eventually

pytest.importorskip("av", reason="cameras decode with PyAV: pip install -e '.[cameras]'")
pytest.importorskip("cv2", reason="the pipeline's processors need OpenCV: pip install -e '.[processors]'")

@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, engines: Path) -> Iterator[Daemon]:
    folder = tmp_path_factory.mktemp("zygote")
    clip = write_clip(folder / "small.mp4", 64, 48, frames=30)
    text = DAEMON_HEAD + CLASSIFIER_MODEL + camera_pipeline("cams") + camera("left", str(clip)) + camera("right", str(clip))
    daemon = Daemon(tmp_path_factory.mktemp("daemon"), text.format(engines=engines)).start()
    yield daemon
    daemon.stop()


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def is_zygote(pid: int) -> bool:
    return b"infermux.cameras.zygote" in Path(f"/proc/{pid}/cmdline").read_bytes()


def gone(pid: int) -> bool:
    """No such process, or one that ended and waits to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def streaming(d: Daemon, name: str, other_than: int | None = None) -> dict[str, Any]:
    return eventually(lambda: (c := cameras(d)[name])["state"] == "streaming" and c["pid"] not in (None, other_than)
                      and c["served"] > 0 and c, f"camera {name} streaming and served", 30)


def test_a_killed_camera_is_forked_again_by_the_same_zygote(d: Daemon) -> None:
    left, right = streaming(d, "left"), streaming(d, "right")
    zygote = parent(left["pid"])
    assert is_zygote(zygote) and parent(right["pid"]) == zygote and parent(zygote) == d.proc.pid  # type: ignore[union-attr]
    lost_before = len(camera_events(d, "camera_lost", "left"))
    os.kill(left["pid"], signal.SIGKILL)
    again = streaming(d, "left", other_than=left["pid"])
    assert parent(again["pid"]) == zygote and again["restarts"] == left["restarts"] + 1
    lost = camera_events(d, "camera_lost", "left")[lost_before:]
    assert lost and "killed by SIGKILL" in lost[0]["reason"]  # the exit status, as the zygote reaped it
    started = camera_events(d, "camera_started", "left")
    assert started[-1]["pid"] == again["pid"]
    assert cameras(d)["right"]["pid"] == right["pid"]


def test_a_killed_zygote_takes_its_cameras_with_it_and_they_come_back_from_another(d: Daemon) -> None:
    left, right = streaming(d, "left"), streaming(d, "right")
    zygote = parent(left["pid"])
    with d.client() as client:
        os.kill(zygote, signal.SIGKILL)
        new_left = streaming(d, "left", other_than=left["pid"])
        new_right = streaming(d, "right", other_than=right["pid"])
        status = client.infer("classifier", {"images": np.zeros((1, 3, 64, 64), np.float32)}).status
    assert status == 200
    eventually(lambda: gone(left["pid"]) and gone(right["pid"]), "the old zygote's cameras ended", 10)
    zygote_now = parent(new_left["pid"])
    assert zygote_now != zygote and is_zygote(zygote_now) and parent(new_right["pid"]) == zygote_now
    assert camera_events(d, "camera_lost", "left") and camera_events(d, "camera_lost", "right")


def test_nothing_of_the_cameras_runs_once_the_daemon_stopped(d: Daemon) -> None:
    left, right = streaming(d, "left"), streaming(d, "right")
    zygote = parent(left["pid"])
    assert d.stop() == 0
    eventually(lambda: all(gone(pid) for pid in (zygote, left["pid"], right["pid"])), "no camera process left", 10)
