"""The daemon↔worker messages (workers/wire.py): each kind is a dataclass that survives its trip,
and a frame that is no message says which kind failed and why, as MalformedMessage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infermux.config import ModelConfig
from infermux.execution.job import Outcome
from infermux.execution.placement import Change
from infermux.models.hot import WarmShape
from infermux.plugins.base import TensorSpec
from infermux.workers import wire

SPECS = [TensorSpec("x", "float32", (-1, 4), (1, 4), (8, 4)), TensorSpec("y", "int64", (-1,))]
MESSAGES = [
    wire.Load(ModelConfig("m", Path("/engines/m/1/model.onnx"), version="1", placement="cold", contexts=2,
                          preferred_batch=(2, 4), options={"intra_op_threads": 1})),
    wire.Load(ModelConfig("det", Path("/engines/det/1/model.onnx")),  # with the shapes its pipelines send it
              (WarmShape("", (1, 3, 736, 1312), "float32", "pipeline 'ocr' step 'det' at 1280x720"),)),
    wire.Infer(7, 10, 20, "req-1", "m", "cam-3", ["y"], [wire.Tensor("x", "float32", [2, 4])],
               {"from": "big"}, "infermux-1-1-1", [[0, 32]], 64, [wire.RegionInput(1, "tok", 128, 32)],
               [wire.RegionOutput("y", "tok", 256)]),
    wire.Forget("infermux-1-1-3"),
    wire.Map("region-token"),
    wire.Unmap("region-token"),
    wire.Set(Change(contexts=3, preferred_batch=(2, 4))),
    wire.Exit(),
    wire.Hello(4242, 96 << 20),
    wire.Stage("warming", "onnxruntime"),
    wire.Ready(SPECS, SPECS[1:], 1 << 20, 12.5, "onnxruntime", 340, True),
    wire.Error("engine file /x does not exist", "load"),
    wire.Reply(7, Outcome(200, 4, 10, 250, 300)),
    wire.Reply(8, Outcome(200, 1, 0, 90, 120), [[0, 4096], [4096, 64]]),
    wire.Late(9),
    wire.Beat([(1, 1, 30), (0, 0, 28)]),
    wire.Bye(),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_decodes_to_what_was_encoded(message: wire.Message) -> None:
    frame = message.encode()
    assert wire.kind_of(frame) == message.KIND
    assert wire.decode(frame) == message


def test_every_kind_has_its_own_byte_and_a_dataclass() -> None:
    kinds = [type(m) for m in MESSAGES]
    assert {k.KIND for k in kinds} == {wire.LOAD, wire.INFER, wire.FORGET, wire.MAP, wire.UNMAP, wire.SET, wire.EXIT,
                                       wire.HELLO, wire.STAGE, wire.READY, wire.ERROR, wire.REPLY, wire.LATE,
                                       wire.BEAT, wire.BYE}
    assert len({k.KIND for k in kinds}) == len(set(kinds)) == 15


def test_set_carries_only_what_changes() -> None:
    assert json.loads(wire.Set(Change(max_batch=8)).encode()[1:]) == {"max_batch": 8}


@pytest.mark.parametrize("frame, says", [
    (b"", "an empty message"),
    (b"Z{}", "unknown message kind b'Z'"),
    (b"R\x00\x01", "REPLY does not decode"),  # its head is a fixed-size struct
    (wire.Reply(1, Outcome(200, 1, 0, 0, 0)).encode() + b"[[1]]", "REPLY does not decode"),
    (b"h{not json", "HELLO does not decode"),
    (b'h{"pid": 1}', "HELLO does not decode: KeyError: 'rss'"),
    (b'h{"pid": "1", "rss": 0}', "HELLO does not decode: TypeError"),
    (b"h[1, 2]", "HELLO does not decode: TypeError: expected a JSON object"),
    (b'r{"inputs": []}', "READY does not decode"),
    (b'H{"ctx": [[1, 2]]}', "BEAT does not decode"),
    (b"L\x01", "LATE does not decode"),
    (b"Xjunk", "EXIT does not decode"),
    (b"F", "FORGET does not decode"),
    (b'l{"name": "m"}', "LOAD does not decode"),
    (b"I[1, 2]", "INFER does not decode"),
])
def test_a_frame_that_is_no_message_raises_malformed_naming_the_kind(frame: bytes, says: str) -> None:
    with pytest.raises(wire.MalformedMessage, match=says.replace("[", r"\[")):
        wire.decode(frame)
