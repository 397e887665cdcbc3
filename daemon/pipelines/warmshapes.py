"""The shapes a pipeline's model steps send their models, derived from its steps: what a model is
warmed at when it loads (models/hot.py), so that a camera's first frame costs what its hundredth does.

A `resize` fixes the working image's size: `stretch` and `letterbox` whatever the frame, `height`
its height (and its width where it pads to `max_width`), `multiple` from the frame's size, which
the pipeline's `warm_frames` lists. `normalize` and `layout` make it CHW and add the batch axis,
`cast` sets the dtype. A per-region model step (`for_each = "regions"`) is warmed with one crop,
one row of its batch, the last axis padded to `pad_multiple` as the pipeline pads it. Where a size
depends on what a frame holds (a crop's width, a frame's size that `warm_frames` does not list),
the step is not warmed at it: its model is warmed as any other, at the smallest shape it takes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from infermux.config import Config, PipelineConfig, StepConfig
from infermux.models.hot import WarmShape
from infermux.plugins import processors

log = logging.getLogger("infermux.pipelines")

MAX_SHAPES_PER_MODEL = 8  # each is two more inferences while the model loads
SHAPED = ("decode", "resize", "normalize", "layout", "cast")  # the steps whose output shape is known here


@dataclass(frozen=True)
class Working:
    """What the working tensor is known to be at a step; None where it depends on the frame's content."""

    width: int | None
    height: int | None
    channels: int | None
    chw: bool = False
    batch: bool = False
    dtype: str = "uint8"
    max_width: int | None = None  # a `height` resize's bound on a crop's width, where the width is not known


UNKNOWN = Working(None, None, None)


def for_model(config: Config, model: str) -> list[WarmShape]:
    """The shapes every pipeline of `config` sends `model` (at most MAX_SHAPES_PER_MODEL, each once)."""
    found: list[WarmShape] = []
    for pipeline in config.pipelines:
        if not any(step.model == model for step in pipeline.steps):
            continue
        try:
            shapes = [shape for name, shape in warm_shapes(pipeline) if name == model]
        except Exception as exc:  # a plugin's options or a processor that cannot be built: warm as before
            log.warning("pipeline %r: its shapes for model %r are not known (%s); warmed at its smallest shape",
                        pipeline.name, model, exc)
            continue
        for shape in shapes:
            if not any((s.input, s.shape, s.dtype) == (shape.input, shape.shape, shape.dtype) for s in found):
                found.append(shape)
    return found[:MAX_SHAPES_PER_MODEL]


def warm_shapes(pipeline: PipelineConfig) -> list[tuple[str, WarmShape]]:
    """(model, shape) of each model step whose input shape the steps before it fix, per warm frame."""
    out: list[tuple[str, WarmShape]] = []
    for frame in pipeline.warm_frames or (None,):
        working = Working(frame[0], frame[1], 3) if frame else Working(None, None, 3)
        fan_out, image_channels = False, 3  # crops are cut from the decoded frame: its channels
        for step in pipeline.steps:
            if (step.for_each == "regions") != fan_out:
                fan_out = not fan_out
                working = replace(UNKNOWN, channels=image_channels) if fan_out else UNKNOWN
            if step.model:
                shape = model_shape(working, step, fan_out)
                if shape is not None:
                    why = f"pipeline {pipeline.name!r} step {step.name!r}" + (f" at {frame[0]}x{frame[1]}" if frame else "")
                    out.append((step.model, WarmShape(step.input, shape, working.dtype, why)))
                working = UNKNOWN  # what a model step leaves is the next processors' to read
            else:
                working = through(step, working)
                if step.processor == "decode":
                    image_channels = working.channels or image_channels
    return out


def through(step: StepConfig, working: Working) -> Working:
    """What processor `step` makes of `working`, as far as its options say."""
    if step.processor not in SHAPED:
        return UNKNOWN
    config: Any = getattr(processors.create(step.processor, step.options, step.name), "config")
    if step.processor == "decode":
        return replace(working, channels=1 if config.to == "gray" else 3, chw=False, batch=False, dtype="uint8")
    if step.processor == "resize":
        return resized(step, working)
    if step.processor in ("normalize", "layout"):
        return replace(working, chw=config.chw, batch=config.batch,
                       dtype="float32" if step.processor == "normalize" else working.dtype)
    return replace(working, dtype=config.dtype)  # cast


def resized(step: StepConfig, working: Working) -> Working:
    """The working image's size after `resize` step `step`, where it is known."""
    resize: Any = processors.create("resize", step.options, step.name)
    c = resize.config
    if c.mode in ("stretch", "letterbox"):
        width, height = resize.output_size(1, 1)  # the frame's own size does not matter
        return replace(working, width=width, height=height)
    if working.width is not None and working.height is not None:
        try:
            width, height = resize.output_size(working.width, working.height)
        except processors.ProcessorError:  # a warm frame this pipeline refuses (max_side): nothing to warm
            return replace(working, width=None, height=None)
        return replace(working, width=width, height=height)
    if c.mode == "height":
        padded = c.pad and c.max_width
        return replace(working, width=c.max_width if padded else None, height=c.height, max_width=c.max_width)
    return replace(working, width=None, height=None)


def model_shape(working: Working, step: StepConfig, fan_out: bool) -> tuple[int, ...] | None:
    """The batch a model step sends for one frame (one crop where `fan_out`); None where not known."""
    width = working.width
    if width is None and fan_out and working.max_width and step.pad_multiple >= working.max_width:
        width = step.pad_multiple  # every crop, at most max_width wide, is padded to one multiple
    if width is None or working.height is None or working.channels is None:
        return None
    dims = [working.channels, working.height, width] if working.chw else [working.height, width, working.channels]
    dims[-1] = -(-dims[-1] // step.pad_multiple) * step.pad_multiple  # as the pipeline pads the batch
    return (1, *dims) if working.batch else tuple(dims)
