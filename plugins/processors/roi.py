"""`roi`: the working image cut to where the frame changed, so that the steps after it (a detector)
see only that part (docs/pipelines.md#roi).

A camera's motion gate sends its boxes with each frame (the request's `motion`, `Sample.motion`, in
original-frame pixels). This step cuts the working image to the box that holds them all, grown by
`margin` pixels on each side, and composes the cut onto the sample's transform: a post-processor
(`yolo`, `dbnet`) maps what it finds back to the whole frame as it does after a letterbox. A frame
without boxes (a client's, or a camera's without a gate), or whose boxes cover more than
`whole_above` of it (a cut would save little), goes on whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from infermux.plugins.processors.base import ProcessorError, Sample, parse_config


@dataclass(frozen=True)
class RoiConfig:
    """`margin`: pixels of the working image added around the boxes (an object's edge the gate's
    downscaled view cut off); `whole_above`: a cut holding more than this fraction of the image is not
    made."""

    margin: int = 16
    whole_above: float = 0.6

    def check(self) -> tuple[str, str] | None:
        if self.margin < 0:
            return "margin", "must not be negative"
        return ("whole_above", "must be from 0 to 1") if not 0.0 <= self.whole_above <= 1.0 else None


class Roi:
    """Cuts `sample.tensor` (an H x W [x C] image) to the union of `sample.motion`, plus the margin."""

    kind = "roi"

    def __init__(self, options: Mapping[str, Any], step: str = "roi") -> None:
        self.step = step
        self.config = parse_config(step, RoiConfig, options)

    def __call__(self, sample: Sample) -> None:
        if not sample.motion:
            return
        image = sample.tensor
        if image is None or image.ndim not in (2, 3):
            raise ProcessorError(self.step, "needs an image to cut: put it after 'decode' (or 'resize'), before "
                                 "'normalize'")
        height, width = image.shape[:2]
        t, margin = sample.transform, self.config.margin
        # The boxes are the original frame's: into the working image's pixels, as the steps before it made it.
        x0 = min(box[0] for box in sample.motion) * t.scale_x + t.pad_x - margin
        y0 = min(box[1] for box in sample.motion) * t.scale_y + t.pad_y - margin
        x1 = max(box[2] for box in sample.motion) * t.scale_x + t.pad_x + margin
        y1 = max(box[3] for box in sample.motion) * t.scale_y + t.pad_y + margin
        left, top = max(0, int(x0)), max(0, int(y0))
        right, bottom = min(width, int(x1 + 0.999)), min(height, int(y1 + 0.999))
        if right <= left or bottom <= top:  # the boxes lie outside this image: nothing of it changed
            return
        if (right - left) * (bottom - top) > self.config.whole_above * width * height:
            return
        sample.tensor = image[top:bottom, left:right]
        sample.transform = t.then(1.0, 1.0, -float(left), -float(top))
