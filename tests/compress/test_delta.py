"""Activation deltas `delta(inner, first=..., cache_mb=...)` and `int2_block`: both ends' caches stay equal through
the wire, deltas are smaller than first sights, eviction is identical, a desync or a hostile message is refused."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.compress import CodecError, SpecError, decode_encoded, encoded_to_frames, frames_to_encoded, get_codec
from nebula.compress.delta import DesyncError, SampleCache, dequantize2, is_keyed, quantize2

SPEC = "delta(int2_block, first=int8_block, cache_mb=1)"


def _wire(enc):
    """The message as the receiver parses it: joined frames, as a channel delivers them."""
    return frames_to_encoded([b"".join(bytes(memoryview(f).cast("B")) for f in encoded_to_frames(enc))])


def _nbytes(enc) -> int:
    return sum(len(memoryview(f).cast("B")) for f in encoded_to_frames(enc))


def _drift(epochs=4, n=24, shape=(32, 64), seed=0):
    """Per epoch, the activations of samples 0..n-1 (slowly changing, as training moves the weights)."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n,) + shape).astype(np.float32)
    return [base + 0.02 * e * rng.standard_normal(base.shape).astype(np.float32) for e in range(epochs)]


def test_spec_is_canonical_keyed_and_defaults():
    c = get_codec("delta(int2_block)")
    assert c.spec == "delta(int2_block(64), first=int8_block(64), cache_mb=64)" and is_keyed(c)
    assert get_codec(c.spec).spec == c.spec
    assert not is_keyed(get_codec("int8"))


@pytest.mark.parametrize("spec,match", [
    ("delta", "exactly one inner codec"), ("delta(int8, int8)", "exactly one inner codec"),
    ("delta(0.5)", "exactly one inner codec"), ("delta(int2_block, cache_mb=0)", "'cache_mb'"),
    ("delta(int2_block, first=3)", "'first'"), ("delta(int2_block, size=3)", "unknown argument 'size'"),
    ("delta(delta(int8))", "cannot be keyed"), ("delta(int2_block, first=zip)", "unknown codec 'zip'"),
    ("int2_block(block=0)", "block")])
def test_bad_specs_are_one_line_with_usage(spec, match):
    with pytest.raises(SpecError, match=match) as info:
        get_codec(spec)
    assert "\n" not in str(info.value)


def test_int2_block_error_bound_and_bytes():
    x = np.random.default_rng(1).standard_normal(4096).astype(np.float32)
    q, s = quantize2(x, 64)
    assert q.nbytes == 1024 and s.nbytes == 64 * 4
    y = dequantize2(q, s, 64, x.size)
    bound = np.repeat(np.abs(x.reshape(-1, 64)).max(axis=1) / 3, 64)
    assert np.all(np.abs(y - x) <= bound * (1 + 1e-6))
    enc = get_codec("int2_block").encode(x.reshape(64, 64))
    assert decode_encoded(_wire(enc)).shape == (64, 64) and enc.payload_nbytes == 1024 + 256


def test_both_caches_stay_equal_and_deltas_are_small():
    """Epoch 1 goes with `first`, later epochs as 2-bit deltas: the receiver decodes exactly what the sender stored,
    deltas take at least 8x fewer bytes than float32, and the error stays below the first sight's."""
    send, recv = get_codec(SPEC), get_codec(SPEC)
    per_epoch = []
    for e, acts in enumerate(_drift()):
        nbytes = 0
        for b in range(0, len(acts), 6):
            ids = np.arange(b, b + 6)
            enc = send.encode_keyed(acts[b:b + 6], ids)
            gens = enc.parts["gen"]
            assert (gens == 0).all() if e == 0 else (gens == e).all()
            y = recv.decode(_wire(enc))
            np.testing.assert_array_equal(y, np.stack([send.cache.get(i).row for i in ids]))
            np.testing.assert_array_equal(y, np.stack([recv.cache.get(i).row for i in ids]))
            nbytes += _nbytes(enc)
        per_epoch.append(nbytes)
    raw = _drift()[0].nbytes
    assert raw / per_epoch[-1] >= 8, per_epoch
    assert per_epoch[0] > 2 * per_epoch[-1]
    assert send.cache_bytes == recv.cache_bytes == raw


def test_lru_eviction_is_identical_and_evicted_samples_go_first_again():
    """A cache holding 10 of 24 samples: both ends evict the same ones; a sample evicted is sent with `first`."""
    row = 8 * 16 * 4
    spec = f"delta(int2_block, first=int8_block, cache_mb={10 * row / 2 ** 20!r})"
    send, recv = get_codec(spec), get_codec(spec)
    for acts in _drift(epochs=2, shape=(8, 16)):
        for b in range(0, 24, 6):
            ids = np.arange(b, b + 6)
            enc = send.encode_keyed(acts[b:b + 6], ids)
            recv.decode(_wire(enc))
            assert len(send.cache) == len(recv.cache) <= 10
            assert [i for i in range(24) if send.cache.get(i)] == [i for i in range(24) if recv.cache.get(i)]
    # the last 10 sent are held; every one of epoch 2's first 18 had been evicted, so it went with `first`
    assert [i for i in range(24) if send.cache.get(i)] == list(range(14, 24))
    assert send.cache.get(23).gen == 1 and send.cache.evictions == recv.cache.evictions == 38


def test_receiver_that_lost_its_cache_refuses_in_one_line():
    acts = _drift(epochs=2)
    send = get_codec(SPEC)
    send.encode_keyed(acts[0][:6], np.arange(6))
    restarted = get_codec(SPEC)  # e.g. a receiver restarted while the sender kept its cache
    with pytest.raises(DesyncError, match="sample 0 is sent as a delta against cache generation 1 but this end "
                                          "holds no entry") as info:
        restarted.decode(_wire(send.encode_keyed(acts[1][:6], np.arange(6))))
    assert "\n" not in str(info.value) and "restart both ends" in str(info.value)
    assert len(restarted.cache) == 0  # nothing half-applied


def test_lost_message_is_a_generation_mismatch():
    acts = _drift(epochs=3)
    send, recv = get_codec(SPEC), get_codec(SPEC)
    recv.decode(_wire(send.encode_keyed(acts[0][:6], np.arange(6))))
    send.encode_keyed(acts[1][:6], np.arange(6))  # lost on the way
    with pytest.raises(DesyncError, match="generation 2 but this end holds generation 1"):
        recv.decode(_wire(send.encode_keyed(acts[2][:6], np.arange(6))))


def test_hostile_or_mismatched_messages_are_refused():
    acts = _drift(epochs=1)[0]
    send, recv = get_codec(SPEC), get_codec(SPEC)
    with pytest.raises(DesyncError, match="2 sample ids for a tensor of shape"):
        send.encode_keyed(acts[:3], np.array([1, 2]))
    enc = send.encode_keyed(acts[:4], np.arange(4))
    enc.parts["ids"] = np.array([0, 1, 2])  # a peer whose ids do not fit the rows
    with pytest.raises(DesyncError, match="3 sample ids for a tensor of shape"):
        recv.decode(_wire(enc))
    enc = send.encode_keyed(acts[:2], np.arange(2))
    enc.parts["gen"] = np.array([0, -1], np.int32)
    with pytest.raises(DesyncError, match="malformed message"):
        recv.decode(_wire(enc))
    other = get_codec("delta(int2_block, first=int8_block, cache_mb=2)")
    with pytest.raises(DesyncError, match="same delta spec"):
        other.decode(_wire(send.encode_keyed(acts[4:6], np.arange(4, 6))))


def test_no_ids_or_no_cache_is_refused():
    c = get_codec(SPEC)
    with pytest.raises(CodecError, match="needs the sample id of each row"):
        c.encode(np.ones((2, 3), np.float32))
    with pytest.raises(CodecError, match="only with the receiving end's cache"):
        decode_encoded(_wire(c.encode_keyed(np.ones((2, 3), np.float32), np.arange(2))))


def test_integer_and_empty_tensors_pass_through():
    send, recv = get_codec(SPEC), get_codec(SPEC)
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    np.testing.assert_array_equal(recv.decode(_wire(send.encode_keyed(x, np.arange(2)))), x)
    assert len(send.cache) == 0


def test_sample_cache_bound():
    c = SampleCache(100)
    c.put(1, np.zeros(10, np.float32))
    c.put(2, np.zeros(10, np.float32))
    c.put(1, np.zeros(10, np.float32))
    assert c.nbytes == 80 and c.get(1).gen == 2
    c.put(3, np.zeros(10, np.float32))
    assert c.get(2) is None and c.nbytes == 80 and c.evictions == 1
    c.clear()
    assert len(c) == 0 and c.nbytes == 0


def test_paddle_tensors_in_and_out():
    """A paddle.Tensor is encoded (on the host) and a message parsed as paddle decodes to a paddle.Tensor, as on a
    device; both ends' caches stay equal."""
    import paddle

    send, recv = get_codec(SPEC), get_codec(SPEC)
    for acts in _drift(epochs=2, n=4):
        enc = send.encode_keyed(paddle.to_tensor(acts), paddle.to_tensor(np.arange(4)))
        frames = [b"".join(bytes(memoryview(f).cast("B")) for f in encoded_to_frames(enc))]
        y = recv.decode(frames_to_encoded(frames, like="paddle"))
        assert isinstance(y, paddle.Tensor) and y.dtype == paddle.float32
        np.testing.assert_array_equal(y.numpy(), np.stack([send.cache.get(i).row for i in range(4)]))


def test_an_example_twice_in_one_batch_stays_in_step():
    """A step spanning two epochs of a small set may hold an example twice: both rows go against the same entry and
    both ends store them in row order."""
    acts = _drift(epochs=3, n=4)
    send, recv = get_codec(SPEC), get_codec(SPEC)
    for e, ids in enumerate(([0, 1, 2, 0], [3, 0, 0, 1], [2, 2, 3, 1])):
        ids = np.array(ids)
        y = recv.decode(_wire(send.encode_keyed(acts[e][ids], ids)))
        for i in set(ids.tolist()):
            assert send.cache.get(i).gen == recv.cache.get(i).gen
            np.testing.assert_array_equal(send.cache.get(i).row, recv.cache.get(i).row)
        assert y.shape == (4, 32, 64)
    assert send.cache.get(0).gen == 4 and send.cache.get(2).gen == 3
