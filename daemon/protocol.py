"""Wire protocol v1 (DESIGN §4), shared by the daemon and the client.

A message is `[header JSON, tensor bytes, ...]`, one raw C-contiguous
little-endian frame per tensor, in the order the header lists them. This
module turns frames into typed requests and replies and back, and is the
only place that knows the header's field names.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Mapping, Sequence

import numpy as np

PROTOCOL_VERSION = 1

# json.dumps with arguments builds a new encoder per call; this one is reused.
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

# numpy dtype names accepted on the wire; "<" pins little-endian.
DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<") if np.dtype(name).itemsize > 1 else np.dtype(name)
    for name in ("float32", "float16", "uint8", "int8", "int32", "int64", "bool")
}


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
    NOT_FOUND = 404
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


@dataclass(frozen=True)
class Limits:
    """Safe bounds on what one request may ask of the daemon."""

    max_message_bytes: int = 64 * 1024 * 1024
    max_header_bytes: int = 64 * 1024
    max_tensors: int = 64
    max_rank: int = 8
    max_elements: int = 1 << 28


@dataclass(frozen=True)
class TensorMeta:
    """Name, dtype and shape of one tensor frame."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass
class Request:
    """A parsed, validated inference request."""

    model: str
    inputs: dict[str, np.ndarray]
    id: str | int | None = None
    version: str | None = None
    outputs: tuple[str, ...] | None = None
    timeout_ms: int | None = None
    key: str | None = None


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


def _bad(message: str) -> ProtocolError:
    return ProtocolError(Status.BAD_REQUEST, message)


def _parse_meta(item: Any, index: int, limits: Limits) -> TensorMeta:
    where = f"inputs[{index}]"
    if not isinstance(item, dict):
        raise _bad(f"{where} must be an object with name, dtype and shape")
    name, dtype, shape = item.get("name"), item.get("dtype"), item.get("shape")
    if not isinstance(name, str) or not name:
        raise _bad(f"{where}.name must be a non-empty string")
    if dtype not in DTYPES:
        raise _bad(f"{where}.dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    if not isinstance(shape, list) or len(shape) > limits.max_rank:
        raise _bad(f"{where}.shape must be a list of at most {limits.max_rank} dimensions")
    if not all(type(d) is int and 0 <= d <= limits.max_elements for d in shape):
        raise _bad(f"{where}.shape {shape!r} must hold non-negative integers")
    if math.prod(shape) > limits.max_elements:
        raise _bad(f"{where} has {math.prod(shape)} elements; the limit is {limits.max_elements}")
    return TensorMeta(name, dtype, tuple(shape))


def _optional(header: dict[str, Any], key: str, types: tuple[type, ...]) -> Any:
    value = header.get(key)
    if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
        names = " or ".join(t.__name__ for t in types)
        raise _bad(f"header field {key!r} must be {names}")
    return value


def parse_header(raw: bytes | memoryview, limits: Limits = Limits()) -> dict[str, Any]:
    """Decode the JSON header frame; it must be an object."""
    if len(raw) > limits.max_header_bytes:
        raise _bad(f"header is {len(raw)} bytes; the limit is {limits.max_header_bytes}")
    try:
        header = json.loads(bytes(raw))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _bad(f"header is not UTF-8 JSON: {exc}") from None
    if not isinstance(header, dict):
        raise _bad("header must be a JSON object")
    return header


def parse_request(frames: Sequence[bytes | memoryview], limits: Limits = Limits()) -> Request:
    """Validate `[header, tensors...]` and return the request with numpy inputs.

    The arrays are read-only views on the frames: no copy is made.
    """
    if not frames or (len(frames) == 1 and not len(frames[0])):
        raise _bad("empty message: expected a JSON header frame, then one frame per input tensor")
    total = sum(len(f) for f in frames)
    if total > limits.max_message_bytes:
        raise ProtocolError(Status.TOO_LARGE,
                            f"message is {total} bytes; the limit is {limits.max_message_bytes}")
    header = parse_header(frames[0], limits)
    model = header.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("header field 'model' (a non-empty string) is required")
    metas = header.get("inputs", [])
    if not isinstance(metas, list) or len(metas) > limits.max_tensors:
        raise _bad(f"header field 'inputs' must be a list of at most {limits.max_tensors} tensors")
    if len(frames) - 1 != len(metas):
        raise _bad(f"header lists {len(metas)} inputs but {len(frames) - 1} tensor frames follow")
    inputs: dict[str, np.ndarray] = {}
    for index, (item, frame) in enumerate(zip(metas, frames[1:])):
        meta = _parse_meta(item, index, limits)
        dtype = DTYPES[meta.dtype]
        want = math.prod(meta.shape) * dtype.itemsize
        if len(frame) != want:
            raise _bad(f"input {meta.name!r}: {meta.dtype}{list(meta.shape)} needs {want} bytes, "
                       f"frame has {len(frame)}")
        if meta.name in inputs:
            raise _bad(f"input {meta.name!r} is listed twice")
        inputs[meta.name] = np.frombuffer(frame, dtype=dtype).reshape(meta.shape)
    outputs = header.get("outputs")
    if outputs is not None and (not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs)):
        raise _bad("header field 'outputs' must be a list of output names")
    timeout_ms = _optional(header, "timeout_ms", (int,))
    if timeout_ms is not None and timeout_ms <= 0:
        raise _bad("header field 'timeout_ms' must be a positive integer")
    version = _optional(header, "version", (str, int))
    ident = header.get("id")
    if ident is not None and (not isinstance(ident, (str, int)) or isinstance(ident, bool)):
        raise _bad("header field 'id' must be a string or an integer")
    return Request(
        model=model, inputs=inputs, id=ident,
        version=None if version is None else str(version),
        outputs=None if outputs is None else tuple(outputs),
        timeout_ms=timeout_ms, key=_optional(header, "key", (str, int)),
    )


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


def _frame(array: np.ndarray) -> memoryview | bytes:
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    if array.nbytes < 1 << 16:
        return array.tobytes()  # cheaper than a buffer view for small tensors
    return memoryview(np.ascontiguousarray(array)).cast("B")


def encode_request(model: str, inputs: Mapping[str, np.ndarray], *, id: Any = None,
                   version: str | None = None, outputs: Sequence[str] | None = None,
                   timeout_ms: int | None = None, key: str | None = None) -> list[Any]:
    """Frames of a request: the header, then one raw frame per input."""
    header: dict[str, Any] = {"model": model, "inputs": []}
    frames: list[Any] = [b""]
    for name, value in inputs.items():
        array = np.asarray(value)
        dtype = dtype_name(array.dtype)
        if dtype not in DTYPES:
            raise ValueError(f"input {name!r} has dtype {dtype}; the wire takes {', '.join(DTYPES)}")
        header["inputs"].append(TensorMeta(name, dtype, tuple(array.shape)).as_json())
        frames.append(_frame(array))
    for key_, value in (("id", id), ("version", version), ("timeout_ms", timeout_ms), ("key", key)):
        if value is not None:
            header[key_] = value
    if outputs is not None:
        header["outputs"] = list(outputs)
    frames[0] = _dumps(header).encode()
    return frames


def encode_reply(header: dict[str, Any], outputs: Mapping[str, np.ndarray] | None = None) -> list[Any]:
    """Frames of a reply; `header['outputs']` is filled from `outputs`."""
    frames: list[Any] = [b""]
    if outputs:
        metas = []
        for name, value in outputs.items():
            array = np.asarray(value)
            metas.append({"name": name, "dtype": dtype_name(array.dtype), "shape": list(array.shape)})
            frames.append(_frame(array))
        header["outputs"] = metas
    frames[0] = _dumps(header).encode()
    return frames


def error_header(status: Status, message: str, id: Any = None, **extra: Any) -> dict[str, Any]:
    """A reply header for a request that was not served."""
    header: dict[str, Any] = {"id": id, "status": int(status), "error": message}
    header.update({k: v for k, v in extra.items() if v is not None})
    return header


def decode_reply(frames: Sequence[bytes | memoryview]) -> Reply:
    """Parse a reply's frames (client side); outputs become numpy arrays."""
    if not frames:
        raise ValueError("empty reply")
    header = json.loads(bytes(frames[0]))
    outputs: dict[str, np.ndarray] = {}
    metas = header.get("outputs") or []
    if len(metas) != len(frames) - 1:
        raise ValueError(f"reply lists {len(metas)} outputs but carries {len(frames) - 1} frames")
    for meta, frame in zip(metas, frames[1:]):
        dtype = np.dtype(meta["dtype"]).newbyteorder("<") if meta["dtype"] != "bool" else np.dtype(bool)
        outputs[meta["name"]] = np.frombuffer(frame, dtype=dtype).reshape(meta["shape"])
    return Reply(status=int(header.get("status", 0)), header=header, outputs=outputs)
