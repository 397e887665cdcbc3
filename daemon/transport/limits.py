"""The request limits a configuration sets (docs/security.md), for the frontend and reload alike."""

from __future__ import annotations

from infermux import config as cfg
from infermux.protocol import Limits


def limits_from(daemon: cfg.DaemonConfig) -> Limits:
    """The request limits a `[daemon]` table sets."""
    return Limits(max_message_bytes=daemon.max_message_bytes, max_header_bytes=daemon.max_header_bytes,
                  max_tensors=daemon.max_tensors, max_rank=daemon.max_rank, max_elements=daemon.max_elements,
                  max_shared_input_bytes=daemon.max_shared_input_bytes, max_reply_bytes=daemon.max_reply_bytes)


# How far over max_message_bytes a single frame may be and still be read (and answered
# 413 naming the setting); a header's worth, so a request a little over learns why.
FRAME_SLACK = 64 << 10


def frame_cap(daemon: cfg.DaemonConfig) -> int:
    """libzmq's MAXMSGSIZE for the inference socket: the most one frame can make the daemon hold.

    libzmq caps each frame, not the message, and cannot count frames (docs/security.md):
    this is all it bounds. A frame over it drops the connection unread, without a reply.
    """
    return daemon.max_message_bytes + FRAME_SLACK
