"""The wire protocol's data model (docs/protocol.md): statuses, errors, limits, the tensors and frames
a message carries, and a request and a reply as their parsers give them.

Everything here is importable from `infermux.protocol`, as clients and the daemon import it; the
parsers are there, the encoders in protocol_encode.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol

import numpy as np

# numpy dtype names accepted on the wire; "<" pins little-endian.
DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<") if np.dtype(name).itemsize > 1 else np.dtype(name)
    for name in ("float32", "float16", "uint8", "int8", "int32", "int64", "bool")
}


# The fields each part of a request header may carry, in the order the docs list
# them. Anything else is refused (400 naming it) rather than ignored, so that a
# typo such as `timout_ms` or a field from another server's protocol
# (`deadline_ms`) is seen instead of silently changing nothing.
REQUEST_FIELDS = ("model", "inputs", "id", "version", "outputs", "timeout_ms", "key", "output_regions", "captured",
                  "replaced", "motion")
# An input entry's last four describe a camera frame sent to a pipeline (docs/protocol.md, "Pipelines
# on the wire"); the pipeline's first step reads and checks them.
INPUT_FIELDS = ("name", "dtype", "shape", "region", "offset", "format", "width", "height", "stride")
FRAME_FIELDS = ("format", "width", "height", "stride")  # what an input entry may say of a frame (Request.described)
REGION_FIELDS = ("region", "offset")

# dtype -> wire name; numpy's own `dtype.name` costs microseconds per call.
_NAMES: dict[np.dtype, str] = {dt: name for name, dt in DTYPES.items()}
_NAMES.update({dt.newbyteorder("="): name for name, dt in DTYPES.items()})


def dtype_name(dtype: np.dtype) -> str:
    """The wire name of a numpy dtype ("float32", ...)."""
    name = _NAMES.get(dtype)
    return name if name is not None else dtype.name

# retry_after_ms for a state that ends only when someone acts (a failed load fixed, an unloaded
# version loaded, a drain resumed): a client asks again each second rather than spin.
OPERATOR_RETRY_MS = 1000

# Outputs may carry any fixed-size numeric dtype an engine produces (float64,
# int16, ...), not just the request dtypes; anything else is refused.
REPLY_KINDS = frozenset("biufc")


class Status(IntEnum):
    """HTTP-like reply status codes."""

    OK = 200
    BAD_REQUEST = 400
    FORBIDDEN = 403  # the request's stream key belongs to another connection (stream_keys = "bound")
    NOT_FOUND = 404
    SUPERSEDED = 409  # a stream's newer request replaced this one before it was computed
    TOO_LARGE = 413
    TOO_MANY = 429
    BACKEND_ERROR = 500
    NOT_READY = 503
    DEADLINE = 504


class ProtocolError(Exception):
    """A request the daemon answers with `status` and `message` instead of serving it."""

    def __init__(self, status: Status, message: str, retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_ms = retry_after_ms


class MalformedReply(ProtocolError, ValueError):
    """A reply the client cannot decode (also a ValueError, as decode_reply raised before)."""

    def __init__(self, message: str) -> None:
        super().__init__(Status.BAD_REQUEST, f"malformed reply: {message}")


@dataclass(frozen=True)
class Limits:
    """Safe bounds on what one request may ask of the daemon.

    Each field is the `[daemon]` setting of the same name; error messages
    name it so an operator knows which one a client ran into.
    """

    max_message_bytes: int = 64 * 1024 * 1024
    max_header_bytes: int = 64 * 1024
    max_tensors: int = 64
    max_rank: int = 8
    max_elements: int = 1 << 28
    max_shared_input_bytes: int = 256 << 20  # inputs in shared-memory regions, all of a request's together
    max_reply_bytes: int = 64 * 1024 * 1024  # what the daemon sends back in one reply (not counting regions)


@dataclass(frozen=True)
class TensorMeta:
    """Name, dtype and shape of one tensor frame."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class SharedTensor:
    """An input that lies in a registered shared-memory region instead of a frame (regions.py).

    On the wire it is the input's entry in the header with `"region"` and
    `"offset"` added, and no frame of its own."""

    region: str
    offset: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype].itemsize


class RegionLookup(Protocol):
    """Where the daemon finds the bytes a SharedTensor points at (regions.RegionTable)."""

    def view(self, token: str, offset: int, nbytes: int) -> memoryview:
        """The bytes, or ProtocolError when the region is unknown or too small."""
        ...

    def writable(self, token: str, offset: int) -> memoryview:
        """The region from `offset` to its end, writable; ProtocolError when it cannot be written."""
        ...


@dataclass(frozen=True)
class OutputRegion:
    """Where a request asked for one output to be written: `view` is its region from `offset` on."""

    region: str
    offset: int
    view: memoryview


# A frame's formats (docs/protocol.md, "Pipelines on the wire"): files, then raw pixels.
ENCODED_FORMATS = ("jpeg", "jpg", "png")
RAW_FORMATS = {"bgr": 3, "rgb": 3, "gray": 1, "nv12": 1, "i420": 1}  # bytes per pixel of a row (luma for YUV)


@dataclass(frozen=True)
class Frame:
    """A camera frame, as a pipeline's input takes it: a JPEG or PNG file's bytes, or raw pixels with
    their geometry (`width`, `height`, and `stride`, bytes per row; packed when absent).

        Frame(jpeg_bytes, "jpeg")
        Frame.of(image)                      # an H x W x 3 BGR uint8 array (OpenCV's), or H x W gray
        Frame(nv12_bytes, "nv12", width=1280, height=720, stride=1280)

    In `Client.infer`, `Pipeline.submit` and `Stream.send` it is one input, sent as one uint8 tensor
    of its bytes with "format" and the geometry in its header entry; those check it first (`check`),
    as the daemon's decode step would, so a wrong size is a ValueError before anything is sent."""

    data: bytes | np.ndarray
    format: str
    width: int | None = None
    height: int | None = None
    stride: int | None = None

    def check(self) -> "Frame":
        """Itself, if the daemon's decode step can take it; else ValueError saying what is wrong."""
        if self.format not in (*ENCODED_FORMATS, *RAW_FORMATS):
            raise ValueError(f"frame format {self.format!r}: use one of {', '.join((*ENCODED_FORMATS, *RAW_FORMATS))}")
        if self.format in RAW_FORMATS:
            if not (isinstance(self.width, int) and isinstance(self.height, int) and self.width > 0
                    and self.height > 0):
                raise ValueError(f"a raw {self.format} frame needs its width and height (positive integers)")
            stride = self.stride or self.width * RAW_FORMATS[self.format]
            if stride < self.width * RAW_FORMATS[self.format]:
                raise ValueError(f"stride {stride} is less than a {self.format} row of width {self.width}")
            rows = self.height * 3 // 2 if self.format in ("nv12", "i420") else self.height
            if len(self.payload()) != stride * rows:
                raise ValueError(f"a {self.width}x{self.height} {self.format} frame with stride {stride} is "
                                 f"{stride * rows} bytes, got {len(self.payload())}")
        return self

    @classmethod
    def of(cls, image: np.ndarray, format: str = "bgr") -> "Frame":
        """A raw frame from an image array: H x W x 3 (bgr or rgb) or H x W (gray) uint8, rows packed or
        not (a crop's rows keep their stride when the array's own layout allows; else it is copied)."""
        if image.dtype != np.uint8 or image.ndim not in (2, 3):
            raise ValueError(f"an image is an H x W (x C) uint8 array, got {image.dtype}{list(image.shape)}")
        channels = image.shape[2] if image.ndim == 3 else 1
        if channels != RAW_FORMATS.get(format):
            raise ValueError(f"a {format} frame has {RAW_FORMATS.get(format, '?')} channel(s), the array has {channels}")
        height, width = image.shape[:2]
        if not image.flags.c_contiguous:
            image = np.ascontiguousarray(image)
        return cls(image, format, width=width, height=height, stride=width * channels).check()

    def payload(self) -> memoryview | bytes:
        """The frame's bytes, as they go in the tensor frame."""
        if isinstance(self.data, np.ndarray):
            return np.ascontiguousarray(self.data).reshape(-1).view(np.uint8).data
        return self.data

    def entry(self, name: str) -> dict[str, Any]:
        """Its `inputs` entry: a uint8 tensor of its bytes, with the format and geometry."""
        entry: dict[str, Any] = {"name": name, "dtype": "uint8", "shape": [len(self.payload())], "format": self.format}
        entry.update({k: v for k, v in (("width", self.width), ("height", self.height), ("stride", self.stride))
                      if v is not None})
        return entry


@dataclass
class Request:
    """A parsed, validated inference request.

    `input_regions` names the inputs that came from shared-memory regions; their
    arrays in `inputs` are views on the daemon's mapping of the region.
    `output_regions` names the outputs the client wants written into its
    regions instead of sent in frames (when they fit)."""

    model: str
    inputs: dict[str, np.ndarray]
    id: str | int | None = None
    version: str | None = None
    outputs: tuple[str, ...] | None = None
    timeout_ms: int | None = None
    key: str | None = None
    captured: float | None = None  # when the frame was captured (epoch seconds): stream ages count from it
    replaced: int = 0  # frames of this key the client replaced before sending them, since its last request
    # Where the frame changed (a camera's motion gate): boxes x0, y0, x1, y1 in its pixels, for a pipeline.
    motion: tuple[tuple[int, int, int, int], ...] = ()
    input_regions: dict[str, SharedTensor] = field(default_factory=dict)
    output_regions: dict[str, OutputRegion] = field(default_factory=dict)
    # A frame's entry as its header gave it ("format" and the geometry, FRAME_FIELDS), by input name,
    # for the inputs that give any: a pipeline reads its frame from it instead of parsing the header
    # again. Not checked here (the pipeline's processors check what they read); None where none does.
    described: dict[str, dict[str, Any]] | None = None


@dataclass
class Reply:
    """A reply as the client sees it: the status, the header and decoded outputs."""

    status: int
    header: dict[str, Any]
    outputs: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    @property
    def error(self) -> str | None:
        return self.header.get("error")

    @property
    def model(self) -> str | None:
        return self.header.get("model")

    @property
    def version(self) -> str | None:
        return self.header.get("version")

    @property
    def retry_after_ms(self) -> int | None:
        return self.header.get("retry_after_ms")

    @property
    def fallback(self) -> dict[str, str] | None:
        return self.header.get("fallback")

    @property
    def superseded_by(self) -> str | int | None:
        """With a 409: the id of the newer request of the same key that replaced this one."""
        return self.header.get("superseded_by")
