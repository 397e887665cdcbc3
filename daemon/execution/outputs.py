"""Outputs computed straight into memory given before the run: a client's region, or a worker's slot.

Without this the outputs are copied after they are computed: into the
client's region by protocol.encode_reply, into a worker's slot by the worker
(a second memcpy of the tensor on the cold path, which shows for a large
output). A backend that can write into arrays it is given
(base.WritesOutputs: onnxruntime through an IOBinding, TensorRT by copying
from the device straight into them) computes into views on that memory
instead. `RegionOutputs` places a hot request's outputs in its client's
regions; the worker's slot placement is workers/slotoutputs.py.

The arrays need the output shapes before the run. They are learnt: the first
request of each kind (input names, dtypes and shapes, requested outputs) runs
the ordinary way and its reply teaches the shapes; later ones of that kind are
placed. A kind whose outputs turn out to vary (data-dependent shapes) is
refused once by the backend, served the ordinary way, and never placed again.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from infermux.protocol import Request, dtype_name

Kind = tuple[Any, ...]
_MAX_KINDS = 256  # kinds remembered; past this the memory starts over (clients sending every shape)
PLACE_MIN_BYTES = 64 * 1024  # smaller outputs are computed the ordinary way and copied into a region


class ShapeMemory:
    """The output shapes each kind of request produced; None for kinds that vary."""

    def __init__(self) -> None:
        self._known: dict[Kind, list[tuple[str, np.dtype, tuple[int, ...]]] | None] = {}

    @staticmethod
    def kind(inputs: list[list[Any]], outputs: list[str] | None) -> Kind:
        """The key of a request: its [name, dtype, shape] inputs and the outputs it asked for."""
        return (tuple((name, dtype, tuple(shape)) for name, dtype, shape in inputs),
                None if outputs is None else tuple(outputs))

    def shapes(self, kind: Kind) -> list[tuple[str, np.dtype, tuple[int, ...]]] | None:
        return self._known.get(kind)

    def knows(self, kind: Kind) -> bool:
        """Whether `kind` was learnt (or found to vary): nothing more to learn from it."""
        return kind in self._known

    def learn(self, kind: Kind, metas: list[dict[str, Any]]) -> None:
        """Remember a served reply's outputs ({"name", "dtype", "shape"} as in its header)."""
        if kind in self._known:
            return
        if len(self._known) >= _MAX_KINDS:
            self._known.clear()
        self._known[kind] = [(m["name"], np.dtype(m["dtype"]), tuple(m["shape"])) for m in metas]

    def varies(self, kind: Kind) -> None:
        self._known[kind] = None


class RegionOutputs:
    """One request's outputs computed straight into the regions its client named (regions.py).

    Placed only when every output the request gets has a region it fits,
    by the shapes its kind produced before; otherwise the executor computes
    the ordinary way and protocol.encode_reply copies what fits."""

    __slots__ = ("into", "kind", "memory")

    def __init__(self, request: Request, memory: ShapeMemory) -> None:
        self.into = request.output_regions
        self.kind = kind_of(request)
        self.memory = memory

    def arrays(self) -> dict[str, np.ndarray] | None:
        shapes = self.memory.shapes(self.kind)
        if not shapes:
            return None
        arrays, total = {}, 0
        for name, dtype, shape in shapes:
            place, count = self.into.get(name), math.prod(shape)
            if place is None or count * dtype.itemsize > place.view.nbytes:
                return None
            arrays[name] = np.frombuffer(place.view, dtype=dtype, count=count).reshape(shape)
            total += count * dtype.itemsize
        # An IOBinding costs tens of µs more than a plain run: only worth it where it saves a big copy.
        return arrays if total >= PLACE_MIN_BYTES else None

    def mismatch(self) -> None:
        self.memory.varies(self.kind)

    def learn(self, outputs: dict[str, np.ndarray]) -> None:
        """Teach the memory this run's output shapes, so the next request of its kind is placed."""
        if not self.memory.knows(self.kind):
            self.memory.learn(self.kind, [{"name": n, "dtype": dtype_name(a.dtype), "shape": list(a.shape)}
                                          for n, a in outputs.items()])


def kind_of(request: Request) -> Kind:
    """ShapeMemory's key for a request the daemon parsed."""
    return ShapeMemory.kind([[name, dtype_name(a.dtype), a.shape] for name, a in request.inputs.items()],
                            None if request.outputs is None else list(request.outputs))
