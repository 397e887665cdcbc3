#!/usr/bin/env python3
"""Several cameras sending frames to infermux's OCR pipeline; results drawn and written as images.

    python engines/fetch_ppocr.py
    infermux serve --config etc/infermux/examples/ocr.toml &
    python examples/camera_ocr.py --cameras 4 --frames 20 --out /tmp/ocr-out
    python examples/camera_ocr.py --source video.mp4 --format nv12 --fps 15
    python examples/camera_ocr.py --source photos/ --format jpeg

Each camera is a thread producing frames at `--fps` (a camera does not wait
for the daemon) and sending them as JPEG (or raw NV12, as a camera or a
hardware decoder delivers it) on its own `infermux.client.Stream` with the
camera's key: at most one frame in flight, a newer frame replacing one not
sent yet, so what comes back is about the newest frame. The pipeline `ocr`
(etc/infermux/examples/ocr.toml, queue_policy = "newest_per_key") serves the
cameras in turn and batches the text lines of all their frames into its
recogniser. It prints each answer with its age (frame taken to answer) and,
per camera, the frames taken, sent and replaced. A camera keeps a frame's
image only while a reply can still come for it: the stream tells it of
each frame replaced before it was sent (and of each it gave up), and the
daemon counts those too (`infermux ctl streams`, CLIENT). Frames come from a video
file (OpenCV), a folder of images, or, by default, a generator that renders
words onto noise with Pillow.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np

if TYPE_CHECKING:
    from infermux.client import Frame, Reply, Stream

WORDS = ["INFERMUX", "camera", "pipeline", "Jetson", "hello", "world", "batch", "frame", "edge", "OCR",
         "stream", "model", "text", "2026", "gate 7", "exit", "parking", "lane 3", "speed 40", "open"]
FONTS = ["DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf",
         "DejaVuSerif-Bold.ttf", "DejaVuSansCondensed.ttf"]
FONT_DIRS = [Path("/usr/share/fonts/truetype/dejavu"), Path("/usr/share/fonts/dejavu")]


def font_paths() -> list[Path]:
    """The DejaVu fonts found on this box (Debian's fonts-dejavu-core); empty: Pillow's default font."""
    return [d / f for d in FONT_DIRS for f in FONTS if (d / f).is_file()]


def synthetic(seed: int, size: tuple[int, int] = (320, 240)) -> np.ndarray:
    """A BGR frame: noise, then one to three lines of words in a font, size and small rotation
    chosen by `seed` (the same seed gives the same frame)."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    width, height = size
    base = rng.integers(150, 230)
    noise = rng.normal(base, rng.uniform(3, 18), (height, width, 3)).clip(0, 255).astype(np.uint8)
    image = Image.fromarray(noise)
    fonts = font_paths()
    lines = int(rng.integers(1, 4))
    for i in range(lines):
        text = " ".join(str(w) for w in rng.choice(WORDS, size=int(rng.integers(1, 3)), replace=False))
        points = int(rng.integers(20, 34))
        path = str(fonts[int(rng.integers(len(fonts)))]) if fonts else None
        x = int(rng.integers(8, 40))
        font = ImageFont.truetype(path, points) if path else ImageFont.load_default()
        draw = ImageDraw.Draw(Image.new("L", (1, 1)))
        while path and points > 12 and x + draw.textlength(text, font=font) > width - 16:
            points -= 2  # the whole line inside the frame: a glyph cut at the edge reads as anything
            font = ImageFont.truetype(path, points)
        layer = Image.new("L", (width, height), 0)
        y = 12 + i * (height - 24) // lines + int(rng.integers(0, 10))
        ImageDraw.Draw(layer).text((x, y), text, fill=255, font=font)
        layer = layer.rotate(float(rng.uniform(-4, 4)), resample=Image.BILINEAR, center=(width / 2, y + points / 2))
        ink = Image.new("RGB", (width, height), tuple(int(c) for c in rng.integers(0, 70, 3)))
        image = Image.composite(ink, image, layer)
    return np.ascontiguousarray(np.asarray(image)[:, :, ::-1])


def frames(source: str | None, count: int, camera: int) -> Iterator[np.ndarray]:
    """BGR frames from a video file, a folder of images, or the generator."""
    import cv2

    if source is None:
        for i in range(count):
            yield synthetic(camera * 100_000 + i)
    elif Path(source).is_dir():
        files = sorted(p for p in Path(source).iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
        for path in files[:count]:
            image = cv2.imread(str(path))
            if image is not None:
                yield image
    else:
        video = cv2.VideoCapture(source)
        for _ in range(count):
            ok, image = video.read()
            if not ok:
                break
            yield image
        video.release()


def to_nv12(bgr: np.ndarray) -> tuple[bytes, int, int]:
    """A BGR frame as NV12 bytes (even width and height), as a camera sends it."""
    import cv2

    h, w = bgr.shape[0] & ~1, bgr.shape[1] & ~1
    i420 = cv2.cvtColor(np.ascontiguousarray(bgr[:h, :w]), cv2.COLOR_BGR2YUV_I420).reshape(-1)
    y, u, v = i420[:w * h], i420[w * h:w * h * 5 // 4], i420[w * h * 5 // 4:]
    uv = np.stack([u, v], axis=1).reshape(-1)
    return np.concatenate([y, uv]).tobytes(), w, h


def draw(bgr: np.ndarray, regions: list[dict]) -> np.ndarray:
    """The frame with each region's box and text drawn on it."""
    import cv2

    out = bgr.copy()
    for region in regions:
        box = np.array(region["box"], np.int32)
        cv2.polylines(out, [box], True, (0, 200, 0), 2)
        cv2.putText(out, region.get("text", region.get("label", "")), (int(box[0][0]), max(12, int(box[0][1]) - 4)),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 255), 1)
    return out


def encode(bgr: np.ndarray, fmt: str) -> Frame:
    """A BGR image as the frame a camera sends: JPEG, or raw NV12."""
    import cv2

    from infermux.client import Frame

    if fmt == "nv12":
        data, w, h = to_nv12(bgr)
        return Frame(data, "nv12", width=w, height=h, stride=w)
    return Frame(cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, 92])[1].tobytes(), "jpeg")


class Camera:
    """What one camera keeps of its frames: the image and when it was taken, by request id, only while a
    reply can still come for it (the frame in flight and the one waiting to be sent): the stream tells
    `dropped` of every frame replaced before it was sent or given up, `answered` of every reply."""

    def __init__(self, index: int, out: str | None = None, latencies: list[float] | None = None) -> None:
        self.index, self.out = index, out
        self.latencies = latencies if latencies is not None else []
        self.taken: dict[int, tuple[int, float, np.ndarray]] = {}  # request id -> (frame number, when taken, image)
        # The stream's thread answers while this one sends; re-entrant: `send` calls `dropped` before it returns.
        self._lock = threading.RLock()

    def take(self, stream: Stream, n: int, bgr: np.ndarray, fmt: str = "jpeg") -> int:
        """Send frame `n` on `stream` and keep its image until its reply or its drop; the request's id."""
        frame = encode(bgr, fmt)
        with self._lock:  # before the reply can be handled: it may come the moment the frame is sent
            ident = stream.send(frame)
            self.taken[ident] = (n, time.perf_counter(), bgr)
        return ident

    def dropped(self, ident: int) -> None:
        """A frame that will never get a reply: replaced by a newer one before it was sent, or given up."""
        with self._lock:
            self.taken.pop(ident, None)

    def answered(self, reply: Reply) -> None:  # on the stream's thread
        """Print a reply with its age, and draw it where --out asks."""
        with self._lock:
            kept = self.taken.pop(reply.header.get("id"), None)
        if kept is None:
            return
        n, at, bgr = kept
        ms = (time.perf_counter() - at) * 1000
        if reply.status != 200:
            print(f"camera {self.index} frame {n}: {reply.status} {reply.header.get('error')}", flush=True)
            return
        regions = reply.header.get("regions", [])
        texts = ", ".join(r.get("text", "?") for r in regions) or "(no text)"
        print(f"camera {self.index} frame {n}: {ms:7.1f} ms old  {texts}", flush=True)
        with self._lock:
            self.latencies.append(ms)
        if self.out:
            import cv2

            cv2.imwrite(str(Path(self.out) / f"cam{self.index}_{n:05d}.jpg"), draw(bgr, regions))


def camera(index: int, args: argparse.Namespace, latencies: list[float], lock: threading.Lock) -> None:
    """One camera: a frame every 1/fps s on its own stream, whatever the daemon does with them."""
    from infermux.client import Stream

    mine = Camera(index, args.out)
    period = 1.0 / args.fps if args.fps else 0.0
    n = -1
    with Stream(args.endpoint, args.model, key=f"camera-{index}", on_reply=mine.answered, on_dropped=mine.dropped,
                timeout_s=30) as stream:
        start = time.perf_counter()
        for n, bgr in enumerate(frames(args.source, args.frames, index)):
            if not period:
                stream.wait()  # --fps 0: the next frame once the last is answered
            mine.take(stream, n, bgr, args.format)
            time.sleep(max(0.0, start + (n + 1) * period - time.perf_counter()))
        stream.wait()
        counts = stream.counts
    with lock:
        latencies.extend(mine.latencies)
    print(f"camera {index}: {n + 1} frames taken, {counts.sent} sent, {counts.replaced} replaced by a newer one "
          f"before they were sent, {counts.served} answered 200", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = f"ipc://{os.environ.get('RUNTIME_DIRECTORY', '/run/infermux')}/infer.sock"
    parser.add_argument("--endpoint", default=default, help=f"the daemon's inference socket ({default})")
    parser.add_argument("--model", default="ocr", help="the pipeline (ocr)")
    parser.add_argument("--source", help="a video file or a folder of images (default: generated frames)")
    parser.add_argument("--format", choices=("jpeg", "nv12"), default="jpeg", help="how frames are sent")
    parser.add_argument("--cameras", type=int, default=2)
    parser.add_argument("--frames", type=int, default=10, help="frames per camera")
    parser.add_argument("--fps", type=float, default=10.0, help="frames per second each camera takes (10; 0: the "
                        "next frame once the last is answered)")
    parser.add_argument("--out", help="a folder for the frames with their results drawn on")
    args = parser.parse_args()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    latencies: list[float] = []
    lock = threading.Lock()
    start = time.perf_counter()
    threads = [threading.Thread(target=camera, args=(i, args, latencies, lock)) for i in range(args.cameras)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    if latencies:
        p50, p99 = np.percentile(latencies, [50, 99])
        print(f"{len(latencies)} answers in {seconds:.1f} s: {len(latencies) / seconds:.1f} fps, "
              f"age of an answer p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    return 0 if latencies else 1


if __name__ == "__main__":
    sys.exit(main())
