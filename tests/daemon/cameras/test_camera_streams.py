"""The daemon's cameras on real network cameras: GStreamer's RTSP server in its own process serving
H.264 the test made, an HTTP MJPEG server, and a port that answers garbage; one daemon for the file."""

from __future__ import annotations

import itertools
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from infermux.cameras.config import CameraConfig
from infermux.cameras.source import open_source
from support import mjpeg, rtsp
from support.camera_files import camera, camera_events, cameras
from support.harness import DAEMON_HEAD, Daemon
from support.pipelines import CLASSIFIER_MODEL, camera_pipeline
from support.polling import eventually

pytest.importorskip("av", reason="cameras decode with PyAV: pip install -e '.[cameras]'")
pytest.importorskip("cv2", reason="the pipeline's processors need OpenCV: pip install -e '.[processors]'")

BACK_WITHIN_S = 3.0  # a camera that comes back is served again within this (docs/cameras.md)
SLICED, SLICES = (320, 180), 4  # a clip whose every frame is cut into this many slices (NAL units)
# How far (mean absolute difference, 0-255) a decoded frame may be from the nearest frame the clip was made
# of: the encoder's loss is a few levels; a frame cut off after its first slice is grey-green below it.
WHOLE_FRAME_DIFF = 12.0


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("rtsp-clips")
    clip = rtsp.make_clip(folder, 160, 120, fps=15, seconds=2)
    sliced = rtsp.make_clip(folder, SLICED[0], SLICED[1], fps=15, seconds=2, slices=SLICES)
    with (rtsp.serve(clip) as server, rtsp.serve(sliced, path="/sliced") as sliced_server,
          mjpeg.serve(160, 120, fps=15, seconds=1) as http, rtsp.garbage() as junk):
        yield {"rtsp": server, "sliced": sliced_server, "mjpeg": http, "junk": junk}


def gi_path(folder: Path) -> Path | None:
    """A folder holding only the system's GStreamer bindings (`gi`, for its Python), for the daemon's
    PYTHONPATH: the cameras' decoder = "gstreamer" path imports them. None where they are missing."""
    found = subprocess.run([rtsp.DEBIAN_PYTHON, "-c", "import gi; print(gi.__path__[0])"], capture_output=True,
                           text=True)
    if found.returncode != 0:
        return None
    (folder / "gi").symlink_to(found.stdout.strip())
    return folder


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, engines: Path, servers: dict[str, Any]) -> Iterator[Daemon]:
    cameras = (camera("door", servers["rtsp"].url, transport="tcp") + camera("hall", servers["mjpeg"].url)
               + camera("junk", f"rtsp://127.0.0.1:{servers['junk']}/cam")
               + camera("sliced", servers["sliced"].url, transport="tcp", decoder="software"))
    gi = gi_path(tmp_path_factory.mktemp("gi"))
    if gi is not None:
        cameras += camera("porch", servers["rtsp"].url, decoder="gstreamer")
        # Over max_pixels as the stream sends it, under it once scaled to `size`: refused all the same.
        cameras += camera("attic", servers["rtsp"].url, decoder="gstreamer", size=[32, 24], max_pixels=10_000)
    cameras += camera("cellar", servers["rtsp"].url, decoder="software", size=[32, 24], max_pixels=10_000)
    daemon = Daemon(tmp_path_factory.mktemp("camera-streams"),
                    (DAEMON_HEAD + CLASSIFIER_MODEL + camera_pipeline("cams") + cameras).format(engines=engines),
                    env={"PYTHONPATH": str(gi)} if gi is not None else None).start()
    yield daemon
    daemon.stop()


def served(d: Daemon, name: str) -> int:
    return int(cameras(d)[name]["served"])


def test_an_rtsp_camera_decoded_by_gstreamer_is_served(d: Daemon) -> None:
    if "porch" not in d.config_path.read_text():
        pytest.skip("GStreamer's Python bindings (python3-gi) are not installed")
    porch = eventually(lambda: (c := cameras(d)["porch"])["served"] >= 3 and c, "porch served through GStreamer", 30)
    assert porch["state"] == "streaming" and porch["decode_ms"] is not None


@pytest.mark.timing
def test_an_rtsp_camera_that_goes_away_is_lost_and_served_again_soon_after_it_returns(
        d: Daemon, servers: dict[str, Any]) -> None:
    server = servers["rtsp"]
    eventually(lambda: served(d, "door") >= 5, "door served over RTSP", 30)
    server.stop()
    lost = eventually(lambda: camera_events(d, "camera_lost", "door"), "camera_lost for door", 30)
    assert "closed the stream" in lost[0]["reason"] or "rtsp://127.0.0.1" in lost[0]["reason"]
    eventually(lambda: cameras(d)["door"]["reconnects"] >= 3, "door retried while its server is down", 30)
    before = served(d, "door")
    server.start()
    returned = time.time()
    back = eventually(lambda: camera_events(d, "camera_back", "door"), "camera_back for door", 30)
    eventually(lambda: served(d, "door") > before, "door served again", 30)
    print(f"door: camera_back {back[0]['time'] - returned:.2f} s after its RTSP server listened again")  # RESULTS.md
    assert back[0]["time"] - returned <= BACK_WITHIN_S, f"frames flowed {back[0]['time'] - returned:.2f} s after"


def test_an_http_mjpeg_camera_is_served(d: Daemon) -> None:
    hall = eventually(lambda: (c := cameras(d)["hall"])["served"] >= 3 and c, "hall served over MJPEG", 30)
    assert hall["state"] == "streaming" and not camera_events(d, "camera_lost", "hall")


def test_a_server_that_answers_garbage_is_lost_with_a_reason_and_the_others_go_on(d: Daemon) -> None:
    lost = eventually(lambda: camera_events(d, "camera_lost", "junk"), "camera_lost for junk", 30)
    assert lost[0]["reason"] and cameras(d)["junk"]["decoded"] == 0
    assert cameras(d)["hall"]["state"] == "streaming"


def test_an_rtsp_camera_whose_frames_come_in_several_slices_is_decoded_whole_and_served(
        d: Daemon, servers: dict[str, Any]) -> None:
    sliced = eventually(lambda: (c := cameras(d)["sliced"])["served"] >= 5 and c["fps_decoded"] > 0 and c,
                        "sliced served", 30)
    assert sliced["state"] == "streaming" and not camera_events(d, "camera_lost", "sliced")
    # Each access unit is one frame: a decoder handed each slice as a frame decodes SLICES times the rate.
    assert sliced["fps_decoded"] <= 15 * 1.5, sliced
    # What the camera's decoder makes of them, against the frames the clip was encoded from.
    scenes = [frame[:, :, ::-1].astype(np.int16) for frame in rtsp.scene(*SLICED, 30, 15)]
    source = open_source(CameraConfig(name="probe", url=servers["sliced"].url, pipeline="cams", transport="tcp",
                                      decoder="software"))
    diffs = []
    for frame in itertools.islice(source.frames(), 10):
        diffs.append(min(float(np.abs(frame.image.astype(np.int16) - s).mean()) for s in scenes))
    source.close()
    assert len(diffs) == 10 and max(diffs) <= WHOLE_FRAME_DIFF, diffs


@pytest.mark.parametrize("name, decoder", [("cellar", "software"), ("attic", "gstreamer")])
def test_a_stream_over_max_pixels_is_refused_naming_the_limit_before_a_frame_is_decoded(d: Daemon, name: str,
                                                                                        decoder: str) -> None:
    if name not in d.config_path.read_text():
        pytest.skip("GStreamer's Python bindings (python3-gi) are not installed")
    refused = eventually(lambda: camera_events(d, "camera_refused", name), f"camera_refused for {name}", 30)
    assert "max_pixels (10000)" in refused[0]["reason"] and "160x120" in refused[0]["reason"], refused[0]
    entry = eventually(lambda: (c := cameras(d)[name])["state"] == "refused" and c, f"{name} shown refused", 10)
    assert entry["decoded"] == 0 and entry["sent"] == 0, entry
