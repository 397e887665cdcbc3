"""A served frame of a keyed stream as the snapshots keep it: the decoded image and the boxes found in it.

The image is kept by reference: the decode step made it, and nothing
writes to it once the frame is answered. The one exception is a frame
decoded in place from a client's shared-memory region (a camera's raw
frames, docs/protocol.md#shared-memory): the client writes its next frames
there, so that image is copied (`kept`).
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from infermux.plugins.processors.base import Region, Sample

if TYPE_CHECKING:
    from infermux.config import PipelineConfig

#: The colour orders a decode step may leave its image in (its `to` option).
ORDERS = ("rgb", "bgr", "gray")


@dataclass(frozen=True)
class Drawn:
    """A region of the frame as a snapshot draws it: its corners, label and track id."""

    box: np.ndarray
    label: str | None
    track_id: int | None


@dataclass(frozen=True)
class Seen:
    """A served frame of stream `key` by `pipeline`: its image (HWC uint8 in `order`), its regions, and
    when it was seen (Unix seconds: its capture time where the request gave one)."""

    key: str
    pipeline: str
    image: np.ndarray
    order: str
    boxes: tuple[Drawn, ...]
    time: float

    @property
    def size(self) -> tuple[int, int]:
        """(width, height)."""
        return int(self.image.shape[1]), int(self.image.shape[0])


def seen_of(image: np.ndarray, data: np.ndarray | None, regions: list[Region], key: str, pipeline: str,
            order: str, time: float) -> Seen:
    """The frame as kept: `image` by reference unless it lies in shared memory (`data`'s buffer)."""
    boxes = tuple(Drawn(r.box, r.label, r.track_id) for r in regions)
    return Seen(key, pipeline, kept(image, data), order, boxes, time)


def kept(image: np.ndarray, data: np.ndarray | None) -> np.ndarray:
    """`image`, or a copy of it where it is a view of a mapped (shared-memory) buffer."""
    if data is not None and in_mapping(image) and np.may_share_memory(image, data):
        return image.copy()
    return image


def in_mapping(array: np.ndarray) -> bool:
    """Whether `array`'s memory belongs to an mmap (a client's region), following its bases."""
    base: object = array
    for _ in range(32):  # a chain of views is short; a cycle is impossible, the bound only guards
        if isinstance(base, np.ndarray):
            base = base.base
        elif isinstance(base, memoryview):
            base = base.obj
        else:
            break
    return isinstance(base, mmap.mmap)


def bounds(box: np.ndarray) -> tuple[int, int, int, int]:
    """A box's bounding rectangle in whole pixels: x0, y0, x1, y1 (x1, y1 excluded)."""
    xs, ys = box[:, 0], box[:, 1]
    return (int(round(float(xs.min()))), int(round(float(ys.min()))), int(round(float(xs.max()))),
            int(round(float(ys.max()))))


def inside(box: np.ndarray, width: int, height: int) -> bool:
    """Whether the box lies wholly inside the frame, touching no edge (an object at the edge may be cut)."""
    x0, y0, x1, y1 = bounds(box)
    return x0 >= 1 and y0 >= 1 and x1 <= width - 1 and y1 <= height - 1 and x1 > x0 and y1 > y0


def colour_order(config: "PipelineConfig") -> str:
    """The colour order its decode step leaves the image in (its `to`; rgb, the step's default)."""
    for step in config.steps:
        if step.processor == "decode":
            order = step.options.get("to", "rgb")
            return order if order in ORDERS else "rgb"
    return "rgb"


def frame_size(sample: Sample) -> tuple[int, int] | None:
    """The original frame's width and height: its decoded image's, else what its header declared."""
    if sample.image is not None and sample.image.ndim >= 2:
        return int(sample.image.shape[1]), int(sample.image.shape[0])
    if sample.width and sample.height:
        return int(sample.width), int(sample.height)
    return None
