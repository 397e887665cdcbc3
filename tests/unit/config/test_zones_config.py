"""`[[cameras.zones]]` and `[[cameras.lines]]`: read into their dataclasses, and each wrong one refused
with the file's field path and what to write instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from infermux.config import ConfigError, parse

TEXT = """
[[pipelines]]
name = "cams"
{events}
[[pipelines.steps]]
processor = "decode"
[[pipelines.steps]]
processor = "track"

[[cameras]]
name = "door"
url = "/dev/video0"
pipeline = "cams"
{areas}
"""
ZONE = '[[cameras.zones]]\nname = "{name}"\npoints = {points}\n'
LINE = '[[cameras.lines]]\nname = "{name}"\npoints = {points}\n'
SQUARE = "[[0.1, 0.1], [0.5, 0.1], [0.5, 0.5], [0.1, 0.5]]"
EVENTS = "events = { min_frames = 2 }"


def read(areas: str, events: str = EVENTS, tmp: Path = Path("/nonexistent")) -> object:
    return parse(TEXT.format(events=events, areas=areas), tmp / "infermux.toml")


def test_zones_and_lines_are_read_in_fractions_of_the_frame() -> None:
    areas = ZONE.format(name="yard", points=SQUARE) + "inertia = 5\n" + LINE.format(
        name="gate", points="[[0, 0.5], [1, 0.5]]") + 'in_side = "right"\nmargin = 0.05\n'
    camera = read(areas).cameras[0]  # type: ignore[attr-defined]
    assert camera.zones[0].name == "yard" and camera.zones[0].points[1] == (0.5, 0.1) and camera.zones[0].inertia == 5
    assert camera.lines[0].points == ((0.0, 0.5), (1.0, 0.5)) and camera.lines[0].in_side == "right"
    assert "zones" not in camera.as_json()  # the camera's process has no use for them


WHERE = 'cameras[name="door"]'


@pytest.mark.parametrize("areas, where, says", [
    (ZONE.format(name="yard", points="[[0.1, 0.1], [0.5, 0.1]]"), f"{WHERE}.zones[0].points", "3 to 64 points"),
    (ZONE.format(name="yard", points=str([[0.1, 0.1]] * 65)), f"{WHERE}.zones[0].points", "3 to 64 points"),
    (ZONE.format(name="yard", points="[[0.1, 0.1], [1.5, 0.1], [0.5, 0.5]]"), f"{WHERE}.zones[0].points[1]",
     "fractions of the frame's width and height, each from 0 to 1"),
    (ZONE.format(name="yard", points="[[0.1, 0.1], [0.2, 0.2], [0.3, 0.3]]"), f"{WHERE}.zones[0].points",
     "encloses no area"),
    (ZONE.format(name="a b", points=SQUARE), f"{WHERE}.zones[0].name", "letters, digits"),
    (ZONE.format(name="yard", points=SQUARE) + "inertia = 0\n", f"{WHERE}.zones[0].inertia", "must be >= 1"),
    (ZONE.format(name="yard", points=SQUARE) + "colour = 1\n", f"{WHERE}.zones[0].colour", "unknown field"),
    (ZONE.format(name="yard", points=SQUARE) * 2, f"{WHERE}.zones[1].name", "already a zone or line"),
    (ZONE.format(name="yard", points=SQUARE) + LINE.format(name="yard", points="[[0, 0], [1, 1]]"),
     f"{WHERE}.lines[0].name", "already a zone or line"),
    ("".join(ZONE.format(name=f"z{i}", points=SQUARE) for i in range(17)), f"{WHERE}.zones", "at most 16"),
    (LINE.format(name="gate", points="[[0.5, 0.5], [0.5, 0.5]]"), f"{WHERE}.lines[0].points", "the same"),
    (LINE.format(name="gate", points="[[0, 0], [0.5, 0.5], [1, 1]]"), f"{WHERE}.lines[0].points", "two points"),
    (LINE.format(name="gate", points="[[0, 0], [1, 1]]") + 'in_side = "up"\n', f"{WHERE}.lines[0].in_side",
     "must be one of left, right"),
    (LINE.format(name="gate", points="[[0, 0], [1, 1]]") + "margin = 0.9\n", f"{WHERE}.lines[0].margin",
     "between 0 and 0.5"),
])
def test_a_wrong_zone_or_line_is_refused_naming_the_field(areas: str, where: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        read(areas)
    assert caught.value.path == where and says in caught.value.reason, str(caught.value)


def test_zones_on_a_camera_whose_pipeline_makes_no_events_are_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        read(LINE.format(name="gate", points="[[0, 0], [1, 1]]"), events="")
    assert caught.value.path == f"{WHERE}.lines" and "makes no object events" in caught.value.reason
