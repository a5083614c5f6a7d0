"""Low-bit outer-gradient codecs `fp4` and `topk2`: round trips, error bounds, bytes, error feedback, bad input."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from nebula.compress import (CodecError, NonFiniteError, SpecError, decode_encoded, decode_from_frames,
                             encode_to_frames, encoded_to_frames, get_codec, known_codecs, relative_error)
from nebula.compress.lowbit import FP4_LEVELS, fp4_error_bound

SPECS = ["fp4", "fp4(16)", "fp4(block=7)", "fp4(svd(0.5))", "topk2(0.05)", "topk2(0.3)", "topk2(1.0)",
         "ef(fp4)", "ef(topk2(0.05))"]


def _x(shape=(37, 29), seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_registered():
    assert {"fp4", "topk2"} <= set(known_codecs())


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(), (1,), (5,), (37, 29), (2, 3, 65)])
def test_round_trip_shape_dtype_and_exact_bytes(spec, dtype, shape):
    x = _x(shape, dtype=dtype)
    enc = get_codec(spec).encode(x)
    y = decode_encoded(enc)
    assert isinstance(y, np.ndarray) and y.shape == x.shape and y.dtype == x.dtype and np.isfinite(y).all()
    frames = encoded_to_frames(enc)
    assert sum(len(memoryview(f).cast("B")) for f in frames) == enc.nbytes == len(enc.header) + enc.payload_nbytes
    np.testing.assert_array_equal(decode_from_frames(frames), y)
    np.testing.assert_array_equal(decode_from_frames([b"".join(bytes(f) for f in frames)]), y)


@pytest.mark.parametrize("spec", ["fp4", "topk2(0.1)"])
def test_integer_and_empty_tensors_pass_through(spec):
    ids = np.arange(24, dtype=np.int64).reshape(4, 6)
    out = decode_from_frames(encode_to_frames(spec, ids))
    assert out.dtype == np.int64 and (out == ids).all()
    empty = np.zeros((0, 3), np.float32)
    assert decode_from_frames(encode_to_frames(spec, empty)).shape == (0, 3)


@pytest.mark.parametrize("block", [1, 5, 32, 64])
def test_fp4_per_block_error_bound(block):
    rng = np.random.default_rng(block)
    # blocks of very different magnitudes, heavy tails and exact zeros: the scale must be per block
    x = (rng.standard_normal(4000) * np.exp(rng.uniform(-8, 8, 4000)) * (rng.random(4000) > 0.1)).astype(np.float32)
    y = decode_encoded(get_codec(f"fp4({block})").encode(x))
    pad = -x.size % block
    xb = np.concatenate([x, np.zeros(pad, np.float32)]).reshape(-1, block).astype(np.float64)
    yb = np.concatenate([y, np.zeros(pad, np.float32)]).reshape(-1, block).astype(np.float64)
    amax = np.abs(xb).max(axis=1, keepdims=True)
    bound = np.maximum(amax * (1 + 2.0**-8) / 24, np.abs(xb) / 5)
    assert (np.abs(xb - yb) <= bound * (1 + 1e-6)).all()
    assert (np.abs(xb - yb) <= amax / 5 * (1 + 1e-6)).all()  # the block-wide form of the same bound
    assert fp4_error_bound(5.0, 6.0) == pytest.approx(1.0)
    # decoded values are FP4 levels times one scale per block
    s = amax[:, 0] / 6
    for row, sc in zip(yb[:20], s[:20]):
        if sc > 0:
            ratios = np.abs(row) / sc
            assert np.min(np.abs(ratios[:, None] - np.array(FP4_LEVELS)), axis=1).max() < 0.05


def test_fp4_levels_are_exact_and_ties_round_to_even():
    levels = np.array(FP4_LEVELS, np.float32)
    x = np.concatenate([levels, -levels])  # max 6: the scale is exactly 1
    np.testing.assert_array_equal(decode_encoded(get_codec("fp4(16)").encode(x)), x)
    ties = np.array([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
    y = decode_encoded(get_codec("fp4(8)").encode(ties))
    np.testing.assert_array_equal(y, [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0])
    assert (decode_encoded(get_codec("fp4").encode(np.zeros(40, np.float32))) == 0).all()


def test_fp4_bytes_and_error_against_int4_block():
    x = _x((256, 1024), seed=3)
    fp4, int4 = get_codec("fp4").encode(x), get_codec("int4_block").encode(x)
    n = x.size
    assert fp4.payload_nbytes == n // 2 + 2 * (n // 32)  # 4 bits per element + a bf16 scale per 32
    assert fp4.nbytes <= int4.nbytes
    assert get_codec("fp4(64)").encode(x).payload_nbytes == n // 2 + 2 * (n // 64)
    assert relative_error(x, decode_encoded(fp4)) < relative_error(x, decode_encoded(int4))
    assert relative_error(x, decode_encoded(fp4)) < 0.11


@pytest.mark.parametrize("f", [0.001, 0.05, 0.3, 1.0])
def test_topk2_keeps_exactly_k_largest_with_their_signs(f):
    x = _x((64, 100), seed=4)
    n = x.size
    k = max(1, round(f * n))
    y = decode_encoded(get_codec(f"topk2({f})").encode(x)).ravel()
    flat = x.ravel()
    kept = np.flatnonzero(y)
    assert kept.size == k
    assert np.abs(flat[kept]).min() >= np.sort(np.abs(flat))[n - k]  # the k largest magnitudes
    assert (np.sign(y[kept]) == np.sign(flat[kept])).all()
    mags = np.unique(np.abs(y[kept]))
    assert 1 <= mags.size <= 2  # two magnitude buckets per tensor
    assert mags.min() >= np.abs(flat[kept]).min() and mags.max() <= np.abs(flat[kept]).max()


def test_topk2_values_beat_one_scale_and_bytes_beat_topk():
    x = _x((1000, 1000), seed=5)
    enc2, enc1 = get_codec("topk2(0.05)").encode(x), get_codec("topk(0.05)").encode(x)
    y2, y1 = decode_encoded(enc2), decode_encoded(enc1)
    kept = y1 != 0
    assert ((y2 != 0) == kept).all()
    one_scale = np.sign(x[kept]) * np.abs(x[kept]).mean()
    assert relative_error(x[kept], y2[kept]) < relative_error(x[kept], one_scale)
    assert relative_error(x[kept], y2[kept]) < 0.12
    assert enc2.nbytes * 6 < enc1.nbytes  # Elias-Fano indices + 2-bit values vs int32 + float32
    assert enc2.payload_nbytes / (0.05 * x.size) < 1.1  # bytes per kept value: ~0.8 index + 0.25 value


@pytest.mark.parametrize("spec", ["ef(fp4)", "ef(topk2(0.05))"])
def test_error_feedback_makes_the_running_sum_track_the_inputs(spec):
    rng = np.random.default_rng(6)
    codec = get_codec(spec)
    plain = get_codec(spec[3:-1])
    sent = np.zeros((32, 64)), np.zeros((32, 64))
    total = np.zeros((32, 64))
    for step in range(60):
        g = (rng.standard_normal((32, 64)) * 0.1 + 0.02).astype(np.float32)  # a bias every step, as gradients have
        total += g
        sent[0][...] += decode_encoded(codec.encode(g))
        sent[1][...] += decode_encoded(plain.encode(g))
        # with feedback, what was sent differs from what was given by exactly the carried residual
        np.testing.assert_allclose(sent[0] + codec.residual(g.shape), total, atol=1e-4)
    assert relative_error(total, sent[0]) < 0.5 * relative_error(total, sent[1])
    assert relative_error(total, sent[0]) < (0.05 if "fp4" in spec else 0.3)


@pytest.mark.parametrize("spec,match", [
    ("fp4(0)", "block"), ("fp4(block=2.5)", "block"), ("fp4(bogus=3)", "unknown argument"),
    ("fp4(1, 2)", "too many"), ("fp4(fp16, int8)", "at most one"), ("topk2", "needs the fraction"),
    ("topk2(0)", "topk2"), ("topk2(1.5)", "topk2"), ("topk2(-0.1)", "topk2"), ("topk2(0.1, 0.2)", "too many"),
    ("topk2(f=0.1, block=64)", "unknown argument")])
def test_bad_specs_get_one_line_errors(spec, match):
    with pytest.raises(SpecError, match=match) as info:
        get_codec(spec)
    assert "\n" not in str(info.value) and "usage" in str(info.value)


@pytest.mark.parametrize("spec", ["fp4", "fp4(4)", "topk2(0.2)", "ef(topk2(0.2))", "ef(fp4)"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_are_refused(spec, bad):
    x = _x((10, 10))
    x[3, 4] = bad
    with pytest.raises(NonFiniteError):
        get_codec(spec).encode(x)
    with pytest.raises(NonFiniteError):
        get_codec(spec).encode(paddle.to_tensor(x))


def test_fp4_scale_overflow_is_an_error():
    with pytest.raises(CodecError, match="scale range"):
        get_codec("fp4").encode(np.array([1e300, 1.0]))


def test_spec_strings_are_canonical():
    for spec in ("fp4", "fp4(64)", "fp4(svd(0.5), block=8)", "topk2(0.05)", "ef(topk2(0.05))", "ef(fp4(16))"):
        codec = get_codec(spec)
        assert get_codec(codec.spec).spec == codec.spec
    assert get_codec("fp4").spec == "fp4(32)"


def test_corrupted_frames_are_refused():
    enc = get_codec("topk2(0.1)").encode(_x())
    enc.meta["k"] += 1
    with pytest.raises(CodecError, match="corrupted"):
        decode_encoded(enc)
    enc = get_codec("fp4").encode(_x())
    enc.meta["block"] = 7
    with pytest.raises(CodecError, match="malformed"):
        decode_encoded(enc)


@pytest.mark.parametrize("spec", ["fp4", "fp4(7)", "topk2(0.05)", "topk2(1.0)"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_paddle_tensor_gives_the_same_payload_bytes_as_numpy(spec, dtype):
    a = _x((33, 47), seed=7)
    if dtype in ("float16", "bfloat16"):
        # distinct magnitudes that both 16-bit formats hold exactly: top-k has no ties to break differently
        mags = np.arange(0x3F80, 0x3F80 + a.size, dtype=np.uint32).__lshift__(16).view(np.float32)
        a = (np.random.default_rng(8).permutation(mags) * np.sign(a.ravel())).reshape(a.shape)
    t = paddle.cast(paddle.to_tensor(a), dtype)
    ref_in = paddle.cast(t, "float64" if dtype == "float64" else "float32").numpy()
    enc_pd = get_codec(spec).encode(t)
    enc_np = get_codec(spec).encode(ref_in)
    assert all(isinstance(leaf, paddle.Tensor) for leaf in enc_pd.leaves())  # encoded with paddle ops
    assert enc_pd.payload_nbytes == enc_np.payload_nbytes
    for p, q in zip(enc_pd.leaves(), enc_np.leaves()):
        pb = p.numpy().view(np.uint16) if p.dtype == paddle.bfloat16 else p.numpy()
        np.testing.assert_array_equal(pb, q)
    y = decode_encoded(enc_pd)
    assert isinstance(y, paddle.Tensor) and y.dtype == t.dtype and list(y.shape) == list(t.shape)
    ref = paddle.cast(paddle.to_tensor(decode_encoded(enc_np)), dtype)  # the numpy decode, rounded to the input's dtype
    np.testing.assert_array_equal(paddle.cast(y, "float64").numpy(), paddle.cast(ref, "float64").numpy())
    # either side decodes the other's frames
    as_pd = decode_from_frames(encode_to_frames(spec, ref_in), like="paddle")
    np.testing.assert_array_equal(as_pd.numpy(), decode_encoded(enc_np))
    as_np = decode_from_frames(encoded_to_frames(enc_pd), like="numpy")
    np.testing.assert_allclose(as_np.astype(np.float64), decode_encoded(enc_np).astype(np.float64), rtol=1e-2)


def test_paddle_error_feedback_keeps_paddle_residuals():
    ef = get_codec("ef(topk2(0.1))")
    x = paddle.to_tensor(_x())
    first = decode_encoded(ef.encode(x))
    r = ef.residual(tuple(x.shape), "float32", "paddle")
    assert isinstance(r, paddle.Tensor)
    np.testing.assert_allclose((first + r).numpy(), x.numpy(), atol=1e-6)
