"""Round trips, error bounds, byte accounting and bad input for every codec on numpy arrays."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from nebula.compress import (CodecError, NonFiniteError, SpecError, decode_encoded, decode_from_frames, encode_to_frames, encoded_to_frames,
                             get_codec, known_codecs, relative_error)

EVERY_CODEC = ["none", "fp16", "bf16", "int8", "int8_row", "int8_block", "int8_block(7)", "int4_block",
               "int4_block(5)", "int3_block", "int3_block(9)", "svd(0.5)", "svd(1.0)", "fp16(svd(0.6))", "int8(svd(0.3))", "lowrank(rank=2)",
               "lowrank(ratio=0.5)", "lowrank(energy=0.9)", "int8_row(lowrank(rank=3))", "topk(0.25)",
               "fp16(topk(0.5))", "ef(int8)", "ef(topk(0.1))", "auto(0.05)", "auto(0.5, fp16, int8, mbit=1)"]

FLOATS = st.sampled_from([np.float16, np.float32, np.float64])
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=9)


def arrays(dtype=FLOATS, shape=SHAPES):
    """Finite float arrays whose values FP16 can hold."""
    return dtype.flatmap(lambda dt: hnp.arrays(dt, shape, elements=st.floats(
        -1000, 1000, width=np.dtype(dt).itemsize * 8, allow_subnormal=False).map(lambda v: 0.0 if abs(v) < 1e-20 else v)))


def frames_len(frames) -> int:
    return sum(len(memoryview(f).cast("B")) for f in frames)


@pytest.mark.parametrize("spec", EVERY_CODEC)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=arrays())
def test_round_trip_keeps_kind_shape_dtype_and_counts_bytes(spec, x):
    codec = get_codec(spec)
    enc = codec.encode(x)
    y = codec.decode(enc)
    assert isinstance(y, np.ndarray) and y.shape == x.shape and y.dtype == x.dtype
    frames = encoded_to_frames(enc)
    assert frames_len(frames) == enc.nbytes == len(enc.header) + enc.payload_nbytes
    z = decode_from_frames(frames)
    np.testing.assert_array_equal(z, y)
    joined = decode_from_frames([b"".join(bytes(f) for f in frames)])
    np.testing.assert_array_equal(joined, y)
    assert np.isfinite(y).all()
    fresh = encode_to_frames(spec, x)
    assert decode_from_frames(fresh).shape == x.shape


def _blocks(a: np.ndarray, block: int) -> np.ndarray:
    flat = a.astype(np.float64).ravel()
    pad = (-flat.size) % block
    return np.concatenate([flat, np.zeros(pad)]).reshape(-1, block), pad


@pytest.mark.parametrize("spec,block_of,levels", [
    ("int8", lambda x: x.size, 127), ("int8_row", lambda x: x.shape[-1] if x.ndim else 1, 127),
    ("int8_block", lambda x: 64, 127), ("int8_block(5)", lambda x: 5, 127), ("int4_block", lambda x: 64, 7),
    ("int4_block(3)", lambda x: 3, 7), ("int3_block", lambda x: 64, 3), ("int3_block(5)", lambda x: 5, 3)])
@settings(max_examples=40, deadline=None)
@given(x=arrays(st.just(np.float32)))
def test_integer_codecs_stay_within_half_a_step_per_block(spec, block_of, levels, x):
    y = decode_from_frames(encode_to_frames(spec, x))
    block = max(1, min(block_of(x), x.size))
    xb, pad = _blocks(x, block)
    yb, _ = _blocks(y, block)
    step = np.abs(xb).max(axis=1, keepdims=True) / levels
    assert (np.abs(xb - yb) <= step / 2 * (1 + 1e-5) + 1e-30).all()


@settings(max_examples=40, deadline=None)
@given(x=arrays(st.just(np.float32)))
def test_fp16_and_bf16_relative_error_per_element(x):
    h = get_codec("fp16").decode(get_codec("fp16").encode(x)).astype(np.float64)
    b = get_codec("bf16").decode(get_codec("bf16").encode(x)).astype(np.float64)
    xd = x.astype(np.float64)
    assert (np.abs(h - xd) <= np.abs(xd) * 2.0**-11 + 2.0**-25).all()
    assert (np.abs(b - xd) <= np.abs(xd) * 2.0**-8).all()


def test_bf16_rounds_to_nearest_even_like_paddle():
    import paddle

    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 100
    ours = decode_from_frames(encode_to_frames("bf16", x))
    ref = paddle.cast(paddle.cast(paddle.to_tensor(x), "bfloat16"), "float32").numpy()
    np.testing.assert_array_equal(ours, ref)


@settings(max_examples=30, deadline=None)
@given(x=arrays(st.just(np.float64), hnp.array_shapes(min_dims=2, max_dims=3, min_side=2, max_side=10)),
       r=st.sampled_from([0.2, 0.5, 0.9]))
def test_svd_error_is_the_eckart_young_tail(x, r):
    m, n = int(np.prod(x.shape[:-1])), x.shape[-1]
    s = np.linalg.svd(x.reshape(m, n), compute_uv=False)
    k = max(1, min(m, n, round(r * min(m, n))))
    y = decode_from_frames(encode_to_frames(f"svd({r})", x))
    assert math.isclose(np.linalg.norm(x - y), math.sqrt(np.sum(s[k:] ** 2)), rel_tol=1e-6, abs_tol=1e-8)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-6), (np.float64, 1e-13)])
def test_svd_1_0_is_exact(dtype, tol):
    x = np.random.default_rng(1).standard_normal((4, 16, 24)).astype(dtype)
    enc = get_codec("svd(1.0)").encode(x)
    assert enc.parts["s"].shape == (24,)
    assert relative_error(x, decode_encoded(enc)) < tol


def test_svd_bytes_follow_the_paper_formula_and_can_exceed_the_tensor():
    x = np.random.default_rng(2).standard_normal((32, 32)).astype(np.float32)
    enc = get_codec("svd(0.9)").encode(x)
    k = round(0.9 * 32)
    assert enc.payload_nbytes == 4 * k * (32 + 32 + 1)
    assert enc.payload_nbytes > x.nbytes  # SVD of a square matrix keeping 90% is larger than the matrix itself


@settings(max_examples=30, deadline=None)
@given(x=arrays(st.just(np.float32), hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=40)),
       f=st.sampled_from([0.01, 0.1, 0.5, 1.0]))
def test_topk_keeps_exactly_the_largest_magnitudes(x, f):
    y = decode_from_frames(encode_to_frames(f"topk({f})", x)).ravel()
    flat = x.ravel()
    kept = y != 0
    k = max(1, min(flat.size, round(f * flat.size)))
    assert np.array_equal(y[kept], flat[kept])
    assert kept.sum() <= k
    if kept.sum() < flat.size and kept.any():
        assert np.abs(flat[~kept]).max() <= np.abs(flat[kept]).min()


@pytest.mark.parametrize("spec", ["fp16", "int8", "int4_block", "svd(0.5)", "lowrank(rank=2)", "topk(0.1)",
                                  "ef(int8)", "auto(0.1)"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.bool_])
def test_integer_and_bool_tensors_pass_through_losslessly(spec, dtype):
    x = (np.arange(-30, 30).reshape(3, 4, 5) % 7).astype(dtype)
    y = decode_from_frames(encode_to_frames(spec, x))
    assert y.dtype == x.dtype and np.array_equal(x, y)


@pytest.mark.parametrize("spec", EVERY_CODEC)
@pytest.mark.parametrize("shape", [(0,), (3, 0, 5), (0, 4)])
def test_empty_tensors(spec, shape):
    x = np.zeros(shape, np.float32)
    frames = encode_to_frames(spec, x)
    y = decode_from_frames(frames)
    assert y.shape == shape and y.dtype == np.float32


@pytest.mark.parametrize("spec", ["none", "fp16", "int8_row", "int8_block(8)", "svd(1.0)", "topk(1.0)"])
def test_non_contiguous_input_matches_its_contiguous_copy(spec):
    base = np.random.default_rng(3).standard_normal((12, 10)).astype(np.float32)
    view = base.T[::2]  # transposed and strided
    assert not view.flags.c_contiguous
    a = decode_from_frames(encode_to_frames(spec, view))
    b = decode_from_frames(encode_to_frames(spec, np.ascontiguousarray(view)))
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert a.shape == view.shape


@pytest.mark.parametrize("spec", ["fp16", "bf16", "int8", "int8_row", "int8_block", "int4_block", "svd(0.5)",
                                  "lowrank(rank=2)", "topk(0.2)", "fp16(svd(0.6))", "ef(int8)", "auto(0.1)"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_are_reported_not_sent(spec, bad):
    x = np.random.default_rng(4).standard_normal((6, 8)).astype(np.float32)
    x[2, 3] = bad
    with pytest.raises(NonFiniteError, match="NaN|Inf"):
        get_codec(spec).encode(x)


def test_none_carries_nan_bit_exactly():
    x = np.array([np.nan, np.inf, -0.0, 1.5], np.float32)
    y = decode_from_frames(encode_to_frames("none", x))
    assert np.array_equal(x.view(np.uint32), y.view(np.uint32))


def test_fp16_overflow_is_an_error_naming_the_fix():
    with pytest.raises(CodecError, match="bf16"):
        get_codec("fp16").encode(np.array([1e6], np.float32))


def test_unknown_codec_lists_known_ones():
    with pytest.raises(SpecError) as info:
        get_codec("fp8")
    for name in known_codecs():
        assert name in str(info.value)
    with pytest.raises(SpecError, match="unknown codec 'zip'"):
        get_codec("fp16(zip(3))")


@pytest.mark.parametrize("spec,match", [
    ("svd(0)", "svd"), ("svd(1.5)", r"\(0, 1\]"), ("svd", "needs the fraction"), ("topk(-0.1)", "topk"),
    ("topk(2)", "topk"), ("lowrank(energy=1.2)", "energy"), ("lowrank(rank=0)", "rank"),
    ("lowrank(rank=3, energy=0.5)", "exactly one"), ("int8_block(0)", "block"), ("int4_block(block=2.5)", "block"),
    ("auto(0)", "budget"), ("auto(0.1, mbit=-1)", "mbit"), ("fp16(3)", "fp16"), ("ef", "ef"),
    ("ef(int8, fp16)", "exactly one"), ("fp16(svd(0.5), int8)", "at most one"), ("svd(0.5", "ended early"),
    ("svd(0.5))", "unexpected"), ("svd(r=0.5, 0.3)", "positional"), ("fp16 svd", "unexpected"), ("", "empty"),
    ("svd(0.5;)", "unexpected character"), ("lowrank(rank=2, bogus=1)", "unknown argument")])
def test_bad_specs_get_clear_errors(spec, match):
    with pytest.raises(SpecError, match=match):
        get_codec(spec)


def test_bad_inputs_get_clear_errors():
    with pytest.raises(CodecError, match="numpy"):
        get_codec("fp16").encode([1.0, 2.0])
    with pytest.raises(CodecError, match="dtype"):
        get_codec("fp16").encode(np.array(["a"]))
    with pytest.raises(CodecError, match="Encoded"):
        get_codec("fp16").decode(b"not encoded")


@pytest.mark.parametrize("spec", ["fp16(svd(0.6))", "int8_block(svd(0.3), 32)", "lowrank(rank=4, power=1)",
                                  "auto(0.05, fp16, int8, mbit=60.0)", "ef(int4_block(16))", "svd(1)"])
def test_spec_strings_are_canonical_and_re_parse(spec):
    codec = get_codec(spec)
    assert get_codec(codec.spec).spec == codec.spec


def test_paper_nesting_quantizes_every_svd_factor():
    x = np.random.default_rng(5).standard_normal((64, 32)).astype(np.float32)
    enc = get_codec("fp16(svd(0.6))").encode(x)
    k = round(0.6 * 32)
    assert enc.codec == "svd(0.6)" and enc.spec == "fp16(svd(0.6))"
    assert {p.codec for p in enc.parts.values()} == {"fp16"}
    assert enc.payload_nbytes == 2 * k * (64 + 32 + 1)
    plain = decode_encoded(get_codec("svd(0.6)").encode(x))
    assert relative_error(plain, decode_encoded(enc)) < 1e-3


def test_vectorised_fp16_rounding_is_bit_identical_to_ieee():
    from nebula.compress import quantize as Q

    rng = np.random.default_rng(9)
    scales = [1, 1e-3, 1e-5, 1e-7, 3e-8, 1e-9, 100, 6e4]
    x = np.concatenate([rng.standard_normal(20_000) * s for s in scales]).astype(np.float32)
    x = x[np.abs(x) < 65519]
    specials = [65504, 65519.9, -65519, 2.0**-14, 2.0**-24, 2.0**-25, 1.5 * 2.0**-25, 0.0, -0.0, 1 + 2.0**-11]
    x = np.concatenate([x, np.array(specials, np.float32)])
    np.testing.assert_array_equal(Q.to_fp16(x).view(np.uint16), x.astype(np.float16).view(np.uint16))
    h = x.astype(np.float16)
    np.testing.assert_array_equal(Q.from_fp16(h, "float32"), h.astype(np.float32))
    with pytest.raises(OverflowError):
        Q.to_fp16(np.array([1.0, 65520.0], np.float32))


def test_bf16_overflow_is_an_error():
    with pytest.raises(CodecError, match="BF16 range"):
        get_codec("bf16").encode(np.array([3.4e38], np.float32))
