"""paddle.Tensor inputs stay paddle on their device; wire frames parse strictly; CompressionConfig validates."""
from __future__ import annotations

import struct

import numpy as np
import paddle
import pytest

from nebula.compress import (FrameError, NonFiniteError, decode_encoded, decode_from_frames,
                             encode_to_frames, encoded_to_frames, get_codec, relative_error)
from nebula.config.job import CompressionConfig
from nebula.config.schema import ConfigError, from_dict


PADDLE_CODECS = ["none", "fp16", "bf16", "int8", "int8_row", "int8_block(16)", "int4_block(16)", "int3_block(16)", "svd(0.5)",
                 "svd(1.0)", "fp16(svd(0.6))", "lowrank(rank=3)", "lowrank(energy=0.9)", "int8_row(lowrank(rank=3))",
                 "topk(0.2)", "fp16(topk(0.2))", "ef(int8)", "auto(0.05)"]


def _x(dtype="float32", shape=(4, 6, 10)):
    rng = np.random.default_rng(0)
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("spec", PADDLE_CODECS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_paddle_round_trip_matches_numpy_and_stays_paddle(spec, dtype):
    a = _x()
    t = paddle.cast(paddle.to_tensor(a), dtype)
    enc = get_codec(spec).encode(t)
    assert all(isinstance(leaf, paddle.Tensor) for leaf in enc.leaves())  # no host copy while encoding
    y = decode_encoded(enc)
    assert isinstance(y, paddle.Tensor) and y.dtype == t.dtype and list(y.shape) == list(t.shape)
    assert y.place.is_cpu_place() == t.place.is_cpu_place()
    frames = encoded_to_frames(enc)
    assert sum(len(memoryview(f).cast("B")) for f in frames) == enc.nbytes
    z = decode_from_frames(frames)  # the sender's kind: paddle
    assert isinstance(z, paddle.Tensor) and z.dtype == t.dtype
    np.testing.assert_array_equal(paddle.cast(z, "float32").numpy(), paddle.cast(y, "float32").numpy())
    as_numpy = decode_from_frames(frames, like="numpy")
    assert isinstance(as_numpy, np.ndarray)
    assert as_numpy.dtype == (np.float32 if dtype == "bfloat16" else np.dtype(dtype))
    ref = get_codec(spec).encode(paddle.cast(t, "float32").numpy())
    assert relative_error(paddle.cast(t, "float32").numpy(), decode_encoded(ref)) == pytest.approx(
        relative_error(paddle.cast(t, "float32").numpy(), paddle.cast(y, "float32").numpy()), rel=0.05, abs=2e-3)


@pytest.mark.parametrize("spec", ["int8", "int8_block(8)", "int4_block(8)", "fp16"])
def test_paddle_and_numpy_quantizers_agree(spec):
    a = _x()
    y_np = decode_encoded(get_codec(spec).encode(a))
    y_pd = decode_encoded(get_codec(spec).encode(paddle.to_tensor(a))).numpy()
    scale = np.abs(a).max()
    # rounding differs only at exact .5 ties (half-even vs half-away), at most one quantization step
    assert np.abs(y_np - y_pd).max() <= scale / (7 if "int4" in spec else 127) + 1e-6


def test_numpy_frames_decode_into_paddle_and_back():
    a = _x()
    for spec in ("bf16", "int4_block", "fp16(svd(0.6))", "topk(0.1)"):
        frames = encode_to_frames(spec, a)
        t = decode_from_frames(frames, like="paddle")
        assert isinstance(t, paddle.Tensor) and t.dtype == paddle.float32
        np.testing.assert_allclose(t.numpy(), decode_from_frames(frames), rtol=1e-5, atol=1e-6)


def test_paddle_integer_tensors_and_nan():
    ids = paddle.to_tensor(np.arange(24).reshape(4, 6), dtype="int64")
    out = decode_from_frames(encode_to_frames("int8(svd(0.5))", ids))
    assert out.dtype == paddle.int64 and bool(paddle.equal_all(out, ids))
    bad = paddle.to_tensor(np.array([1.0, np.nan], np.float32))
    with pytest.raises(NonFiniteError):
        get_codec("int8_row").encode(bad)


def test_paddle_non_contiguous_view_is_encoded_as_its_values():
    t = paddle.to_tensor(_x(shape=(8, 12))).transpose([1, 0])
    y = decode_from_frames(encode_to_frames("none", t))
    np.testing.assert_array_equal(y.numpy(), t.numpy())


def test_paddle_error_feedback_keeps_the_residual_on_device():
    ef = get_codec("ef(topk(0.1))")
    t = paddle.to_tensor(_x())
    ef.encode(t)
    r = ef.residual(tuple(t.shape), "float32", "paddle")
    assert isinstance(r, paddle.Tensor)


# --- frames -----------------------------------------------------------------------------------------------------

def _frames():
    return [bytes(f) for f in encode_to_frames("int8_block(8)", _x())]


def test_frames_accept_one_joined_buffer_and_bytearrays():
    frames = _frames()
    ref = decode_from_frames(frames)
    np.testing.assert_array_equal(decode_from_frames([b"".join(frames)]), ref)
    np.testing.assert_array_equal(decode_from_frames(b"".join(frames)), ref)
    np.testing.assert_array_equal(decode_from_frames([bytearray(f) for f in frames]), ref)
    np.testing.assert_array_equal(decode_from_frames([frames[0], b"".join(frames[1:])]), ref)
    assert decode_from_frames(frames).flags.writeable


@pytest.mark.parametrize("mangle,match", [
    (lambda f: [], "no frames"),
    (lambda f: [b"NB"], "shorter"),
    (lambda f: [b"XXXX" + f[0][4:]] + f[1:], "bad magic"),
    (lambda f: [f[0][:20]] + f[1:], "truncated"),
    (lambda f: [f[0]] + f[1:-1], "payload is"),
    (lambda f: [f[0]] + f[1:] + [b"x"], "payload is"),
    (lambda f: [struct.pack("<4sI", b"NBC1", 5) + b"{oops"], "not valid JSON"),
    (lambda f: [struct.pack("<4sI", b"NBC1", 2) + b"[]"], "version"),
    (lambda f: [f[0].replace(b'"int8"', b'"int9"')] + f[1:], "dtype"),
    (lambda f: [f[0].replace(b'"block":8', b'"block":0')] + f[1:], "malformed"),
    (lambda f: [f[0].replace(b'"c":"int8_block(8)"', b'"c":"zip(8)       "')] + f[1:], "unknown codec"),
])
def test_malformed_frames_get_clear_errors(mangle, match):
    with pytest.raises(ValueError, match=match):
        decode_from_frames(mangle(_frames()))


def test_frame_error_is_a_value_error():
    assert issubclass(FrameError, ValueError)


def test_frames_declaring_a_huge_tensor_are_refused_before_allocating():
    frames = encode_to_frames("topk(0.5)", _x())
    header = bytes(frames[0]).replace(b'"s":[4,6,10],"p"', b'"s":[400000,600000,1000000],"p"')
    fixed = struct.pack("<4sI", b"NBC1", len(header) - 8) + header[8:]
    with pytest.raises(FrameError, match="max_bytes"):
        decode_from_frames([fixed] + list(frames[1:]))


# --- config -----------------------------------------------------------------------------------------------------

def test_compression_config_validates_and_selects_by_step():
    cfg = CompressionConfig(forward="fp16(svd(0.6))", backward="int8", start_step=2000)
    assert cfg.spec_at("forward", 1999) == "none" and cfg.spec_at("forward", 2000) == "fp16(svd(0.6))"
    assert cfg.spec_at("backward", 5000) == "int8"
    assert CompressionConfig() == CompressionConfig(forward="none", backward="none", start_step=0)
    with pytest.raises(ValueError, match="forward='fp8' is not a valid codec spec: .*known codecs"):
        CompressionConfig(forward="fp8")
    with pytest.raises(ValueError, match="start_step"):
        CompressionConfig(start_step=-1)
    with pytest.raises(ValueError, match="direction"):
        cfg.spec_at("sideways", 0)
    with pytest.raises(AttributeError):
        cfg.forward = "none"


def test_compression_config_loads_from_a_mapping_with_path_errors():
    cfg = from_dict(CompressionConfig, {"forward": "fp16", "backward": "ef(int8)", "start_step": 10})
    assert cfg.backward == "ef(int8)"
    with pytest.raises(ConfigError, match="svd"):
        from_dict(CompressionConfig, {"forward": "svd(2)"}, "job.compression")
    with pytest.raises(ConfigError, match="unknown key"):
        from_dict(CompressionConfig, {"fwd": "fp16"})


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64"])
def test_auto_choosing_none_for_a_narrow_or_wide_float_keeps_its_dtype(dtype):
    t = paddle.cast(paddle.to_tensor(_x()), dtype)
    enc = get_codec("auto(0.05, none)").encode(t)
    for like in ("numpy", "paddle"):
        y = decode_from_frames(encoded_to_frames(enc), like=like)
        ref = paddle.cast(t, "float32").numpy()
        got = paddle.cast(y, "float32").numpy() if like == "paddle" else y
        np.testing.assert_array_equal(np.asarray(got, np.float32), ref)
