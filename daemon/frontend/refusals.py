"""The replies the frontend sends in place of a computation, and the ones it holds back.

Each function here turns one reason for not computing a request (the
connection does not read its replies, the daemon drains, the message is
malformed, its reply would be or was over `max_reply_bytes`) into the reply
frames the frontend loop (server.py) sends; the loop decides when.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from infermux.events import Throttle
from infermux.frontend.oversize import ClientEnvelope, OversizeMemory
from infermux.protocol import (OPERATOR_RETRY_MS, ProtocolError, Request, Status, encode_reply, error_header,
                               limits_reply, request_id)
from infermux.transport.limits import Limits
from infermux.transport.regions import RegionTable

if TYPE_CHECKING:
    from infermux.frontend.parsecache import ParseCache
    from infermux.frontend.sender import Sender

log = logging.getLogger("infermux.server")

MAX_ENVELOPE = 8  # identity frames a proxy chain may add before the delimiter
STALLED_RETRY_MS = 100  # the retry time in the 429 a peer gets while its replies are dropped (peers.py)
_TOO_LARGE = Throttle()  # replies over max_reply_bytes: a few lines per interval, then counted
_REFUSED_OVERSIZE = Throttle()  # requests refused uncomputed for such a reply: the same
# ... and their 413 is held back (pacing.py), as is the refusal of a malformed message this large: a
# client looping on one (40 frames of 1 MB) made libzmq's I/O thread read 40 MB tens of times a second.
PACED_REFUSAL_BYTES = 1 << 20
# A refused header this large is held back too: 60 KB keys in a loop kept the frontend thread parsing.
PACED_REFUSAL_HEADER_BYTES = 16 << 10


def delimiter(frames: list[Any]) -> int:
    """Index just past the envelope (identities + empty delimiter)."""
    for i in range(1, min(len(frames), MAX_ENVELOPE + 1)):
        if len(frames[i]) == 0:
            return i + 1
    return 1  # a raw DEALER that sent no delimiter: the identity alone routes the reply


def stalled(body: list[Any], limits: Limits) -> list[Any]:
    """The 429 of a connection whose replies are dropped because it does not read them (peers.py)."""
    return encode_reply(error_header(
        Status.TOO_MANY, "replies to this connection are being dropped because it does not read them "
        "(its receive queue is full); read the replies, then retry", request_id(body, limits),
        retry_after_ms=STALLED_RETRY_MS))


def not_serving(body: list[Any], limits: Limits, stopping: bool) -> list[Any]:
    """The 503 of every request while the daemon shuts down or drains."""
    reason = "shutting down" if stopping else "draining (admin `resume` reopens it)"
    return encode_reply(error_header(Status.NOT_READY, f"infermux is {reason}; retry later",
                                     request_id(body, limits), retry_after_ms=OPERATOR_RETRY_MS,
                                     draining=True))  # the whole daemon, not one model: clients move elsewhere


def malformed(body: list[Any], exc: ProtocolError, limits: Limits) -> tuple[list[Any], bool]:
    """The answer to a message that is no request (or the answer to a limits query), and whether it
    is held back: small mistakes are answered at once, so a client fixing its requests waits for
    nothing; a large message is paced (pacing.py)."""
    answer = limits_reply(body, limits) or error_header(
        exc.status, exc.message, request_id(body, limits),
        max_message_bytes=limits.max_message_bytes if exc.status is Status.TOO_LARGE else None)
    paced = sum(len(f) for f in body) >= PACED_REFUSAL_BYTES or bool(
        body and len(body[0]) >= PACED_REFUSAL_HEADER_BYTES)
    return encode_reply(answer), paced


def too_many_tensors(body: list[Any], limits: Limits) -> ProtocolError | None:
    """The error for a message with more frames than a request may have (max_tensors), else None."""
    if len(body) <= limits.max_tensors + 1:
        return None
    return ProtocolError(Status.BAD_REQUEST, f"{len(body)} frames; at most "
                         f"{limits.max_tensors} tensors may follow the header (max_tensors)")


def bounded(frames: list[Any], envelope: list[Any] | None, limit: int,
            oversize: OversizeMemory) -> list[Any] | None:
    """None if the reply in `frames` (after its envelope) is within `limit` (max_reply_bytes), else
    a 413 in its place: the outputs were computed, and are dropped here rather than queued for the
    client (a 4 MiB input to a model that tiles it made 256 MiB). The request's kind is remembered,
    so that the next like it is refused before it is computed (oversize.py)."""
    split = delimiter(frames)
    size = sum(len(f) for f in frames[split:])
    if size <= limit:
        return None
    kind = envelope.kind() if type(envelope) is ClientEnvelope else None
    if kind is not None:
        oversize.over(kind, size)
    try:
        header = json.loads(bytes(frames[split]))
    except ValueError:
        header = {}
    where = {k: header[k] for k in ("model", "version") if isinstance(header.get(k), str)}
    held = _TOO_LARGE.admit("reply")
    if held is not None:
        log.warning("a reply of %d bytes is over max_reply_bytes (%d): answered 413 instead%s", size, limit,
                    f" ({held} more not logged)" if held else "")
    return frames[:split] + encode_reply(error_header(
        Status.TOO_LARGE, f"the reply would be {size} bytes; the limit is {limit} (max_reply_bytes): ask for "
        "fewer outputs (\"outputs\"), send a smaller batch, or have outputs written to shared memory "
        "(\"output_regions\"); it was computed", header.get("id"), **where))


def oversize_refusal(envelope: ClientEnvelope, request: Request, limit: int,
                     oversize: OversizeMemory) -> list[Any] | None:
    """A 413 for `request`, at once, if a request of its kind from this connection just made a reply
    over `limit` (oversize.py), before it is queued or computed: on both the fast path and the
    general one, which it never reaches; else None, and the request is marked its kind's probe
    if the kind is remembered."""
    kind = envelope.kind()
    assert kind is not None
    size = oversize.refusal(kind)
    if size is None:
        envelope.probe = kind if oversize.probing(kind) else None
        return None
    held = _REFUSED_OVERSIZE.admit("request")
    if held is not None:
        log.warning("a request of a kind whose reply was just %d bytes, over max_reply_bytes (%d), "
                    "refused without computing it%s", size, limit, f" ({held} more not logged)" if held else "")
    return envelope + encode_reply(error_header(
        Status.TOO_LARGE, f"refused without computing it: a request of the same shapes from this connection "
        f"just made a reply of {size} bytes; the limit is {limit} (max_reply_bytes): ask for fewer outputs "
        "(\"outputs\"), send a smaller batch, or have outputs written to shared memory (\"output_regions\"); "
        f"one request of these shapes is computed again {oversize.memory_s:g} s after the last reply over the limit",
        request.id, model=request.model, version=request.version))


def unserved(sender: "Sender", envelope: ClientEnvelope, body: list[Any], refuse: bool, stopping: bool) -> bool:
    """Answer a request the frontend takes nothing from now, True if it was one: its connection does
    not read its replies (a 429 now and then, else nothing), or the daemon drains or stops (503)."""
    peers = sender.peers
    if peers.stalled and envelope[0] in peers.stalled:
        if peers.probe(envelope[0]):
            sender.send(envelope + stalled(body, sender.limits))
        return True
    if refuse:
        sender.send(envelope + not_serving(body, sender.limits, stopping))
    return refuse


def parsed(sender: "Sender", parses: "ParseCache", lookup: RegionTable | None, envelope: ClientEnvelope,
           body: list[Any]) -> Request | None:
    """The request in `body`, or None once its error (or a limits query's answer) is sent or held."""
    limits = sender.limits
    try:
        too_many = too_many_tensors(body, limits)
        if too_many is not None:
            raise too_many
        return parses.parse(body, limits, lookup)
    except ProtocolError as exc:  # or a limits query, which no request field names
        answer, paced = malformed(body, exc, limits)
        if paced:
            sender.pause(envelope + answer)
        else:
            sender.send(envelope + answer)
        return None


def oversized(sender: "Sender", envelope: ClientEnvelope, request: Request) -> bool:
    """Answer `request` 413 at once if its kind just made a reply over max_reply_bytes
    (`oversize_refusal`): True if it was."""
    refused = oversize_refusal(envelope, request, sender.limits.max_reply_bytes, sender.oversize)
    if refused is None:
        return False
    sender.pause(refused)
    return True
