"""The wire protocol's encoders (docs/protocol.md): a header as JSON, a request's and a reply's frames,
and the serving hot path's encoder of 200 replies (`OkReplies`).

Importable from `infermux.protocol`, as clients and the daemon import them.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np

from infermux.protocol_types import (DTYPES, FRAME_FIELDS, REPLY_KINDS, Frame, OutputRegion, SharedTensor, Status,
                                     TensorMeta, dtype_name)

# json.dumps with arguments builds a new encoder per call; this one is reused.
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def encode_header(header: Mapping[str, Any]) -> bytes:
    """A header as UTF-8 JSON.

    Strings echoed from a client (`id`, a version asked for) can hold lone
    surrogates (JSON `"\\ud800"`), which UTF-8 cannot carry; those headers
    go out ASCII-escaped, which every JSON parser reads back to the same string.
    """
    try:
        return _dumps(header).encode()
    except UnicodeEncodeError:
        return json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode()


def _frame(array: np.ndarray) -> memoryview | bytes:
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    if array.nbytes < 1 << 16:
        return array.tobytes()  # cheaper than a buffer view for small tensors
    return np.ascontiguousarray(array).data.cast("B")


def encode_request(model: str, inputs: Mapping[str, np.ndarray | SharedTensor | Frame], *, id: Any = None,
                   version: str | None = None, outputs: Sequence[str] | None = None,
                   timeout_ms: int | None = None, key: str | int | None = None,
                   output_regions: Mapping[str, SharedTensor] | None = None, replaced: int = 0,
                   captured: float | None = None, described: Mapping[str, Mapping[str, Any]] | None = None,
                   motion: Sequence[Sequence[int]] = (),
                   ) -> list[Any]:
    """Frames of a request: the header, then one raw frame per input (none for a SharedTensor; a
    Frame's bytes for a Frame, its format and geometry in its entry).

    `replaced`: frames of `key` the client replaced before sending them since its last request (sent when > 0).
    `captured`: the frame's capture time (epoch seconds); `described`: a frame's format and geometry
    (FRAME_FIELDS) for an input sent as a SharedTensor, by input name; `motion`: boxes [x0, y0, x1, y1]
    where the frame changed (sent when any), for a pipeline's `roi` step.

    `output_regions`: outputs to be written into the client's regions, each at
    the offset of the given SharedTensor (its dtype and shape are not sent)."""
    header: dict[str, Any] = {"model": model, "inputs": []}
    frames: list[Any] = [b""]
    for name, value in inputs.items():
        if isinstance(value, Frame):
            header["inputs"].append(value.entry(name))
            frames.append(value.payload())
            continue
        if isinstance(value, SharedTensor):  # no frame: the daemon reads it in the region
            frame = {k: v for k, v in (described or {}).get(name, {}).items() if k in FRAME_FIELDS}
            header["inputs"].append({**TensorMeta(name, value.dtype, value.shape).as_json(),
                                     "region": value.region, "offset": value.offset, **frame})
            continue
        array = np.asarray(value)
        dtype = dtype_name(array.dtype)
        if dtype not in DTYPES:
            raise ValueError(f"input {name!r} has dtype {dtype}; the wire takes {', '.join(DTYPES)}")
        header["inputs"].append(TensorMeta(name, dtype, tuple(array.shape)).as_json())
        frames.append(_frame(array))
    for key_, given in (("id", id), ("version", version), ("timeout_ms", timeout_ms), ("key", key),
                        ("captured", captured)):
        if given is not None:
            header[key_] = given
    _optional_fields(header, outputs, output_regions, replaced, motion)
    frames[0] = encode_header(header)
    return frames


def _optional_fields(header: dict[str, Any], outputs: Sequence[str] | None,
                     output_regions: Mapping[str, SharedTensor] | None, replaced: int,
                     motion: Sequence[Sequence[int]]) -> None:
    """A request header's fields that are sent only when they say something."""
    if outputs is not None:
        header["outputs"] = list(outputs)
    if output_regions:
        header["output_regions"] = {name: {"region": ref.region, "offset": ref.offset}
                                    for name, ref in output_regions.items()}
    if replaced:
        header["replaced"] = replaced
    if motion:
        header["motion"] = [[int(v) for v in box] for box in motion]


def encode_reply(header: dict[str, Any], outputs: Mapping[str, np.ndarray] | None = None,
                 into: Mapping[str, OutputRegion] | None = None) -> list[Any]:
    """Frames of a reply; `header['outputs']` is filled from `outputs`.

    An output named in `into` that fits its region is copied there and gets
    no frame; its entry in the header says where it is."""
    frames: list[Any] = [b""]
    if outputs:
        metas = []
        for name, value in outputs.items():
            array = np.asarray(value)
            if array.dtype.kind not in REPLY_KINDS:
                raise ValueError(f"output {name!r} has dtype {array.dtype}, which the wire cannot carry "
                                 f"(numeric and bool dtypes only)")
            meta: dict[str, Any] = {"name": name, "dtype": dtype_name(array.dtype),
                                    "shape": list(array.shape)}
            place = into.get(name) if into else None
            if place is not None and array.nbytes <= place.view.nbytes:
                _write(place.view, array)
                meta["region"], meta["offset"] = place.region, place.offset
            else:  # no region asked for, or too small for it: in a frame as usual
                frames.append(_frame(array))
            metas.append(meta)
        header["outputs"] = metas
    frames[0] = encode_header(header)
    return frames


class OkReplies:
    """The 200 replies of one model version, byte for byte what `encode_reply` makes of
    `{"id", "status": 200, "model", "version", "timing_us": {"queue", "compute", "total"}}` and
    the outputs, in a third of the time: what never changes (model, version) is encoded once,
    each output's entry once per name, dtype and shape. The serving hot path's encoder."""

    _KEPT = 64  # output entries remembered (shapes vary with the batch)

    def __init__(self, model: str, version: str) -> None:
        self._middle = ',"status":200,' + _dumps({"model": model, "version": version})[1:-1] + ',"timing_us":{"queue":'
        self._metas: dict[tuple[str, np.dtype, tuple[int, ...]], str] = {}

    def encode(self, id: Any, queue_us: int, compute_us: int, total_us: int,
               outputs: Mapping[str, np.ndarray]) -> list[Any] | None:
        """The reply's frames; None where only `encode_reply` can answer (no outputs, one the
        wire cannot carry, an id that UTF-8 cannot)."""
        if not outputs:
            return None
        frames: list[Any] = [b""]
        metas = []
        for name, value in outputs.items():
            array = value if type(value) is np.ndarray else np.asarray(value)
            key = (name, array.dtype, array.shape)
            meta = self._metas.get(key)
            if meta is None:
                if array.dtype.kind not in REPLY_KINDS:
                    return None
                if len(self._metas) >= self._KEPT:
                    self._metas.clear()
                meta = self._metas[key] = _dumps({"name": name, "dtype": dtype_name(array.dtype),
                                                  "shape": list(array.shape)})
            metas.append(meta)
            frames.append(_frame(array))
        try:
            ident = str(id) if type(id) is int else "null" if id is None else _dumps(id)
            frames[0] = (f'{{"id":{ident}{self._middle}{queue_us},"compute":{compute_us},'
                         f'"total":{total_us}}},"outputs":[{",".join(metas)}]}}').encode()
        except UnicodeEncodeError:
            return None
        return frames


def _write(view: memoryview, array: np.ndarray) -> None:
    """Copy `array` to the start of `view` as raw little-endian bytes."""
    dtype = array.dtype.newbyteorder("<") if array.dtype.itemsize > 1 else array.dtype
    target = np.frombuffer(view, dtype=np.uint8, count=array.nbytes).view(dtype).reshape(array.shape)
    if target.ctypes.data == array.ctypes.data and target.dtype == array.dtype:
        return  # computed straight into the region (execution/outputs.py, RegionOutputs)
    np.copyto(target, array, casting="equiv")  # "equiv": a big-endian array is swapped on the way


def error_header(status: Status, message: str, id: Any = None, **extra: Any) -> dict[str, Any]:
    """A reply header for a request that was not served."""
    header: dict[str, Any] = {"id": id, "status": int(status), "error": message}
    header.update({k: v for k, v in extra.items() if v is not None})
    return header
