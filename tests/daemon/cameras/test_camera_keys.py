"""Cameras under `[daemon] stream_keys = "bound"`, through a SIGKILL of their process and a drain, and
the capture-to-result age percentiles they show: one daemon for the file, two file cameras on a camera
pipeline of the sample model; the tests run in order and each leaves both cameras streaming."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from infermux.client import Frame
from support.camera_files import camera, camera_events, cameras, write_clip
from support.harness import DAEMON_HEAD, Daemon, free_port
from support.pipelines import CLASSIFIER_MODEL, camera_pipeline
from support.polling import eventually

pytest.importorskip("av", reason="cameras decode with PyAV: pip install -e '.[cameras]'")
pytest.importorskip("cv2", reason="the pipeline's processors need OpenCV: pip install -e '.[processors]'")

METRICS_PORT = free_port()
# A long hold: a restarted camera process that had to wait for its old connection's hold to end would be
# refused for all of it.
HOLD_S = 30


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, engines: Path) -> Iterator[Daemon]:
    clip = write_clip(tmp_path_factory.mktemp("clips") / "small.mp4", 64, 48, frames=30)
    head = DAEMON_HEAD + f'stream_keys = "bound"\nstream_silent_s = {HOLD_S}\nmetrics_port = {METRICS_PORT}\n'
    text = head + CLASSIFIER_MODEL + camera_pipeline("cams") + camera("front", str(clip)) + camera("back", str(clip))
    daemon = Daemon(tmp_path_factory.mktemp("camera-keys"), text.format(engines=engines)).start()
    yield daemon
    daemon.stop()


def streaming(d: Daemon, name: str, served: int = 1) -> dict[str, Any]:
    return eventually(lambda: (c := cameras(d).get(name)) and c["state"] == "streaming" and c["served"] >= served
                      and c, f"camera {name} streaming with {served} served", 30)


def stream(d: Daemon, key: str) -> dict[str, Any]:
    with d.admin() as admin:
        return {s["key"]: s for s in admin.call("streams", model="cams")["streams"]}[key]


@pytest.mark.timing
def test_a_camera_process_killed_under_bound_keys_is_served_on_its_own_key_at_once(d: Daemon) -> None:
    back = streaming(d, "back", 3)
    os.kill(back["pid"], signal.SIGKILL)
    again = eventually(lambda: (c := cameras(d)["back"])["pid"] not in (None, back["pid"]) and c["served"] >
                       back["served"] + 3 and c, "back restarted and served again", HOLD_S - 5)
    assert again["failed"] == back["failed"], again["last_error"]  # no 403: the key is still the camera's
    assert stream(d, "back")["foreign"] == 0


def test_a_client_sending_a_cameras_key_is_refused_while_the_camera_holds_it(d: Daemon) -> None:
    streaming(d, "front", 3)
    with d.client() as client:
        reply = client.infer("cams", Frame.of(np.zeros((48, 64, 3), np.uint8), "rgb"), key="front")
    assert reply.status == 403 and "belongs to another client" in str(reply.error)


@pytest.mark.timing
def test_frames_refused_while_the_daemon_drains_are_counted_refused_not_failed_nor_reconnects(d: Daemon) -> None:
    before = {name: streaming(d, name, 3) for name in ("front", "back")}
    lost = {name: len(camera_events(d, "camera_lost", name)) for name in before}
    with d.admin() as admin:
        admin.call("drain")
    try:
        during = {name: eventually(lambda n=name: (c := cameras(d)[n])["refused"] >= before[n]["refused"] + 3 and c,
                                   f"{name}'s frames refused while the daemon drains", 30) for name in before}
    finally:
        with d.admin() as admin:
            admin.call("resume")
    for name, then in before.items():
        now = streaming(d, name, during[name]["served"] + 3)
        assert now["failed"] == then["failed"] and now["reconnects"] == then["reconnects"], (then, now)
        assert now["pid"] == then["pid"] and now["state"] == "streaming"
        assert len(camera_events(d, "camera_lost", name)) == lost[name]
        assert not str(now["last_error"]).startswith("503"), now["last_error"]


def test_the_capture_to_result_age_has_its_p95_in_ctl_cameras_and_prometheus(d: Daemon) -> None:
    front = eventually(lambda: (c := cameras(d)["front"])["capture_age_ms"].get("p95") is not None and c,
                       "front's capture age p95", 30)
    ages = front["capture_age_ms"]
    assert ages["p50"] <= ages["p95"] <= ages["p99"], ages
    out = subprocess.run([sys.executable, "-m", "infermux", "ctl", "cameras", "-c", str(d.config_path),
                          "--runtime-dir", str(d.run_dir)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "AGE P95" in out.stdout.splitlines()[0], out.stdout + out.stderr
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10) as page:
        metrics = page.read().decode()
    assert 'infermux_camera_capture_age_seconds{camera="front",quantile="0.95"}' in metrics
