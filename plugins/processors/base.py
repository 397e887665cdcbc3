"""The processor plugin interface (docs/pipelines.md).

A processor is one pre- or post-processing step: decode a camera frame,
letterbox it, normalise it, decode a detector's output into regions, crop
those regions out of the original frame. Each step reads and writes fields
of one `Sample`, the state of one frame on its way through a pipeline.

A processor is built once from its options and then called from any number
of threads at once: it keeps no per-call state on itself (everything a call
makes goes into the Sample it was given).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol, TypeVar, runtime_checkable

import numpy as np


class ProcessorError(Exception):
    """A step could not process this sample (bad input: the pipeline answers 400 naming the step)."""

    def __init__(self, step: str, reason: str) -> None:
        super().__init__(f"step {step!r}: {reason}")
        self.step = step
        self.reason = reason


class FrameTooLarge(ProcessorError):
    """The frame is over the step's pixel limit (the pipeline answers 413, as for an oversized tensor)."""


class OutOfTime(ProcessorError):
    """The frame cannot be processed before its deadline (the pipeline answers 504; not remembered as a
    refusal of the frame, since another request may give it more time)."""


class ProcessorConfigError(ProcessorError):
    """A step's options are invalid (the configuration is refused; the message names the field)."""


@dataclass(frozen=True)
class Transform:
    """Where a working image's pixels came from: working = original * scale + pad.

    Resizing and letterboxing compose onto it, so a post-processor can map
    boxes found on the model's input back to the original frame.
    """

    scale_x: float = 1.0
    scale_y: float = 1.0
    pad_x: float = 0.0
    pad_y: float = 0.0

    def then(self, scale_x: float, scale_y: float, pad_x: float = 0.0, pad_y: float = 0.0) -> Transform:
        """This transform followed by another scale-and-pad."""
        return Transform(self.scale_x * scale_x, self.scale_y * scale_y,
                         self.pad_x * scale_x + pad_x, self.pad_y * scale_y + pad_y)

    def to_original(self, points: np.ndarray) -> np.ndarray:
        """Points (..., 2) in working-image pixels as float32 original-frame pixels."""
        out = np.asarray(points, dtype=np.float32).copy()
        out[..., 0] = (out[..., 0] - self.pad_x) / self.scale_x
        out[..., 1] = (out[..., 1] - self.pad_y) / self.scale_y
        return out


@dataclass
class Region:
    """Something found in a frame: a quadrilateral in original-frame pixels, clockwise from top-left.

    `track_id` is the object's identity across a stream's frames (set by `track`); `cached` says
    whether a re-inferred step's answer was reused for it (None where no such step ran on it), and
    `skipped` that the step had neither the budget to compute it nor an answer to reuse.
    """

    box: np.ndarray
    score: float
    label: str | None = None
    text: str | None = None
    text_score: float | None = None
    track_id: int | None = None
    cached: bool | None = None
    skipped: bool = False

    def to_json(self) -> dict[str, Any]:
        """The region as the wire's reply header holds it (docs/pipelines.md)."""
        out: dict[str, Any] = {"box": [[round(float(x), 2), round(float(y), 2)] for x, y in self.box],
                               "score": round(float(self.score), 6)}
        if self.track_id is not None:
            out["track_id"] = self.track_id
        if self.label is not None:
            out["label"] = self.label
        if self.text is not None:
            out["text"] = self.text
            if self.text_score is not None:
                out["text_score"] = round(float(self.text_score), 6)
        if self.cached is not None:
            out["cached"] = self.cached
        if self.skipped:
            out["skipped"] = True
        return out


@dataclass(frozen=True)
class Label:
    """One class of a classifier's top-k: its index, its name from the label file, its score."""

    index: int
    label: str
    score: float


@dataclass
class Sample:
    """One frame's state through the steps; owned by one request, never shared between threads.

    `data` with `format` (and for raw frames `width`, `height`, `stride`) is
    the input as the wire delivered it; `image` is the decoded original frame
    (HWC uint8, kept for cropping); `tensor` is the current working array;
    `outputs` holds model outputs by name for the post-processors.
    `key` names the stream (camera) the frame belongs to and `time_ns` when it
    arrived (perf_counter_ns), which orders a stream's frames for `track`;
    a step that cannot be stopped once started checks `deadline_ns` first.
    """

    data: np.ndarray | None = None
    format: str = "rgb"
    width: int | None = None
    height: int | None = None
    stride: int | None = None
    image: np.ndarray | None = None
    tensor: np.ndarray | None = None
    transform: Transform = field(default_factory=Transform)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    regions: list[Region] = field(default_factory=list)
    crops: list[np.ndarray] = field(default_factory=list)
    classes: list[list[Label]] = field(default_factory=list)
    texts: list[tuple[str, float]] = field(default_factory=list)
    key: str | int | None = None
    time_ns: int | None = None
    deadline_ns: int | None = None  # perf_counter_ns by which the frame must be answered
    dropped: int = 0  # regions dropped for a box or score that is not a finite number
    # Where the frame changed, as its request said (`motion`: a camera's gate): x0, y0, x1, y1 in
    # original-frame pixels; empty where it did not say. The `roi` step restricts the working image to them.
    motion: list[tuple[int, int, int, int]] = field(default_factory=list)


@runtime_checkable
class Processor(Protocol):
    """One step, built from its options; thread-safe: it may be called by many threads at once."""

    kind: str
    step: str

    def __call__(self, sample: Sample) -> None:
        """Read and write `sample`'s fields; raise ProcessorError on input this step cannot take."""
        ...


@runtime_checkable
class ProcessorFactory(Protocol):
    """What the entry point names: usually the processor class itself."""

    def __call__(self, options: Mapping[str, Any], step: str = ...) -> Processor: ...


C = TypeVar("C")


def parse_config(step: str, cls: type[C], options: Mapping[str, Any]) -> C:
    """`cls` (a dataclass) from a step's options, or ProcessorConfigError naming the field.

    Unknown fields are refused; lists become tuples; an int is a float where
    a float is wanted. The dataclass's `check()`, where it has one, returns
    (field, reason) for a value outside its range.
    """
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(options) - names)
    if unknown:
        raise ProcessorConfigError(step, f"unknown option {unknown[0]!r}; known: {', '.join(sorted(names))}")
    values = {name: _coerce(step, name, hints[name], value) for name, value in options.items()}
    missing = [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
               if f.name not in values and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ProcessorConfigError(step, f"option {missing[0]!r} is required")
    config = cls(**values)
    problem = getattr(config, "check", lambda: None)()
    if problem:
        raise ProcessorConfigError(step, f"option {problem[0]!r} {problem[1]}")
    return config


def _coerce(step: str, name: str, want: Any, value: Any) -> Any:
    """`value` as type `want`, or ProcessorConfigError naming the option and the type wanted."""
    ok, out = _as_type(want, value)
    if not ok:
        raise ProcessorConfigError(step, f"option {name!r} must be {_describe(want)}, got {value!r}")
    return out


def _as_type(want: Any, value: Any) -> tuple[bool, Any]:
    origin, args = typing.get_origin(want), typing.get_args(want)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            ok, out = _as_type(arg, value)
            if ok:
                return True, out
        return False, None
    if want is type(None):
        return value is None, None
    if origin is tuple:
        return _as_tuple(args, value)
    if want is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else None
    if want is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if want is Path:
        return isinstance(value, (str, Path)), Path(value) if isinstance(value, (str, Path)) else None
    return isinstance(value, want), value


def _as_tuple(args: tuple[Any, ...], value: Any) -> tuple[bool, Any]:
    """`value` as tuple[args] (tuple[X, ...]: any length), each item converted as `_as_type` does."""
    if not isinstance(value, (list, tuple)):
        return False, None
    items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
    if len(items) != len(value):
        return False, None
    converted = [_as_type(a, v) for a, v in zip(items, value)]
    return all(ok for ok, _ in converted), tuple(v for _, v in converted)


def _describe(want: Any) -> str:
    origin, args = typing.get_origin(want), typing.get_args(want)
    if origin in (typing.Union, types.UnionType):  # an optional field: leaving it out is the None
        return " or ".join(_describe(a) for a in args if a is not type(None))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return "a list of " + {int: "integers", float: "numbers", str: "strings"}.get(args[0], "values")
        return f"a list of {len(args)} ({', '.join(_describe(a) for a in args)})"
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", Path: "a path"}
    return names.get(want, getattr(want, "__name__", str(want)))


def read_lines(step: str, option: str, path: Path) -> list[str]:
    """A label or character file, one entry a line (UTF-8), or ProcessorConfigError naming the option."""
    try:
        return [line.rstrip("\r\n") for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ProcessorConfigError(step, f"option {option!r}: cannot read {path}: {exc}") from None


def model_output(step: str, sample: Sample, name: str | None) -> np.ndarray:
    """The model output named `name` (or the only one), or ProcessorError saying which exist."""
    if name is None:
        if len(sample.outputs) != 1:
            raise ProcessorError(step, f"the model has outputs {sorted(sample.outputs)}; set option 'output'")
        return next(iter(sample.outputs.values()))
    if name not in sample.outputs:
        raise ProcessorError(step, f"no model output {name!r}; outputs: {sorted(sample.outputs)}")
    return sample.outputs[name]


def finite_regions(regions: list[Region]) -> tuple[list[Region], int]:
    """The regions whose box and score are finite numbers, and how many others there were: a NaN or an
    infinity from a model has no place in a frame, and nothing after it could crop or track it."""
    kept = [r for r in regions if np.isfinite(r.box).all() and np.isfinite(r.score)]
    return kept, len(regions) - len(kept)


def working(step: str, sample: Sample) -> np.ndarray:
    """The working array (the decoded image until a step replaces it), or ProcessorError."""
    array = sample.tensor if sample.tensor is not None else sample.image
    if array is None:
        raise ProcessorError(step, "no image yet: put a 'decode' step first")
    return array
