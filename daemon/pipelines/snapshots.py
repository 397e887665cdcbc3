"""Snapshots (docs/events.md#snapshots): tracked objects' best frames, and the newest frame of each stream.

For each stream key the newest served frame and its boxes are kept (a
reference, seen.py; at most MAX_KEYS streams), for `infermux ctl snapshot`,
which draws, encodes and writes it at once (`live`). A tracked object's best
frame is handed over by its lifecycle (lifecycle.py) when it makes an event:
`object_snapshot` only queues it (a bounded queue; a full one drops it,
counted) and returns where the files will be, so a pipeline's thread never
waits on the disk. One thread draws the boxes, encodes the frame and the
object's crop with OpenCV and writes them (snapfolder.py), then prunes the
folder to its bounds.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from infermux.config import SnapshotConfig
from infermux.pipelines.seen import Seen, bounds
from infermux.pipelines.snapfolder import SnapFolder, safe_name

log = logging.getLogger("infermux.snapshots")

MAX_KEYS = 1024  # streams whose newest frame is kept; past it the longest-kept key is forgotten
PRUNE_EVERY_S = 1.0  # after a write, the folder is pruned within this long
IDLE_PRUNE_S = 60.0  # without writes, files past keep_days still go this often
FOCUS_BGR = (0, 255, 0)  # the object's own box: green
OTHER_BGR = (0, 200, 255)  # the frame's other boxes: amber
LABEL_CHARS = 32
DROPPED_LOG_S = 10.0  # snapshots dropped for a full queue are logged at most this often


class SnapshotError(Exception):
    """A live snapshot that cannot be made; the message says why and what to do."""


class NoFrame(SnapshotError):
    """No frame of that stream key was served (yet)."""


@dataclass(frozen=True)
class Job:
    """An object's best frame to write: the frame, its region's index, and the files' names."""

    seen: Seen
    index: int
    folder: str
    stem: str


class Snapshots:
    """The newest frame per stream, the writer thread of objects' snapshots and the folder's bounds."""

    def __init__(self, config: SnapshotConfig, root: Path) -> None:
        self.config = config
        self.folder = SnapFolder(root, int(config.max_mb * (1 << 20)), config.keep_days * 86_400)
        self._newest: dict[str, Seen] = {}
        self._queue: queue.Queue[Job | None] = queue.Queue(config.queue)
        self._dirty = threading.Event()  # written since the last prune
        self.written = self.dropped = self.failed = 0
        self._dropped_logged = -DROPPED_LOG_S
        self._thread = threading.Thread(target=self._run, name="snapshots", daemon=True)
        self._thread.start()

    # -- the pipelines' side: never waits -------------------------------------------------

    def remember(self, seen: Seen) -> None:
        """Keep `seen` as its stream's newest frame (a reference: the older one is let go)."""
        newest = self._newest
        if seen.key not in newest and len(newest) >= MAX_KEYS:
            try:
                newest.pop(next(iter(newest)))
            except (StopIteration, KeyError, RuntimeError):  # another thread took it first
                pass
        newest[seen.key] = seen

    def object_snapshot(self, uid: str, label: str | None, seen: Seen, index: int) -> dict[str, Any] | None:
        """Queue the object's best frame; its event's `snapshot` field, or None when the queue is full."""
        folder, stem = safe_name(seen.key), f"{uid}-{safe_name(label or 'object')}"
        try:
            self._queue.put_nowait(Job(seen, index, folder, stem))
        except queue.Full:
            self.dropped += 1
            now = time.monotonic()
            if now - self._dropped_logged >= DROPPED_LOG_S:  # a slow disk: said once in a while, not per frame
                self._dropped_logged = now
                log.warning("snapshots dropped: %d waiting to be written ([snapshots] queue); %d so far",
                            self.config.queue, self.dropped)
            return None
        x0, y0, x1, y1 = crop_bounds(seen, index)
        return {"path": str(self.folder.root / folder / f"{stem}.jpg"),
                "crop": str(self.folder.root / folder / f"{stem}-crop.jpg"),
                "time": round(seen.time, 6), "box": [x0, y0, x1, y1]}

    # -- `ctl snapshot` ------------------------------------------------------------------

    def live(self, key: str) -> tuple[Path, bytes, Seen]:
        """Draw, encode and write stream `key`'s newest frame: (its path, the JPEG, the frame)."""
        seen = self._newest.get(key)
        if seen is None:
            raise NoFrame(f"no frame of {key[:80]!r} yet")
        data = encode(draw(seen, None), self.config.quality)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(seen.time)) + f".{int(seen.time * 1000) % 1000:03d}Z"
        try:
            path = self.folder.write(safe_name(key), f"live-{stamp}.jpg", data)
        except OSError as exc:
            raise SnapshotError(f"cannot write into {self.folder.root}: {exc.strerror or exc}; check that "
                                "the daemon's user may write its state directory") from None
        self._dirty.set()
        return path, data, seen

    def keys(self) -> list[str]:
        """The streams whose newest frame is kept."""
        return sorted(self._newest)

    # -- the writer thread -------------------------------------------------------------------

    def _run(self) -> None:
        last_prune = 0.0
        while True:
            try:
                job = self._queue.get(timeout=PRUNE_EVERY_S)
            except queue.Empty:
                job = None
            else:
                if job is None:
                    return
                self._write(job)
            now = time.monotonic()
            due = self._dirty.is_set() and now - last_prune >= PRUNE_EVERY_S
            if due or now - last_prune >= IDLE_PRUNE_S:
                self._dirty.clear()
                last_prune = now
                self._prune()

    def _write(self, job: Job) -> None:
        try:
            frame = encode(draw(job.seen, job.index), self.config.quality)
            crop = encode(crop_of(job.seen, job.index), self.config.quality)
            self.folder.write(job.folder, f"{job.stem}.jpg", frame)
            self.folder.write(job.folder, f"{job.stem}-crop.jpg", crop)
        except Exception as exc:  # a full disk, a folder made a link: logged, and the next one is tried
            self.failed += 1
            log.warning("snapshot %s/%s not written: %s", job.folder, job.stem, exc)
            return
        self.written += 1
        self._dirty.set()

    def _prune(self) -> None:
        try:
            self.folder.prune()
        except Exception:  # never lose the thread
            log.exception("pruning the snapshots' folder failed")

    def view(self) -> dict[str, Any]:
        """For `ctl pipelines --json` and the docs: the folder, files written, dropped, failed, pruned."""
        return {"folder": str(self.folder.root), "written": self.written, "dropped": self.dropped,
                "failed": self.failed, "pruned": self.folder.pruned, "queued": self._queue.qsize(),
                "streams": len(self._newest)}

    def stop(self) -> None:
        """Write what is queued, then end the thread."""
        try:
            self._queue.put(None, timeout=5.0)
        except queue.Full:
            return
        self._thread.join(timeout=10.0)


def draw(seen: Seen, focus: int | None) -> np.ndarray:
    """The frame in BGR with every box drawn (`focus`'s in green and thicker, the others amber), each
    labelled with its label and track id."""
    import cv2

    image = to_bgr(seen.image, seen.order)
    for i, region in enumerate(seen.boxes):
        colour, thickness = (FOCUS_BGR, 2) if i == focus or focus is None else (OTHER_BGR, 1)
        points = np.round(np.asarray(region.box, np.float64)).astype(np.int32).reshape(-1, 1, 2)
        cv2.polylines(image, [points], True, colour, thickness)
        text = caption(region.label, region.track_id)
        if text:
            x0, y0, _, _ = bounds(region.box)
            cv2.putText(image, text, (max(0, x0), max(10, y0 - 4)), cv2.FONT_HERSHEY_SIMPLEX, 0.4, colour, 1)
    return image


def caption(label: str | None, track_id: int | None) -> str:
    """A box's caption: its label (printable ASCII only: OpenCV draws nothing else) and `#track id`."""
    shown = "".join(c if " " <= c <= "~" else "?" for c in (label or ""))[:LABEL_CHARS]
    return " ".join(part for part in (shown, f"#{track_id}" if track_id is not None else "") if part)


def crop_of(seen: Seen, index: int) -> np.ndarray:
    """The object's box cut from the frame (no drawing), in BGR."""
    x0, y0, x1, y1 = crop_bounds(seen, index)
    return to_bgr(seen.image[y0:y1, x0:x1], seen.order)


def crop_bounds(seen: Seen, index: int) -> tuple[int, int, int, int]:
    """The object's box in whole pixels, within the frame and at least a pixel wide and high: its crop."""
    x0, y0, x1, y1 = bounds(seen.boxes[index].box)
    width, height = seen.size
    x0, y0 = min(max(0, x0), width - 1), min(max(0, y0), height - 1)
    return x0, y0, min(width, max(x1, x0 + 1)), min(height, max(y1, y0 + 1))


def to_bgr(image: np.ndarray, order: str) -> np.ndarray:
    """A BGR copy of `image` (in `order`), which may then be drawn on."""
    import cv2

    if image.ndim == 2 or image.shape[2] == 1:
        return np.ascontiguousarray(cv2.cvtColor(np.ascontiguousarray(image.reshape(image.shape[:2])),
                                                 cv2.COLOR_GRAY2BGR))
    if order == "rgb":
        return cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2BGR)
    return np.array(image, copy=True)


def encode(image: np.ndarray, quality: int) -> bytes:
    """A JPEG of `image` (BGR), full chroma where OpenCV allows it (thin boxes keep their colour)."""
    import cv2

    params = [cv2.IMWRITE_JPEG_QUALITY, quality]
    if hasattr(cv2, "IMWRITE_JPEG_SAMPLING_FACTOR"):
        params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444]
    ok, data = cv2.imencode(".jpg", image, params)
    if not ok:
        raise ValueError(f"OpenCV could not encode a {image.shape} frame as JPEG")
    return data.tobytes()
