"""The camera motion gate: what it sends on generated clips, masks, keep-alives, boxes, and its configuration.

The clips (tests/support/clips.py) are 640×360 at 15 fps with sensor noise
and a slow lighting drift; the moving ones carry the tracking sequences'
objects and their ground truth. The gate's cost per frame is measured by
tests/benchmarks/bench_gate.py, not here.
"""

from __future__ import annotations

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2", reason="the gate needs OpenCV: pip install -e '.[processors]'")

from support import clips  # noqa: E402

from infermux.cameras.gate import GateConfig, MotionGate, parse_gate  # noqa: E402
from infermux.config import ConfigError  # noqa: E402

FPS = 15.0


def scene(size: tuple[int, int] = (320, 180), seed: int = 0) -> tuple[np.ndarray, np.random.Generator]:
    """A cheap still grey scene (width, height) and a noise source for its frames."""
    rng = np.random.default_rng(seed)
    return np.full((size[1], size[0], 3), 90, np.float32), rng


def noisy(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.clip(image + rng.normal(0, 3, image.shape), 0, 255).astype(np.uint8)


def with_square(image: np.ndarray, x: int, y: int, side: int = 24, value: float = 220) -> np.ndarray:
    out = image.copy()
    out[y:y + side, x:x + side] = value
    return out


def test_the_static_scene_sends_at_most_one_frame_in_twenty_keep_alives_included():
    clip = clips.static(300)  # 20 s: the first frame and the keep-alive at 10 s
    gate = MotionGate(GateConfig(every_s=10.0))
    decisions = [gate.decide(frame, t) for t, frame in clip.frames()]
    sent = [d.reason for d in decisions if d.send]
    assert len(sent) <= 0.05 * clip.length, sent
    assert sent == ["first", "keepalive"]


@pytest.mark.parametrize("sequence", clips.sequences(), ids=lambda s: s.name)
def test_frames_that_show_an_object_reach_the_target(sequence):
    clip = clips.moving(sequence)
    gate = MotionGate(GateConfig())
    decisions = [gate.decide(frame, t) for t, frame in clip.frames()]
    shown = [i for i, present in enumerate(clip.present) if present]
    missed = [i for i in shown if not decisions[i].send]
    assert shown and len(missed) <= 0.01 * len(shown), missed


def test_motion_boxes_cover_each_moving_object_in_the_images_pixels():
    clip = clips.moving(clips.tracking.crossing().first(40))
    gate = MotionGate(GateConfig())
    for t, frame in clips.static(15).frames():  # the empty scene first, as a camera starts: no object's ghost
        gate.decide(frame, t - 1.0)
    checked = 0
    for i, (t, frame) in enumerate(clip.frames()):
        decision = gate.decide(frame, t)
        if decision.reason != "motion":
            continue
        covered = np.zeros(frame.shape[:2], bool)
        for x0, y0, x1, y1 in decision.boxes:
            assert 0 <= x0 < x1 <= frame.shape[1] and 0 <= y0 < y1 <= frame.shape[0]
            covered[y0:y1, x0:x1] = True
        for x0, y0, x1, y1 in clip.boxes(i):
            inside = covered[int(y0) + 2:int(y1) - 2, int(x0) + 2:int(x1) - 2]
            assert inside.size == 0 or inside.mean() >= 0.9, (i, (x0, y0, x1, y1), decision.boxes)
            checked += 1
    assert checked >= 40


def test_motion_inside_a_mask_is_ignored_and_the_same_motion_outside_it_is_not():
    base, rng = scene()
    clock = [[0.0, 0.0], [0.25, 0.0], [0.25, 0.25], [0.0, 0.25]]  # the top left corner: a clock ticking
    masked = MotionGate(GateConfig(masks=parse_gate({"masks": [clock]}, "gate").masks, every_s=0))
    plain = MotionGate(GateConfig(every_s=0))
    reasons: dict[str, list[str]] = {"masked": [], "plain": []}
    for i in range(30):
        frame = noisy(with_square(base, 10, 5, value=90 + 120 * (i % 2)), rng)  # blinks inside the mask
        for name, gate in (("masked", masked), ("plain", plain)):
            reasons[name].append(gate.decide(frame, i / FPS).reason)
    assert reasons["masked"] == ["first"] + ["still"] * 29
    assert reasons["plain"][1::2] == ["motion"] * 15  # each time it lights up
    moving = noisy(with_square(base, 200, 100), rng)  # outside the mask
    assert masked.decide(moving, 30 / FPS).reason == "motion"


def test_a_keep_alive_is_sent_every_every_s_without_motion_and_motion_restarts_its_interval():
    base, rng = scene()
    gate = MotionGate(GateConfig(every_s=2.0))
    sent = []
    for i in range(int(7 * FPS)):
        frame = with_square(base, 100, 80) if i == int(3 * FPS) else base  # one frame of motion at 3 s
        decision = gate.decide(noisy(frame, rng), i / FPS)
        if decision.send:
            sent.append((round(i / FPS, 2), decision.reason))
    times = [t for t, _ in sent]
    assert sent[0] == (0.0, "first") and (3.0, "motion") in sent
    assert all(b - a <= 2.0 + 1 / FPS for a, b in zip(times, times[1:])), sent
    assert [t for t, r in sent if r == "keepalive"] == [2.0, 5.0], sent  # 2 s after the first, then after 3.0


def test_a_keep_alive_covers_the_whole_frame_and_no_keep_alive_comes_with_every_s_zero():
    base, rng = scene()
    gate, never = MotionGate(GateConfig(every_s=1.0)), MotionGate(GateConfig(every_s=0))
    kept = [d for i in range(40) if (d := gate.decide(noisy(base, rng), i / FPS)).reason == "keepalive"]
    assert kept and all(d.boxes == [(0, 0, 320, 180)] for d in kept)
    assert [never.decide(noisy(base, rng), i / FPS).send for i in range(40)] == [True] + [False] * 39


def test_an_object_that_stops_joins_the_background_and_the_frames_stop():
    base, rng = scene()
    gate = MotionGate(GateConfig(every_s=0, absorb_s=1.0))
    parked = with_square(base, 100, 80)
    reasons = [gate.decide(noisy(base if i < 5 else parked, rng), i / FPS).reason for i in range(int(8 * FPS))]
    assert reasons[5] == "motion"
    assert set(reasons[-int(2 * FPS):]) == {"still"}, reasons


def test_the_whole_scene_getting_brighter_is_not_motion():
    base, rng = scene()
    gate = MotionGate(GateConfig(every_s=0))
    reasons = [gate.decide(noisy(base + min(i, 30), rng), i / FPS).reason for i in range(40)]  # +1 a frame
    assert reasons == ["first"] + ["still"] * 39


def test_a_frame_of_another_size_starts_over():
    base, rng = scene()
    gate = MotionGate(GateConfig())
    assert gate.decide(noisy(base, rng), 0.0).reason == "first"
    assert gate.decide(noisy(base, rng), 0.1).reason == "still"
    bigger, _ = scene((640, 360))
    decision = gate.decide(noisy(bigger, rng), 0.2)
    assert decision.reason == "first" and decision.boxes == [(0, 0, 640, 360)]


def test_an_image_that_is_not_rgb_uint8_is_refused_by_name():
    gate = MotionGate(GateConfig())
    with pytest.raises(ValueError, match=r"H×W×3 uint8 RGB image, got uint8 \[180, 320\]"):
        gate.decide(np.zeros((180, 320), np.uint8), 0.0)
    with pytest.raises(ValueError, match=r"got float32 \[180, 320, 3\]"):
        gate.decide(np.zeros((180, 320, 3), np.float32), 0.0)
    assert gate.decide(np.zeros((180, 320, 3), np.uint8), 0.0).reason == "first"  # the gate is unharmed


def test_a_gate_table_becomes_its_config():
    config = parse_gate({"threshold": 0.01, "delta": 20, "every_s": 5, "width": 120,
                         "masks": [[[0, 0], [1, 0], [0.5, 0.5]]]}, 'cameras[name="door"].gate')
    assert config == GateConfig(threshold=0.01, delta=20, every_s=5.0, width=120,
                                masks=(((0.0, 0.0), (1.0, 0.0), (0.5, 0.5)),))
    assert parse_gate({}, "gate") == GateConfig()


@pytest.mark.parametrize("table, path, reason", [
    ({"treshold": 0.1}, "gate.treshold", "did you mean `threshold`?"),
    ({"colour": 1}, "gate.colour", "unknown field; known fields: absorb_s"),
    ({"threshold": 0}, "gate.threshold", "between 0.0001 and 1, got 0"),
    ({"threshold": "high"}, "gate.threshold", "must be int or number, got str"),
    ({"delta": 1.5}, "gate.delta", "must be int, got float"),
    ({"delta": True}, "gate.delta", "must be int, got bool"),
    ({"every_s": float("inf")}, "gate.every_s", "between 0 and 86400"),
    ({"width": 8}, "gate.width", "must be >= 16, got 8"),
    ({"absorb_s": 0.5, "background_s": 2}, "gate.absorb_s", "must be >= background_s (2.0)"),
    ({"masks": "clock"}, "gate.masks", "a list of at most 32 polygons"),
    ({"masks": [[[0, 0], [1, 1]]]}, "gate.masks[0]", "a list of 3 to 64 points"),
    ({"masks": [[[0, 0], [1, 1], [2, 0]]]}, "gate.masks[0][2]", "fractions of the frame's width and height"),
    ({"masks": [[[0, 0], [1, 1], [0.5]]]}, "gate.masks[0][2]", "got [0.5]"),
    ({"masks": [[[0, 0], [1, 0], [0, 1]]] * 33}, "gate.masks", "at most 32"),
])
def test_a_bad_gate_table_is_refused_with_its_field_and_reason(table, path, reason):
    with pytest.raises(ConfigError) as caught:
        parse_gate(table, "gate", file="cameras.toml")
    assert caught.value.file == "cameras.toml" and caught.value.path == path
    assert reason in caught.value.reason, caught.value.reason


def test_a_gate_that_is_not_a_table_is_refused():
    with pytest.raises(ConfigError, match="gate: must be a table, got int"):
        parse_gate(3, "gate")  # type: ignore[arg-type]
