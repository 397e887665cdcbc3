"""Consistent hashing: a key keeps its node when nodes come and go.

Each node owns `replicas` points on a 64-bit ring; a key goes to the first
point at or after its own hash. Adding a node to N moves about 1/(N+1) of
the keys, where `hash % N` would move most of them.

The hash is BLAKE2b, not CRC32: CRC32 is linear, so the points of nodes
named "0#1", "1#1", ... cluster, and two contexts split camera ids far from
evenly; BLAKE2b splits them evenly within a few percent, at a small cost a
lookup (docs/performance.md has the figures).
"""

from __future__ import annotations

import bisect
import hashlib
from typing import Generic, Hashable, Sequence, TypeVar

N = TypeVar("N", bound=Hashable)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class HashRing(Generic[N]):
    """Maps string keys onto `nodes` consistently."""

    def __init__(self, nodes: Sequence[N], replicas: int = 160) -> None:
        if not nodes:
            raise ValueError("a hash ring needs at least one node")
        points = sorted((_hash(f"{node}#{i}"), node) for node in nodes for i in range(replicas))
        self._hashes = [h for h, _ in points]
        self._nodes = [n for _, n in points]

    def lookup(self, key: str) -> N:
        index = bisect.bisect_left(self._hashes, _hash(key)) % len(self._hashes)
        return self._nodes[index]
