"""Wire protocol v1: what parses, what is refused, and with which message."""

from __future__ import annotations

import json

import numpy as np
import pytest

from infermux.protocol import (DTYPES, Limits, MalformedReply, OkReplies, OutputRegion, ProtocolError, SharedTensor, Status,
                               decode_reply, encode_reply, encode_request, parse_request)


def frames_of(header: dict, *tensors: bytes) -> list[bytes]:
    return [json.dumps(header).encode(), *tensors]


def refused(frames: list, limits: Limits = Limits()) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_request(frames, limits)
    return info.value


def test_request_round_trips_every_dtype() -> None:
    inputs = {name: np.arange(6).reshape(2, 3).astype(dt) for name, dt in DTYPES.items()}
    req = parse_request([bytes(f) for f in encode_request("m", inputs, id="a", version="2",
                                                         timeout_ms=5, key="cam1", outputs=["y"])])
    assert (req.model, req.id, req.version, req.timeout_ms, req.key, req.outputs) == ("m", "a", "2", 5, "cam1", ("y",))
    for name, value in inputs.items():
        np.testing.assert_array_equal(req.inputs[name], value)
        assert req.inputs[name].dtype == value.dtype


def test_inputs_are_views_on_the_frames_not_copies() -> None:
    frame = np.arange(4, dtype=np.float32).tobytes()
    req = parse_request(frames_of({"model": "m", "inputs": [{"name": "x", "dtype": "float32", "shape": [4]}]}, frame))
    assert not req.inputs["x"].flags.owndata


@pytest.mark.parametrize("frames, fragment", [
    ([], "empty message"),
    ([b"\xff\xfe"], "not UTF-8 JSON"),
    ([b"{not json"], "not UTF-8 JSON"),
    ([b"[1, 2]"], "must be a JSON object"),
    ([b'{"inputs": []}'], "'model'"),
    ([b'{"model": ""}'], "'model'"),
    ([b'{"model": 5}'], "'model'"),
    ([b'{"model": "m", "inputs": {}}'], "'inputs' must be a list"),
    ([b'{"model": "m", "inputs": [{"name": "x", "dtype": "float32", "shape": [1]}]}'], "1 inputs but 0 tensor frames"),
    ([b'{"model": "m"}', b"\0"], "0 inputs but 1 tensor frames"),
    ([b'{"model": "m", "inputs": [{"name": "x", "dtype": "complex64", "shape": [1]}]}', b"\0" * 8], "not supported"),
    ([b'{"model": "m", "inputs": [{"name": "x", "dtype": "float32", "shape": [-1]}]}', b""], "non-negative"),
    ([b'{"model": "m", "inputs": [{"name": "x", "dtype": "float32", "shape": [1.5]}]}', b""], "non-negative"),
    ([b'{"model": "m", "inputs": [{"name": "x", "dtype": "float32", "shape": [true]}]}', b""], "non-negative"),
    ([b'{"model": "m", "inputs": [{"name": "x", "dtype": "float32", "shape": [65536, 65536]}]}', b""], "elements"),
    ([b'{"model": "m", "inputs": [{"name": "x", "dtype": "float32", "shape": [1,1,1,1,1,1,1,1,1]}]}', b"\0" * 4], "at most 8"),
    ([b'{"model": "m", "inputs": [{"name": "x", "dtype": "float32", "shape": [2]}]}', b"\0" * 7], "needs 8 bytes, frame has 7"),
    ([b'{"model": "m", "inputs": [{"name": "", "dtype": "float32", "shape": [1]}]}', b"\0" * 4], "name"),
    ([b'{"model": "m", "inputs": [{"name": "x", "dtype": "uint8", "shape": [1]}, {"name": "x", "dtype": "uint8", "shape": [1]}]}', b"\0", b"\0"], "listed twice"),
    ([b'{"model": "m", "timeout_ms": 0}'], "timeout_ms"),
    ([b'{"model": "m", "timeout_ms": "5"}'], "timeout_ms"),
    ([b'{"model": "m", "outputs": "y"}'], "outputs"),
    ([b'{"model": "m", "id": [1]}'], "'id'"),
    ([b'{"model": "m", "version": [1]}'], "version"),
])
def test_malformed_requests_are_refused_with_a_reason(frames: list, fragment: str) -> None:
    error = refused(frames)
    assert error.status == Status.BAD_REQUEST
    assert fragment in error.message


def test_oversize_message_is_413_not_400() -> None:
    error = refused([b'{"model": "m"}', b"\0" * 2000], Limits(max_message_bytes=1024))
    assert error.status == Status.TOO_LARGE and "limit is 1024" in error.message


def test_oversize_header_is_refused() -> None:
    header = json.dumps({"model": "m", "pad": "x" * 100}).encode()
    assert "header is" in refused([header], Limits(max_header_bytes=64)).message


def test_reply_round_trip_keeps_outputs_and_header() -> None:
    outs = {"probs": np.random.rand(2, 10).astype(np.float32), "idx": np.arange(2, dtype=np.int64)}
    reply = decode_reply([bytes(f) for f in encode_reply({"id": 1, "status": 200}, outs)])
    assert reply.ok and reply.header["outputs"][0] == {"name": "probs", "dtype": "float32", "shape": [2, 10]}
    for name in outs:
        np.testing.assert_array_equal(reply.outputs[name], outs[name])


def test_big_endian_arrays_go_on_the_wire_little_endian() -> None:
    big = np.arange(3, dtype=">f4")
    frames = encode_request("m", {"x": big})
    assert bytes(frames[1]) == np.arange(3, dtype="<f4").tobytes()


class Regions:
    """A RegionLookup over one bytes object called "r1"."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)

    def view(self, token: str, offset: int, nbytes: int) -> memoryview:
        if token != "r1" or offset + nbytes > len(self.data):
            raise ProtocolError(Status.BAD_REQUEST, "outside")
        return self.data[offset:offset + nbytes]


def test_an_input_in_shared_memory_has_no_frame_and_is_read_in_its_region() -> None:
    x = np.arange(8, dtype=np.float32)
    region = Regions(b"\0" * 16 + x.tobytes())
    frames = encode_request("m", {"a": SharedTensor("r1", 16, "float32", (2, 4)), "b": x})
    header = json.loads(frames[0])
    assert len(frames) == 2  # the header and b's frame
    assert header["inputs"][0] == {"name": "a", "dtype": "float32", "shape": [2, 4], "region": "r1", "offset": 16}
    request = parse_request(frames, Limits(), region)
    np.testing.assert_array_equal(request.inputs["a"], x.reshape(2, 4))
    np.testing.assert_array_equal(request.inputs["b"], x)
    assert list(request.inputs) == ["a", "b"] and request.input_regions == {"a": SharedTensor("r1", 16, "float32", (2, 4))}
    assert np.shares_memory(request.inputs["a"], np.frombuffer(region.data, np.uint8))


def test_shared_memory_inputs_are_checked_like_frames() -> None:
    meta = {"name": "a", "dtype": "float32", "shape": [2], "region": "r1", "offset": 0}
    region = Regions(b"\0" * 8)
    with pytest.raises(ProtocolError, match="does not take"):
        parse_request(frames_of({"model": "m", "inputs": [meta]}), Limits(), None)
    for bad in ({"offset": -1}, {"offset": "0"}, {"region": 7}):
        with pytest.raises(ProtocolError, match="non-negative integer"):
            parse_request(frames_of({"model": "m", "inputs": [{**meta, **bad}]}), Limits(), region)
    with pytest.raises(ProtocolError, match="outside"):
        parse_request(frames_of({"model": "m", "inputs": [{**meta, "shape": [3]}]}), Limits(), region)
    framed = {"name": "b", "dtype": "float32", "shape": [2]}
    with pytest.raises(ProtocolError, match=r"1 inputs \(and 1 in shared memory\) but 0 tensor frames"):
        parse_request(frames_of({"model": "m", "inputs": [meta, framed]}), Limits(), region)


def test_outputs_asked_into_a_region_are_written_there_and_read_back_from_it() -> None:
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    memory = bytearray(64)
    request = encode_request("m", {}, output_regions={"y": SharedTensor("r1", 8, "float32", (2, 3))})
    assert json.loads(request[0])["output_regions"] == {"y": {"region": "r1", "offset": 8}}
    into = {"y": OutputRegion("r1", 8, memoryview(memory)[8:]), "z": OutputRegion("r1", 60, memoryview(memory)[60:])}
    frames = encode_reply({"status": 200}, {"y": y, "z": y}, into)
    assert len(frames) == 2  # y in the region; z did not fit its 4 bytes and came in a frame
    metas = json.loads(frames[0])["outputs"]
    assert metas[0]["region"] == "r1" and metas[0]["offset"] == 8 and "region" not in metas[1]
    reply = decode_reply(frames, lambda token, offset, n: memoryview(memory)[offset:offset + n])
    np.testing.assert_array_equal(reply.outputs["y"], y)
    np.testing.assert_array_equal(reply.outputs["z"], y)
    with pytest.raises(MalformedReply, match="cannot read"):
        decode_reply(frames)


def test_output_regions_in_a_request_are_checked() -> None:
    class Writable(Regions):
        def writable(self, token: str, offset: int) -> memoryview:
            if token != "r1":
                raise ProtocolError(Status.BAD_REQUEST, "no such region")
            return self.data[offset:]

    regions = Writable(bytes(16))
    x = np.zeros(2, np.float32)
    ok = encode_request("m", {"x": x}, output_regions={"y": SharedTensor("r1", 4, "float32", (1,))})
    assert parse_request(ok, Limits(), regions).output_regions["y"].offset == 4
    with pytest.raises(ProtocolError, match="shared_memory is off"):
        parse_request(ok, Limits(), None)
    header = json.loads(ok[0])
    for bad in (["y"], {"y": {"region": "r1", "offset": -1}}, {"y": "r1"}):
        with pytest.raises(ProtocolError, match="output_regions"):
            parse_request([json.dumps({**header, "output_regions": bad}).encode(), *ok[1:]], Limits(), regions)
    with pytest.raises(ProtocolError, match="no such region"):
        parse_request([json.dumps({**header, "output_regions": {"y": {"region": "r2"}}}).encode(), *ok[1:]],
                      Limits(), regions)


X1 = {"name": "x", "dtype": "float32", "shape": [1]}


class WritableRegions(Regions):
    """Regions whose "r1" takes outputs too."""

    def writable(self, token: str, offset: int) -> memoryview:
        return self.data[offset:]


@pytest.mark.parametrize("extra, named, guess", [
    ({"deadline_ms": 5}, "'deadline_ms'", "'timeout_ms'"),    # another server's name for it
    ({"timout_ms": 5}, "'timout_ms'", "'timeout_ms'"),        # a typo
    ({"Version": "2"}, "'Version'", "'version'"),
    ({"output": ["y"]}, "'output'", "'outputs'"),
    ({"note": "hi"}, "'note'", None),                          # nothing close: no guess
])
def test_an_unknown_header_field_is_refused_naming_it(extra: dict, named: str, guess: str | None) -> None:
    error = refused(frames_of({"model": "m", "id": 3, "inputs": [X1], **extra}, b"\0" * 4))
    assert error.status == Status.BAD_REQUEST
    assert f"unknown header field {named}" in error.message and "it takes model, inputs, id" in error.message
    assert (f"did you mean {guess}?" in error.message) if guess else "did you mean" not in error.message


def test_an_unknown_field_is_found_before_the_field_it_misspells_reads_as_missing() -> None:
    assert "did you mean 'model'" in refused(frames_of({"modle": "m"})).message
    typo = {"name": "x", "dtpye": "float32", "shape": [1]}
    message = refused(frames_of({"model": "m", "inputs": [X1, typo]}, b"\0" * 4, b"\0" * 4)).message
    assert "unknown inputs[1] field 'dtpye' (did you mean 'dtype'?)" in message


def test_many_unknown_fields_are_counted_not_all_listed() -> None:
    message = refused(frames_of({"model": "m", **{f"f{i}": i for i in range(500)}})).message
    assert "unknown header fields 'f0', 'f1', 'f10', 'f100' and 496 more;" in message


def test_an_unknown_field_in_an_output_region_is_refused() -> None:
    ok = encode_request("m", {"x": np.zeros(1, np.float32)}, output_regions={"y": SharedTensor("r1", 0, "float32", (1,))})
    header = {**json.loads(ok[0]), "output_regions": {"y": {"region": "r1", "ofset": 8}}}
    with pytest.raises(ProtocolError, match=r"unknown output_regions\['y'\] field 'ofset' \(did you mean 'offset'\?\)"):
        parse_request([json.dumps(header).encode(), *ok[1:]], Limits(), WritableRegions(bytearray(16)))


def test_every_field_the_encoder_writes_is_one_the_parser_takes() -> None:
    frames = encode_request("m", {"x": np.zeros(1, np.float32)}, id=1, version="2", outputs=["y"], timeout_ms=9,
                            key="cam", output_regions={"y": SharedTensor("r1", 0, "float32", (1,))})
    request = parse_request(frames, Limits(), WritableRegions(bytearray(16)))
    assert (request.id, request.version, request.outputs, request.timeout_ms, request.key) == (1, "2", ("y",), 9, "cam")


@pytest.mark.parametrize("ident", [7, -2**63 - 1, "cam-1/frame-9", "ünïcødé \"quoted\"", None, 1.5, True,
                                   "lone \ud800 surrogate"])
def test_ok_replies_are_byte_for_byte_what_encode_reply_makes(ident) -> None:
    ok = OkReplies("model \"m\"", "2.1")
    outputs = {"probs": np.arange(10, dtype=np.float32).reshape(1, 10), "label": np.int64([3])}
    header = {"id": ident, "status": 200, "model": "model \"m\"", "version": "2.1",
              "timing_us": {"queue": 5, "compute": 40, "total": 61}}
    expected = [bytes(f) for f in encode_reply(header, outputs)]
    for _ in range(2):  # the second time from what it remembered
        fast = ok.encode(ident, 5, 40, 61, outputs)
        if fast is None:  # only where UTF-8 cannot carry the id: encode_reply escapes it
            assert isinstance(ident, str) and "\ud800" in ident
            continue
        assert [bytes(f) for f in fast] == expected


def test_ok_replies_leave_what_they_cannot_encode_to_encode_reply() -> None:
    ok = OkReplies("m", "1")
    assert ok.encode(1, 0, 0, 0, {}) is None  # no outputs: no "outputs" key at all
    assert ok.encode(1, 0, 0, 0, {"s": np.array(["text"])}) is None  # not a wire dtype


def test_a_keyed_request_says_how_many_frames_its_client_replaced() -> None:
    frames = [bytes(f) for f in encode_request("m", {}, key="cam1", replaced=7)]
    assert json.loads(frames[0])["replaced"] == 7 and parse_request(frames).replaced == 7
    plain = [bytes(f) for f in encode_request("m", {}, key="cam1")]
    assert "replaced" not in json.loads(plain[0]) and parse_request(plain).replaced == 0


@pytest.mark.parametrize("header, fragment", [
    ({"model": "m", "key": "c", "replaced": -1}, "'replaced' must be an integer from 0 to 1000000, got -1"),
    ({"model": "m", "key": "c", "replaced": 10**30}, "'replaced' must be an integer from 0 to 1000000"),
    ({"model": "m", "key": "c", "replaced": 2.5}, "'replaced' must be int"),
    ({"model": "m", "key": "c", "replaced": True}, "'replaced' must be int"),
    ({"model": "m", "replaced": 3}, "'replaced' counts frames of a stream: it needs a 'key'"),
])
def test_a_replaced_count_out_of_bounds_or_without_a_key_is_refused(header: dict, fragment: str) -> None:
    error = refused(frames_of(header))
    assert error.status == Status.BAD_REQUEST and fragment in error.message, error.message
