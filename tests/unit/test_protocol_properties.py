"""Property tests of the wire protocol: the decoders refuse
anything malformed with a ProtocolError and nothing else, and whatever the
encoders write reads back the same."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from infermux.protocol import (DTYPES, INPUT_FIELDS, MAX_KEY_BYTES, MAX_TIMEOUT_MS, REQUEST_FIELDS, Limits, MalformedReply,
                               ProtocolError, Status, decode_reply, encode_reply, encode_request, error_header,
                               parse_header, parse_request, request_id)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text as JSON can carry it: any code point, lone surrogates included.
any_text = st.text(st.characters(codec=None), max_size=20)
json_scalars = st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | any_text
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(any_text, inner, max_size=4), max_leaves=20)

header_keys = st.sampled_from(["model", "inputs", "outputs", "id", "version", "timeout_ms", "key",
                               "name", "dtype", "shape"])
# Headers shaped like requests, with every field free to be the wrong type.
tensor_metas = st.fixed_dictionaries({}, optional={
    "name": st.just("x") | any_text | json_values,
    "dtype": st.sampled_from([*DTYPES, "float64", "complex64", "", "<f4"]) | json_values,
    "shape": st.lists(st.integers(-3, 2**40) | json_scalars, max_size=10) | json_values,
})
request_like = st.fixed_dictionaries({}, optional={
    "model": st.just("m") | any_text | json_values,
    "inputs": st.lists(tensor_metas | json_values, max_size=4) | json_values,
    "outputs": st.lists(any_text, max_size=3) | json_values,
    "id": json_values, "version": json_values, "key": json_values,
    "timeout_ms": st.integers(-5, 10**400 // 10**390) | json_values,
}).flatmap(lambda h: st.dictionaries(header_keys, json_values, max_size=2).map(lambda extra: {**extra, **h}))


def dumps(value: object) -> bytes:
    """JSON the way a sloppy client might write it (ASCII escapes keep lone surrogates legal)."""
    return json.dumps(value, ensure_ascii=True, allow_nan=True).encode()


def only_protocol_errors(call, *args):
    """Run the decoder; any exception but ProtocolError fails the test."""
    try:
        return call(*args)
    except ProtocolError as exc:
        assert isinstance(exc.status, Status) and exc.message
        return exc


@FAST
@given(st.lists(st.binary(max_size=64), max_size=6))
def test_parse_request_on_arbitrary_frames_raises_only_protocol_errors(frames):
    only_protocol_errors(parse_request, frames)
    request_id(frames)  # must never raise either: the error reply needs it


@FAST
@given(request_like, st.lists(st.binary(max_size=48), max_size=4))
def test_parse_request_on_request_shaped_headers_raises_only_protocol_errors(header, tensors):
    result = only_protocol_errors(parse_request, [dumps(header), *tensors])
    if not isinstance(result, ProtocolError):
        assert result.model == header["model"] and len(result.inputs) == len(tensors)
        assert set(header) <= set(REQUEST_FIELDS)  # whatever else it carried was refused


@FAST
@given(st.binary(max_size=256) | json_values.map(dumps))
def test_parse_header_returns_an_object_or_refuses(raw):
    result = only_protocol_errors(parse_header, raw)
    assert isinstance(result, (dict, ProtocolError))


@pytest.mark.parametrize("depth", [50, 5_000, 30_000])
def test_deeply_nested_header_is_a_400_not_a_recursion_error(depth):
    # Found by the fuzzer: json.loads raised RecursionError, which took the frontend down.
    raw = b'{"model": "m", "x": ' + b"[" * depth + b"]" * depth + b"}"
    result = only_protocol_errors(parse_request, [raw])
    if depth > 1000:
        assert result.status == Status.BAD_REQUEST and "nests too deeply" in result.message


@pytest.mark.parametrize("dtype", [["float32"], {"a": 1}, None, 5])
def test_unhashable_or_odd_dtypes_are_a_400(dtype):
    # Found by the fuzzer: `dtype not in DTYPES` raised TypeError for a list.
    raw = dumps({"model": "m", "inputs": [{"name": "x", "dtype": dtype, "shape": [1]}]})
    result = only_protocol_errors(parse_request, [raw, b"\0" * 4])
    assert result.status == Status.BAD_REQUEST and "dtype" in result.message
    reply = only_protocol_errors(decode_reply, [dumps({"status": 200, "outputs": [
        {"name": "y", "dtype": dtype, "shape": [1]}]}), b"\0" * 4])
    assert isinstance(reply, MalformedReply)


@FAST
@given(st.lists(st.binary(max_size=64), min_size=0, max_size=4))
def test_decode_reply_on_arbitrary_frames_raises_only_protocol_errors(frames):
    result = only_protocol_errors(decode_reply, frames)
    if isinstance(result, ProtocolError):
        assert isinstance(result, MalformedReply) and isinstance(result, ValueError)


@FAST
@given(st.fixed_dictionaries({}, optional={"status": json_values, "outputs": st.lists(
    tensor_metas | json_values, max_size=3) | json_values}), st.lists(st.binary(max_size=32), max_size=3))
def test_decode_reply_on_reply_shaped_headers_raises_only_protocol_errors(header, tensors):
    only_protocol_errors(decode_reply, [dumps(header), *tensors])


@FAST
@given(st.dictionaries(st.text(max_size=12).filter(lambda k: k not in REQUEST_FIELDS), json_values,
                       min_size=1, max_size=3), st.booleans())
def test_any_field_outside_the_protocol_is_refused_and_named(extra, in_an_input):
    x = np.zeros((1, 2), np.float32)
    header = json.loads(encode_request("m", {"x": x}, id=4, timeout_ms=9)[0])
    if in_an_input:
        extra = {k: v for k, v in extra.items() if k not in INPUT_FIELDS}
        assume(extra)
        header["inputs"][0].update(extra)
    else:
        header.update(extra)
    error = only_protocol_errors(parse_request, [dumps(header), x.tobytes()])
    assert isinstance(error, ProtocolError) and error.status == Status.BAD_REQUEST
    assert repr(min(extra))[:40] in error.message and "unknown" in error.message
    assert request_id([dumps(header)]) == 4  # the refusal still reaches a pipelined client


wire_arrays = st.sampled_from(list(DTYPES)).flatmap(
    lambda dt: hnp.arrays(np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)))
names = st.text(st.characters(codec=None), min_size=1, max_size=8)
# The stream keys the daemon takes: printable text (within MAX_KEY_BYTES) or a 64-bit integer.
stream_keys = any_text.filter(str.isprintable) | st.integers(-(2**63), 2**63 - 1)


@FAST
@given(st.dictionaries(names, wire_arrays, min_size=0, max_size=4), any_text.filter(bool),
       st.integers(-(2**63), 2**63) | any_text, any_text, st.integers(1, MAX_TIMEOUT_MS), stream_keys)
def test_valid_requests_round_trip(inputs, model, ident, version, timeout_ms, key):
    frames = [bytes(f) for f in encode_request(model, inputs, id=ident, version=version,
                                               timeout_ms=timeout_ms, key=key)]
    request = parse_request(frames)
    assert (request.model, request.id, request.version, request.timeout_ms, request.key) == \
        (model, ident, version, timeout_ms, key)
    assert list(request.inputs) == list(inputs)
    for name, array in inputs.items():
        got = request.inputs[name]
        assert got.dtype == array.dtype and got.shape == array.shape
        np.testing.assert_array_equal(got, array)
        # the size invariant the decoder enforces: bytes = elements x itemsize
        assert len(frames[1 + list(inputs).index(name)]) == math.prod(array.shape) * array.dtype.itemsize


@FAST
@given(st.dictionaries(names, wire_arrays, min_size=1, max_size=3), st.data())
def test_a_lying_frame_size_is_always_refused(inputs, data):
    frames = [bytes(f) for f in encode_request("m", inputs)]
    index = data.draw(st.integers(1, len(frames) - 1))
    delta = data.draw(st.sampled_from([-1, 1, 7]))
    assume(len(frames[index]) + delta >= 0)
    frames[index] = frames[index][:-1] if delta < 0 else frames[index] + b"\0" * delta
    error = only_protocol_errors(parse_request, frames)
    assert isinstance(error, ProtocolError) and error.status == Status.BAD_REQUEST
    assert "needs" in error.message and "bytes" in error.message


@FAST
@given(st.dictionaries(names, wire_arrays, max_size=3), json_values, st.integers(100, 599))
def test_replies_round_trip_whatever_the_client_sent_as_id(outputs, ident, status):
    # A lone surrogate in an echoed id used to make the encoder raise (found by the fuzzer).
    frames = [bytes(f) for f in encode_reply({"id": ident, "status": status, "model": "m"}, outputs)]
    frames[0].decode("utf-8")  # always valid UTF-8 on the wire
    reply = decode_reply(frames)
    assert reply.status == status
    assert dumps(reply.header["id"]) == dumps(ident)  # via JSON: NaN != NaN
    for name, array in outputs.items():
        np.testing.assert_array_equal(reply.outputs[name], array)
        assert reply.outputs[name].dtype == array.dtype


@FAST
@given(json_values, any_text)
def test_error_replies_always_encode(ident, message):
    header = error_header(Status.BAD_REQUEST, message, ident)
    decoded = decode_reply([bytes(f) for f in encode_reply(header)])
    assert decoded.status == 400 and decoded.error == message


@FAST
@given(st.integers(1, 10), st.integers(1, 4), st.integers(2, 64))
def test_each_limit_is_enforced_and_named(max_rank, max_tensors, max_elements):
    limits = Limits(max_message_bytes=1 << 20, max_header_bytes=4096, max_tensors=max_tensors,
                    max_rank=max_rank, max_elements=max_elements)
    deep = {"x": np.zeros((1,) * (max_rank + 1), np.uint8)}
    many = {f"t{i}": np.zeros(1, np.uint8) for i in range(max_tensors + 1)}
    big = {"x": np.zeros(max_elements + 1, np.uint8)}
    for inputs, name in ((deep, "max_rank"), (many, "max_tensors"), (big, "max_elements")):
        error = only_protocol_errors(parse_request, [bytes(f) for f in encode_request("m", inputs)], limits)
        assert isinstance(error, ProtocolError) and error.status == Status.BAD_REQUEST
        assert name in error.message


@FAST
@given(any_text.filter(lambda t: not t.isprintable()) | st.text(min_size=MAX_KEY_BYTES + 1, max_size=400)
       | st.integers(2**63, 2**80))
def test_a_key_that_is_not_printable_bounded_text_is_a_400_naming_it(key):
    frames = [bytes(f) for f in encode_request("m", {}, key=key)]
    with pytest.raises(ProtocolError) as refused:
        parse_request(frames)
    assert refused.value.status == Status.BAD_REQUEST and "'key'" in refused.value.message
