"""The one way a reply leaves the frontend: bounded, recorded, and sent without ever waiting.

The frontend serves everyone on one thread, so a peer whose pipe is full
(it does not read) loses its reply instead of stalling the others
(transport/peers.py counts it). A reply over `max_reply_bytes` is answered
413 in its place (refusals.py); a refusal the client could loop on is held
back (pacing.py). Only the frontend thread calls `send`.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

import zmq

from infermux.frontend import refusals
from infermux.frontend.mirror import Mirror
from infermux.frontend.oversize import ClientEnvelope, OversizeMemory
from infermux.frontend.pacing import RefusalPacer
from infermux.frontend.recorder import Recorder
from infermux.transport.limits import Limits
from infermux.transport.peers import PeerGuard
from infermux.transport.wire import Wire

log = logging.getLogger("infermux.server")

COPY_BELOW = 1 << 20  # a reply smaller than this is copied into libzmq's message; a larger one is lent


class Sender:
    """Sends the frontend's replies on its socket's calls (`wire`, once bound)."""

    def __init__(self, limits: Limits, peers: PeerGuard, pacer: RefusalPacer, oversize: OversizeMemory,
                 recorder: Recorder) -> None:
        self.limits, self.peers, self.pacer, self.oversize, self.recorder = limits, peers, pacer, oversize, recorder
        self.wire: Wire  # the socket's calls, once bound
        self.mirror: Mirror  # a candidate's comparison with what serves, once the rollouts exist
        self.replies_too_large = 0  # replies over max_reply_bytes, answered 413 instead

    def send(self, frames: list[Any], envelope: list[Any] | None = None) -> None:
        """Queue a reply without ever waiting. `envelope`: the request's own, where the reply answers
        a computed request."""
        size = sum(len(f) for f in frames)
        if size > self.limits.max_reply_bytes:
            frames, size = self._bounded(frames, envelope, size)
        elif type(envelope) is ClientEnvelope and envelope.probe is not None:
            self.oversize.fits(envelope.probe)  # its kind no longer makes replies too large
        if envelope is not None:  # a computed request's reply: the connection's refusals start over
            self.pacer.forgive(frames[0])
        # What the client gets (a 413 in place of an oversized reply) is what is recorded and compared.
        if self.recorder.active or self.mirror.pending:
            self._observe(frames)
        try:
            self.wire.send(frames, copy=size < COPY_BELOW)
        except zmq.Again:  # only the identity frame can meet a full pipe: nothing was queued
            self.peers.dropped(frames[0])
            return
        except zmq.ZMQError as exc:
            if exc.errno != errno.EHOSTUNREACH:
                raise
            log.debug("client went away before its reply")
            return
        if self.peers.stalled:
            self.peers.delivered(frames[0])

    def _bounded(self, frames: list[Any], envelope: list[Any] | None, size: int) -> tuple[list[Any], int]:
        """A 413 in place of a reply over max_reply_bytes (refusals.bounded), and its size."""
        refused = refusals.bounded(frames, envelope, self.limits.max_reply_bytes, self.oversize)
        if refused is None:  # the envelope's own frames took it over: the reply itself fits
            return frames, size
        self.replies_too_large += 1
        return refused, sum(len(f) for f in refused)

    def _observe(self, frames: list[Any]) -> None:
        """A reply for `infermux record` and for a candidate's comparison with what serves."""
        if self.recorder.active:
            self.recorder.on_reply(frames, refusals.delimiter(frames))
        if self.mirror.pending:
            self.mirror.on_reply(frames, refusals.delimiter(frames))

    def pause(self, frames: list[Any]) -> None:
        """Send a refusal when its connection's time comes (pacing.py; at a turn of the loop after it)."""
        if not self.pacer.hold(frames):
            self.send(frames)

    def send_paused(self, every: bool = False) -> None:
        """A tick: send the refusals held back whose time has come (`every`: all, at the drain)."""
        if len(self.pacer):
            for frames in self.pacer.due(every):
                self.send(frames)
