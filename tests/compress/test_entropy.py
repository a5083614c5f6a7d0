"""`huffman(inner)`: lossless Huffman coding of a codec's integer codes: same decode as the inner codec, fewer
bytes where the codes are skewed, the same wire path, and a hostile header refused in one line, never inflated
past what the tensor can need."""
from __future__ import annotations

import json
import zlib

import numpy as np
import paddle
import pytest

from nebula.compress import (CodecError, FrameError, SpecError, decode_encoded, decode_from_frames,
                             encoded_to_frames, frames_to_encoded, get_codec, known_codecs, relative_error)
from nebula.compress.delta import is_keyed
from nebula.compress.encoded import HEADER_PREFIX, MAGIC
from nebula.compress.entropy import deflate_codes, inflate_codes

INNERS = ["fp4(block=64)", "fp4", "int4_block", "int8", "int8_block", "topk2(0.05)", "lowrank(rank=2)",
          "int2_block", "int3_block"]


def _heavy(shape=(300, 200), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_t(3, shape).astype(np.float32)


def test_registered():
    assert "huffman" in known_codecs()


@pytest.mark.parametrize("inner", INNERS)
@pytest.mark.parametrize("shape", [(), (7,), (300, 200), (2, 3, 65)])
def test_decodes_exactly_what_the_inner_codec_decodes(inner, shape):
    x = _heavy(shape) if shape else np.float32(1.5) * np.ones((), np.float32)
    plain = decode_encoded(get_codec(inner).encode(x))
    enc = get_codec(f"huffman({inner})").encode(x)
    y = decode_encoded(enc)
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_array_equal(y, plain)
    frames = encoded_to_frames(enc)
    assert sum(len(memoryview(f).cast("B")) for f in frames) == enc.nbytes
    np.testing.assert_array_equal(decode_from_frames(frames), plain)
    np.testing.assert_array_equal(decode_from_frames([b"".join(bytes(f) for f in frames)]), plain)


@pytest.mark.parametrize("inner, at_most", [("int4_block", 0.85), ("int8", 0.5), ("fp4(block=64)", 0.97),
                                             ("int3_block", 0.4)])
def test_skewed_codes_cost_fewer_bytes(inner, at_most):
    x = _heavy((1000, 400))
    plain = get_codec(inner).encode(x).nbytes
    coded = get_codec(f"huffman({inner})").encode(x).nbytes
    assert coded <= at_most * plain, (inner, coded / plain)


def test_three_bit_codes_huffman_coded_beat_two_bit_codes_on_delta_like_data():
    # deltas cluster at zero (Laplace-like): 7 levels with a zero, Huffman-coded, cost about int2_block's bytes at
    # well under half its error (int2_block has no zero level)
    x = np.random.default_rng(3).laplace(size=200_000).astype(np.float32)
    int2 = get_codec("int2_block").encode(x)
    int3 = get_codec("huffman(int3_block)").encode(x)
    assert int3.nbytes / x.size < 0.33 and int3.nbytes < 1.05 * int2.nbytes
    assert relative_error(x, decode_encoded(int3)) < 0.5 * relative_error(x, decode_encoded(int2))


def test_a_part_that_would_not_shrink_goes_as_it_was():
    # uniform bytes do not compress: int8 codes of uniform data spread over the whole grid
    x = np.random.default_rng(1).uniform(-1, 1, 50_000).astype(np.float32)
    plain = get_codec("int8").encode(x)
    enc = get_codec("huffman(int8)").encode(x)
    assert enc.meta["huffman"] == []  # nothing coded
    assert enc.payload_nbytes == plain.payload_nbytes
    np.testing.assert_array_equal(decode_encoded(enc), decode_encoded(plain))


def test_paddle_tensors_round_trip_on_their_device():
    x = paddle.to_tensor(_heavy((64, 96)))
    enc = get_codec("huffman(fp4(block=64))").encode(x)
    assert enc.meta["huffman"]  # the codes were coded
    y = decode_encoded(enc)
    assert isinstance(y, paddle.Tensor) and y.shape == [64, 96]
    plain = decode_encoded(get_codec("fp4(block=64)").encode(x))
    np.testing.assert_array_equal(y.numpy(), plain.numpy())
    z = decode_from_frames(encoded_to_frames(enc), like="paddle")
    np.testing.assert_array_equal(z.numpy(), plain.numpy())


def test_error_feedback_around_it_tracks_the_sum_and_keeps_its_state():
    rng = np.random.default_rng(3)
    xs = [rng.standard_t(3, 5000).astype(np.float32) for _ in range(30)]
    a, b = get_codec("ef(huffman(fp4))"), get_codec("ef(fp4)")
    sa = sum(decode_encoded(a.encode(x)).astype(np.float64) for x in xs)
    sb = sum(decode_encoded(b.encode(x)).astype(np.float64) for x in xs)
    np.testing.assert_array_equal(sa, sb)  # lossless: the same residuals, the same sums
    state = a.export_state()
    assert state and all(k.startswith("residual:") for k in state)
    c = get_codec("ef(huffman(fp4))")
    c.import_state(state)
    x = xs[0]
    np.testing.assert_array_equal(decode_encoded(c.encode(x)), decode_encoded(a.encode(x)))


@pytest.mark.parametrize("spec, says", [
    ("huffman", "needs the codec whose codes it entropy-codes"),
    ("huffman(fp4, 3)", "usage"),
    ("fp16(huffman(int8))", "must be the outermost codec"),
    ("huffman(huffman(int8))", "must be the outermost codec"),
    ("huffman(delta(int2_block))", "a keyed codec goes outside"),
])
def test_bad_specs_are_refused_in_one_line(spec, says):
    with pytest.raises(SpecError, match=says) as e:
        get_codec(spec)
    assert "\n" not in str(e.value)


def test_activation_deltas_can_huffman_code_their_deltas():
    codec = get_codec("delta(huffman(int2_block), first=int4_block)")
    assert is_keyed(codec)
    rng = np.random.default_rng(5)
    x = rng.standard_t(3, (8, 256)).astype(np.float32)
    ids = np.arange(8)
    peer = get_codec("delta(huffman(int2_block), first=int4_block)")
    first = codec.encode_keyed(x, ids)
    np.testing.assert_array_equal(peer.decode(first), decode_encoded(get_codec("int4_block").encode(x)))
    second = codec.encode_keyed(x + 0.01 * rng.standard_normal(x.shape).astype(np.float32), ids)
    assert peer.decode(second).shape == x.shape


# -- hostile frames ---------------------------------------------------------------------------------------------


def _frames_with(meta_fn=None, payload_fn=None) -> list[bytes]:
    """Frames of huffman(int4_block) for a skewed tensor, the header's huffman list and the coded payload changed."""
    enc = get_codec("huffman(int4_block)").encode(_heavy((100, 100)))
    frames = [bytes(f) for f in encoded_to_frames(enc)]
    magic, n = HEADER_PREFIX.unpack(frames[0][:HEADER_PREFIX.size])
    doc = json.loads(frames[0][HEADER_PREFIX.size:])
    if meta_fn:
        doc["tree"]["m"]["huffman"] = meta_fn(doc["tree"]["m"]["huffman"])
    coded = doc["tree"]["m"]["huffman"][0][0] if doc["tree"]["m"]["huffman"] else 0
    payloads = frames[1:]
    if payload_fn:
        payloads[coded] = payload_fn(payloads[coded])
        _set_payload_len(doc["tree"], coded, len(payloads[coded]))
    body = json.dumps(doc).encode()
    return [HEADER_PREFIX.pack(MAGIC, len(body)) + body, *payloads]


def _set_payload_len(node: dict, index: int, length: int, seen: list | None = None) -> None:
    seen = [0] if seen is None else seen
    for _, desc in node["p"]:
        if "a" in desc:
            if seen[0] == index:
                desc["s"] = [length]
            seen[0] += 1
        else:
            _set_payload_len(desc, index, length, seen)


@pytest.mark.parametrize("meta_fn, payload_fn, says", [
    (None, lambda p: p[: len(p) // 2], "no end"),
    (None, lambda p: p + b"\x00" * 9, "after its end"),
    (None, lambda p: bytes(b ^ 0x5A for b in p), "corrupted"),
    (lambda m: [[m[0][0], m[0][1], [m[0][2][0] - 1]]], None, "more than"),
    (lambda m: [[m[0][0], m[0][1], [m[0][2][0] + 1]]], None, "not the"),
    (lambda m: [[m[0][0], m[0][1], [10**9]]], None, "more bytes than a tensor of shape"),
    (lambda m: m + m, None, "unique"),
    (lambda m: [[99, "uint8", [10]]], None, "name no payload"),
    (lambda m: [[0, "float32", [10]]], None, "integer dtype"),
    (lambda m: "all", None, "malformed encoding"),
])
def test_hostile_headers_and_payloads_are_refused_in_one_line(meta_fn, payload_fn, says):
    frames = _frames_with(meta_fn, payload_fn)
    with pytest.raises((CodecError, FrameError)) as e:
        decode_from_frames(frames)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_an_inner_tree_of_another_shape_than_the_node_is_refused():
    enc = get_codec("huffman(int4_block)").encode(_heavy((100, 100)))
    frames = [bytes(f) for f in encoded_to_frames(enc)]
    doc = json.loads(frames[0][HEADER_PREFIX.size:])
    doc["tree"]["p"][0][1]["s"] = [10000, 10000]  # the inner claims a far larger tensor than the node
    body = json.dumps(doc).encode()
    with pytest.raises(CodecError, match="inner tree decodes to shape") as e:
        decode_from_frames([HEADER_PREFIX.pack(MAGIC, len(body)) + body, *frames[1:]])
    assert "\n" not in str(e.value)


def test_a_decompression_bomb_is_never_inflated_past_the_declared_size():
    bomb = deflate_codes(b"\x00" * (16 << 20))  # Huffman-only: a bit per zero byte, 2 MiB
    with pytest.raises(CodecError, match="more than 1000 bytes"):
        inflate_codes(bomb, 1000, "test")
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    tiny = z.compress(b"\x00" * (64 << 20)) + z.flush()  # with matches: 64 MiB in about 64 KiB
    with pytest.raises(CodecError, match="more than 4096 bytes"):
        inflate_codes(tiny, 4096, "test")


def test_frames_declare_the_coded_bytes_not_the_raw_ones():
    enc = get_codec("huffman(int4_block)").encode(_heavy((200, 200)))
    parsed = frames_to_encoded(encoded_to_frames(enc))
    coded = parsed.parts["codes"].parts["q"]
    assert coded.dtype == np.uint8 and coded.size < 200 * 200 // 2
