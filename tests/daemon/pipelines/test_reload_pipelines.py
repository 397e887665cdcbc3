"""Reload (SIGHUP, `ctl reload`) and pipelines on a real daemon: added, removed and changed ones apply,
a frame in flight finishes on the definition it started on, a broken section refuses the reload.

The pipelines run the test classifier (decode → resize → normalize → classifier → classify); `k`
classes per frame tells which definition answered. A frame is held inside a pipeline by a test
processor (tests/support/fakes/plugins/gate_processor.py) until the test opens its gate.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

cv2 = pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from infermux.pipelines.wire import send_frame  # noqa: E402
from support.polling import eventually  # noqa: E402


def png(image: np.ndarray) -> bytes:
    return cv2.imencode(".png", image)[1].tobytes()


RELOADED = """
[[models]]
name = "classifier"
engine = "classifier/1/model.onnx"
{pipelines}
"""


def classify_pipeline(name: str, k: int, gate: Path | None = None) -> str:
    """A small pipeline on the test classifier: `k` classes per frame, held at a gate when given."""
    held = f'[[pipelines.steps]]\nprocessor = "gate_processor:Gate"\noptions = {{ path = "{gate}" }}\n' if gate else ""
    return (f'[[pipelines]]\nname = "{name}"\n[[pipelines.steps]]\nprocessor = "decode"\n{held}'
            '[[pipelines.steps]]\nprocessor = "resize"\noptions = { size = [64, 64] }\n'
            '[[pipelines.steps]]\nprocessor = "normalize"\n[[pipelines.steps]]\nmodel = "classifier"\n'
            f'[[pipelines.steps]]\nprocessor = "classify"\noptions = {{ k = {k} }}\n')


def classes(sock: zmq.Socket, pipeline: str) -> int:
    """How many classes pipeline answers per frame (its `k`); fails on anything but a 200."""
    reply = send_frame(sock, pipeline, png(np.full((32, 48, 3), 90, np.uint8)), "png")
    assert reply.status == 200, reply.header
    return len(reply.header["classes"][0])


def test_reload_adds_removes_and_changes_pipelines_and_frames_in_flight_finish_on_the_old_one(
        make_daemon: Any, tmp_path: Path) -> None:
    gate = tmp_path / "open"
    before = classify_pipeline("held", 2, gate) + classify_pipeline("gone", 2)
    d = make_daemon(RELOADED.replace("{pipelines}", before.replace("{", "{{").replace("}", "}}")))
    with ThreadPoolExecutor(1) as pool:
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(d.endpoint)
        in_flight = pool.submit(classes, s, "held")  # held at the gate inside the old definition
        def at_gate() -> bool:
            assert not in_flight.done(), "the frame was answered before it reached the gate"
            return gate.with_suffix(".entered").exists()

        eventually(at_gate, "the frame to reach the gate", 30, interval_s=0.01)
        d.config_path.write_text(d.config_path.read_text().split("[[pipelines]]")[0]
                                 + classify_pipeline("held", 1) + classify_pipeline("new", 3))
        with d.admin() as admin:
            changes = admin.call("reload")["changes"]
        assert (changes["pipelines_added"], changes["pipelines_removed"], changes["pipelines_changed"]) == (
            ["new"], ["gone"], ["held"])
        with zmq.Context.instance().socket(zmq.DEALER) as other:
            other.setsockopt(zmq.LINGER, 0)
            other.connect(d.endpoint)
            assert classes(other, "held") == 1 and classes(other, "new") == 3  # the new definitions serve
            gone = send_frame(other, "gone", png(np.zeros((8, 8, 3), np.uint8)), "png")
            assert gone.status == 404, gone.header
        assert not in_flight.done()  # the reload did not wait for it, nor drop it
        gate.touch()
        assert in_flight.result(timeout=30) == 2  # answered 200 by the definition it started on
        s.close()
    with d.admin() as admin:
        kinds = [(e["kind"], e.get("pipeline")) for e in admin.call("events")["events"]]
    assert {("pipeline_added", "new"), ("pipeline_removed", "gone"), ("pipeline_changed", "held")} <= set(kinds)


def test_a_broken_pipeline_in_the_new_file_refuses_the_reload_and_keeps_the_old_ones(make_daemon: Any) -> None:
    d = make_daemon(RELOADED.replace("{pipelines}", classify_pipeline("p", 2).replace("{", "{{").replace("}", "}}")))
    head = d.config_path.read_text().split("[[pipelines]]")[0]
    d.config_path.write_text(head + classify_pipeline("p", 1).replace('size = [64, 64]', 'mode = "sideways"')
                             + classify_pipeline("q", 1))
    with d.admin() as admin:
        with pytest.raises(Exception, match="not reloaded.*pipelines\\[0\\].*mode"):
            admin.call("reload")
        assert [p["name"] for p in admin.call("pipelines")["pipelines"]] == ["p"]
    with zmq.Context.instance().socket(zmq.DEALER) as s:
        s.setsockopt(zmq.LINGER, 0)
        s.connect(d.endpoint)
        assert classes(s, "p") == 2
