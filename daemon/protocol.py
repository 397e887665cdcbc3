"""Wire protocol v1 (docs/protocol.md), shared by the daemon and the client.

A message is `[header JSON, tensor bytes, ...]`, one raw C-contiguous
little-endian frame per tensor, in the order the header lists them. This
module turns frames into typed requests and replies, holding a request to
its bounds; protocol_types.py holds those types and the header's field
names, protocol_encode.py turns them back into frames. Clients and the
daemon import all three parts from here.
"""

from __future__ import annotations

import difflib
import json
import math
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from infermux.protocol_encode import OkReplies, encode_header, encode_reply, encode_request, error_header
from infermux.protocol_types import (DTYPES, ENCODED_FORMATS, FRAME_FIELDS, INPUT_FIELDS, OPERATOR_RETRY_MS,
                                     RAW_FORMATS, REGION_FIELDS, REPLY_KINDS, REQUEST_FIELDS, Frame, Limits,
                                     MalformedReply, OutputRegion, ProtocolError, RegionLookup, Reply, Request,
                                     SharedTensor, Status, TensorMeta, dtype_name)

__all__ = [
    "DTYPES", "ENCODED_FORMATS", "FRAME_FIELDS", "INPUT_FIELDS", "MAX_CAPTURE_SKEW_S", "MAX_KEY_BYTES", "MAX_KEY_INT",
    "MAX_REPLACED", "MAX_TIMEOUT_MS", "OPERATOR_RETRY_MS", "RAW_FORMATS", "REGION_FIELDS", "REQUEST_FIELDS",
    "Frame", "Limits", "MalformedReply", "OkReplies", "OutputRegion", "ProtocolError", "RegionLookup", "Reply",
    "Request", "SharedTensor", "Status", "TensorMeta", "decode_reply", "dtype_name", "encode_header",
    "encode_reply", "encode_request", "error_header", "limits_reply", "parse_header", "parse_request",
    "request_id",
]

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

# The most motion boxes a request may carry (`motion`), and the largest coordinate of one: a camera's
# gate sends at most its `max_boxes` (256 at most), and no frame is wider or taller than this.
MAX_MOTION_BOXES = 256
MAX_MOTION_COORD = 65_535

_REQUEST_SET, _INPUT_SET, _REGION_SET = frozenset(REQUEST_FIELDS), frozenset(INPUT_FIELDS), frozenset(REGION_FIELDS)
# Names that other protocols give a field, too far from ours in spelling for difflib to find.
_ALIASES = {"deadline": "timeout_ms", "deadline_ms": "timeout_ms", "request_id": "id", "model_version": "version"}


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
        motion=_motion(header), input_regions=input_regions,
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


def _motion(header: dict[str, Any]) -> tuple[tuple[int, int, int, int], ...]:
    """The header's motion boxes: at most MAX_MOTION_BOXES, each [x0, y0, x1, y1] of integers
    0 <= x0 < x1 <= MAX_MOTION_COORD (and so for y)."""
    value = header.get("motion")
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_MOTION_BOXES:
        raise _bad(f"header field 'motion' must be a list of at most {MAX_MOTION_BOXES} boxes [x0, y0, x1, y1]")
    boxes = []
    for box in value:
        if not (isinstance(box, list) and len(box) == 4 and all(type(v) is int for v in box)
                and 0 <= box[0] < box[2] <= MAX_MOTION_COORD and 0 <= box[1] < box[3] <= MAX_MOTION_COORD):
            raise _bad(f"header field 'motion': a box must be [x0, y0, x1, y1], integers with 0 <= x0 < x1 <= "
                       f"{MAX_MOTION_COORD} and 0 <= y0 < y1 <= {MAX_MOTION_COORD}, got {_short(box, 60)}")
        boxes.append((box[0], box[1], box[2], box[3]))
    return tuple(boxes)


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
    if dtype is None or dtype.kind not in REPLY_KINDS or dtype.name != name:
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
