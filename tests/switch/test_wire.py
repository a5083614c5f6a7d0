"""Frame format: round trips, every malformed header refused with a reason code, and fuzzing of the parser."""
from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nebula.wire import (
    HEADER_BYTES,
    ChannelKey,
    FrameType,
    Lane,
    WireError,
    decode_frame,
    encode_frame,
    lane_of,
    relink,
    unpack_header,
)

KEY = ChannelKey("job1", "acct", "A", 3, "B", 7, "act")


def data_frame(payload: bytes = b"hello", **kw) -> bytes:
    return encode_frame(FrameType.DATA, KEY.to_meta(), payload, lane=Lane.GRADIENT, channel_id=KEY.id, seq=9, **kw)


def test_round_trip_split_and_contiguous():
    head = data_frame(b"xyz")
    for f in (decode_frame(head, b"xyz"), decode_frame(head + b"xyz")):
        assert f.type == FrameType.DATA and f.header.lane == Lane.GRADIENT and f.header.seq == 9
        assert bytes(f.payload) == b"xyz" and f.key() == KEY


def test_relink_changes_only_link_sequence():
    head = data_frame()
    f = decode_frame(relink(head, 12345), b"hello")
    assert f.header.link_seq == 12345 and f.header.seq == 9 and f.key() == KEY


@pytest.mark.parametrize(
    "mutate, code",
    [
        (lambda b: b"GET / HTTP/1.1\r\n" + b[16:], "bad_magic"),
        (lambda b: b[:2] + bytes([9]) + b[3:], "bad_version"),
        (lambda b: b[:3] + bytes([99]) + b[4:], "bad_type"),
        (lambda b: b[:4] + bytes([7]) + b[5:], "bad_lane"),
        (lambda b: b[:5] + bytes([1]) + b[6:], "bad_flags"),
        (lambda b: b[:10], "truncated"),
    ],
)
def test_bad_headers_are_named(mutate, code):
    with pytest.raises(WireError) as err:
        decode_frame(mutate(data_frame() + b"hello"))
    assert err.value.code == code and str(err.value)


def test_lengths_are_checked_before_allocation():
    head = bytearray(data_frame())
    struct.pack_into("!I", head, 40, 1 << 30)  # payload_len far above the limit
    with pytest.raises(WireError) as err:
        unpack_header(bytes(head), max_payload_bytes=1 << 20)
    assert err.value.code == "chunk_too_large"
    with pytest.raises(WireError) as err:
        decode_frame(data_frame() + b"hello" + b"junk")
    assert err.value.code == "trailing_bytes"
    with pytest.raises(WireError) as err:
        decode_frame(data_frame(), b"hell")
    assert err.value.code == "truncated"


def test_channel_id_must_match_key_and_meta_is_validated():
    wrong = encode_frame(FrameType.DATA, KEY.to_meta(), b"x", channel_id=KEY.id ^ 1)
    with pytest.raises(WireError, match="channel id"):
        decode_frame(wrong, b"x")
    bad = encode_frame(FrameType.DATA, {**KEY.to_meta(), "dst": ["B", -1]}, b"x", channel_id=KEY.id)
    with pytest.raises(WireError, match="dst"):
        decode_frame(bad, b"x")
    for meta in (b"[1,2]", b"\xff\xfe", b"{not json"):
        with pytest.raises(WireError) as err:
            decode_frame(encode_frame(FrameType.PING, meta))
        assert err.value.code == "bad_meta"
    with pytest.raises(WireError, match="parts"):
        decode_frame(encode_frame(FrameType.DATA, {**KEY.to_meta(), "parts": [1, 1]}, b"xyz", channel_id=KEY.id), b"xyz")


def test_hello_stage_map_is_validated():
    hello = {"job": "j", "rank": 0, "account": "a", "name": "w"}
    ok = decode_frame(encode_frame(FrameType.HELLO, {**hello, "stages": {"enc": "A", "dec": "B"}}))
    assert ok.meta["stages"] == {"enc": "A", "dec": "B"}
    for bad in (["enc", "A"], {"enc": 1}, {"": "A"}, {"enc": "x" * 300}):
        with pytest.raises(WireError, match="HELLO meta 'stages' must map stage names to cluster names"):
            decode_frame(encode_frame(FrameType.HELLO, {**hello, "stages": bad}))


def test_chunk_fields():
    ok = data_frame(b"ab", chunk_index=1, chunk_count=3, total_len=10)
    assert decode_frame(ok, b"ab").header.chunk_index == 1
    for kw in (dict(chunk_index=3, chunk_count=3, total_len=10), dict(chunk_count=0), dict(chunk_count=2, total_len=1)):
        with pytest.raises(WireError):
            decode_frame(data_frame(b"ab", **kw), b"ab")
    assert decode_frame(encode_frame(FrameType.PING, {"t": 1}), b"").type == FrameType.PING
    with pytest.raises(WireError, match="no payload"):
        decode_frame(encode_frame(FrameType.PING, {"t": 1}, b"zz"), b"zz")


def test_lane_names():
    assert lane_of("bulk") == Lane.BULK and lane_of(0) == Lane.CONTROL
    with pytest.raises(ValueError, match="control, activation, gradient, bulk"):
        lane_of("fast")


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=0, max_size=400))
def test_fuzz_random_bytes_never_crash(buf):
    try:
        f = decode_frame(buf)
    except WireError as exc:
        assert exc.code and exc.message
    else:
        assert len(buf) == HEADER_BYTES + f.header.meta_len + f.header.payload_len


VALID = [data_frame() + b"hello", encode_frame(FrameType.ACK, {**KEY.to_meta(), "consumed": 3}, channel_id=KEY.id),
         encode_frame(FrameType.HELLO, {"job": "j", "rank": 0, "account": "a", "name": "w"}),
         encode_frame(FrameType.ERROR, {"code": "x", "message": "y", "channel": KEY.to_meta()})]


@settings(max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID), st.lists(st.tuples(st.integers(0, 500), st.integers(0, 255)), max_size=6),
       st.integers(0, 600))
def test_fuzz_mutated_valid_frames(frame, flips, cut):
    buf = bytearray(frame)
    for pos, val in flips:
        if pos < len(buf):
            buf[pos] = val
    buf = bytes(buf[: cut if cut < len(buf) else len(buf)])
    try:
        f = decode_frame(buf)
    except WireError as exc:
        assert exc.code
    else:
        if f.type in (FrameType.DATA, FrameType.ACK):
            assert f.header.channel_id == f.key().id  # anything accepted is internally consistent


def _outcome(buf: bytes):
    try:
        f = decode_frame(buf)
    except WireError as exc:
        return exc.code
    return f.header, f.meta, bytes(f.payload), f.key() if f.type in (FrameType.DATA, FrameType.ACK) else None


def test_a_meta_parsed_before_is_still_checked_against_each_new_header():
    """DATA and ACK metas are parsed once per distinct meta (nebula.wire.meta keeps them); a repeat of the same meta
    bytes under another header still gets every check that involves the header."""
    meta = KEY.to_meta()
    assert decode_frame(data_frame(b"x"), b"x").key() == KEY  # (now kept)
    with pytest.raises(WireError) as err:
        decode_frame(encode_frame(FrameType.DATA, meta, b"x", channel_id=KEY.id ^ 1), b"x")
    assert err.value.code == "bad_channel"
    ack = {**meta, "consumed": 2}
    assert decode_frame(encode_frame(FrameType.ACK, ack, channel_id=KEY.id, seq=5)).meta["consumed"] == 2
    with pytest.raises(WireError, match="cannot consume more than it has"):
        decode_frame(encode_frame(FrameType.ACK, ack, channel_id=KEY.id, seq=1))
    parts = {**meta, "parts": [1, 2]}
    assert decode_frame(encode_frame(FrameType.DATA, parts, b"xyz", channel_id=KEY.id), b"xyz").meta["parts"] == [1, 2]
    for kw in (dict(chunk_index=1, chunk_count=2, total_len=6), dict(chunk_count=2, total_len=4)):
        with pytest.raises(WireError, match="parts"):
            decode_frame(encode_frame(FrameType.DATA, parts, b"xyz", channel_id=KEY.id, **kw), b"xyz")


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID + [encode_frame(FrameType.ACK, {**KEY.to_meta(), "consumed": 3}, channel_id=KEY.id,
                                             seq=4)]),
       st.lists(st.tuples(st.integers(0, 300), st.integers(0, 255)), max_size=4), st.integers(0, 600))
def test_fuzz_a_kept_meta_decodes_as_a_fresh_one(frame, flips, cut):
    """Whatever the bytes, a frame decodes the same (or is refused with the same code) whether its meta was parsed
    before or not."""
    from nebula.wire import meta as meta_mod

    buf = bytearray(frame)
    for pos, val in flips:
        if pos < len(buf):
            buf[pos] = val
    buf = bytes(buf[: cut if cut < len(buf) else len(buf)])
    meta_mod._cache.clear()
    cold = _outcome(buf)
    assert _outcome(buf) == cold
    for other in VALID:  # a kept meta under the original header, then the mutated one again
        _outcome(other)
    assert _outcome(buf) == cold
