"""Reading snapshots back: a JPEG the daemon wrote, and whether a box was drawn on it where it should be."""

from __future__ import annotations

import os

import numpy as np

from support.polling import eventually


def jpeg(path: str) -> np.ndarray:
    """The JPEG at `path` (BGR), once the writer thread put it there (files appear whole: written, then renamed)."""
    import cv2  # the processors' extra; tests/support imports without OpenCV

    return eventually(lambda: os.path.exists(path) and [cv2.imread(path)], f"{path} written")[0]


def bounds(box: list[list[float]]) -> tuple[int, int, int, int]:
    """A region's corners as its axis-aligned bounds (x0, y0, x1, y1), in whole pixels."""
    xs, ys = [p[0] for p in box], [p[1] for p in box]
    return round(min(xs)), round(min(ys)), round(max(xs)), round(max(ys))


def green_share(image: np.ndarray, box: tuple[int, int, int, int]) -> float:
    """The share of the box's top and bottom edge pixels drawn green (BGR), within a pixel of the edge."""
    x0, y0, x1, y1 = box
    hits = total = 0
    for y in (y0, y1):
        for x in range(x0 + 3, x1 - 3):
            around = image[max(0, y - 1):y + 2, x].astype(int)
            total += 1
            hits += any(g > 150 and b < 110 and r < 110 for b, g, r in around)
    return hits / max(total, 1)
