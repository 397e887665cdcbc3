"""Outputs computed straight into a worker's shared-memory slot (execution/outputs.py says why).

A placed request's outputs go after its inputs in the slot, which the
backend still reads while it writes; the shapes come from the worker's
`ShapeMemory`, learnt from earlier requests of the same kind.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from infermux.execution.outputs import Kind, ShapeMemory
from infermux.workers.slots import Slot, aligned, layout


class SlotOutputs:
    """The arrays one request's outputs may be computed into (job.OutputArrays): views on its slot after its inputs."""

    __slots__ = ("slot", "start", "kind", "memory", "placed")

    def __init__(self, slot: Slot, inputs_end: int, kind: Kind, memory: ShapeMemory) -> None:
        self.slot = slot
        self.start = aligned(inputs_end)
        self.kind = kind
        self.memory = memory
        self.placed: dict[str, tuple[int, int]] | None = None  # name -> (offset, nbytes) once computed into

    def arrays(self) -> dict[str, np.ndarray] | None:
        shapes = self.memory.shapes(self.kind)
        if not shapes:
            return None
        sizes = [dtype.itemsize * math.prod(shape) for _, dtype, shape in shapes]
        offsets, span = layout(sizes)
        if self.start + span > self.slot.size:
            return None
        self.placed = {}
        arrays = {}
        for (name, dtype, shape), offset, size in zip(shapes, offsets, sizes):
            self.placed[name] = (self.start + offset, size)
            arrays[name] = np.ndarray(shape, dtype, buffer=self.slot.mm, offset=self.start + offset)
        return arrays

    def mismatch(self) -> None:
        self.placed = None
        self.memory.varies(self.kind)

    def where(self, metas: list[dict[str, Any]]) -> list[list[int]] | None:
        """[offset, nbytes] of each output a reply carries, if all were computed into the slot."""
        placed = self.placed
        if placed is None or not metas or any(m["name"] not in placed for m in metas):
            return None
        return [list(placed[m["name"]]) for m in metas]
