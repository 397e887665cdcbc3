"""The frontend's request parse, done once per header layout.

A camera, a sensor loop or a bench client sends the same header again and
again, all but its "id". Decoding that JSON and checking every field of it
is the largest piece of the Python a small request costs. `ParseCache`
keeps what one such header parsed to, as a `Layout`, and answers a header
that is the layout's bytes with another plain id in the id's place from
it: the tensor frames are still checked and viewed as `parse_request` does
them, the header is not decoded again.

Why that is the same parse: replacing one scalar JSON token by another
keeps the document's tree and changes only that leaf. A layout is made
only when a second parse, with another id written into the same bytes,
came out the same but for its id: the bytes replaced are the header's
"id" value and nothing else (not a nested "id", not the first of two).
Plain ids are integers of up to 18 digits and strings of printable ASCII
without quotes or backslashes, so the new id cannot change the header's
text encoding or its structure.

Anything else goes through `parse_request`, which also gives every error:
a header seen once, a header with shared-memory inputs or outputs (those
depend on the regions, which change), frames that do not match the
layout. A layout is made on the second sighting of its bytes, so a client
whose headers never repeat costs one search and one set insertion more.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from infermux.protocol import Limits, ProtocolError, RegionLookup, Request, parse_request

ID_KEY = b'"id":'
# A plain id: what may take the place of another without changing the header's tree or encoding.
PLAIN_ID = re.compile(rb'-?(?:0|[1-9][0-9]{0,17})|"[ !#-\[\]-~]{0,128}"')
MAX_CACHED_HEADER = 1024  # bytes; larger headers are rare and are parsed each time
MAX_LAYOUTS = 256  # per kind of entry; the table starts over when full (a bound, not a policy)


@dataclass(frozen=True)
class Input:
    """One tensor frame a layout expects."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """What a header parsed to, but for its id; `id_at` is where the id's bytes start (-1: no id)."""

    id_at: int
    model: str
    inputs: tuple[Input, ...]
    version: str | None
    outputs: tuple[str, ...] | None
    timeout_ms: int | None
    key: str | None
    # Request.described, as items (a layout is immutable): a camera's raw frames repeat their header too.
    described: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()

    @property
    def rows(self) -> int:
        """Its requests' batch size (batcher.rows: dim 0 of the first input, 1 for a scalar)."""
        shape = self.inputs[0].shape if self.inputs else ()
        return shape[0] if shape else 1


# The express lane's entry for a layout (express.py, looked up in C by _wire.serve): where the
# id starts, the longest header the limits allow beside its tensors, each tensor frame's size.
ExpressEntry = tuple[int, int, tuple[int, ...], Layout]


class ParseCache:
    """`parse_request` for one frontend, with known header layouts parsed by a comparison."""

    def __init__(self) -> None:
        self._limits: Limits | None = None
        self._layouts: dict[bytes, Layout | None] = {}  # None: this layout cannot be kept
        self._seen: set[bytes] = set()
        self.hits = 0
        self.layout: Layout | None = None  # the last request's layout; None where it was parsed in full
        # The layouts the express lane may take, by the same key: no version asked for, no stream key.
        self.express: dict[bytes, ExpressEntry] = {}

    def parse(self, frames: Sequence[bytes | memoryview], limits: Limits,
              regions: RegionLookup | None = None) -> Request:
        """What `parse_request(frames, limits, regions)` returns, and the same errors."""
        self.check_limits(limits)
        raw = frames[0] if frames else b""
        if type(raw) is not bytes or len(raw) > MAX_CACHED_HEADER:
            self.layout = None
            return parse_request(frames, limits, regions)
        shape, ident, id_at = _split(raw)
        layout = self._layouts.get(shape)
        if layout is not None and layout.id_at == id_at:  # the same bytes around the id, at the same place
            request = fill(layout, ident, frames, limits)
            if request is not None:
                self.hits += 1
                self.layout = layout
                return request
        self.layout = None
        request = parse_request(frames, limits, regions)
        if shape not in self._layouts:
            self._learn(shape, raw, id_at, ident, frames, request, limits)
        return request

    def check_limits(self, limits: Limits) -> None:
        """Forget every layout if `limits` are not those they were checked against (a reload)."""
        if limits is not self._limits:
            self._limits, self._layouts, self._seen, self.express = limits, {}, set(), {}

    def _learn(self, shape: bytes, raw: bytes, id_at: int, ident: bytes | None,
               frames: Sequence[bytes | memoryview], request: Request, limits: Limits) -> None:
        """Keep `raw`'s layout the second time it is seen, if another id in its place changes only the id."""
        if shape not in self._seen:
            if len(self._seen) >= MAX_LAYOUTS:
                self._seen.clear()
            self._seen.add(shape)
            return
        if len(self._layouts) >= MAX_LAYOUTS:
            self._layouts.clear()
            self.express.clear()
        layout = self._layouts[shape] = _layout(raw, id_at, ident, frames, request, limits)
        if layout is not None and layout.version is None and layout.key is None:
            tensors = sum(spec.nbytes for spec in layout.inputs)
            longest = min(MAX_CACHED_HEADER, limits.max_header_bytes, limits.max_message_bytes - tensors)
            self.express[shape] = (id_at, longest, tuple(spec.nbytes for spec in layout.inputs), layout)


def _split(raw: bytes) -> tuple[bytes, bytes | None, int]:
    """The header's bytes with the plain id after its first `"id":` cut out, that id's bytes and where
    they started; the header itself, None and -1 where there is no such id."""
    at = raw.find(ID_KEY)
    if at < 0:
        return raw, None, -1
    start = at + len(ID_KEY)
    token = PLAIN_ID.match(raw, start)
    if token is None:
        return raw, None, -1
    return raw[:start] + raw[token.end():], token.group(), start


def id_value(token: bytes | None) -> str | int | None:
    """The request id a plain id's bytes (as `_split` cut them out of a header) stand for; None for none."""
    if token is None:
        return None
    return token[1:-1].decode("ascii") if token[:1] == b'"' else int(token)


def _layout(raw: bytes, id_at: int, ident: bytes | None, frames: Sequence[bytes | memoryview],
            request: Request, limits: Limits) -> Layout | None:
    """The layout of `raw`, which parsed to `request`; None where it cannot be kept."""
    if request.input_regions or request.output_regions or request.replaced:  # a count to add each time, not a layout
        return None
    if request.id != id_value(ident):  # the id found is not the one the header holds
        return None
    if ident is not None:
        other = b"0" if ident != b"0" else b"1"
        try:
            check = parse_request([raw[:id_at] + other + raw[id_at + len(ident):], *frames[1:]], limits)
        except ProtocolError:
            return None
        if check.id != int(other) or _without_id(check) != _without_id(request):
            return None  # those bytes are not (only) the header's id
    inputs = tuple(Input(name, array.dtype, array.shape, array.nbytes) for name, array in request.inputs.items())
    described = tuple((name, tuple(entry.items())) for name, entry in (request.described or {}).items())
    return Layout(id_at, request.model, inputs, request.version, request.outputs, request.timeout_ms, request.key,
                  described)


def _without_id(request: Request) -> tuple[Any, ...]:
    shapes = tuple((name, array.dtype.str, array.shape) for name, array in request.inputs.items())
    return (request.model, shapes, request.version, request.outputs, request.timeout_ms, request.key,
            bool(request.input_regions), bool(request.output_regions), request.described)


def fill(layout: Layout, ident: bytes | None, frames: Sequence[bytes | memoryview],
          limits: Limits) -> Request | None:
    """The request `frames` hold, read with `layout`; None if they do not fit it (parse_request says why)."""
    expected = layout.inputs
    if len(frames) != len(expected) + 1 or len(frames[0]) > limits.max_header_bytes:
        return None
    total = len(frames[0])
    inputs: dict[str, np.ndarray] = {}
    for spec, frame in zip(expected, frames[1:]):
        if len(frame) != spec.nbytes:
            return None
        total += spec.nbytes
        inputs[spec.name] = np.frombuffer(frame, dtype=spec.dtype).reshape(spec.shape)
    if total > limits.max_message_bytes:
        return None
    described = {name: dict(entry) for name, entry in layout.described} if layout.described else None
    return Request(model=layout.model, inputs=inputs, id=id_value(ident), version=layout.version,
                   outputs=layout.outputs, timeout_ms=layout.timeout_ms, key=layout.key, described=described)
