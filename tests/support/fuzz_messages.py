"""Fuzz the inference socket of a LIVE daemon.

`MessageFactory` makes random and mutated wire messages, each labelled with
what a correct daemon must answer: bad JSON, wrong frame counts, lying
sizes, odd dtypes, huge dimensions, binary garbage, truncated and
duplicated frames, deep JSON nesting, enormous numbers, unicode oddities,
with valid requests interleaved. `run_fuzz` sends them over a few DEALER
sockets in lockstep (one message in flight per socket, so every reply is
matched to its message even when the header was garbage) and checks each
answer: malformed -> a 4xx with a reason, valid -> 200 with outputs equal to
onnxruntime run here, anything -> a reply at all, never a 5xx for the
client's mistake.

Independent of the daemon's code except `infermux.protocol.parse_request`,
used as the oracle for mutated messages that happen to stay valid.
Used by tests/daemon/test_fuzz_daemon.py (short) and
tests/benchmarks/bench_fuzz.py (long).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnxruntime as ort
import zmq

from infermux.protocol import MAX_KEY_BYTES, ProtocolError, parse_request

MALFORMED = "4xx"   # must be answered 400/404/413 with an error text
VALID = "ok"        # must be 200 with the right outputs
EITHER = "either"   # a mutation that may or may not still be valid: 200 (checked) or 4xx
ANSWERS_4XX = (400, 404, 413)


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]  # -1: the batch dimension


@dataclass
class ModelSpec:
    """A model the daemon serves, and the same ONNX file for the reference run here."""

    name: str
    path: Path
    inputs: list[Tensor]
    session: Any = None

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.session is None:
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(names, inputs)))


@dataclass
class Message:
    """One message to send and what a correct daemon answers to it."""

    kind: str
    frames: list[bytes]
    expect: str
    ident: int | None = None           # the id the reply must echo, when the header carries one we trust
    model: ModelSpec | None = None     # for VALID: whose reference to compare with
    inputs: dict[str, np.ndarray] | None = None
    mentions: str | None = None        # for MALFORMED: text the error must hold (the field at fault)


def _dumps(header: Any, ascii_only: bool = False) -> bytes:
    return json.dumps(header, ensure_ascii=ascii_only, separators=(",", ":")).encode("utf-8", "surrogatepass")


class MessageFactory:
    """Random wire messages for the models in `specs`; reproducible from `seed`."""

    def __init__(self, specs: list[ModelSpec], seed: int = 0, limits: dict[str, int] | None = None) -> None:
        self.specs = specs
        self.rng = random.Random(seed)
        self.np = np.random.default_rng(seed)
        self.limits = {"max_header_bytes": 65536, "max_tensors": 64, "max_rank": 8,
                       "max_message_bytes": 1 << 20, **(limits or {})}
        self._ids = iter(range(1, 1 << 62))
        self.families: list[tuple[Callable[[], Message], int]] = [
            (self.valid, 30), (self.bad_json, 6), (self.not_an_object, 3), (self.wrong_fields, 8),
            (self.frame_count, 5), (self.lying_size, 5), (self.odd_dtype, 4), (self.huge_dims, 4),
            (self.garbage, 5), (self.truncated, 4), (self.duplicated, 4), (self.deep_nesting, 3),
            (self.enormous_numbers, 5), (self.unicode, 6), (self.engine_mismatch, 5), (self.unknown_model, 2),
            (self.over_limits, 2), (self.mutated, 10), (self.zero_rows, 2), (self.bom, 1), (self.bad_regions, 3),
            (self.unknown_field, 4),
        ]
        self._weights = [w for _, w in self.families]

    def next(self) -> Message:
        family = self.rng.choices(self.families, self._weights)[0][0]
        return family()

    # -- building blocks -------------------------------------------------------

    def _spec(self) -> ModelSpec:
        return self.rng.choice(self.specs)

    def _arrays(self, spec: ModelSpec, rows: int | None = None) -> dict[str, np.ndarray]:
        rows = self.rng.randint(1, 3) if rows is None else rows
        out = {}
        for t in spec.inputs:
            shape = tuple(rows if d == -1 else d for d in t.shape)
            out[t.name] = self.np.standard_normal(shape).astype(t.dtype)
        return out

    def _request(self, spec: ModelSpec, arrays: dict[str, np.ndarray], **extra: Any) -> tuple[dict, list[bytes]]:
        ident = next(self._ids)
        header = {"model": spec.name, "id": ident,
                  "inputs": [{"name": n, "dtype": str(a.dtype), "shape": list(a.shape)} for n, a in arrays.items()],
                  **extra}
        return header, [a.tobytes() for a in arrays.values()]

    def _valid_parts(self) -> tuple[ModelSpec, dict[str, np.ndarray], dict, list[bytes]]:
        spec = self._spec()
        arrays = self._arrays(spec)
        header, tensors = self._request(spec, arrays)
        return spec, arrays, header, tensors

    # -- families --------------------------------------------------------------

    def valid(self) -> Message:
        spec, arrays, header, tensors = self._valid_parts()
        extra = self.rng.choice([{}, {}, {"timeout_ms": self.rng.randint(1000, 60000)}, {"key": "cam1"},
                                 {"outputs": [o.name for o in self._outputs(spec)]}, {"version": "1"}])
        header.update(extra)
        return Message("valid", [_dumps(header), *tensors], VALID, header["id"], spec, arrays)

    def _outputs(self, spec: ModelSpec) -> list[Any]:
        spec.reference({t.name: np.zeros([1 if d == -1 else d for d in t.shape], t.dtype) for t in spec.inputs})
        return spec.session.get_outputs()

    def bad_json(self) -> Message:
        _, _, header, tensors = self._valid_parts()
        raw = _dumps(header)
        broken = self.rng.choice([
            raw[: self.rng.randint(0, len(raw) - 1)],            # cut short
            raw + b"}garbage",                                   # trailing junk
            raw.replace(b'"', b"'", 2),                          # single quotes
            raw.replace(b":", b"=", 1),
            b"",                                                 # empty header frame
            b"{" * self.rng.randint(1, 50),
            raw.replace(b'"model"', b'"model" "model"'),
            b'{"model": "x", "id": 1,}',                         # trailing comma
            raw.replace(b"{", b"{\xff\xfe", 1),                  # invalid UTF-8 inside
        ])
        return Message("bad_json", [broken, *tensors], MALFORMED)

    def not_an_object(self) -> Message:
        value = self.rng.choice([[], [1, 2], "model", 5, 1.5, None, True, [{"model": "addone"}]])
        return Message("not_an_object", [_dumps(value)], MALFORMED)

    def wrong_fields(self) -> Message:
        spec, arrays, header, tensors = self._valid_parts()
        key, value = self.rng.choice([
            ("model", None), ("model", ""), ("model", 5), ("model", ["addone"]), ("model", {"n": 1}),
            ("inputs", {}), ("inputs", "x"), ("inputs", [1]), ("inputs", [None]), ("outputs", "y"),
            ("outputs", [1]), ("outputs", [None]), ("timeout_ms", 0), ("timeout_ms", -5), ("timeout_ms", "5"),
            ("timeout_ms", 1.5), ("timeout_ms", True), ("id", [1]), ("id", {"a": 1}), ("id", 1.5), ("id", True),
            ("version", [1]), ("version", {"v": 1}), ("version", 1.5), ("key", [1]), ("key", 2.5),
        ])
        if value is None:
            header.pop(key, None)
        else:
            header[key] = value
        trusted = header["id"] if key != "id" else None
        return Message(f"wrong_{key}", [_dumps(header), *tensors], MALFORMED, trusted)

    def unknown_field(self) -> Message:
        """A field the protocol does not have, in the header or an input: refused and named, never ignored."""
        _, _, header, tensors = self._valid_parts()
        name = self.rng.choice(["deadline_ms", "timout_ms", "note", "Model", "priority", "", "\u00e9", "id ",
                                "inputs\u0000", "trace_id"])
        where = header if self.rng.random() < 0.7 else self.rng.choice(header["inputs"])
        where[name] = self.rng.choice([5, "x", None, [], {"a": 1}, True])
        return Message("unknown_field", [_dumps(header), *tensors], MALFORMED, header["id"], mentions=repr(name))

    def bad_regions(self) -> Message:
        """Shared-memory references (regions.py) to regions no client registered, or badly formed."""
        _, _, header, tensors = self._valid_parts()
        tensors = list(tensors)
        if self.rng.random() < 0.5:
            index = self.rng.randrange(len(header["inputs"]))
            header["inputs"][index].update(self.rng.choice([
                {"region": "0" * 32, "offset": 0}, {"region": 5}, {"region": None}, {"region": "r", "offset": -1},
                {"region": "r", "offset": "0"}, {"region": "", "offset": 2**70}, {"region": ["r"], "offset": 0.5}]))
            del tensors[index]
        else:
            header["output_regions"] = self.rng.choice([
                {"y": {"region": "0" * 32}}, {"y": "r"}, ["y"], {"y": {"region": "r", "offset": -3}}, 5,
                {str(i): {"region": "r"} for i in range(100)}, {"y": {"region": "r", "offset": 2**70}}])
        return Message("bad_regions", [_dumps(header), *tensors], MALFORMED, header["id"])

    def frame_count(self) -> Message:
        _, _, header, tensors = self._valid_parts()
        choice = self.rng.randint(0, 3)
        if choice == 0:
            frames = [_dumps(header)]                                       # no tensors
        elif choice == 1:
            frames = [_dumps(header), *tensors, b"\0" * 16]                 # one too many
        elif choice == 2:
            frames = [_dumps(header), *tensors, *([b"x"] * self.rng.randint(2, 200))]
        else:
            header["inputs"] = header["inputs"] * 2                        # lists more than it sends
            frames = [_dumps(header), *tensors]
        return Message("frame_count", frames, MALFORMED, header["id"])

    def lying_size(self) -> Message:
        _, _, header, tensors = self._valid_parts()
        i = self.rng.randrange(len(tensors))
        delta = self.rng.choice([-1, 1, -4, 4, 3, len(tensors[i]) // 2, -len(tensors[i])])
        tensors[i] = tensors[i][:delta] if delta < 0 else tensors[i] + b"\x01" * delta
        meta = header["inputs"][i]
        if self.rng.random() < 0.3:  # or: the bytes are right, the shape lies
            meta["shape"] = [d + 1 for d in meta["shape"]]
        return Message("lying_size", [_dumps(header), *tensors], MALFORMED, header["id"])

    def odd_dtype(self) -> Message:
        _, _, header, tensors = self._valid_parts()
        header["inputs"][0]["dtype"] = self.rng.choice([
            "float64", "complex64", "float128", "<f4", ">f4", "f4", "FLOAT32", "", None, 5, "object", "str",
            "V8", "datetime64", "float32 ", "float\u0000", ["float32"], {"t": "float32"}, "bfloat16", "int4"])
        return Message("odd_dtype", [_dumps(header), *tensors], MALFORMED, header["id"])

    def huge_dims(self) -> Message:
        _, _, header, tensors = self._valid_parts()
        header["inputs"][0]["shape"] = self.rng.choice([
            [2**40], [2**62, 0], [0, 2**62], [-1, 4], [2**31, 2**31], [1e308], ["1"], [None], [1] * 9,
            [1] * 1000, [2**64], [65536, 65536], [3.0, 4], [True, 4], [], "1x4", {"0": 1}, [[1], [4]],
        ])
        return Message("huge_dims", [_dumps(header), *tensors], MALFORMED, header["id"])

    def bom(self) -> Message:
        """A UTF-8 byte-order mark before the JSON: RFC 8259 lets a parser skip it, Python's does."""
        spec, arrays, header, tensors = self._valid_parts()
        return Message("bom", [b"\xef\xbb\xbf" + _dumps(header), *tensors], EITHER)

    def garbage(self) -> Message:
        frames = [self.rng.randbytes(self.rng.randint(1, 256)) for _ in range(self.rng.randint(1, 5))]
        if frames[0][:1] in (b"{", b"[") or frames[0].strip()[:1].isdigit():
            frames[0] = b"\x00" + frames[0]  # keep it garbage: a digit alone parses as JSON
        return Message("garbage", frames, MALFORMED)

    def truncated(self) -> Message:
        _, _, header, tensors = self._valid_parts()
        raw = _dumps(header)
        if self.rng.random() < 0.5:
            return Message("truncated_header", [raw[: self.rng.randrange(len(raw))], *tensors], MALFORMED)
        i = self.rng.randrange(len(tensors))
        tensors[i] = tensors[i][: self.rng.randrange(len(tensors[i]))]
        return Message("truncated_tensor", [raw, *tensors], MALFORMED, header["id"])

    def duplicated(self) -> Message:
        _, _, header, tensors = self._valid_parts()
        raw = _dumps(header)
        frames = self.rng.choice([[raw, raw, *tensors], [raw, *tensors, tensors[-1]], [raw, *tensors, raw]])
        return Message("duplicated", frames, MALFORMED, header["id"])

    def deep_nesting(self) -> Message:
        _, _, header, tensors = self._valid_parts()
        depth = self.rng.choice([2000, 5000, 20000, 30000])
        opener, closer = self.rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
        nested = opener * depth + b"1" + closer * depth
        where = self.rng.choice(["model", "inputs", "extra", "top"])
        if where == "top":
            raw = nested
        else:
            raw = _dumps({**header, where: "__NEST__"}).replace(b'"__NEST__"', nested)
        if len(raw) > self.limits["max_header_bytes"]:
            raw = raw[: self.limits["max_header_bytes"]]  # still deep, still malformed
        return Message(f"deep_{where}", [raw, *tensors], MALFORMED)

    def enormous_numbers(self) -> Message:
        spec, arrays, header, tensors = self._valid_parts()
        key, value, expect = self.rng.choice([
            ("timeout_ms", 10**30, MALFORMED), ("timeout_ms", 10**310, MALFORMED), ("timeout_ms", 2**31, MALFORMED),
            ("timeout_ms", 2**31 - 1, VALID),
            ("id", 10**100, VALID), ("id", -(10**100), VALID), ("version", 10**50, VALID),
            ("key", 10**80, MALFORMED), ("key", 2**63 - 1, VALID), ("timeout_ms", "1e400", MALFORMED), ("timeout_ms", "-1e400", MALFORMED),
            ("timeout_ms", "NaN", MALFORMED), ("id", "Infinity", MALFORMED), ("timeout_ms", "9" * 5000, MALFORMED),
        ])
        raw = _dumps({**header, key: "__NUM__"})
        literal = value if isinstance(value, str) else str(value)
        raw = raw.replace(b'"__NUM__"', literal.encode())
        ident = header["id"] if key != "id" else (value if expect == VALID else None)
        if literal == "9" * 5000:
            ident = None  # the header does not parse at all
        kind = f"number_{key}"
        if expect == VALID:
            return Message(kind, [raw, *tensors], VALID, ident, spec, arrays)
        return Message(kind, [raw, *tensors], MALFORMED, ident)

    def unicode(self) -> Message:
        spec, arrays, header, tensors = self._valid_parts()
        odd = self.rng.choice(["\ud800", "\udfff", "a\u0000b", "\u202eevil", "\ufeff", "😀" * 50, "e\u0301",
                               "\uffff", "𝕞𝕠𝕕𝕖𝕝", "\u2028", "x" * 2000])
        where = self.rng.choice(["id", "key", "model", "input_name", "version", "outputs", "overlong"])
        if where == "overlong":  # an overlong UTF-8 encoding of "/": invalid UTF-8
            raw = _dumps(header).replace(b'"model":"', b'"model":"\xc0\xaf', 1)
            return Message("unicode_overlong", [raw, *tensors], MALFORMED, None)
        if where == "key" and not (odd.isprintable() and len(odd.encode("utf-8", "surrogatepass")) <= MAX_KEY_BYTES):
            header["key"] = odd  # a stream key is printable text of at most MAX_KEY_BYTES: a 400 naming it
            return Message("unicode_key_refused", [_dumps(header, ascii_only=True), *tensors], MALFORMED, header["id"])
        if where in ("id", "key", "version"):
            header[where] = odd  # ids are free text, keys printable text; an unknown version falls back to the default
            raw = _dumps(header, ascii_only=self.rng.random() < 0.5)
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:  # a raw (CESU-8) surrogate: Python's json takes it, strict parsers do not
                return Message(f"unicode_{where}_raw", [raw, *tensors], EITHER)
            return Message(f"unicode_{where}", [raw, *tensors], VALID, header["id"], spec, arrays)
        if where == "model":
            header["model"] = odd
        elif where == "input_name":
            header["inputs"][0]["name"] = odd
        else:
            header["outputs"] = [odd]
        return Message(f"unicode_{where}", [_dumps(header, ascii_only=True), *tensors], MALFORMED, header["id"])

    def engine_mismatch(self) -> Message:
        spec = self._spec()
        arrays = self._arrays(spec)
        first = spec.inputs[0]
        choice = self.rng.randint(0, 5)
        if choice == 0:
            arrays = {"not_" + first.name: arrays[first.name], **{k: v for k, v in arrays.items() if k != first.name}}
        elif choice == 1:
            arrays[first.name] = arrays[first.name].astype(np.int32)
        elif choice == 2:
            arrays[first.name] = arrays[first.name][..., :1].copy()     # a wrong non-batch dimension
        elif choice == 3:
            arrays[first.name] = arrays[first.name][None]              # a wrong rank
        elif choice == 4:
            arrays["extra"] = np.zeros(2, np.float32)
        header, tensors = self._request(spec, arrays)
        if choice == 5:  # right inputs, an output the engine does not have
            header["outputs"] = ["no_such_output"]
        return Message("engine_mismatch", [_dumps(header), *tensors], MALFORMED, header["id"])

    def unknown_model(self) -> Message:
        _, _, header, tensors = self._valid_parts()
        header["model"] = self.rng.choice(["nope", "ADDONE", "addone ", "../addone", "addone\u0000"])
        return Message("unknown_model", [_dumps(header), *tensors], MALFORMED, header["id"])

    def over_limits(self) -> Message:
        _, _, header, tensors = self._valid_parts()
        which = self.rng.choice(["header", "tensors", "rank", "message"])
        if which == "header":
            header["pad"] = "x" * (self.limits["max_header_bytes"] + 1)
            return Message("limit_header", [_dumps(header), *tensors], MALFORMED)
        if which == "tensors":
            n = self.limits["max_tensors"] + 1
            header["inputs"] = [{"name": f"t{i}", "dtype": "uint8", "shape": [1]} for i in range(n)]
            return Message("limit_tensors", [_dumps(header), *([b"\0"] * n)], MALFORMED, header["id"])
        if which == "rank":
            rank = self.limits["max_rank"] + 1
            header["inputs"] = [{"name": "x", "dtype": "uint8", "shape": [1] * rank}]
            return Message("limit_rank", [_dumps(header), b"\0"], MALFORMED, header["id"])
        size = self.limits["max_message_bytes"] + 1
        header["inputs"] = [{"name": "x", "dtype": "uint8", "shape": [size]}]
        return Message("limit_message", [_dumps(header), bytes(size)], MALFORMED, header["id"])

    def mutated(self) -> Message:
        """Random byte edits of a valid message: still valid or not, it must be answered sanely."""
        _, _, header, tensors = self._valid_parts()
        frames = [bytearray(_dumps(header)), *map(bytearray, tensors)]
        for _ in range(self.rng.randint(1, 4)):
            frame = frames[0] if self.rng.random() < 0.7 else self.rng.choice(frames)
            op = self.rng.randint(0, 3)
            pos = self.rng.randrange(len(frame) + 1)
            if op == 0 and frame:
                frame[min(pos, len(frame) - 1)] = self.rng.randrange(256)
            elif op == 1:
                frame[pos:pos] = self.rng.randbytes(self.rng.randint(1, 8))
            elif op == 2:
                del frame[pos:pos + self.rng.randint(1, 8)]
            else:
                frame[pos:pos] = self.rng.choice([b'"', b"{", b"}", b"[", b",", b"\\", b'\\ud800', b"0", b"-"])
        return Message("mutated", [bytes(f) for f in frames], EITHER)

    def zero_rows(self) -> Message:
        spec = self._spec()
        arrays = self._arrays(spec, rows=0)
        header, tensors = self._request(spec, arrays)
        return Message("zero_rows", [_dumps(header), *tensors], EITHER, header["id"])


# -- sending them -----------------------------------------------------------------

@dataclass
class FuzzReport:
    """What a run saw. `failures` holds the first few problems, in words."""

    sent: int = 0
    answered: int = 0
    malformed: int = 0
    malformed_4xx: int = 0
    valid: int = 0
    valid_ok: int = 0
    by_status: Counter = field(default_factory=Counter)
    by_kind: Counter = field(default_factory=Counter)
    problems: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.sent / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def clean(self) -> bool:
        return not self.problems and self.answered == self.sent

    def fail(self, what: str, message: Message, detail: str) -> None:
        self.problems[what] += 1
        if len(self.failures) < 20:
            head = message.frames[0][:120] if message.frames else b""
            self.failures.append(f"{what}: {message.kind} ({detail}); header {head!r}")

    def summary(self) -> str:
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(self.by_status.items()))
        return (f"{self.sent} messages in {self.elapsed_s:.1f} s ({self.rate:,.0f}/s); answered {self.answered}; "
                f"malformed {self.malformed} -> 4xx {self.malformed_4xx}; valid {self.valid} -> correct "
                f"{self.valid_ok}; statuses {statuses}; problems {dict(self.problems) or 'none'}")


def _close_enough(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> str | None:
    for name, value in got.items():
        ref = want.get(name)
        if ref is None:
            return f"unexpected output {name!r}"
        if ref.shape != value.shape or ref.dtype != value.dtype:
            return f"{name}: {value.dtype}{list(value.shape)} != reference {ref.dtype}{list(ref.shape)}"
        if not np.allclose(value, ref, rtol=1e-4, atol=1e-5, equal_nan=True):
            return f"{name}: max difference {float(np.max(np.abs(value - ref)))}"
    return None


def _decode(frames: list[bytes]) -> tuple[dict, dict[str, np.ndarray]]:
    header = json.loads(frames[0])
    outputs = {}
    for meta, frame in zip(header.get("outputs") or [], frames[1:]):
        outputs[meta["name"]] = np.frombuffer(frame, dtype=np.dtype(meta["dtype"])).reshape(meta["shape"])
    return header, outputs


class Checker:
    """Judges each reply against its message's label."""

    def __init__(self, specs: list[ModelSpec], report: FuzzReport) -> None:
        self.specs = {s.name: s for s in specs}
        self.report = report

    def check(self, message: Message, frames: list[bytes]) -> None:
        r = self.report
        r.answered += 1
        try:
            header, outputs = _decode(frames)
            status = int(header["status"])
        except Exception as exc:  # the reply itself is broken
            r.fail("undecodable reply", message, repr(exc)[:200])
            return
        r.by_status[status] += 1
        r.by_kind[(message.kind, status)] += 1
        if message.ident is not None and header.get("id") != message.ident:
            r.fail("id not echoed", message, f"sent {message.ident!r:.40}, got {header.get('id')!r:.40}")
        if message.expect == MALFORMED:
            self._malformed(message, status, header)
        elif message.expect == VALID:
            self._valid(message, status, header, outputs, message.model, message.inputs)
        else:
            self._either(message, status, header, outputs)

    def _malformed(self, message: Message, status: int, header: dict) -> None:
        self.report.malformed += 1
        if status in ANSWERS_4XX and header.get("error"):
            self.report.malformed_4xx += 1
            if message.mentions is not None and message.mentions not in header["error"]:
                self.report.fail("error does not name the fault", message, str(header["error"])[:200])
        else:
            self.report.fail(f"malformed answered {status}", message, str(header.get("error"))[:200])

    def _valid(self, message: Message, status: int, header: dict, outputs: dict, spec: ModelSpec | None,
               inputs: dict | None) -> None:
        self.report.valid += 1
        if status != 200:
            self.report.fail(f"valid answered {status}", message, str(header.get("error"))[:200])
            return
        assert spec is not None and inputs is not None
        want = spec.reference(inputs)
        problem = _close_enough(outputs, want) or (None if set(outputs) <= set(want) and outputs else "no outputs")
        if problem:
            self.report.fail("wrong outputs", message, problem)
        else:
            self.report.valid_ok += 1

    def _either(self, message: Message, status: int, header: dict, outputs: dict) -> None:
        if status in ANSWERS_4XX and header.get("error"):
            return
        if status != 200:
            self.report.fail(f"mutation answered {status}", message, str(header.get("error"))[:200])
            return
        try:  # it stayed valid: our own parse says what was asked, onnxruntime what the answer is
            request = parse_request(message.frames)
        except ProtocolError as exc:
            self.report.fail("accepted what the protocol refuses", message, exc.message[:200])
            return
        spec = self.specs.get(request.model)
        if spec is None:
            spec = self.specs.get(header.get("model", ""))  # served by a fallback
        if spec is None:
            self.report.fail("200 for an unknown model", message, request.model[:80])
            return
        inputs = {k: np.ascontiguousarray(v) for k, v in request.inputs.items()}
        want = spec.reference(inputs)
        problem = _close_enough(outputs, want)
        if problem:
            self.report.fail("wrong outputs", message, problem)


def run_fuzz(endpoint: str, factory: MessageFactory, count: int, *, sockets: int = 8, timeout_s: float = 10.0,
             alive: Callable[[], bool] | None = None, progress: Callable[[FuzzReport], None] | None = None,
             context: zmq.Context | None = None) -> FuzzReport:
    """Send `count` messages, `sockets` at a time in lockstep, and check every answer."""
    ctx = context or zmq.Context.instance()
    report = FuzzReport()
    checker = Checker(factory.specs, report)
    poller = zmq.Poller()
    pending: dict[zmq.Socket, tuple[Message, float]] = {}
    socks = [_socket(ctx, endpoint) for _ in range(sockets)]
    for s in socks:
        poller.register(s, zmq.POLLIN)
    start = time.perf_counter()
    next_progress = start + 1.0

    def send(sock: zmq.Socket) -> None:
        message = factory.next()
        sock.send_multipart([b"", *message.frames])
        pending[sock] = (message, time.monotonic())
        report.sent += 1

    silent = 0  # messages timed out since the last reply: all sockets silent means the daemon is gone
    try:
        for sock in socks:
            if report.sent < count:
                send(sock)
        while pending:
            for sock, _ in poller.poll(100):
                frames = sock.recv_multipart()
                if sock not in pending:
                    continue  # a reply after its message was given up on (already counted)
                message, _ = pending.pop(sock)
                checker.check(message, frames[1:] if frames and not frames[0] else frames)
                silent = 0
                if report.sent < count:
                    send(sock)
            now = time.monotonic()
            for sock, (message, sent_at) in list(pending.items()):
                if now - sent_at > timeout_s:
                    report.fail("no reply", message, f"nothing within {timeout_s:g} s")
                    pending.pop(sock)
                    silent += 1
                    if (alive is not None and not alive()) or silent >= sockets:
                        report.problems["daemon died or hung"] += 1
                        return report
            if progress and time.perf_counter() >= next_progress:
                report.elapsed_s = time.perf_counter() - start
                progress(report)
                next_progress += 1.0
    finally:
        report.elapsed_s = time.perf_counter() - start
        for s in socks:
            s.close(0)
    if alive is not None and not alive():
        report.problems["daemon died or hung"] += 1
    return report


def _socket(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


# -- the daemon the fuzzers run against ---------------------------------------------

FUZZ_MODELS = """
[routing]
version_mismatch = "fallback"

[[models]]
name = "classifier"
engine = "classifier/1/model.onnx"
contexts = 2
max_queue = 1024
max_batch = 4
batch_delay_us = 200

[[models]]
name = "addone"
engine = "addone/1/model.onnx"
max_queue = 1024

[[models]]
name = "pair"
engine = "pair/1/model.onnx"
max_queue = 1024
fallback = "addone"
"""


def fuzz_specs(engines: Path) -> list[ModelSpec]:
    """The models of FUZZ_MODELS, found under `engines`."""
    return [
        ModelSpec("classifier", engines / "classifier/1/model.onnx", [Tensor("images", "float32", (-1, 3, 64, 64))]),
        ModelSpec("addone", engines / "addone/1/model.onnx", [Tensor("x", "float32", (-1, 4))]),
        ModelSpec("pair", engines / "pair/1/model.onnx", [Tensor("a", "float32", (-1, 3)),
                                                         Tensor("b", "float32", (-1, 3))]),
    ]


def message_count_by_kind(report: FuzzReport) -> dict[str, int]:
    kinds: Counter = Counter()
    for (kind, _), n in report.by_kind.items():
        kinds[kind] += n
    return dict(kinds)


