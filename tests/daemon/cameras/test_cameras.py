"""The daemon's own cameras, end to end: one daemon reading generated clips (and a URL that never
answers) through real camera processes, their frames served by a real pipeline on the sample model.

One daemon for the file; the tests run in order and each leaves the others' cameras as they were
(the last restarts the daemon, to see a live change kept)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from support.camera_files import camera, camera_events, cameras, write_clip
from support.harness import DAEMON_HEAD, Daemon, free_port
from support.pipelines import CLASSIFIER_MODEL, camera_pipeline
from support.polling import eventually

pytest.importorskip("av", reason="cameras decode with PyAV: pip install -e '.[cameras]'")
pytest.importorskip("cv2", reason="the pipeline's processors need OpenCV: pip install -e '.[processors]'")

METRICS_PORT = free_port()


def configuration(clips: Path, engines: Path, *, extra: str = "", without: str = "", back_fps: float = 15.0) -> str:
    cameras = {
        "front": camera("front", str(clips / "small.mp4")),
        "back": camera("back", str(clips / "small.mp4"), fps=back_fps),
        "once": camera("once", str(clips / "small.mp4"), loop=False),
        "far": camera("far", f"rtsp://127.0.0.1:{free_port()}/never", transport="tcp"),
        "big": camera("big", str(clips / "big.mp4"), max_pixels=10_000),
        "still": camera("still", str(clips / "still.mp4")) + "[cameras.gate]\nevery_s = 60\n",
    }
    text = "".join(entry for name, entry in cameras.items() if name != without)
    head = DAEMON_HEAD + f"metrics_port = {METRICS_PORT}\n"
    return (head + CLASSIFIER_MODEL + camera_pipeline("cams") + text + extra).format(engines=engines)


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("clips")
    write_clip(folder / "small.mp4", 64, 48, frames=30)
    write_clip(folder / "big.mp4", 320, 240, frames=5)
    write_clip(folder / "still.mp4", 64, 48, frames=15, moving=False)
    return folder


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, engines: Path, clips: Path) -> Iterator[Daemon]:
    daemon = Daemon(tmp_path_factory.mktemp("cameras"), configuration(clips, engines)).start()
    yield daemon
    daemon.stop()


def streaming(d: Daemon, name: str) -> dict[str, Any]:
    return eventually(lambda: (c := cameras(d).get(name)) and c["state"] == "streaming" and c["served"] > 0 and c,
                      f"camera {name} streaming and served", 30)


def test_a_file_camera_is_served_as_the_stream_of_its_name_with_its_capture_age(d: Daemon) -> None:
    front = streaming(d, "front")
    assert front["pipeline"] == "cams" and front["decoded"] >= front["sent"] > 0

    def stream() -> dict[str, Any] | None:
        with d.admin() as admin:
            found = {s["key"]: s for s in admin.call("streams", model="cams")["streams"]}
        entry = found.get("front")
        return entry if entry and entry["served"] >= 3 and entry["capture_age_ms"]["p50"] is not None else None

    entry = eventually(stream, "front's frames served on the stream `front` of `cams`")
    assert entry["failed"] == 0 and entry["capture_age_ms"]["p99"] >= entry["capture_age_ms"]["p50"] > 0
    out = subprocess.run([sys.executable, "-m", "infermux", "ctl", "cameras", "-c", str(d.config_path),
                          "--runtime-dir", str(d.run_dir)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "front" in out.stdout and "streaming" in out.stdout, out.stdout + out.stderr
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10) as page:
        metrics = page.read().decode()
    assert 'infermux_camera_up{camera="front"} 1' in metrics
    assert 'infermux_camera_frames_total{camera="front",what="served"}' in metrics
    assert 'infermux_camera_fps{camera="back"} 15' in metrics  # what InfermuxCameraBelowFps compares with


@pytest.mark.timing
@pytest.mark.parametrize("sig, why", [(signal.SIGKILL, "killed by SIGKILL"), (signal.SIGSTOP, "hung")],
                         ids=["SIGKILL", "SIGSTOP"])
def test_a_camera_process_killed_or_stopped_is_restarted_and_nothing_else_notices(d: Daemon, sig: int,
                                                                                  why: str) -> None:
    back, front = streaming(d, "back"), streaming(d, "front")
    lost_before = len(camera_events(d, "camera_lost", "back"))
    statuses: list[int] = []
    stop = threading.Event()

    def plain_client() -> None:
        with d.client() as client:
            while not stop.is_set():
                statuses.append(client.infer("classifier", {"images": np.zeros((1, 3, 64, 64), np.float32)}).status)

    worker = threading.Thread(target=plain_client)
    worker.start()
    try:
        os.kill(back["pid"], sig)
        lost = eventually(lambda: camera_events(d, "camera_lost", "back")[lost_before:], "camera_lost for back", 30)
        assert why in lost[0]["reason"]
        again = eventually(lambda: (c := cameras(d)["back"])["pid"] not in (None, back["pid"]) and
                           c["state"] == "streaming" and c, "back restarted and streaming", 30)
        assert again["restarts"] > back["restarts"] and camera_events(d, "camera_back", "back")
    finally:
        stop.set()
        worker.join()
    assert cameras(d)["front"]["pid"] == front["pid"] and not camera_events(d, "camera_lost", "front")
    assert statuses and set(statuses) == {200}, sorted(set(statuses))


def test_a_gated_camera_of_a_still_scene_sends_its_first_frame_and_gates_out_the_rest(d: Daemon) -> None:
    still = eventually(lambda: (c := cameras(d)["still"])["gated"] >= 10 and c, "still's frames gated out", 30)
    assert still["sent"] == 1 and still["served"] == 1 and still["taken"] == still["gated"] + still["sent"]


def test_a_file_played_once_ends_with_camera_ended(d: Daemon) -> None:
    ended = eventually(lambda: camera_events(d, "camera_ended", "once"), "camera_ended for once", 30)
    assert ended[0]["reason"] == "the file ended" and cameras(d)["once"]["state"] == "ended"


def test_an_rtsp_url_that_never_answers_is_lost_with_its_reason_and_retried(d: Daemon) -> None:
    lost = eventually(lambda: camera_events(d, "camera_lost", "far"), "camera_lost for far", 30)
    assert "Connection refused" in lost[0]["reason"] and "rtsp://127.0.0.1" in lost[0]["reason"]
    far = eventually(lambda: (c := cameras(d)["far"])["reconnects"] >= 3 and c, "far retried", 30)
    assert far["state"] == "lost" and len(camera_events(d, "camera_lost", "far")) == 1  # one event per loss, not per try


def test_a_stream_over_max_pixels_is_refused_naming_the_limit(d: Daemon) -> None:
    refused = eventually(lambda: camera_events(d, "camera_refused", "big"), "camera_refused for big", 30)
    assert "320x240" in refused[0]["reason"] and "max_pixels (10000)" in refused[0]["reason"]
    big = cameras(d)["big"]
    assert big["state"] == "refused" and big["decoded"] == 0


def test_a_reload_adds_removes_and_restarts_only_the_cameras_it_changes(d: Daemon, engines: Path,
                                                                        clips: Path) -> None:
    front, back = streaming(d, "front"), streaming(d, "back")
    d.config_path.write_text(configuration(clips, engines, without="far", back_fps=10.0,
                                           extra=camera("side", str(clips / "small.mp4")).format()))
    with d.admin() as admin:
        changes = admin.call("reload")["changes"]
    assert changes["cameras_restarted"] == ["back"]  # what the planner reads from the declarations ...
    streaming(d, "side")
    eventually(lambda: "far" not in cameras(d), "far gone")
    eventually(lambda: (c := cameras(d)["back"])["state"] == "streaming" and c["pid"] != back["pid"],
               "back restarted with its new fps", 30)
    assert cameras(d)["front"]["pid"] == front["pid"]  # ... and the cameras do: front runs on untouched
    assert camera_events(d, "camera_stopped", "far")[0]["reason"] == "removed"
    assert camera_events(d, "camera_stopped", "back")[-1]["reason"] == "changed"


def test_ctl_camera_disable_and_enable_work_live_and_are_kept_across_a_restart(d: Daemon) -> None:
    pid = eventually(lambda: (c := streaming(d, "front"))["capture_age_ms"]["p50"] is not None and c,
                     "front's ages shown")["pid"]
    assert d.ctl("camera", "front", "disable").returncode == 0
    eventually(lambda: cameras(d)["front"]["state"] == "disabled", "front disabled")
    eventually(lambda: not _alive(pid), "front's process gone")
    assert cameras(d)["front"]["capture_age_ms"] == {"p50": None, "p95": None, "p99": None}  # none current
    assert streaming(d, "back")
    bad = d.ctl("camera", "nowhere", "disable")
    assert bad.returncode == 1 and "no camera 'nowhere'" in bad.stderr
    d.stop()
    d.start()
    eventually(lambda: cameras(d).get("front", {}).get("state") == "disabled", "front still disabled")
    streaming(d, "back")
    assert d.ctl("camera", "front", "enable").returncode == 0
    streaming(d, "front")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
