"""Codecs on the tensor's device: only compressed bytes reach the host, and the wire format is one format on both paths;
no codec sends more than the raw tensor without a warning, and auto falls back to a smaller codec there."""
from __future__ import annotations

import json
import logging

import numpy as np
import paddle
import pytest

from nebula.compress import TensorCoder, codec_path, decode_from_frames, encode_to_frames, get_codec, relative_error
from nebula.compress.auto import Measurement, pick_measurement
from nebula.compress.device import decode_frames_to_tensor, encode_tensor_to_frames, relative_error_on_device
from nebula.compress.inflation import check_inflation, forget_warnings, svd_break_even_ratio

EXACT = ["none", "fp16", "bf16", "int8", "int8_row", "int8_block(16)", "int4_block(16)"]
FACTORED = ["svd(0.3)", "fp16(svd(0.3))", "lowrank(rank=4)", "int8_row(lowrank(rank=4))"]


def _act(shape=(8, 12, 64), seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    low = rng.standard_normal((int(np.prod(shape[:-1])), 6)) @ rng.standard_normal((6, shape[-1]))
    return (low + 0.05 * rng.standard_normal(low.shape)).reshape(shape).astype(np.float32)


def _header(frames) -> dict:
    doc = json.loads(bytes(memoryview(frames[0]).cast("B")[8:]))
    doc.pop("kind")  # the sender's kind only sets the default decode kind
    return doc


def _bytes(frames) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in frames]


@pytest.mark.parametrize("spec", EXACT + FACTORED)
def test_device_path_copies_only_compressed_bytes_and_decodes_on_the_numpy_path(spec):
    a = _act()
    t = paddle.to_tensor(a)
    df = encode_tensor_to_frames(spec, t)
    sizes = [len(b) for b in _bytes(df.frames)]
    assert df.nbytes == sum(sizes) and df.host_copy_bytes == sum(sizes[1:])
    if spec != "none":
        assert df.host_copy_bytes < 0.9 * a.nbytes  # the compressed payloads, not the tensor, crossed to the host
    ref = encode_to_frames(spec, a)
    assert _header(df.frames) == _header(ref)  # one wire format: codec tree, dtypes and shapes identical
    assert [len(b) for b in _bytes(ref)[1:]] == sizes[1:]
    on_numpy = decode_from_frames(df.frames, like="numpy")  # a CPU-only peer decodes the device path's frames
    on_device = decode_frames_to_tensor(df.frames)
    assert isinstance(on_numpy, np.ndarray) and isinstance(on_device, paddle.Tensor)
    np.testing.assert_allclose(on_numpy, on_device.numpy(), rtol=1e-6, atol=1e-6)
    back = decode_frames_to_tensor(ref)  # and the device decodes the numpy path's frames
    np.testing.assert_allclose(back.numpy(), decode_from_frames(ref), rtol=1e-6, atol=1e-6)
    if spec in EXACT:  # element codecs: the same bytes whichever path encoded
        assert _bytes(df.frames)[1:] == _bytes(ref)[1:]
    else:  # factorisations differ in LAPACK rounding and signs, not in quality
        assert relative_error(a, on_numpy) == pytest.approx(relative_error(a, decode_from_frames(ref)), rel=0.05,
                                                             abs=1e-3)


def test_device_path_keeps_codec_state_and_rejects_host_arrays():
    codec = get_codec("ef(int8)")
    t = paddle.to_tensor(_act())
    encode_tensor_to_frames(codec, t)
    assert isinstance(codec.residual((8, 12, 64), kind="paddle"), paddle.Tensor)  # the residual stayed on device
    with pytest.raises(ValueError, match="expects a paddle.Tensor.*encode_to_frames"):
        encode_tensor_to_frames("fp16", _act())


def test_relative_error_on_device_matches_the_host():
    a, b = _act(seed=1), _act(seed=2)
    assert relative_error_on_device(paddle.to_tensor(a), paddle.to_tensor(b)) == pytest.approx(relative_error(a, b),
                                                                                              rel=1e-9)


def test_svd_larger_than_the_raw_tensor_warns_once_with_a_smaller_alternative(caplog):
    forget_warnings()
    a = _act((8, 8, 64))  # [64, 64]: svd(0.9) keeps 58 * (64 + 64 + 1) values, more than 64 * 64
    with caplog.at_level(logging.WARNING, logger="nebula.compress"):
        enc = get_codec("svd(0.9)").encode(a)
        get_codec("svd(0.9)").encode(a)
    assert enc.nbytes > a.nbytes
    msgs = [r.getMessage() for r in caplog.records if "svd(0.9)" in r.getMessage()]
    assert len(msgs) == 1, msgs  # once per codec and shape
    r = svd_break_even_ratio((8, 8, 64))
    assert "[8, 8, 64]" in msgs[0] and "more than the raw tensor" in msgs[0] and f"'svd({r})'" in msgs[0]
    assert get_codec(f"svd({r})").encode(a).nbytes <= a.nbytes + 200  # the suggestion fits (header aside)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nebula.compress"):
        get_codec("svd(0.3)").encode(a)
        get_codec("fp16").encode(a)
    assert caplog.records == []


def test_nested_codec_larger_than_its_outer_codec_alone_warns(caplog):
    forget_warnings()
    a = _act((8, 8, 64))
    with caplog.at_level(logging.WARNING, logger="nebula.compress"):
        enc = get_codec("fp16(svd(0.6))").encode(a)
    assert get_codec("fp16").encode(a).nbytes < enc.nbytes < a.nbytes
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "'fp16(svd(0.6))'" in msg and "[8, 8, 64]" in msg and "'fp16' alone" in msg and "use 'fp16'" in msg


def test_check_inflation_on_paddle_tensors_names_the_shape(caplog):
    forget_warnings()
    t = paddle.to_tensor(_act((4, 16, 64)))
    with caplog.at_level(logging.WARNING, logger="nebula.compress"):
        assert check_inflation("topk(0.9)", t, 10 * 4 * 16 * 64 * 4, get_codec)
    assert "[4, 16, 64]" in caplog.records[0].getMessage()


def test_auto_never_picks_a_candidate_larger_than_the_raw_tensor(caplog):
    raw = Measurement("none", encode_s=0.5, decode_s=0.0, nbytes=1000, error=0.0)
    big = Measurement("svd(0.9)", encode_s=0.0, decode_s=0.0, nbytes=1200, error=0.01)
    small = Measurement("int8", encode_s=0.3, decode_s=0.0, nbytes=300, error=0.01)
    # faster on paper, but it would send more than the tensor
    assert pick_measurement([raw, big], 0.05, 1e12).spec == "none"
    assert pick_measurement([raw, big, small], 0.05, 1e12).spec == "int8"
    forget_warnings()
    codec = get_codec("auto(0.5, svd(0.9), svd(1.0), mbit=1000000)")
    a = _act((8, 8, 64))
    with caplog.at_level(logging.WARNING):
        codec.encode(a)
    assert codec.chosen((8, 8, 64)) == "none"
    assert any("send more than the raw tensor" in r.getMessage() and "[8, 8, 64]" in r.getMessage()
               for r in caplog.records)


def test_codec_path_sends_accelerator_tensors_to_the_device_and_cpu_tensors_to_numpy():
    for device in ("gpu:0", "Place(gpu:1)", "npu:0", "xpu:3", "Place(intel_gpu:0)"):
        assert codec_path(device) == "paddle", device
    for place in ("cpu", "Place(cpu)", "Place(gpu_pinned)", paddle.CPUPlace(), paddle.ones([1]).place):
        assert codec_path(place) == "numpy", place
    assert codec_path("cpu", "bfloat16") == "paddle"  # numpy has no bfloat16
    assert codec_path("gpu:0", "float16") == "paddle"


def _kind(frames) -> str:
    return json.loads(bytes(memoryview(frames[0]).cast("B")[8:]))["kind"]


def test_runtime_coder_encodes_and_decodes_cpu_tensors_with_numpy():
    """TensorCoder (the channels' and pipeline boundaries' path) sends a CPU paddle.Tensor through numpy: same
    bytes as numpy's own encoding, state kept as numpy, and like='paddle' still hands back a paddle.Tensor."""
    a = _act()
    coder = TensorCoder()
    frames = coder.encode(paddle.to_tensor(a), "ef(int8)")
    assert _kind(frames) == "numpy"
    assert _bytes(frames)[1:] == _bytes(encode_to_frames("ef(int8)", a))[1:]
    assert isinstance(coder.codec("ef(int8)").residual(a.shape, kind="numpy"), np.ndarray)
    y = TensorCoder().decode(frames, like="paddle")
    assert isinstance(y, paddle.Tensor) and y.place.is_cpu_place() and y.dtype == paddle.float32
    np.testing.assert_array_equal(y.numpy(), decode_from_frames(frames, like="numpy"))
    bf = paddle.to_tensor(a).astype("bfloat16")  # no numpy bfloat16: stays on paddle
    frames = coder.encode(bf, "int8")
    assert _kind(frames) == "paddle"
    assert TensorCoder().decode(frames, like="paddle").dtype == paddle.bfloat16


@pytest.mark.skipif(not paddle.is_compiled_with_cuda() or paddle.device.cuda.device_count() == 0,
                    reason="needs a GPU build of paddle and a GPU")
def test_runtime_coder_encodes_gpu_tensors_on_the_device():
    t = paddle.to_tensor(_act(), place=paddle.CUDAPlace(0))
    frames = TensorCoder().encode(t, "fp16(svd(0.3))")
    assert _kind(frames) == "paddle"
    paddle.set_device("gpu:0")
    y = TensorCoder().decode(frames, like="paddle")
    assert y.place.is_gpu_place()
