"""The request limits a configuration sets (docs/security.md), for the frontend and reload alike."""

from __future__ import annotations

from infermux import config as cfg
from infermux.protocol import Limits


def limits_from(daemon: cfg.DaemonConfig) -> Limits:
    """The request limits a `[daemon]` table sets."""
    return Limits(max_message_bytes=daemon.max_message_bytes, max_header_bytes=daemon.max_header_bytes,
                  max_tensors=daemon.max_tensors, max_rank=daemon.max_rank, max_elements=daemon.max_elements)
