"""Generated tracking sequences and the standard scores of a tracker's output on them.

A sequence is a scene of moving rectangles seen by a camera: objects cross
each other (the one in front hides the other), pass behind a pillar, bounce
off the frame's edges. Everything comes from a fixed seed, so a sequence is
the same on every run; frames are drawn with numpy (filled rectangles, each
with a black outline so that touching objects stay apart for a detector).

What a tracker is given, per frame, comes two ways:
- `detections(i)`: the boxes a detector would give, straight from the scene:
  each object at least a quarter visible, its full (amodal) box with a pixel
  or two of noise, scored by how much of it is visible (a half-hidden object
  scores low: what ByteTrack's second stage is for); now and then a missed
  detection and a low-scored false one;
- `frame(i)`: the RGB image, for a detector pipeline (tests/support/models.py's
  `brightness_map` with `dbnet` finds each visible part's box).

`idf1` and `id_switches` score a tracker's ids against the ground truth:
IDF1 as Ristani et al. (2016) define it (one global assignment of predicted
to true identities, IDTP over the mean of true and predicted detections) and
identity switches as CLEAR MOT counts them (a true object matched to another
id than the last time it was matched).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import zmq

from support.harness import Daemon

from infermux.pipelines.wire import send_frame

W, H = 320, 240
VISIBLE = 0.25  # an object less visible than this is neither in the ground truth nor detected
Box = tuple[float, float, float, float]  # x0, y0, x1, y1


@dataclass
class Thing:
    """One object of a scene: its box at frame 0, its velocity (px/frame), its colour, its depth (0 = front)."""

    id: int
    x: float
    y: float
    w: float
    h: float
    vx: float
    vy: float
    colour: tuple[int, int, int]
    depth: int
    stops: tuple[tuple[int, int], ...] = ()  # frame ranges [start, end) in which it stands still
    bounce: bool = False


@dataclass
class Sequence:
    """A scene over `length` frames; frame i's truth is `truth[i]`: id -> (full box, visible box, visible fraction)."""

    name: str
    things: list[Thing]
    length: int
    seed: int
    pillars: list[Box] = field(default_factory=list)  # dark, in front of everything, never detected
    truth: list[dict[int, tuple[Box, Box, float]]] = field(default_factory=list)
    _positions: list[dict[int, Box]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._positions = self._move()
        self.truth = [self._see(i) for i in range(self.length)]

    def _move(self) -> list[dict[int, Box]]:
        state = {t.id: [t.x, t.y, t.vx, t.vy] for t in self.things}
        out = []
        for i in range(self.length):
            frame = {}
            for t in self.things:
                x, y, vx, vy = state[t.id]
                frame[t.id] = (x, y, x + t.w, y + t.h)
                if any(a <= i < b for a, b in t.stops):
                    continue
                x, y = x + vx, y + vy
                if t.bounce:
                    if not 0 <= x <= W - t.w:
                        vx, x = -vx, min(max(x, 0), W - t.w)
                    if not 0 <= y <= H - t.h:
                        vy, y = -vy, min(max(y, 0), H - t.h)
                state[t.id] = [x, y, vx, vy]
            out.append(frame)
        return out

    def _owners(self, i: int) -> np.ndarray:
        """Per pixel, the id of the object seen there (0: background, -1: a pillar)."""
        owner = np.zeros((H, W), np.int32)
        for t in sorted(self.things, key=lambda t: -t.depth):  # back to front
            x0, y0, x1, y1 = _pixels(self._positions[i][t.id])
            owner[y0:y1, x0:x1] = t.id
        for pillar in self.pillars:
            x0, y0, x1, y1 = _pixels(pillar)
            owner[y0:y1, x0:x1] = -1
        return owner

    def _see(self, i: int) -> dict[int, tuple[Box, Box, float]]:
        owner = self._owners(i)
        out = {}
        for t in self.things:
            box = self._positions[i][t.id]
            x0, y0, x1, y1 = _pixels(box)
            area = max(1, (x1 - x0) * (y1 - y0))
            ys, xs = np.nonzero(owner[y0:y1, x0:x1] == t.id)
            fraction = len(xs) / area
            if fraction >= VISIBLE:
                visible = (float(x0 + xs.min()), float(y0 + ys.min()), float(x0 + xs.max() + 1), float(y0 + ys.max() + 1))
                out[t.id] = (box, visible, fraction)
        return out

    def first(self, frames: int) -> "Sequence":
        """The same scene over its first `frames` frames only."""
        return Sequence(self.name, self.things, min(frames, self.length), self.seed, self.pillars)

    def ground_truth(self, visible_boxes: bool = False) -> list[dict[int, Box]]:
        """Per frame, id -> box of each object at least VISIBLE seen: its full box, or the part in view."""
        return [{k: v[1] if visible_boxes else v[0] for k, v in frame.items()} for frame in self.truth]

    def detections(self, i: int) -> list[tuple[Box, float]]:
        """What a detector gives on frame i: (box, score) per object seen, plus the odd miss and false alarm."""
        rng = np.random.default_rng((self.seed, i))
        out = []
        for box, _, fraction in self.truth[i].values():
            if rng.random() < 0.03:  # a missed detection
                continue
            noisy = tuple(float(v) for v in np.asarray(box) + rng.normal(0, 1.0, 4))
            score = float(np.clip(0.95 * fraction + rng.normal(0, 0.03), 0.0, 1.0))
            out.append((noisy, score))  # type: ignore[arg-type]
        if rng.random() < 0.1:  # a false alarm, scored low
            x, y = rng.uniform(0, W - 30), rng.uniform(0, H - 30)
            out.append(((x, y, x + rng.uniform(10, 30), y + rng.uniform(10, 30)), float(rng.uniform(0.12, 0.4))))
        order = rng.permutation(len(out))
        return [out[k] for k in order]

    def frame(self, i: int) -> np.ndarray:
        """Frame i as RGB uint8 (H, W, 3): black background, objects in their colours with a black
        outline, pillars dark grey (too dark for the detector)."""
        image = np.zeros((H, W, 3), np.uint8)
        for t in sorted(self.things, key=lambda t: -t.depth):
            x0, y0, x1, y1 = _pixels(self._positions[i][t.id])
            image[y0:y1, x0:x1] = 0
            image[y0 + 2:y1 - 2, x0 + 2:x1 - 2] = t.colour
        for pillar in self.pillars:
            x0, y0, x1, y1 = _pixels(pillar)
            image[y0:y1, x0:x1] = 40
        return image


def _pixels(box: Box) -> tuple[int, int, int, int]:
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    return max(0, x0), max(0, y0), min(W, x1), min(H, y1)


COLOURS = [(255, 80, 80), (80, 255, 80), (80, 120, 255), (255, 255, 80), (255, 80, 255), (80, 255, 255),
           (255, 160, 60), (200, 200, 200)]


def crossing() -> Sequence:
    """Two pairs crossing head-on (a big one hides a small one completely for several frames) and one
    crossing them all."""
    things = [
        Thing(1, 10, 50, 64, 48, 3.0, 0.0, COLOURS[0], 0),
        Thing(2, 280, 62, 30, 26, -3.0, 0.0, COLOURS[1], 1),
        Thing(3, 20, 160, 30, 40, 2.5, -0.3, COLOURS[2], 1),
        Thing(4, 270, 150, 30, 40, -2.5, 0.2, COLOURS[3], 0),
        Thing(5, 150, 5, 28, 28, 0.2, 2.2, COLOURS[4], 2),
    ]
    return Sequence("crossing", things, 100, seed=1)


def pillar() -> Sequence:
    """Objects passing behind a pillar wider than they are: a few frames out of sight, then back."""
    things = [
        Thing(1, 5, 40, 30, 30, 3.0, 0.0, COLOURS[0], 0),
        Thing(2, 290, 110, 26, 36, -2.6, 0.0, COLOURS[1], 0),
        Thing(3, 40, 180, 34, 28, 2.2, 0.0, COLOURS[2], 0),
    ]
    return Sequence("pillar", things, 120, seed=2, pillars=[(140, 0, 176, H)])


def crowd() -> Sequence:
    """Eight objects of random sizes at random velocities, bouncing off the edges: crossings of every kind."""
    rng = np.random.default_rng(3)
    things = []
    for k in range(8):
        w, h = rng.uniform(22, 40, 2)
        things.append(Thing(k + 1, rng.uniform(0, W - w), rng.uniform(0, H - h), w, h,
                            rng.uniform(-2.5, 2.5), rng.uniform(-2.0, 2.0), COLOURS[k], k, bounce=True))
    return Sequence("crowd", things, 150, seed=3)


def stop_and_go() -> Sequence:
    """Objects that stop and start again, one of them turning back: motion the velocity filter must follow."""
    things = [
        Thing(1, 10, 50, 32, 32, 3.0, 0.0, COLOURS[0], 0, stops=((25, 45),)),
        Thing(2, 280, 60, 32, 32, -3.0, 0.0, COLOURS[1], 1, stops=((30, 40),)),
        Thing(3, 100, 150, 40, 30, 2.0, 1.0, COLOURS[2], 0, stops=((10, 20), (50, 60)), bounce=True),
    ]
    return Sequence("stop_and_go", things, 110, seed=4)


def through_zone() -> Sequence:
    """For zones and lines (tests/daemon/sinks/test_zone_events.py): object 1 walks down the left half
    (its box's bottom centre at x = 0.23 of the width) from the top to y = 0.83 of the height and
    stops there; object 2 walks up the right half (x = 0.75) from y = 0.96 to 0.25. The frame's
    middle row (y = 0.5) is crossed by both, one each way."""
    things = [
        Thing(1, 60, 10, 30, 30, 0.0, 3.0, COLOURS[0], 0, stops=((50, 70),)),
        Thing(2, 225, 200, 30, 30, 0.0, -3.0, COLOURS[1], 0, stops=((50, 70),)),
    ]
    return Sequence("through_zone", things, 70, seed=5)


def sequences() -> list[Sequence]:
    """The shipped sequences (their figures: tests/benchmarks/RESULTS.md#tracking)."""
    return [crossing(), pillar(), crowd(), stop_and_go()]


# -- scoring -------------------------------------------------------------------------------------


def iou(a: Box, b: Box) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def max_weight_matching(weights: np.ndarray) -> list[tuple[int, int]]:
    """(row, column) pairs of a matching with the largest total weight (the Hungarian algorithm,
    O(n³), on the negated weights padded to a square; pairs of weight 0 are left out)."""
    rows, cols = weights.shape
    n = max(rows, cols)
    cost = [[0.0] * (n + 1) for _ in range(n + 1)]
    for r in range(rows):
        for c in range(cols):
            cost[r + 1][c + 1] = -float(weights[r, c])
    u, v, owner, way = [0.0] * (n + 1), [0.0] * (n + 1), [0] * (n + 1), [0] * (n + 1)
    for row in range(1, n + 1):
        owner[0], col = row, 0
        least, used = [float("inf")] * (n + 1), [False] * (n + 1)
        while True:
            used[col] = True
            r, delta, nxt = owner[col], float("inf"), 0
            for c in range(1, n + 1):
                if not used[c]:
                    reduced = cost[r][c] - u[r] - v[c]
                    if reduced < least[c]:
                        least[c], way[c] = reduced, col
                    if least[c] < delta:
                        delta, nxt = least[c], c
            for c in range(n + 1):
                if used[c]:
                    u[owner[c]] += delta
                    v[c] -= delta
                else:
                    least[c] -= delta
            col = nxt
            if owner[col] == 0:
                break
        while col:
            prev = way[col]
            owner[col] = owner[prev]
            col = prev
    return [(owner[c] - 1, c - 1) for c in range(1, n + 1)
            if 0 < owner[c] <= rows and c <= cols and weights[owner[c] - 1, c - 1] > 0]


@dataclass(frozen=True)
class IdScores:
    """IDF1 and its parts: identity true positives, false positives, false negatives."""

    idf1: float
    idp: float
    idr: float
    idtp: int
    idfp: int
    idfn: int


def idf1(truth: list[dict[int, Box]], predicted: list[dict[int, Box]], threshold: float = 0.5) -> IdScores:
    """IDF1 of `predicted` (per frame, track id -> box) against `truth` (per frame, object id -> box):
    a predicted box counts for a true one where their IoU is at least `threshold`; each predicted
    identity is assigned to at most one true identity, for the most such frames over the sequence."""
    true_ids = sorted({k for frame in truth for k in frame})
    pred_ids = sorted({k for frame in predicted for k in frame})
    t_index = {k: i for i, k in enumerate(true_ids)}
    p_index = {k: i for i, k in enumerate(pred_ids)}
    together = np.zeros((len(true_ids), len(pred_ids)))
    for gt, pr in zip(truth, predicted):
        for t, tbox in gt.items():
            for p, pbox in pr.items():
                if iou(tbox, pbox) >= threshold:
                    together[t_index[t], p_index[p]] += 1
    idtp = int(sum(together[r, c] for r, c in max_weight_matching(together)))
    n_true = sum(len(f) for f in truth)
    n_pred = sum(len(f) for f in predicted)
    return IdScores(idf1=2 * idtp / (n_true + n_pred) if n_true + n_pred else 1.0,
                    idp=idtp / n_pred if n_pred else 1.0, idr=idtp / n_true if n_true else 1.0,
                    idtp=idtp, idfp=n_pred - idtp, idfn=n_true - idtp)


def id_switches(truth: list[dict[int, Box]], predicted: list[dict[int, Box]], threshold: float = 0.5) -> int:
    """CLEAR MOT's identity switches: per frame, a true object keeps the id it was last matched to
    where that one still overlaps it enough; the rest are matched for the most overlap; a true object
    matched to another id than the last time is a switch."""
    last: dict[int, int] = {}
    switches = 0
    for gt, pr in zip(truth, predicted):
        matched: dict[int, int] = {}
        for t, p in last.items():
            if t in gt and p in pr and iou(gt[t], pr[p]) >= threshold and p not in matched.values():
                matched[t] = p
        rest_t = [t for t in gt if t not in matched]
        rest_p = [p for p in pr if p not in matched.values()]
        overlap = np.array([[iou(gt[t], pr[p]) if iou(gt[t], pr[p]) >= threshold else 0.0 for p in rest_p]
                            for t in rest_t]).reshape(len(rest_t), len(rest_p))
        for r, c in max_weight_matching(overlap):
            matched[rest_t[r]] = rest_p[c]
        for t, p in matched.items():
            if t in last and last[t] != p:
                switches += 1
            last[t] = p
    return switches



# -- through a daemon --------------------------------------------------------------------------------

DETECT = """
[[pipelines]]
name = "{name}"
[[pipelines.steps]]
processor = "decode"
[[pipelines.steps]]
processor = "normalize"
[[pipelines.steps]]
model = "{detector}"
[[pipelines.steps]]
processor = "dbnet"
options = {{ unclip_ratio = 0.0, dilate = false, box_thresh = 0.3 }}
[[pipelines.steps]]
processor = "track"
"""
CLASSIFY = """
[[pipelines.steps]]
processor = "crop"
options = {{ rectify = false }}
[[pipelines.steps]]
name = "{classifier}_resize"
processor = "resize"
for_each = "regions"
options = {{ size = [64, 64] }}
[[pipelines.steps]]
name = "{classifier}_normalize"
processor = "normalize"
for_each = "regions"
[[pipelines.steps]]
model = "{classifier}"
for_each = "regions"
{options}
[[pipelines.steps]]
processor = "classify"
for_each = "regions"
"""


def detecting(name: str, detector: str = "det", **events: float) -> str:
    """A `[[pipelines]]` section: decode → normalize → `detector` (models.brightness_map) → dbnet → track;
    with `events` (min_frames=2, ...), the pipeline's object events with those settings."""
    section = DETECT.format(name=name, detector=detector)
    if not events:
        return section
    table = ", ".join(f"{key} = {value}" for key, value in events.items())
    return section.replace(f'name = "{name}"\n', f'name = "{name}"\nevents = {{ {table} }}\n', 1)


def classifying(name: str, classifier: str, options: str = "", detector: str = "det") -> str:
    """`detecting`, then crop and, for each region, resize → normalize → `classifier` (the test
    classifier, its step named after it, with `options`: reinfer_every...) → classify."""
    return detecting(name, detector) + CLASSIFY.format(classifier=classifier, options=options)



@dataclass
class Replay:
    """What a pipeline answered to a sequence's frames, one reply header per frame."""

    headers: list[dict]

    @property
    def statuses(self) -> list[int]:
        return [h["status"] for h in self.headers]

    def predicted(self) -> list[dict[int, Box]]:
        """Per frame, track id -> the bounds of its region's box (frames not answered 200: none)."""
        out = []
        for header in self.headers:
            boxes = {}
            for region in header.get("regions", []):
                xs, ys = [p[0] for p in region["box"]], [p[1] for p in region["box"]]
                boxes[region["track_id"]] = (min(xs), min(ys), max(xs), max(ys))
            out.append(boxes)
        return out

    def by_track(self) -> dict[int, list[dict]]:
        """Each track's regions, in frame order."""
        out: dict[int, list[dict]] = {}
        for header in self.headers:
            for region in header.get("regions", []):
                out.setdefault(region["track_id"], []).append(region)
        return out

    def computed(self) -> int:
        """Regions whose re-inferred step ran (neither reused nor skipped)."""
        return sum(1 for regions in self.by_track().values() for r in regions
                   if r.get("cached") is False and not r.get("skipped"))


def png(image: np.ndarray) -> bytes:
    import cv2  # the daemon tests' frames; the unit tests need no OpenCV
    return bytes(cv2.imencode(".png", image[:, :, ::-1])[1])


def replay(sock: zmq.Socket, pipeline: str, seq: Sequence, key: str,
           before: Callable[[int], None] | None = None, frames: int | None = None) -> Replay:
    """The sequence's frames (its first `frames`) sent to `pipeline` as PNG with `key`, one at a time,
    on DEALER `sock`; `before(i)`, where given, runs before frame i is sent (to publish a version
    mid-sequence)."""
    headers = []
    for i in range(seq.length if frames is None else frames):
        if before is not None:
            before(i)
        reply = send_frame(sock, pipeline, png(seq.frame(i)), "png", key=key, timeout_s=60)
        headers.append(reply.header)
    return Replay(headers)


def every_nth(replay: Replay, every: int) -> dict[int, tuple[list[int], list[int]]]:
    """Tracks whose answer was not computed exactly on their 1st, (N+1)th, (2N+1)th... frame:
    track id -> (the frames of the track it was computed on, those it should have been)."""
    wrong = {}
    for track_id, regions in replay.by_track().items():
        got = [k for k, r in enumerate(regions) if r.get("cached") is False]
        want = list(range(0, len(regions), every))
        if got != want:
            wrong[track_id] = (got, want)
    return wrong


def rows_computed(daemon: Daemon, model: str) -> int:
    """Rows model `model` computed, over its versions (its backend calls' batch sizes, summed)."""
    with daemon.admin() as admin:
        views = admin.call("models")["models"]
    return sum(int(size) * n for v in views if v["name"] == model for size, n in v["stats"]["batches"].items())
