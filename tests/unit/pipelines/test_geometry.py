"""Zones' and lines' geometry: a box's anchor, a point in a polygon, a line's sides, a path past a segment."""

from __future__ import annotations

import pytest

from infermux.pipelines.geometry import anchor, inside, passes, side

SQUARE = ((0.25, 0.25), (0.75, 0.25), (0.75, 0.75), (0.25, 0.75))
# A U shape: its notch (0.4 to 0.6 wide, down to 0.5) is outside.
U = ((0.1, 0.1), (0.4, 0.1), (0.4, 0.5), (0.6, 0.5), (0.6, 0.1), (0.9, 0.1), (0.9, 0.9), (0.1, 0.9))


def test_the_anchor_is_the_bottom_centre_of_the_box_in_fractions_of_the_frame() -> None:
    box = [[20, 10], [60, 10], [60, 50], [20, 50]]
    assert anchor(box, 200, 100) == (0.2, 0.5)
    assert anchor([[60, 10], [20, 12], [24, 50], [58, 46]], 200, 100) == (0.2, 0.5)  # a rotated quad's bounds


@pytest.mark.parametrize("point, polygon, expected", [
    ((0.5, 0.5), SQUARE, True), ((0.1, 0.5), SQUARE, False), ((0.5, 0.9), SQUARE, False),
    ((0.2, 0.3), U, True), ((0.5, 0.3), U, False), ((0.5, 0.7), U, True), ((0.95, 0.5), U, False),
])
def test_a_point_is_in_a_polygon_convex_or_not(point: tuple[float, float], polygon: tuple, expected: bool) -> None:
    assert inside(point, polygon) is expected


def test_right_and_left_are_as_seen_on_the_image_from_the_first_point_to_the_second() -> None:
    east = ((0.1, 0.5), (0.9, 0.5))
    assert side((0.5, 0.6), *east) == pytest.approx(0.1)  # below an eastward line: its right
    assert side((0.5, 0.4), *east) == pytest.approx(-0.1)
    assert side((0.5, 0.6), *reversed(east)) == pytest.approx(-0.1)


def test_a_path_passes_a_segment_only_between_its_ends() -> None:
    a, b = (0.1, 0.5), (0.9, 0.5)
    assert passes((0.5, 0.4), (0.5, 0.6), a, b)
    assert passes((0.1, 0.4), (0.1, 0.6), a, b)  # through an end
    assert not passes((0.95, 0.4), (0.95, 0.6), a, b)  # round the end
    assert not passes((0.0, 0.4), (1.0, 0.4), a, b)  # parallel
