"""Sinks that fail never slow a camera or a client: a webhook that answers 500, one that never answers,
both with their spools at their bound, beside a camera whose tracked objects make the events and a
plain model's client.

The camera is a looping file of tests/support/tracking.py's crossing, into a tracked
pipeline with object events; the endpoints are HTTP servers of the test's. The camera must go on
streaming at its fps (served within 1.5x of it) with no frame failed, the client's requests answered
200, while both webhooks are down and drop their oldest; the `jsonl` sink beside them gets the events.
tests/benchmarks/bench_events.py's `--failing` compares the camera's rate and the client's p99 with
and without such sinks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("av", reason="cameras decode with PyAV: pip install -e '.[cameras]'")
pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from support import models, tracking  # noqa: E402
from support.camera_files import cameras, write_frames  # noqa: E402
from support.harness import Daemon  # noqa: E402
from support.sinks import Endpoint, camera_and_webhooks, valid, waiting  # noqa: E402

pytestmark = pytest.mark.timing  # a camera's rate over a few seconds of a shared box

FPS = 10


def sinks(d: Daemon) -> dict[str, dict[str, Any]]:
    with d.admin() as admin:
        return {s["name"]: s for s in admin.call("sinks")["sinks"]}


def test_a_webhook_answering_500_and_one_never_answering_at_their_bound_leave_the_camera_and_clients_served(
        tmp_path: Path) -> None:
    models.brightness_map(tmp_path / "engines" / "det" / "1" / "model.onnx")
    seq = tracking.crossing()  # bright objects on a dark frame, which the tracked pipeline's detector finds
    clip = write_frames(tmp_path / "crossing.mp4", [seq.frame(i) for i in range(seq.length)], fps=FPS)
    failing, stuck = Endpoint([500]), Endpoint([None])
    d = Daemon(tmp_path, camera_and_webhooks(tmp_path, clip, FPS, failing.url, stuck.url)).start()
    try:
        full = waiting(lambda: (lambda s: s if all(s[n]["state"] == "down" and s[n]["dropped"] > 0
                                                   for n in ("failing", "stuck")) else None)(sinks(d)),
                       "both webhooks down, their spools past their bound", timeout_s=60)
        assert full["failing"]["backlog"] == full["stuck"]["backlog"] == 5
        assert "HTTP 500" in full["failing"]["last_error"] and "timed out" in full["stuck"]["last_error"]
        before, started = cameras(d)["front"], time.monotonic()
        with d.client() as client:
            replies = [client.infer("classifier", {"images": np.zeros((1, 3, 64, 64), np.float32)})
                       for _ in range(50)]
        time.sleep(max(0.0, 5.0 - (time.monotonic() - started)))  # the camera's rate over at least 5 s
        after, seconds = cameras(d)["front"], time.monotonic() - started
        assert {r.status for r in replies} == {200}
        assert after["state"] == "streaming" and after["failed"] == before["failed"], after
        served = (after["served"] - before["served"]) / seconds
        assert served >= FPS / 1.5, f"the camera served {served:.1f} frames/s of its {FPS}"
        made = [valid(json.loads(line)) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        assert {e["key"] for e in made} == {"front"} and {"new", "end"} <= {e["type"] for e in made}
        assert sinks(d)["files"]["state"] == "up"
    finally:
        assert d.stop() == 0, d.log()[-4000:]
        failing.close()
        stuck.close()
    assert "Traceback" not in d.log(), d.log()[-6000:]
