"""The `roi` step: the working image cut to a frame's motion boxes, and what a detector finds in the cut
mapped back to the whole frame (the real processors, on arrays)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from infermux.plugins.processors import ProcessorConfigError, ProcessorError, Sample, create  # noqa: E402


def decoded(width: int = 200, height: int = 100, motion: list[tuple[int, int, int, int]] | None = None) -> Sample:
    sample = Sample(data=np.arange(width * height * 3, dtype=np.uint32).astype(np.uint8), format="rgb", width=width,
                    height=height, motion=list(motion or []))
    create("decode")(sample)
    return sample


def test_the_image_is_cut_to_the_union_of_the_boxes_with_the_margin_and_points_map_back() -> None:
    sample = decoded(motion=[(50, 20, 60, 30), (80, 40, 90, 50)])
    original = sample.image
    create("roi", {"margin": 5})(sample)
    assert sample.tensor is not None and sample.tensor.shape[:2] == (40, 50)  # y 15..55, x 45..95
    assert np.array_equal(sample.tensor, original[15:55, 45:95])
    assert sample.transform.to_original(np.array([[0.0, 0.0], [50.0, 40.0]])).tolist() == [[45.0, 15.0], [95.0, 55.0]]


def test_after_a_resize_the_boxes_are_taken_into_the_working_images_pixels() -> None:
    sample = decoded(motion=[(100, 50, 120, 60)])
    create("resize", {"mode": "stretch", "size": [100, 50]})(sample)  # half the size
    create("roi", {"margin": 0})(sample)
    assert sample.tensor is not None and sample.tensor.shape[:2] == (5, 10)
    assert sample.transform.to_original(np.array([[0.0, 0.0]])).tolist() == [[100.0, 50.0]]


@pytest.mark.parametrize("motion", [[], [(0, 0, 190, 95)], [(300, 300, 400, 400)]],
                         ids=["no boxes", "most of the frame", "outside it"])
def test_a_frame_goes_on_whole_without_boxes_or_when_a_cut_would_save_little(motion: list) -> None:
    sample = decoded(motion=motion)
    whole = sample.tensor
    create("roi")(sample)
    assert sample.tensor is whole and sample.transform.scale_x == 1.0 and sample.transform.pad_x == 0.0


def test_bad_options_and_a_missing_image_are_refused_naming_them() -> None:
    with pytest.raises(ProcessorConfigError, match="margin"):
        create("roi", {"margin": -1})
    with pytest.raises(ProcessorConfigError, match="whole_above"):
        create("roi", {"whole_above": 2})
    with pytest.raises(ProcessorError, match="after 'decode'"):
        create("roi")(Sample(motion=[(0, 0, 1, 1)]))
