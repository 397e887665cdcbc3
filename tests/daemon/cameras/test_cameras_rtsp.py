"""RTSP cameras through an outage, beside cameras that never work, as other clients see it.

One daemon for the file with four cameras: `door` and `hall` on two real RTSP servers (GStreamer's, each
its own process, H.264 the test made), `junk` on a port that answers garbage, `mute` on a port that takes
the connection and never answers; and a plain client of the camera pipeline's model. `door`'s server is
stopped for ten seconds and started again on its port: `door` is lost and served again within 3 s of the
return, while `hall` and the plain client are served throughout, without an error status.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from support import rtsp
from support.camera_files import camera, camera_events, cameras
from support.harness import DAEMON_HEAD, Daemon
from support.pipelines import CLASSIFIER_MODEL, camera_pipeline
from support.polling import eventually

pytest.importorskip("av", reason="cameras decode with PyAV: pip install -e '.[cameras]'")
pytest.importorskip("cv2", reason="the pipeline's processors need OpenCV: pip install -e '.[processors]'")

OUTAGE_S = 10.0  # how long door's server is away
BACK_WITHIN_S = 3.0  # a camera that comes back is served again within this (docs/cameras.md)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    clip = rtsp.make_clip(tmp_path_factory.mktemp("rtsp-clips"), 160, 120, fps=15, seconds=2)
    with (rtsp.serve(clip, path="/door") as door, rtsp.serve(clip, path="/hall") as hall,
          rtsp.garbage() as junk, rtsp.silent() as mute):
        yield {"door": door, "hall": hall, "junk": junk, "mute": mute}


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, engines: Path, servers: dict[str, Any]) -> Iterator[Daemon]:
    cameras = (camera("door", servers["door"].url, transport="tcp") + camera("hall", servers["hall"].url)
               + camera("junk", f"rtsp://127.0.0.1:{servers['junk']}/cam")
               + camera("mute", f"rtsp://127.0.0.1:{servers['mute']}/cam"))
    daemon = Daemon(tmp_path_factory.mktemp("cameras-rtsp"),
                    (DAEMON_HEAD + CLASSIFIER_MODEL + camera_pipeline("cams") + cameras).format(engines=engines)).start()
    yield daemon
    daemon.stop()


def served(d: Daemon) -> dict[str, int]:
    """Frames served per camera, from the daemon's own table of the pipeline's streams (not a sampled view)."""
    with d.admin() as admin:
        return {s["key"]: s["served"] for s in admin.call("streams", model="cams")["streams"]}


class PlainClient:
    """A client of the model alone, sending one request after another while the block runs."""

    def __init__(self, d: Daemon) -> None:
        self.d, self.statuses, self.stop = d, [], threading.Event()
        self.thread = threading.Thread(target=self.run, name="plain-client")

    def run(self) -> None:
        image = np.zeros((1, 3, 64, 64), np.float32)
        with self.d.client() as client:
            while not self.stop.is_set():
                self.statuses.append(client.infer("classifier", {"images": image}).status)
                self.stop.wait(0.02)

    def __enter__(self) -> PlainClient:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


@pytest.mark.timing
def test_an_rtsp_outage_is_lost_and_served_again_within_3_s_of_the_return_and_nobody_else_notices(
        d: Daemon, servers: dict[str, Any]) -> None:
    eventually(lambda: (s := served(d)).get("door", 0) >= 5 and s.get("hall", 0) >= 5, "door and hall served", 30)
    with PlainClient(d) as plain:
        servers["door"].stop()
        stopped = time.monotonic()
        lost = eventually(lambda: camera_events(d, "camera_lost", "door"), "camera_lost for door", 30)
        assert lost[0]["reason"]
        hall_during = served(d)["hall"]
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped)))  # the outage's length, not an outcome
        before = served(d)
        assert before["hall"] > hall_during, "hall was not served while door's server was away"
        servers["door"].start()
        returned = time.monotonic()
        eventually(lambda: served(d)["door"] > before["door"], "door served again", 30)
        again_s = time.monotonic() - returned
        back = eventually(lambda: camera_events(d, "camera_back", "door"), "camera_back for door", 30)
    print(f"door: served again {again_s:.2f} s after its RTSP server listened again")
    assert again_s <= BACK_WITHIN_S, f"door served again {again_s:.2f} s after its server returned"
    assert back[-1]["time"] >= lost[0]["time"]
    assert not camera_events(d, "camera_lost", "hall") and cameras(d)["hall"]["state"] == "streaming"
    assert plain.statuses and set(plain.statuses) == {200}, sorted(set(plain.statuses))


def test_a_port_that_answers_garbage_and_one_that_never_answers_are_lost_with_reasons(d: Daemon) -> None:
    for name in ("junk", "mute"):
        lost = eventually(lambda: camera_events(d, "camera_lost", name), f"camera_lost for {name}", 30)
        assert lost[0]["reason"], lost[0]
        assert cameras(d)[name]["decoded"] == 0
    assert cameras(d)["hall"]["state"] == "streaming"
