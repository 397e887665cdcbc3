"""The frontend's parse cache: a header seen before but for its id is read from its layout, and every
header, seen before or not, parses to exactly what parse_request makes of it, errors included."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infermux.frontend.parsecache import MAX_LAYOUTS, ParseCache
from infermux.pipelines.wire import encode_frame
from infermux.protocol import Limits, ProtocolError, Request, encode_request, parse_request

IMAGE = np.arange(2 * 3, dtype=np.float32).reshape(2, 3)
LIMITS = Limits()


def frames_with_id(ident: object) -> list[bytes]:
    return [bytes(memoryview(f)) for f in encode_request("m", {"x": IMAGE}, id=ident, timeout_ms=50)]


def outcome(parse, frames: list[bytes], limits: Limits = LIMITS) -> tuple:
    """What a parse gives, in a form two parses can be compared by: the request's fields, or the error."""
    try:
        request: Request = parse(frames, limits)
    except ProtocolError as exc:
        return ("error", exc.status, exc.message)
    arrays = {name: (a.dtype.str, a.shape, a.tobytes(), a.flags.writeable) for name, a in request.inputs.items()}
    return (request.model, arrays, request.id, type(request.id), request.version, request.outputs,
            request.timeout_ms, request.key, request.input_regions, request.output_regions, request.described)


def test_a_header_seen_twice_is_read_from_its_layout_after_with_any_plain_id():
    cache = ParseCache()
    for ident in (1, 2, 3, "cam-7", -40, 10**17, "", 0):
        frames = frames_with_id(ident)
        assert outcome(cache.parse, frames) == outcome(parse_request, frames)
    assert cache.hits == 6  # all but the first two: the layout is kept on its second sighting


def test_a_frames_format_and_geometry_stay_on_the_request_whether_parsed_or_read_from_its_layout():
    # A pipeline reads its frame from them (Request.described) instead of parsing the header again.
    pixels = np.zeros((4, 6, 3), np.uint8)
    cache = ParseCache()
    for ident in range(4):
        frames = [bytes(memoryview(f)) for f in encode_frame("ocr", pixels.tobytes(), "bgr", width=6, height=4,
                                                             stride=18, id=ident, key="cam")]
        request = cache.parse(frames, LIMITS)
        assert request.described == {"image": {"format": "bgr", "width": 6, "height": 4, "stride": 18}}
        assert outcome(cache.parse, frames) == outcome(parse_request, frames)
    assert cache.hits >= 2
    plain = cache.parse(frames_with_id(9), LIMITS)
    assert plain.described is None  # a model's tensors say nothing of frames


def test_arrays_from_a_layout_are_views_on_the_frames_not_copies():
    cache = ParseCache()
    for ident in range(3):
        frames = frames_with_id(ident)
        request = cache.parse(frames, LIMITS)
    assert cache.hits == 1
    assert np.shares_memory(request.inputs["x"], np.frombuffer(frames[1], np.uint8))


def test_a_header_whose_id_bytes_are_not_json_is_refused_although_the_rest_matches_a_layout():
    cache = ParseCache()
    for ident in range(3):
        cache.parse(frames_with_id(ident), LIMITS)
    good = frames_with_id(5)
    for broken in (b'"id":', b'"id":-', b'"id":5.', b'"id":05', b'"id":"5', b'"id":5 5'):
        frames = [good[0].replace(b'"id":5', broken), good[1]]
        assert frames[0] != good[0]
        assert outcome(cache.parse, frames)[0] == "error", broken
        assert outcome(cache.parse, frames) == outcome(parse_request, frames)


@pytest.mark.parametrize("header", [
    b'{"id":1,"model":"m","inputs":[{"name":"x","dtype":"float32","shape":[2,3]}],"id":%s}',  # the last one counts
    b'{"model":"m","inputs":[{"name":"x","dtype":"float32","shape":[2,3]}],"id": %s}',
    b'{"model":"m","inputs":[{"name":"x","dtype":"float32","shape":[2,3]}],"\\u0069d":%s}',
], ids=["a second id", "a space before the id", "an escaped key"])
def test_headers_whose_first_id_is_not_simply_the_id_parse_as_parse_request_parses_them(header):
    cache = ParseCache()
    for ident in (b"1", b"2", b"3", b'"a"', b"4"):
        frames = [header.replace(b"%s", ident), IMAGE.tobytes()]
        assert outcome(cache.parse, frames) == outcome(parse_request, frames)


def test_a_header_with_the_same_id_twice_is_not_kept_as_a_layout():
    header = b'{"id":%s,"model":"m","inputs":[{"name":"x","dtype":"float32","shape":[2,3]}],"id":5}'
    cache = ParseCache()
    for ident in (b"5", b"5", b"5", b"6", b"7"):
        frames = [header.replace(b"%s", ident), IMAGE.tobytes()]
        assert outcome(cache.parse, frames) == outcome(parse_request, frames)
        assert cache.parse(frames, LIMITS).id == 5
    assert cache.hits == 0


def test_frames_that_do_not_fit_the_layout_get_parse_requests_error():
    cache = ParseCache()
    for ident in range(3):
        cache.parse(frames_with_id(ident), LIMITS)
    header = frames_with_id(9)[0]
    for frames in ([header], [header, b"\0" * 4], [header, IMAGE.tobytes(), b"extra"]):
        assert outcome(cache.parse, frames)[0] == "error"
        assert outcome(cache.parse, frames) == outcome(parse_request, frames)


def test_new_limits_apply_to_headers_whose_layout_was_kept_under_the_old():
    cache = ParseCache()
    for ident in range(3):
        cache.parse(frames_with_id(ident), LIMITS)
    small = Limits(max_message_bytes=40)
    frames = frames_with_id(4)
    assert outcome(cache.parse, frames, small) == outcome(parse_request, frames, small)
    assert outcome(cache.parse, frames, small)[0] == "error"


def test_the_tables_stay_bounded_whatever_headers_arrive():
    cache = ParseCache()
    for n in range(3 * MAX_LAYOUTS):
        frames = [bytes(memoryview(f)) for f in encode_request(f"m{n}", {"x": IMAGE}, id=n)]
        for _ in range(2):
            cache.parse(frames, LIMITS)
    assert len(cache._layouts) <= MAX_LAYOUTS and len(cache._seen) <= MAX_LAYOUTS


# Headers as clients write them: fields in any order, an id token of any kind in one place or two.
ID_TOKENS = st.sampled_from([b"0", b"7", b"-3", b"123456789012345678", b"1234567890123456789", b'"a"', b'""',
                             b'"cam 1"', b"1.5", b"1e3", b"true", b"null", b'"\\u0041"', b'"a\\"b"', b"[]", b"{}",
                             b"01", b"-", b"", b" 7", b"7 ", b'"', b'"\xc3\xa9"', b'"\xff"'])
FIELDS = st.fixed_dictionaries({"model": st.sampled_from(["m", "", 5])}, optional={
    "version": st.sampled_from(["1", 2, None, [1]]),
    "timeout_ms": st.sampled_from([1, 0, 50, "5"]),
    "key": st.sampled_from(["cam", 3, True]),
    "outputs": st.sampled_from([["y"], [], "y"]),
    "extra": st.just(1),
})


@st.composite
def layouts(draw) -> bytes:
    """A header's bytes with `%s` where an id goes, and `%t` where a second id goes (if any)."""
    fields = draw(FIELDS)
    fields["inputs"] = [{"name": "x", "dtype": draw(st.sampled_from(["float32", "uint8", "complex"])),
                         "shape": draw(st.sampled_from([[2, 3], [6], [3, 8], [-1]]))}]
    parts = [json.dumps({k: v}, separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))[1:-1].encode()
             for k, v in draw(st.permutations(list(fields.items())))]
    for place in (b"%s", b"%t")[:draw(st.integers(1, 2))]:
        parts.insert(draw(st.integers(0, len(parts))), b'"id":' + place)
    return b"{" + b",".join(parts) + b"}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts(), st.lists(st.tuples(ID_TOKENS, st.sampled_from([b"5", b"7"])), min_size=2, max_size=8),
       st.sampled_from([IMAGE.tobytes(), b"\0" * 24, b"\0" * 6, b""]))
def test_any_sequence_of_headers_parses_as_parse_request_parses_each(layout, tokens, tensor):
    cache = ParseCache()
    for first, second in tokens + tokens:
        frames = [layout.replace(b"%s", first).replace(b"%t", second), tensor]
        assert outcome(cache.parse, frames) == outcome(parse_request, frames)


def test_a_header_with_a_replaced_count_is_never_read_from_a_layout():
    cache = ParseCache()
    for ident in range(4):  # the same bytes but the id: a layout would drop the counts
        frames = [bytes(memoryview(f)) for f in encode_request("m", {"x": IMAGE}, id=ident, key="cam", replaced=2)]
        assert cache.parse(frames, LIMITS).replaced == 2
    assert cache.hits == 0
