"""The processors' bounds before work, on the processors alone (the daemon's side: tests/daemon/pipelines/test_hostile_boxes.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from support.hostile_files import progressive_jpeg_with_scans  # noqa: E402

from infermux.plugins.processors import create  # noqa: E402
from infermux.plugins.processors.base import FrameTooLarge, OutOfTime, Region, Sample, finite_regions  # noqa: E402
from infermux.plugins.processors.frames import jpeg_scans  # noqa: E402


def _jpeg(image: np.ndarray, progressive: bool = False, restart: int = 0) -> bytes:
    params = [cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive), cv2.IMWRITE_JPEG_RST_INTERVAL, restart]
    return cv2.imencode(".jpg", image, params)[1].tobytes()


def test_the_scans_are_counted_from_the_markers_past_stuffed_bytes_and_restarts() -> None:
    noise = np.random.default_rng(1).integers(0, 256, (64, 64, 3), np.uint8)  # entropy data full of 0xFF 0x00
    assert jpeg_scans(_jpeg(noise), 100) == 1
    assert jpeg_scans(_jpeg(noise, restart=1), 100) == 1
    assert jpeg_scans(_jpeg(noise, progressive=True), 100) == 10  # libjpeg's progression for colour
    assert jpeg_scans(progressive_jpeg_with_scans(64, 50), 100) == 56
    assert jpeg_scans(progressive_jpeg_with_scans(64, 100_000), 100) == 101  # counted no further than the limit


def test_a_jpeg_of_more_scans_than_max_scans_is_refused_before_it_is_decoded() -> None:
    decode = create("decode", {"max_scans": 20})
    with pytest.raises(FrameTooLarge, match=r"more than 20 scans \(max_scans\)"):
        decode(Sample(data=np.frombuffer(progressive_jpeg_with_scans(64, 30), np.uint8), format="jpeg"))
    decode(Sample(data=np.frombuffer(progressive_jpeg_with_scans(64, 10), np.uint8), format="jpeg"))


def test_a_frame_whose_least_cost_is_over_max_decode_ms_or_its_deadline_is_not_decoded() -> None:
    data = np.frombuffer(progressive_jpeg_with_scans(2048, 90), np.uint8)  # 96 scans: at least 9 ms
    with pytest.raises(FrameTooLarge, match=r"of 96 scan\(s\) would take at least 9 ms of CPU; the step allows 5 "):
        create("decode", {"max_decode_ms": 5})(Sample(data=data, format="jpeg"))
    late = Sample(data=data, format="jpeg", deadline_ns=time.perf_counter_ns() + 4_000_000)
    with pytest.raises(OutOfTime, match="would take at least 9 ms; the frame's deadline is"):
        create("decode")(late)


def test_a_frame_whose_decoding_took_more_cpu_than_max_decode_ms_is_refused() -> None:
    noise = np.random.default_rng(2).integers(0, 256, (1024, 1024, 3), np.uint8)
    data = np.frombuffer(_jpeg(noise, progressive=True), np.uint8)  # least cost 0.4 ms; decoded, many more
    with pytest.raises(FrameTooLarge, match=r"decoding the 1024x1024 frame took \d+ ms of CPU; the step allows 2"):
        create("decode", {"max_decode_ms": 2})(Sample(data=data, format="jpeg"))


def _cropping(*boxes: list[list[float]], side: int = 32) -> Sample:
    image = np.zeros((side, side, 3), np.uint8)
    return Sample(image=image, regions=[Region(np.array(box, np.float32), 0.9) for box in boxes])


@pytest.mark.parametrize("rectify", [True, False])
def test_a_crop_larger_than_max_scale_times_its_frame_is_refused_from_its_box(rectify: bool) -> None:
    huge = [[0, 0], [40000, 0], [40000, 40000], [0, 40000]]
    sample = _cropping([[0, 0], [8, 0], [8, 8], [0, 8]], huge)
    if rectify:
        with pytest.raises(FrameTooLarge, match=r"region 1's box would crop to 40000x40000 from a 32x32 frame"):
            create("crop", {"rectify": True})(sample)
        assert sample.crops == []  # nothing was cropped
    else:  # the axis-aligned bounds are cut within the frame: at most the frame
        create("crop", {"rectify": False})(sample)
        assert [c.shape for c in sample.crops] == [(8, 8, 3), (32, 32, 3)]


def test_crops_over_max_total_pixels_together_are_refused_before_any_is_cut() -> None:
    box = [[0, 0], [30, 0], [30, 30], [0, 30]]
    sample = _cropping(*[box] * 5)
    with pytest.raises(FrameTooLarge, match=r"5 crops would be 4500 pixels; the step crops at most 4000"):
        create("crop", {"max_total_pixels": 4000})(sample)
    create("crop", {"max_total_pixels": 4500})(sample)
    assert len(sample.crops) == 5


def test_a_box_with_edges_longer_than_float32_holds_is_refused_not_crashed() -> None:
    sample = _cropping([[-3e38, -3e38], [3e38, -3e38], [3e38, 3e38], [-3e38, 3e38]])
    with pytest.raises(FrameTooLarge, match="max_scale"):
        create("crop")(sample)


def test_resize_refuses_an_image_over_its_max_pixels_before_making_it() -> None:
    sample = Sample(image=np.zeros((1, 4000, 3), np.uint8))  # a 1-px-high crop, scaled to a height of 48
    with pytest.raises(FrameTooLarge, match=r"4000x1 image would be resized to 192000x48, over the 1000000"):
        create("resize", {"mode": "height", "height": 48, "max_pixels": 1_000_000})(sample)
    create("resize", {"mode": "height", "height": 48, "max_width": 320, "max_pixels": 1_000_000})(sample)
    assert sample.tensor is not None and sample.tensor.shape == (48, 320, 3)


def test_regions_whose_box_or_score_is_not_finite_are_dropped_and_counted() -> None:
    good = Region(np.zeros((4, 2), np.float32), 0.5)
    nan_box = Region(np.array([[np.nan, 0]] * 4, np.float32), 0.5)
    inf_score = Region(np.zeros((4, 2), np.float32), float("inf"))
    assert finite_regions([nan_box, good, inf_score]) == ([good], 2)


def test_yolo_drops_a_nan_box_before_suppression_so_that_the_others_are_kept() -> None:
    # v8 layout [1, 4 + 1 class, 2 boxes]: box 0 has NaN corners (inf - inf), box 1 is ordinary; same score.
    out = np.array([[[np.inf, 10], [0, 10], [np.inf, 4], [0, 4], [0.9, 0.9]]], np.float32)
    sample = Sample(outputs={"y": out})
    create("yolo", {"per_class": False})(sample)
    assert sample.dropped == 1
    assert len(sample.regions) == 1 and sample.regions[0].box.tolist() == [[8, 8], [12, 8], [12, 12], [8, 12]]
