"""`Frame`, a camera frame as a pipeline's input (protocol_types.py): its header entry, its bytes and its checks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from infermux.protocol import Frame, encode_request


def test_an_encoded_frame_is_its_file_s_bytes_with_the_format() -> None:
    frame = Frame(b"\xff\xd8jpeg", "jpeg").check()
    assert frame.entry("image") == {"name": "image", "dtype": "uint8", "shape": [6], "format": "jpeg"}
    assert bytes(frame.payload()) == b"\xff\xd8jpeg"


def test_an_image_array_becomes_a_raw_frame_with_its_geometry() -> None:
    image = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    frame = Frame.of(image)
    assert frame.entry("cam") == {"name": "cam", "dtype": "uint8", "shape": [72], "format": "bgr",
                                  "width": 6, "height": 4, "stride": 18}
    assert bytes(frame.payload()) == image.tobytes()
    gray = Frame.of(np.zeros((5, 7), np.uint8), "gray")
    assert (gray.width, gray.height, gray.stride) == (7, 5, 7)


def test_a_crop_of_an_image_is_sent_packed() -> None:
    image = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    crop = image[2:6, 1:5]  # rows 24 bytes apart, 12 used
    frame = Frame.of(crop, "rgb")
    assert (frame.width, frame.height, frame.stride) == (4, 4, 12)
    assert bytes(frame.payload()) == np.ascontiguousarray(crop).tobytes()


def test_nv12_with_a_padded_stride() -> None:
    frame = Frame(bytes(64 * 48 * 3 // 2), "nv12", width=60, height=48, stride=64).check()
    assert frame.entry("image")["stride"] == 64


@pytest.mark.parametrize("frame, words", [
    (Frame(b"x", "webp"), "frame format 'webp'"),
    (Frame(bytes(12), "bgr", width=2), "needs its width and height"),
    (Frame(bytes(10), "bgr", width=2, height=2), "a 2x2 bgr frame with stride 6 is 12 bytes, got 10"),
    (Frame(bytes(100), "nv12", width=16, height=16, stride=16), "is 384 bytes, got 100"),
    (Frame(bytes(32), "gray", width=8, height=4, stride=4), "stride 4 is less than a gray row of width 8"),
])
def test_a_frame_the_daemon_would_refuse_is_a_value_error(frame: Frame, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        frame.check()


def test_an_array_that_is_not_an_image_is_refused() -> None:
    with pytest.raises(ValueError, match="H x W"):
        Frame.of(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError, match="has 3 channel"):
        Frame.of(np.zeros((4, 4, 4), np.uint8), "bgr")


def test_a_request_carries_a_frame_as_one_uint8_input_beside_tensors() -> None:
    x = np.ones((1, 2), np.float32)
    frames = encode_request("ocr", {"image": Frame(b"png!", "png"), "x": x}, id=3, key="gate-1")
    header = json.loads(frames[0])
    assert header["key"] == "gate-1" and header["inputs"][0] == {"name": "image", "dtype": "uint8", "shape": [4],
                                                                 "format": "png"}
    assert bytes(frames[1]) == b"png!" and bytes(frames[2]) == x.tobytes()
