"""Batching within what the engine admits: a BatchPolicy capped at the engine's batch maximum.

A TensorRT engine's optimization profile bounds the rows one call may carry. A `max_batch` above
that bound would merge valid requests into a batch the engine refuses, answering 400 to every
request in it about a shape none of them sent (docs/tensorrt.md#what-the-backend-does).
"""

from __future__ import annotations

import logging

from infermux.execution.executor import BatchPolicy

log = logging.getLogger("infermux.executor")


class CappedPolicy(BatchPolicy):
    """A BatchPolicy whose `max_batch`, configured or set live, never exceeds `limit`
    (batcher.row_limit: the engine's batch maximum, None for no bound). Capping is logged once."""

    def __init__(self, max_batch: int, delay_us: int, preferred: tuple[int, ...], allowed: bool,
                 limit: int | None, name: str) -> None:
        self.limit, self.name, self._logged = limit, name, False
        super().__init__(max_batch, delay_us, preferred, allowed)

    @property
    def max_batch(self) -> int:
        return self._max_batch

    @max_batch.setter
    def max_batch(self, value: int) -> None:
        if self.limit is not None and value > self.limit:
            if not self._logged:
                log.warning("max_batch %d of %s is above the engine's batch maximum %d: batches are "
                            "capped at %d rows", value, self.name, self.limit, self.limit)
                self._logged = True
            value = self.limit
        self._max_batch = value
