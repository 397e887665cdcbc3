"""The frontend's side of shadowing (swap/rollout.py): copies of live requests and their answers.

For a model with a candidate, `on_request` copies the inputs of a request
(they are views on ZeroMQ's buffers) when the rollout has room for one more
sample, and `on_reply` pairs the answer the client is being sent with it,
by the client's envelope and the request's `id` (as frontend/recorder.py
does), and hands both to the rollout. Only answers the model gave itself
(200, no fallback) are mirrored. Nothing here computes: the candidate runs
on the rollout's own thread, and the client's reply is sent as it is.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np

from infermux.frontend.recorder import key_of
from infermux.protocol import MalformedReply, Request, decode_reply
from infermux.swap.rollout import Rollout, Rollouts, Sample

MAX_PENDING = 64  # copies waiting for their answer; an older one is dropped (its reply never came)


class Mirror:
    """Pairs live requests of models under rollout with their answers, for `Rollouts.offer`."""

    def __init__(self, rollouts: Rollouts) -> None:
        self.rollouts = rollouts
        self.pending: dict[tuple[Any, ...], tuple[Rollout, dict[str, np.ndarray]]] = {}

    def on_request(self, envelope: Sequence[Any], request: Request) -> None:
        """A request is being admitted (the frontend thread)."""
        rollout = self.rollouts.wants(request.model)
        if rollout is None or request.output_regions:
            return
        key = key_of(envelope, request.id)
        if key in self.pending:
            return  # cannot be told apart from the one waiting
        if len(self.pending) >= MAX_PENDING:
            del self.pending[next(iter(self.pending))]
        self.pending[key] = (rollout, {name: np.array(a, copy=True) for name, a in request.inputs.items()})

    def on_reply(self, frames: Sequence[Any], split: int) -> None:
        """A reply is being sent (the frontend thread); `frames[:split]` is the client's envelope."""
        try:
            ident = json.loads(bytes(frames[split])).get("id")
        except (ValueError, AttributeError, IndexError):
            return
        found = self.pending.pop(key_of(frames[:split], ident), None)
        if found is None:
            return
        rollout, inputs = found
        try:
            reply = decode_reply(frames[split:])
        except MalformedReply:
            return
        if reply.status != 200 or reply.header.get("fallback") or reply.header.get("model") not in (None,
                                                                                                    rollout.name):
            return
        outputs = {name: np.array(a, copy=True) for name, a in reply.outputs.items()}
        timing = reply.header.get("timing_us")
        spent = timing.get("compute") if isinstance(timing, dict) else None
        self.rollouts.offer(rollout, Sample(inputs, outputs, str(reply.header.get("version", "")),
                                            spent if isinstance(spent, int) else 0))
