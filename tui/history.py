"""Recent QPS and p99 of every model version, one point per snapshot, for the sparklines."""

from __future__ import annotations

from collections import deque
from typing import Any

from infermux import format as fmt


class History:
    """The last `keep` points per version; versions that vanish are forgotten."""

    def __init__(self, keep: int = 120) -> None:
        self.keep = keep
        self.qps: dict[str, deque[float]] = {}
        self.p99_ms: dict[str, deque[float]] = {}

    def add(self, snapshot: dict[str, Any]) -> None:
        seen = set()
        for m in snapshot.get("models", []):
            key = fmt.version_key(m)
            seen.add(key)
            st = m.get("stats") or {}
            self.qps.setdefault(key, deque(maxlen=self.keep)).append(float(st.get("qps") or 0.0))
            self.p99_ms.setdefault(key, deque(maxlen=self.keep)).append(float(st.get("p99_us") or 0.0) / 1000)
        for gone in set(self.qps) - seen:
            del self.qps[gone], self.p99_ms[gone]
