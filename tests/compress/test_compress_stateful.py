"""Low-rank accuracy and warm start, error feedback convergence, and the bandwidth-adaptive auto codec."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.compress import (AutoCodec, decode_encoded, decode_from_frames, encode_to_frames, encoded_to_frames,
                             get_codec, relative_error)


def low_rank_plus_noise(rng, m=300, n=64, rank=6, noise=1e-3):
    """A matrix with a decaying spectrum of `rank` strong directions plus small noise."""
    u = rng.standard_normal((m, rank))
    v = rng.standard_normal((rank, n))
    scale = np.logspace(1, 0, rank)[:, None]
    return (u @ (scale * v) + noise * rng.standard_normal((m, n))).astype(np.float32)


def optimal_error(x, k):
    s = np.linalg.svd(x.reshape(-1, x.shape[-1]).astype(np.float64), compute_uv=False)
    return float(np.sqrt(np.sum(s[k:] ** 2) / np.sum(s ** 2)))


@pytest.mark.parametrize("power", [0, 1, 2])
def test_lowrank_recovers_a_low_rank_matrix(power):
    rng = np.random.default_rng(0)
    x = low_rank_plus_noise(rng, noise=0.0).reshape(3, 100, 64)
    y = decode_from_frames(encode_to_frames(f"lowrank(rank=6, power={power})", x))
    assert relative_error(x, y) < 1e-4


def test_lowrank_is_within_two_percent_of_the_optimal_error_and_sends_k_m_plus_n():
    rng = np.random.default_rng(1)
    x = low_rank_plus_noise(rng, noise=0.05)
    codec = get_codec("lowrank(rank=4)")
    enc = codec.encode(x)
    assert enc.payload_nbytes == 4 * 4 * (300 + 64)
    assert relative_error(x, decode_encoded(enc)) <= 1.02 * optimal_error(x, 4)


def test_lowrank_warm_start_tracks_a_drifting_matrix_better_than_an_extra_iteration():
    rng = np.random.default_rng(2)
    base = low_rank_plus_noise(rng, noise=0.02)
    warm = get_codec("lowrank(rank=4, power=0, oversample=0)")
    cold = get_codec("lowrank(rank=4, power=0, oversample=0, warm=0)")
    warm_err = cold_err = 0.0
    for step in range(8):
        x = base + 0.01 * rng.standard_normal(base.shape).astype(np.float32)
        warm_err = relative_error(x, decode_encoded(warm.encode(x)))
        cold_err = relative_error(x, decode_encoded(cold.encode(x)))
    # warm: the previous step's right singular vectors and no iteration; cold: a Gaussian block and one iteration
    assert warm_err <= 1.02 * optimal_error(x, 4) < cold_err


@pytest.mark.parametrize("energy", [0.5, 0.9, 0.99])
def test_lowrank_energy_keeps_the_fewest_values_holding_that_energy(energy):
    rng = np.random.default_rng(3)
    x = low_rank_plus_noise(rng, noise=0.05)
    s2 = np.linalg.svd(x.astype(np.float64), compute_uv=False) ** 2
    k_best = int(np.searchsorted(np.cumsum(s2), energy * s2.sum()) + 1)
    codec = get_codec(f"lowrank(energy={energy})")
    for _ in range(2):  # the second call starts from the first call's rank
        enc = codec.encode(x)
        k = enc.parts["p"].shape[1]
        assert k_best <= k <= k_best + 1
        assert relative_error(x, decode_encoded(enc)) <= np.sqrt(1 - energy) * 1.001


def test_lowrank_with_ratio_matches_svd_rank_and_nests_under_quantizers():
    rng = np.random.default_rng(4)
    x = low_rank_plus_noise(rng, m=120, n=40, noise=0.1)
    svd = get_codec("svd(0.25)").encode(x)
    low = get_codec("lowrank(ratio=0.25)").encode(x)
    assert svd.parts["u"].shape[1] == low.parts["p"].shape[1] == 10
    enc = get_codec("int8_row(lowrank(ratio=0.25))").encode(x)
    assert {p.codec for p in enc.parts.values()} == {"int8_row"}
    assert abs(relative_error(x, decode_encoded(enc)) - relative_error(x, decode_encoded(low))) < 0.01


@pytest.mark.parametrize("inner", ["int8", "topk(0.05)", "int4_block(16)", "lowrank(rank=1)", "fp16(topk(0.1))"])
def test_error_feedback_makes_the_sum_of_decoded_gradients_converge(inner):
    rng = np.random.default_rng(5)
    mean = rng.standard_normal((40, 25)).astype(np.float32)
    ef, plain = get_codec(f"ef({inner})"), get_codec(inner)
    true_sum = np.zeros_like(mean, dtype=np.float64)
    ef_sum = np.zeros_like(true_sum)
    plain_sum = np.zeros_like(true_sum)
    gaps = []
    for step in range(1, 401):
        g = mean + 0.5 * rng.standard_normal(mean.shape).astype(np.float32)
        true_sum += g
        ef_sum += decode_from_frames(encoded_to_frames(ef.encode(g)))
        plain_sum += decode_encoded(plain.encode(g))
        if step in (100, 400):
            gaps.append(relative_error(true_sum, ef_sum))
    plain_gap = relative_error(true_sum, plain_sum)
    # the gap is the one carried (bounded) residual, so it shrinks like 1/steps; without feedback the bias stays
    assert gaps[1] < 0.05
    assert gaps[1] < 0.5 * gaps[0]
    assert gaps[1] < plain_gap / 3 or plain_gap < 1e-3
    residual = ef.residual(mean.shape)
    np.testing.assert_allclose(ef_sum + residual, true_sum, rtol=1e-3, atol=1e-2)


def test_error_feedback_keeps_state_per_instance_and_shape():
    a, b = get_codec("ef(topk(0.1))"), get_codec("ef(topk(0.1))")
    x = np.random.default_rng(6).standard_normal((10, 10)).astype(np.float32)
    a.encode(x)
    a.encode(x[:5])
    assert a.residual((10, 10)) is not None and a.residual((5, 10)) is not None
    assert b.residual((10, 10)) is None
    a.reset()
    assert a.residual((10, 10)) is None


def activation(rng, m=512, n=64):
    return (low_rank_plus_noise(rng, m=m, n=n, rank=8, noise=0.3)).reshape(8, m // 8, n)


def test_auto_sends_raw_on_a_fast_link_and_compresses_on_a_slow_one():
    x = activation(np.random.default_rng(7))
    codec = get_codec("auto(0.02, mbit=1e6)")
    enc = codec.encode(x)
    assert enc.codec == "none" and codec.chosen() == "none"
    codec.update_bandwidth(1e3)  # 8 kbit/s: bytes dominate everything
    enc = codec.encode(x)
    assert enc.nbytes < x.nbytes / 2
    assert relative_error(x, decode_from_frames(encoded_to_frames(enc))) <= 0.02
    assert [spec for _, spec in codec.decisions][0] == "none" and len(codec.decisions) == 2


def test_auto_re_decides_only_from_its_measurements_and_respects_the_budget():
    x = activation(np.random.default_rng(8))
    codec = get_codec("auto(0.01, fp16, int8_row, int4_block(64), mbit=100)")
    assert isinstance(codec, AutoCodec)
    codec.encode(x)
    ms = {m.spec: m for m in codec.measurements(x.shape)}
    assert set(ms) == {"fp16", "int8_row", "int4_block(64)", "none"}
    assert ms["int4_block(64)"].error > 0.01  # over budget: never chosen
    for bw in (1e3, 1e5, 1e7, 1e11):
        codec.update_bandwidth(bw)
        best = min((m for m in ms.values() if m.error <= 0.01), key=lambda m: m.total_s(bw))
        assert codec.chosen(x.shape) == best.spec != "int4_block(64)"
    codec.update_bandwidth(1e3)
    assert codec.encode(x).codec == "int8_row"
    with pytest.raises(ValueError, match="bandwidth"):
        codec.update_bandwidth(0)


def test_auto_re_measures_periodically():
    codec = get_codec("auto(0.05, fp16, every=3)")
    x = activation(np.random.default_rng(9))
    for _ in range(7):
        codec.encode(x)
    first = codec.measurements(x.shape)
    codec.encode(x * 2)  # tensors 0, 3, 6, 9, ... are measured
    codec.encode(x * 2)
    assert codec.measurements(x.shape) is first
    codec.encode(x)
    assert codec.measurements(x.shape) is not first


def test_tensor_coder_keeps_one_stateful_codec_per_spec_and_direction():
    from nebula.compress import TensorCoder

    rng = np.random.default_rng(8)
    tx, other = TensorCoder(), TensorCoder()
    assert tx.codec("ef(int8)") is tx.codec("ef(int8)") and tx.codec("ef(int8)") is not other.codec("ef(int8)")
    mean = rng.standard_normal((30, 20)).astype(np.float32)
    true_sum, got_sum = np.zeros_like(mean, dtype=np.float64), np.zeros_like(mean, dtype=np.float64)
    for _ in range(200):  # through frames both ways: the sender's residual carries over between calls
        g = mean + 0.5 * rng.standard_normal(mean.shape).astype(np.float32)
        true_sum += g
        got_sum += TensorCoder().decode(tx.encode(g, "ef(int8)"))
    assert relative_error(true_sum, got_sum) < 0.01
    assert tx.codec("ef(int8)").residual(mean.shape) is not None and other.codec("ef(int8)").residual(mean.shape) is None
    # a Codec instance passed in decodes (a stateful decoder keeps its own state); specs decode statelessly
    fp16 = get_codec("fp16")
    y = other.decode(tx.encode(mean, fp16), fp16, like="numpy")
    assert y.dtype == np.float32 and relative_error(mean, y) < 1e-3
