"""Wire protocol v1 (docs/protocol.md), shared by the daemon and the client.

A message is `[header JSON, tensor bytes, ...]`, one raw C-contiguous
little-endian frame per tensor, in the order the header lists them. This
module turns frames into typed requests and replies and back, and is the
only place that knows the header's field names.
"""

from __future__ import annotations

import difflib
import json
import math
import time
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

PROTOCOL_VERSION = 1

# The longest deadline a request may ask for (an int32 of ms, ~24.8 days):
# deadlines become float µs on the way, and 10**310 ms overflowed a float.
MAX_TIMEOUT_MS = 2**31 - 1

# The longest stream key, in bytes of UTF-8: a key is stored per stream, shown in metrics, `ctl`, the
# console, events and logs, so it is bounded (and must be printable text) before any of them sees it.
MAX_KEY_BYTES = 256
# An integer key's bound: what a camera counter or id needs, and no 4,000-digit label.
MAX_KEY_INT = 2**63 - 1
# How far a request's `captured` time (epoch seconds) may lie from the daemon's clock, either side: a
# camera's clock may drift, but a capture time days away is a client's mistake, refused before any
# stream's ages count it.
MAX_CAPTURE_SKEW_S = 86_400.0

# The most frames a client may say it replaced since its last request of a key (`replaced`): a count,
# added to the stream's; a larger backlog is carried to the client's next request (client/stream.py).
MAX_REPLACED = 1_000_000

# json.dumps with arguments builds a new encoder per call; this one is reused.
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

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
                  "replaced")
# An input entry's last four describe a camera frame sent to a pipeline (docs/protocol.md, "Pipelines
# on the wire"); the pipeline's first step reads and checks them.
INPUT_FIELDS = ("name", "dtype", "shape", "region", "offset", "format", "width", "height", "stride")
FRAME_FIELDS = ("format", "width", "height", "stride")  # what an input entry may say of a frame (Request.described)
REGION_FIELDS = ("region", "offset")
_REQUEST_SET, _INPUT_SET, _REGION_SET = frozenset(REQUEST_FIELDS), frozenset(INPUT_FIELDS), frozenset(REGION_FIELDS)
# Names that other protocols give a field, too far from ours in spelling for difflib to find.
_ALIASES = {"deadline": "timeout_ms", "deadline_ms": "timeout_ms", "request_id": "id", "model_version": "version"}


# dtype -> wire name; numpy's own `dtype.name` costs microseconds per call.
_NAMES: dict[np.dtype, str] = {dt: name for name, dt in DTYPES.items()}
_NAMES.update({dt.newbyteorder("="): name for name, dt in DTYPES.items()})


def dtype_name(dtype: np.dtype) -> str:
    """The wire name of a numpy dtype ("float32", ...)."""
    name = _NAMES.get(dtype)
    return name if name is not None else dtype.name


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


def _bad(message: str) -> ProtocolError:
    return ProtocolError(Status.BAD_REQUEST, message)


def _parse_meta(item: Any, index: int, limits: Limits, where: str = "inputs") -> TensorMeta:
    where = f"{where}[{index}]"
    if not isinstance(item, dict):
        raise _bad(f"{where} must be an object with name, dtype and shape")
    name, dtype, shape = item.get("name"), item.get("dtype"), item.get("shape")
    if not isinstance(name, str) or not name:
        raise _bad(f"{where}.name must be a non-empty string")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise _bad(f"{where}.dtype {_short(dtype)} is not supported; use one of {', '.join(DTYPES)}")
    if not isinstance(shape, list) or len(shape) > limits.max_rank:
        raise _bad(f"{where}.shape must be a list of at most {limits.max_rank} dimensions (max_rank)")
    if not all(type(d) is int and 0 <= d <= limits.max_elements for d in shape):
        raise _bad(f"{where}.shape {_short(shape)} must hold non-negative integers "
                   f"of at most {limits.max_elements} (max_elements)")
    if math.prod(shape) > limits.max_elements:
        raise _bad(f"{where} has {math.prod(shape)} elements; the limit is {limits.max_elements} (max_elements)")
    return TensorMeta(name, dtype, tuple(shape))


def _short(value: Any, limit: int = 80) -> str:
    """repr() cut to `limit` characters: error messages echo client data, not all of it."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _unknown_fields(where: str, item: Mapping[str, Any], known: tuple[str, ...]) -> ProtocolError:
    """The 400 for fields of `item` outside `known`: each named, with the closest known field."""
    extra = sorted(k for k in item if k not in known)
    named = []
    for name in extra[:4]:  # a header of thousands of keys gets four guesses, not thousands
        guess = _ALIASES.get(name.lower()) or next(iter(difflib.get_close_matches(name.lower(), known, 1)), None)
        named.append(_short(name, 40) + (f" (did you mean {guess!r}?)" if guess else ""))
    more = f" and {len(extra) - 4} more" if len(extra) > 4 else ""
    return _bad(f"unknown {where} field{'s' if len(extra) > 1 else ''} {', '.join(named)}{more}; "
                f"it takes {', '.join(known)}")


def _optional(header: dict[str, Any], key: str, types: tuple[type, ...]) -> Any:
    value = header.get(key)
    if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
        names = " or ".join(t.__name__ for t in types)
        raise _bad(f"header field {key!r} must be {names}")
    return value


def _key(header: dict[str, Any]) -> Any:
    """The header's stream key, checked: printable text (no control characters, no lone surrogates,
    which UTF-8 cannot carry to a metrics page or a terminal) of at most MAX_KEY_BYTES, or an int64."""
    key = _optional(header, "key", (str, int))
    if isinstance(key, int) and not -MAX_KEY_INT - 1 <= key <= MAX_KEY_INT:
        raise _bad(f"header field 'key' {_short(key, 40)} must be a string or a 64-bit integer")
    if isinstance(key, str):
        if len(key) > MAX_KEY_BYTES // 4 and len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
            raise _bad(f"header field 'key' is {len(key.encode('utf-8', 'surrogatepass'))} bytes of UTF-8; "
                       f"the limit is {MAX_KEY_BYTES}")
        if not key.isprintable():  # a lone surrogate is category Cs: not printable either
            raise _bad(f"header field 'key' {_short(key, 40)} must be printable text: no control characters, "
                       "no lone surrogates")
    return key


def parse_header(raw: bytes | memoryview, limits: Limits = Limits()) -> dict[str, Any]:
    """Decode the JSON header frame; it must be an object."""
    if len(raw) > limits.max_header_bytes:
        raise _bad(f"header is {len(raw)} bytes; the limit is {limits.max_header_bytes} (max_header_bytes)")
    try:
        header = json.loads(bytes(raw))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _bad(f"header is not UTF-8 JSON: {exc}") from None
    except RecursionError:  # `[[[[...` a few thousand deep, well inside max_header_bytes
        raise _bad("header JSON nests too deeply") from None
    if not isinstance(header, dict):
        raise _bad("header must be a JSON object")
    return header


def parse_request(frames: Sequence[bytes | memoryview], limits: Limits = Limits(),
                  regions: RegionLookup | None = None) -> Request:
    """Validate `[header, tensors...]` and return the request with numpy inputs.

    The arrays are read-only views on the frames, or on shared-memory
    regions for inputs that name one: no copy is made.
    """
    if not frames or (len(frames) == 1 and not len(frames[0])):
        raise _bad("empty message: expected a JSON header frame, then one frame per input tensor")
    total = sum(len(f) for f in frames)
    if total > limits.max_message_bytes:
        raise ProtocolError(Status.TOO_LARGE, f"message is {total} bytes; "
                            f"the limit is {limits.max_message_bytes} (max_message_bytes)")
    header = parse_header(frames[0], limits)
    if not _REQUEST_SET.issuperset(header):  # no set built on the common path
        raise _unknown_fields("header", header, REQUEST_FIELDS)
    model = header.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("header field 'model' (a non-empty string) is required")
    metas = header.get("inputs", [])
    if not isinstance(metas, list) or len(metas) > limits.max_tensors:
        raise _bad(f"header field 'inputs' must be a list of at most {limits.max_tensors} tensors (max_tensors)")
    in_frames = sum(1 for m in metas if not (isinstance(m, dict) and "region" in m))
    if len(frames) - 1 != in_frames:
        shared = f" (and {len(metas) - in_frames} in shared memory)" if in_frames < len(metas) else ""
        raise _bad(f"header lists {in_frames} inputs{shared} but {len(frames) - 1} tensor frames follow")
    inputs: dict[str, np.ndarray] = {}
    input_regions: dict[str, SharedTensor] = {}
    in_regions = 0  # bytes read from regions so far: bounded before each is looked at
    described: dict[str, dict[str, Any]] | None = None
    next_frame = iter(frames[1:])
    for index, item in enumerate(metas):
        if isinstance(item, dict) and not _INPUT_SET.issuperset(item):  # before a misspelt dtype reads as absent
            raise _unknown_fields(f"inputs[{index}]", item, INPUT_FIELDS)
        meta = _parse_meta(item, index, limits)
        dtype = DTYPES[meta.dtype]
        want = math.prod(meta.shape) * dtype.itemsize
        if meta.name in inputs:
            raise _bad(f"input {meta.name!r} is listed twice")
        if "region" in item:
            input_regions[meta.name] = ref = _parse_shared(item, meta, regions)
            in_regions += want
            if in_regions > limits.max_shared_input_bytes:
                raise ProtocolError(Status.TOO_LARGE, f"inputs in shared memory are {in_regions} bytes (up to input "
                                    f"{meta.name!r}); the limit is {limits.max_shared_input_bytes} "
                                    "(max_shared_input_bytes)")
            frame = regions.view(ref.region, ref.offset, want)  # type: ignore[union-attr]
        else:
            frame = next(next_frame)
            if len(frame) != want:
                raise _bad(f"input {meta.name!r}: {meta.dtype}{list(meta.shape)} needs {want} bytes, "
                           f"frame has {len(frame)}")
        inputs[meta.name] = np.frombuffer(frame, dtype=dtype).reshape(meta.shape)
        if "format" in item or "width" in item or "height" in item or "stride" in item:
            described = described or {}
            described[meta.name] = {k: item[k] for k in FRAME_FIELDS if k in item}
    outputs = header.get("outputs")
    if outputs is not None and (not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs)):
        raise _bad("header field 'outputs' must be a list of output names")
    timeout_ms = _optional(header, "timeout_ms", (int,))
    if timeout_ms is not None and not 0 < timeout_ms <= MAX_TIMEOUT_MS:
        raise _bad(f"header field 'timeout_ms' must be a positive integer of at most {MAX_TIMEOUT_MS}")
    version = _optional(header, "version", (str, int))
    replaced = _replaced(header)
    ident = header.get("id")
    if ident is not None and (not isinstance(ident, (str, int)) or isinstance(ident, bool)):
        raise _bad("header field 'id' must be a string or an integer")
    return Request(
        model=model, inputs=inputs, id=ident,
        version=None if version is None else str(version),
        outputs=None if outputs is None else tuple(outputs),
        timeout_ms=timeout_ms, key=_key(header), captured=_captured(header), replaced=replaced,
        input_regions=input_regions,
        output_regions=_parse_output_regions(header, regions, limits), described=described,
    )


def _captured(header: dict[str, Any]) -> float | None:
    """The header's capture time: epoch seconds within MAX_CAPTURE_SKEW_S of the daemon's clock."""
    value = header.get("captured")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or abs(value - time.time()) > MAX_CAPTURE_SKEW_S:
        raise _bad(f"header field 'captured' {_short(value, 40)} must be the frame's capture time in epoch "
                   f"seconds, within {MAX_CAPTURE_SKEW_S:.0f} s of the daemon's clock")
    return float(value)


def _replaced(header: dict[str, Any]) -> int:
    """The header's `replaced` count: an integer 0 to MAX_REPLACED, with a `key` (it counts on the key's stream)."""
    replaced = _optional(header, "replaced", (int,))
    if replaced is None:
        return 0
    if not 0 <= replaced <= MAX_REPLACED:
        raise _bad(f"header field 'replaced' must be an integer from 0 to {MAX_REPLACED}, got {_short(replaced, 40)}")
    if replaced and header.get("key") is None:
        raise _bad("header field 'replaced' counts frames of a stream: it needs a 'key'")
    return replaced


def _parse_output_regions(header: dict[str, Any], regions: RegionLookup | None,
                          limits: Limits) -> dict[str, OutputRegion]:
    wanted = header.get("output_regions")
    if wanted is None:
        return {}
    if not isinstance(wanted, dict) or len(wanted) > limits.max_tensors:
        raise _bad(f"header field 'output_regions' must map at most {limits.max_tensors} output names "
                   "(max_tensors) to {\"region\": token, \"offset\": bytes}")
    if regions is None:
        raise _bad("'output_regions' needs shared memory, which this daemon does not take "
                   "([daemon] shared_memory is off); leave it out to get outputs in frames")
    out = {}
    for name, place in wanted.items():
        token = place.get("region") if isinstance(place, dict) else None
        offset = place.get("offset", 0) if isinstance(place, dict) else None
        if isinstance(place, dict) and not _REGION_SET.issuperset(place):
            raise _unknown_fields(f"output_regions[{_short(name)}]", place, REGION_FIELDS)
        if not isinstance(token, str) or type(offset) is not int or offset < 0:
            raise _bad(f"output_regions[{_short(name)}] must be {{\"region\": token, \"offset\": a "
                       "non-negative integer}")
        out[name] = OutputRegion(token, offset, regions.writable(token, offset))
    return out


def _parse_shared(item: dict[str, Any], meta: TensorMeta, regions: RegionLookup | None) -> SharedTensor:
    if regions is None:
        raise _bad(f"input {meta.name!r} names a shared-memory region, which this daemon does not take "
                   "([daemon] shared_memory is off); send the tensor in a frame")
    token, offset = item["region"], item.get("offset", 0)
    if not isinstance(token, str) or type(offset) is not int or offset < 0:
        raise _bad(f"input {meta.name!r}: 'region' must be a string and 'offset' a non-negative integer")
    return SharedTensor(token, offset, meta.dtype, meta.shape)


def request_id(frames: Sequence[bytes | memoryview], limits: Limits = Limits()) -> Any:
    """Best-effort `id` of a request that failed to parse, so its error reply can be matched."""
    if not frames or len(frames[0]) > limits.max_header_bytes:
        return None
    try:
        header = json.loads(bytes(frames[0]))
        ident = header.get("id") if isinstance(header, dict) else None
        return ident if isinstance(ident, (str, int)) and not isinstance(ident, bool) else None
    except Exception:
        return None


def encode_header(header: Mapping[str, Any]) -> bytes:
    """A header as UTF-8 JSON.

    Strings echoed from a client (`id`, a version asked for) can hold lone
    surrogates (JSON `"\\ud800"`), which UTF-8 cannot carry; those headers
    go out ASCII-escaped, which every JSON parser reads back to the same string.
    """
    try:
        return _dumps(header).encode()
    except UnicodeEncodeError:
        return json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode()


def _frame(array: np.ndarray) -> memoryview | bytes:
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    if array.nbytes < 1 << 16:
        return array.tobytes()  # cheaper than a buffer view for small tensors
    return np.ascontiguousarray(array).data.cast("B")


def encode_request(model: str, inputs: Mapping[str, np.ndarray | SharedTensor | Frame], *, id: Any = None,
                   version: str | None = None, outputs: Sequence[str] | None = None,
                   timeout_ms: int | None = None, key: str | int | None = None,
                   output_regions: Mapping[str, SharedTensor] | None = None, replaced: int = 0,
                   captured: float | None = None, described: Mapping[str, Mapping[str, Any]] | None = None,
                   ) -> list[Any]:
    """Frames of a request: the header, then one raw frame per input (none for a SharedTensor; a
    Frame's bytes for a Frame, its format and geometry in its entry).

    `replaced`: frames of `key` the client replaced before sending them since its last request (sent when > 0).
    `captured`: the frame's capture time (epoch seconds); `described`: a frame's format and geometry
    (FRAME_FIELDS) for an input sent as a SharedTensor, by input name.

    `output_regions`: outputs to be written into the client's regions, each at
    the offset of the given SharedTensor (its dtype and shape are not sent)."""
    header: dict[str, Any] = {"model": model, "inputs": []}
    frames: list[Any] = [b""]
    for name, value in inputs.items():
        if isinstance(value, Frame):
            header["inputs"].append(value.entry(name))
            frames.append(value.payload())
            continue
        if isinstance(value, SharedTensor):  # no frame: the daemon reads it in the region
            frame = {k: v for k, v in (described or {}).get(name, {}).items() if k in FRAME_FIELDS}
            header["inputs"].append({**TensorMeta(name, value.dtype, value.shape).as_json(),
                                     "region": value.region, "offset": value.offset, **frame})
            continue
        array = np.asarray(value)
        dtype = dtype_name(array.dtype)
        if dtype not in DTYPES:
            raise ValueError(f"input {name!r} has dtype {dtype}; the wire takes {', '.join(DTYPES)}")
        header["inputs"].append(TensorMeta(name, dtype, tuple(array.shape)).as_json())
        frames.append(_frame(array))
    for key_, given in (("id", id), ("version", version), ("timeout_ms", timeout_ms), ("key", key),
                        ("captured", captured)):
        if given is not None:
            header[key_] = given
    if outputs is not None:
        header["outputs"] = list(outputs)
    if output_regions:
        header["output_regions"] = {name: {"region": ref.region, "offset": ref.offset}
                                    for name, ref in output_regions.items()}
    if replaced:
        header["replaced"] = replaced
    frames[0] = encode_header(header)
    return frames


def encode_reply(header: dict[str, Any], outputs: Mapping[str, np.ndarray] | None = None,
                 into: Mapping[str, OutputRegion] | None = None) -> list[Any]:
    """Frames of a reply; `header['outputs']` is filled from `outputs`.

    An output named in `into` that fits its region is copied there and gets
    no frame; its entry in the header says where it is."""
    frames: list[Any] = [b""]
    if outputs:
        metas = []
        for name, value in outputs.items():
            array = np.asarray(value)
            if array.dtype.kind not in _REPLY_KINDS:
                raise ValueError(f"output {name!r} has dtype {array.dtype}, which the wire cannot carry "
                                 f"(numeric and bool dtypes only)")
            meta: dict[str, Any] = {"name": name, "dtype": dtype_name(array.dtype),
                                    "shape": list(array.shape)}
            place = into.get(name) if into else None
            if place is not None and array.nbytes <= place.view.nbytes:
                _write(place.view, array)
                meta["region"], meta["offset"] = place.region, place.offset
            else:  # no region asked for, or too small for it: in a frame as usual
                frames.append(_frame(array))
            metas.append(meta)
        header["outputs"] = metas
    frames[0] = encode_header(header)
    return frames


class OkReplies:
    """The 200 replies of one model version, byte for byte what `encode_reply` makes of
    `{"id", "status": 200, "model", "version", "timing_us": {"queue", "compute", "total"}}` and
    the outputs, in a third of the time: what never changes (model, version) is encoded once,
    each output's entry once per name, dtype and shape. The serving hot path's encoder."""

    _KEPT = 64  # output entries remembered (shapes vary with the batch)

    def __init__(self, model: str, version: str) -> None:
        self._middle = ',"status":200,' + _dumps({"model": model, "version": version})[1:-1] + ',"timing_us":{"queue":'
        self._metas: dict[tuple[str, np.dtype, tuple[int, ...]], str] = {}

    def encode(self, id: Any, queue_us: int, compute_us: int, total_us: int,
               outputs: Mapping[str, np.ndarray]) -> list[Any] | None:
        """The reply's frames; None where only `encode_reply` can answer (no outputs, one the
        wire cannot carry, an id that UTF-8 cannot)."""
        if not outputs:
            return None
        frames: list[Any] = [b""]
        metas = []
        for name, value in outputs.items():
            array = value if type(value) is np.ndarray else np.asarray(value)
            key = (name, array.dtype, array.shape)
            meta = self._metas.get(key)
            if meta is None:
                if array.dtype.kind not in _REPLY_KINDS:
                    return None
                if len(self._metas) >= self._KEPT:
                    self._metas.clear()
                meta = self._metas[key] = _dumps({"name": name, "dtype": dtype_name(array.dtype),
                                                  "shape": list(array.shape)})
            metas.append(meta)
            frames.append(_frame(array))
        try:
            ident = str(id) if type(id) is int else "null" if id is None else _dumps(id)
            frames[0] = (f'{{"id":{ident}{self._middle}{queue_us},"compute":{compute_us},'
                         f'"total":{total_us}}},"outputs":[{",".join(metas)}]}}').encode()
        except UnicodeEncodeError:
            return None
        return frames


def _write(view: memoryview, array: np.ndarray) -> None:
    """Copy `array` to the start of `view` as raw little-endian bytes."""
    dtype = array.dtype.newbyteorder("<") if array.dtype.itemsize > 1 else array.dtype
    target = np.frombuffer(view, dtype=np.uint8, count=array.nbytes).view(dtype).reshape(array.shape)
    if target.ctypes.data == array.ctypes.data and target.dtype == array.dtype:
        return  # computed straight into the region (execution/outputs.py, RegionOutputs)
    np.copyto(target, array, casting="equiv")  # "equiv": a big-endian array is swapped on the way


# retry_after_ms for a state that ends only when someone acts (a failed load fixed, an unloaded
# version loaded, a drain resumed): a client asks again each second rather than spin.
OPERATOR_RETRY_MS = 1000


def limits_reply(frames: Sequence[bytes | memoryview], limits: Limits) -> dict[str, Any] | None:
    """The 200 reply to a limits query (the single frame `{"limits": true}`, `id` optional), else None.

    A client asks before it sends a message over 64 KiB: libzmq drops a connection whose frame
    exceeds max_message_bytes + 64 KiB unread and unanswered (docs/protocol.md, "Size limits")."""
    if len(frames) != 1 or len(frames[0]) > 256:
        return None
    try:
        header = json.loads(bytes(frames[0]))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(header, dict) or header.get("limits") is not True or not {"limits", "id"}.issuperset(header):
        return None
    return {"id": header.get("id"), "status": int(Status.OK), "limits": {
        "max_message_bytes": limits.max_message_bytes, "max_header_bytes": limits.max_header_bytes,
        "max_tensors": limits.max_tensors, "max_rank": limits.max_rank, "max_elements": limits.max_elements}}


def error_header(status: Status, message: str, id: Any = None, **extra: Any) -> dict[str, Any]:
    """A reply header for a request that was not served."""
    header: dict[str, Any] = {"id": id, "status": int(status), "error": message}
    header.update({k: v for k, v in extra.items() if v is not None})
    return header


# Outputs may carry any fixed-size numeric dtype an engine produces (float64,
# int16, ...), not just the request dtypes; anything else is refused.
_REPLY_KINDS = frozenset("biufc")
_REPLY_LIMITS = Limits(max_message_bytes=1 << 62, max_header_bytes=1 << 62, max_tensors=1 << 16,
                       max_rank=32, max_elements=1 << 48)


def _reply_dtype(name: Any) -> np.dtype:
    if not isinstance(name, str):
        raise MalformedReply(f"output dtype {_short(name)} is not a dtype name")
    if name in DTYPES:
        return DTYPES[name]
    try:
        dtype = np.dtype(name)
    except Exception:  # numpy's dtype-string parser raises TypeError, ValueError, SyntaxError...
        dtype = None
    if dtype is None or dtype.kind not in _REPLY_KINDS or dtype.name != name:
        raise MalformedReply(f"output dtype {_short(name)} is not a numeric dtype name")
    return dtype.newbyteorder("<")


def _region_output(item: dict[str, Any], name: str, nbytes: int,
                   regions: Callable[[str, int, int], memoryview] | None) -> memoryview:
    token, offset = item.get("region"), item.get("offset")
    if not isinstance(token, str) or type(offset) is not int or regions is None:
        raise MalformedReply(f"output {name!r} was written to a shared-memory region this client cannot read")
    try:
        return regions(token, offset, nbytes)
    except (KeyError, ValueError) as exc:
        raise MalformedReply(f"output {name!r}: {exc}") from None


def decode_reply(frames: Sequence[bytes | memoryview],
                 regions: Callable[[str, int, int], memoryview] | None = None) -> Reply:
    """Parse a reply's frames (client side); outputs become numpy arrays.

    Outputs the daemon wrote into the client's regions are views on them,
    found by `regions(token, offset, nbytes)` (client.shared_memory.local_view).
    Raises MalformedReply (a ProtocolError, and a ValueError) for frames
    that are not a well-formed reply, and nothing else.
    """
    if not frames:
        raise MalformedReply("empty reply")
    try:
        header = parse_header(frames[0], _REPLY_LIMITS)
    except ProtocolError as exc:
        raise MalformedReply(exc.message) from None
    status = header.get("status", 0)
    if type(status) is not int:
        raise MalformedReply(f"status {_short(status)} is not an integer")
    metas = header.get("outputs") or []
    in_frames = sum(1 for m in metas if not (isinstance(m, dict) and "region" in m)) \
        if isinstance(metas, list) else -1
    if in_frames != len(frames) - 1:
        raise MalformedReply(f"header lists {_short(metas)} as outputs but {len(frames) - 1} frames follow")
    outputs: dict[str, np.ndarray] = {}
    next_frame = iter(frames[1:])
    for index, item in enumerate(metas):
        dtype = _reply_dtype(item.get("dtype") if isinstance(item, dict) else None)
        try:
            meta = _parse_meta({**item, "dtype": "uint8"}, index, _REPLY_LIMITS, "outputs")
        except ProtocolError as exc:
            raise MalformedReply(exc.message) from None
        want = math.prod(meta.shape) * dtype.itemsize
        frame = _region_output(item, meta.name, want, regions) if "region" in item else next(next_frame)
        if len(frame) != want:
            raise MalformedReply(f"output {meta.name!r} needs {want} bytes, frame has {len(frame)}")
        outputs[meta.name] = np.frombuffer(frame, dtype=dtype).reshape(meta.shape)
    return Reply(status=status, header=header, outputs=outputs)
