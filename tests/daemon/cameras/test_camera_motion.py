"""A camera's motion boxes travel with its frames to the pipeline: a gated file camera whose pipeline
cuts the frame to them (`roi`) before the model, its results read from a real `zmq` sink; and the
request field `motion` as any client sends it. One daemon for the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import zmq

from infermux.protocol import Frame, decode_reply, encode_request
from support.camera_files import camera, write_clip
from support.harness import DAEMON_HEAD, Daemon, dealer
from support.polling import eventually

pytest.importorskip("av", reason="cameras decode with PyAV: pip install -e '.[cameras]'")
pytest.importorskip("cv2", reason="the pipeline's processors need OpenCV: pip install -e '.[processors]'")

WIDTH, HEIGHT = 160, 120
PIPELINE = """
[[models]]
name = "classifier"
engine = "classifier/1/model.onnx"

[[pipelines]]
name = "cams"
queue_policy = "newest_per_key"
[[pipelines.steps]]
processor = "decode"
[[pipelines.steps]]
processor = "roi"
options = {{ margin = 4 }}
[[pipelines.steps]]
processor = "resize"
options = {{ mode = "stretch", size = [64, 64] }}
[[pipelines.steps]]
processor = "normalize"
[[pipelines.steps]]
model = "classifier"
"""


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, engines: Path) -> Iterator[Daemon]:
    folder = tmp_path_factory.mktemp("camera-motion")
    clip = write_clip(folder / "bar.mp4", WIDTH, HEIGHT, frames=30)  # a bar moving across a dark frame
    sink = (f'[[sinks]]\nname = "pub"\nkind = "zmq"\n'
            f'options = {{{{ bind = "ipc://{folder}/results.sock", results = true }}}}\n')
    gated = camera("front", str(clip)) + "[cameras.gate]\nevery_s = 60\n"
    daemon = Daemon(folder, (DAEMON_HEAD + PIPELINE + sink + gated).format(engines=engines)).start()
    yield daemon
    daemon.stop()


def results(d: Daemon, key: str, count: int) -> list[dict[str, Any]]:
    """The next `count` results of stream `key` the sink publishes."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, f"{key}/result".encode())
    sub.connect(f"ipc://{d.workdir}/results.sock")
    got: list[dict[str, Any]] = []
    try:
        def more() -> bool:  # read what has come, up to `count`: a camera's results never pause for long
            while len(got) < count and sub.poll(100):
                got.append(json.loads(sub.recv_multipart()[1]))
            return len(got) >= count
        eventually(more, f"{count} results of {key}", 30)
    finally:
        sub.close()
    return got


def test_a_gated_cameras_motion_boxes_reach_its_pipeline_with_the_frame(d: Daemon) -> None:
    found = results(d, "front", 10)
    moving = [r for r in found if r.get("motion")]
    assert len(moving) == len(found), found  # a gate sends no frame without saying where it changed
    for result in moving:
        assert result["status"] == 200 and "roi" in result["timing_us"]
        for x0, y0, x1, y1 in result["motion"]:
            assert 0 <= x0 < x1 <= WIDTH and 0 <= y0 < y1 <= HEIGHT, result["motion"]
    # The bar is a few pixels wide: boxes around it, not the whole frame (a keep-alive's).
    narrow = [r for r in moving if all(x1 - x0 <= WIDTH // 4 for x0, _, x1, _ in r["motion"])]
    assert narrow, [r["motion"] for r in moving]


def request(d: Daemon, motion: Any) -> Any:
    image = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    with dealer(d.endpoint) as sock:
        frames = encode_request("cams", {"image": Frame.of(image, "rgb")}, id=1, key="client")
        header = json.loads(bytes(frames[0]))
        header["motion"] = motion
        sock.send_multipart([b"", json.dumps(header).encode(), *frames[1:]])
        assert sock.poll(10_000), "no reply"
        return decode_reply(sock.recv_multipart()[1:])


def test_a_clients_motion_boxes_are_given_to_the_pipeline_and_bad_ones_are_a_400_naming_the_field(d: Daemon) -> None:
    reply = request(d, [[10, 20, 30, 40]])
    assert reply.status == 200 and reply.header["motion"] == [[10, 20, 30, 40]], reply.header
    assert "motion" not in request(d, None).header
    for bad in ([[30, 20, 10, 40]], [[0, 0, 1.5, 2]], "everywhere", [[0, 0, 1, 1]] * 257):
        refused = request(d, bad)
        assert refused.status == 400 and "'motion'" in str(refused.error), (bad, refused.header)
