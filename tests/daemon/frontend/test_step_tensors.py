"""A pipeline step's tensors, once a model accepted them, are not checked again for each frame
(Router._check_tensors): a step whose tensors change shape between frames is still checked."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import zmq

cv2 = pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from support.harness import dealer  # noqa: E402

from infermux.pipelines.wire import send_frame  # noqa: E402

# No resize: the classifier's input is [N, 3, 64, 64], so a frame of another size makes a tensor it refuses.
UNRESIZED = """
[[models]]
name = "classifier"
engine = "classifier/1/model.onnx"

[[pipelines]]
name = "p"
[[pipelines.steps]]
processor = "decode"
[[pipelines.steps]]
processor = "normalize"
[[pipelines.steps]]
model = "classifier"
"""


def frame(height: int, width: int) -> bytes:
    return cv2.imencode(".png", np.full((height, width, 3), 90, np.uint8))[1].tobytes()


def test_a_step_s_tensor_of_another_shape_is_refused_after_one_the_model_accepted(make_daemon: Any) -> None:
    d = make_daemon(UNRESIZED)
    with dealer(d.endpoint) as sock:
        assert send(sock, frame(64, 64)).status == 200
        refused = send(sock, frame(48, 64))
        assert refused.status == 400, refused.header
        assert "classifier" in refused.header["error"] and "48" in refused.header["error"], refused.header
        assert send(sock, frame(64, 64)).status == 200  # the accepted shape still is
        assert send(sock, frame(48, 64)).status == 400  # and the refused one is not (now from the pipeline's memory)


def send(sock: zmq.Socket, data: bytes) -> Any:
    return send_frame(sock, "p", data, "png", timeout_s=30)
