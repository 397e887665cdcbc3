"""Live statistics (interim: counts and service time; the full module lands with issue 4)."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StatsSnapshot:
    counts: dict[int, int] = field(default_factory=dict)
    service_time_us: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"counts": {str(k): v for k, v in self.counts.items()}, "service_time_us": self.service_time_us}


class Stats:
    """Counts by status and an EWMA of service time per request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[int] = Counter()
        self._service_us = 0.0

    def record(self, status: int, total_us: int, queue_us: int = 0, compute_us: int = 0,
               batch: int | None = None) -> None:
        with self._lock:
            self._counts[status] += 1

    def record_batch(self, size: int, compute_us: int) -> None:
        per = compute_us / max(size, 1)
        self._service_us = per if not self._service_us else 0.9 * self._service_us + 0.1 * per

    def service_time_us(self) -> float:
        return self._service_us

    def snapshot(self) -> StatsSnapshot:
        with self._lock:
            return StatsSnapshot(dict(self._counts), self._service_us)
