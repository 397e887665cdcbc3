"""The client library's frames and streams against a real daemon: `Frame` in `Client.infer` and
`Pipeline.submit`, and `Stream`, which keeps one frame in flight and lets a newer frame replace one
not sent yet. The pipeline's one thread holds a frame at the gate processor
(tests/support/fakes/plugins/gate_processor.py) until the test opens it, so what is in flight is certain.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import zmq

from infermux.client import Client, Frame, Pipeline, Stream
from infermux.pipelines.wire import send_frame
from support.harness import Daemon, example
from support.polling import eventually

cv2 = pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

CLASSIFIER = '[[models]]\nname = "classifier"\nengine = "classifier/1/model.onnx"\n'
STEPS = ('[[pipelines.steps]]\nprocessor = "decode"\n'
         '[[pipelines.steps]]\nprocessor = "resize"\noptions = {{ mode = "stretch", size = [64, 64] }}\n'
         '[[pipelines.steps]]\nprocessor = "normalize"\n'
         '[[pipelines.steps]]\nmodel = "classifier"\n'
         '[[pipelines.steps]]\nprocessor = "classify"\noptions = {{ k = 3 }}\n')
RNG = np.random.default_rng(5)


def pipeline(name: str, gate: Path | None = None) -> str:
    held = f'[[pipelines.steps]]\nprocessor = "gate_processor:Gate"\noptions = {{{{ path = "{gate}" }}}}\n' if gate else ""
    return f'[[pipelines]]\nname = "{name}"\nworkers = 1\nqueue_policy = "newest_per_key"\n{held}{STEPS}'


def image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)


def classes(reply) -> list[int]:
    assert reply.status == 200, reply.header
    return [c["index"] for c in reply.header["classes"][0]]


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, engines: Path) -> Iterator[Daemon]:
    from support.harness import DAEMON_HEAD

    workdir = tmp_path_factory.mktemp("client-frames")
    daemon = Daemon(workdir, (DAEMON_HEAD + CLASSIFIER + pipeline("cams")).format(engines=engines)).start()
    yield daemon
    daemon.stop()


def test_a_frame_goes_through_client_and_pipeline_as_the_wire_sends_it(d: Daemon) -> None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(d.endpoint)
    try:
        expected = classes(send_frame(sock, "cams", image(1).tobytes(), "bgr", width=64, height=48))
    finally:
        sock.close()
    with Client(d.endpoint) as client:
        assert classes(client.infer("cams", Frame.of(image(1)), key="gate-1")) == expected  # a bare Frame: "image"
        assert classes(client.infer("cams", {"image": Frame.of(image(1))})) == expected
        gray = client.infer("cams", Frame.of(image(1)[:, :, 0].copy(), "gray"))
        assert gray.status == 200, gray.header
    with Pipeline(d.endpoint) as pipe:  # a key each: none replaces another
        replies = pipe.gather([pipe.submit("cams", Frame.of(image(1)), key=f"cam{k}") for k in range(4)])
    assert [classes(r) for r in replies] == [expected] * 4


def test_a_frame_the_daemon_would_refuse_is_refused_before_it_is_sent(d: Daemon) -> None:
    with Client(d.endpoint) as client:
        with pytest.raises(ValueError, match="is 9216 bytes, got 100"):
            client.infer("cams", Frame(bytes(100), "bgr", width=64, height=48))
        assert client.infer("cams", Frame.of(image(2))).status == 200  # the client goes on


def test_a_frame_sent_to_a_model_is_told_to_go_to_a_pipeline_and_which(d: Daemon) -> None:
    with Client(d.endpoint) as client:
        wrong = client.infer("classifier", Frame.of(image(1)))
        plain = client.infer("classifier", {"x": np.zeros((1, 4), np.float32)})
        assert client.infer("cams", Frame.of(image(1))).status == 200  # the pipeline still takes it
    assert wrong.status == 400, wrong.header
    assert "takes inputs" in wrong.error and "input 'image' is a camera frame" in wrong.error, wrong.error
    assert "send it to a pipeline" in wrong.error and "pipelines that take frames: 'cams' (input 'image')" in wrong.error
    assert plain.status == 400 and "pipeline" not in plain.error, plain.error  # plain tensors: as before


def test_a_whole_frame_classifier_answers_its_classes_and_no_regions(d: Daemon) -> None:
    with Client(d.endpoint) as client:
        reply = client.infer("cams", Frame.of(image(3)))
    assert reply.status == 200 and len(reply.header["classes"][0]) == 3, reply.header
    assert "regions" not in reply.header, reply.header  # docs/pipelines.md: `classes` instead
    png = d.workdir / "frame.png"
    png.write_bytes(cv2.imencode(".png", image(3))[1].tobytes())
    out = subprocess.run([sys.executable, "-m", "infermux", "infer", "cams", "--image", str(png), "-e", d.endpoint],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    best = reply.header["classes"][0][0]
    assert f"  {best['label'] or best['index']!r} {best['score']:.3f}, " in out.stdout, out.stdout  # a line per row


def test_a_stream_keeps_one_frame_in_flight_and_the_newest_waiting_and_tells_the_daemon_what_it_replaced(
        make_daemon, tmp_path: Path) -> None:
    gate = tmp_path / "open"
    d = make_daemon(CLASSIFIER + pipeline("held", gate))
    with Stream(d.endpoint, "held", key="gate-7", timeout_s=30) as camera:
        assert camera.latest() is None
        camera.send(Frame.of(image(0)))
        eventually(lambda: gate.with_suffix(".entered").exists(), "the first frame at the gate")
        for seed in range(1, 6):  # the daemon holds the first: each of these waits here, the next replaces it
            camera.send(Frame.of(image(seed)))
        assert (camera.counts.sent, camera.counts.replaced) == (1, 4)
        gate.touch()
        last = camera.wait(30)
        assert last is not None and last is camera.latest()
        assert last.header["id"] == 6  # the newest frame's: sent once the first was answered
        assert classes(last) == classes(Client(d.endpoint).infer("held", Frame.of(image(5))))
        assert (camera.counts.sent, camera.counts.replies, camera.counts.served) == (2, 2, 2)
    with d.admin() as admin:
        (stream,) = [s for s in admin.call("streams")["streams"] if s["key"] == "gate-7"]
    # The daemon saw what the stream sent, nothing to supersede: the replacing was done on the client,
    # which said so with its second request.
    assert (stream["received"], stream["served"], stream["superseded"]) == (2, 2, 0)
    assert stream["replaced_by_client"] == 4
    out = subprocess.run([sys.executable, "-m", "infermux", "ctl", "streams", "--config", str(d.config_path),
                          "--runtime-dir", str(d.run_dir)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    head, row = out.stdout.splitlines()[0].split(), next(line for line in out.stdout.splitlines() if "held/gate-7" in line)
    counts = dict(zip(head[1:7], row.split()[1:7]))
    assert counts == {"RECEIVED": "2", "SERVED": "2", "409": "0", "REFUSED": "0", "FAILED": "0", "CLIENT": "4"}, out.stdout


def test_a_stream_to_a_model_sends_its_tensor_as_the_named_input(make_daemon) -> None:
    d = make_daemon('[[models]]\nname = "fast"\nengine = "fast512/1/model.onnx"\n')
    x = RNG.random((1, 512), dtype=np.float32)
    seen = []
    with Stream(d.endpoint, "fast", key="sensor-1", input="x", on_reply=seen.append) as sensor:
        for k in range(3):
            sensor.send(x + k)
            sensor.wait(10)
        latest = sensor.latest()
    assert latest is not None and latest.status == 200
    np.testing.assert_allclose(latest.outputs["y"], x + 2, rtol=1e-6)
    assert [r.status for r in seen] == [200, 200, 200]


def test_a_stream_gives_up_a_request_that_is_not_answered_and_goes_on(tmp_path: Path) -> None:
    # Nothing listens: the request times out, the stream counts it and stays usable.
    with Stream(f"ipc://{tmp_path}/nobody.sock", "fast", key="k", timeout_s=0.2) as lonely:
        lonely.send({"x": np.zeros((1, 4), np.float32)})
        assert lonely.wait(5) is None and lonely.counts.timeouts == 1 and lonely.counts.sent == 1


def test_the_camera_example_keeps_only_the_images_a_reply_can_still_come_for(make_daemon, tmp_path: Path) -> None:
    camera_ocr = example("camera_ocr")
    gate = tmp_path / "open"
    d = make_daemon(CLASSIFIER + pipeline("held", gate))
    camera = camera_ocr.Camera(0)
    held = []
    with Stream(d.endpoint, "held", key="camera-0", timeout_s=30, on_reply=camera.answered,
                on_dropped=camera.dropped) as stream:
        camera.take(stream, 0, image(0))
        eventually(lambda: gate.with_suffix(".entered").exists(), "the first frame at the gate")
        for n in range(1, 300):  # the first is held: each of these waits on the client and the next replaces it
            camera.take(stream, n, image(n % 5))
            held.append(len(camera.taken))
        gate.touch()
        assert stream.wait(30) is not None
        assert (stream.counts.sent, stream.counts.replaced, stream.counts.served) == (2, 298, 2)
    assert max(held) == 2  # the frame in flight and the one waiting, not one image per frame taken
    assert camera.taken == {} and len(camera.latencies) == 2  # both answers were seen, nothing else is kept


def test_a_stream_tells_of_every_id_that_will_never_get_a_reply(tmp_path: Path) -> None:
    dropped: list[int] = []
    with Stream(f"ipc://{tmp_path}/nobody.sock", "fast", key="k", timeout_s=0.2, on_dropped=dropped.append) as lonely:
        first = lonely.send({"x": np.zeros((1, 4), np.float32)})
        eventually(lambda: lonely.counts.sent == 1, "the first request sent")
        replaced = [lonely.send({"x": np.zeros((1, 4), np.float32)}) for _ in range(3)][:-1]
        assert dropped[:2] == replaced  # told at once, on the caller's thread, before `send` returned
        eventually(lambda: first in dropped, "the unanswered request given up")
