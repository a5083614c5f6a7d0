"""Error feedback's state leaves the codec and comes back: `export_state` / `import_state` of `ef(...)`, the keys
they use, the checks on the way in, and the per-tensor codec state a data-parallel leader packs into its checkpoint
(`nebula.dataparallel.allmean.pack_codec_state` / `unpack_codec_state`)."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.compress import CodecError, decode_encoded, get_codec
from nebula.compress.feedback import check_state, parse_residual_key, residual_key
from nebula.dataparallel.allmean import CODEC_KEY, pack_codec_state, unpack_codec_state


def _stream(n: int, shape=(6, 40), seed=0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def test_a_codec_given_another_ones_exported_state_encodes_exactly_as_it_goes_on():
    xs = _stream(6)
    a = get_codec("ef(int4_block)")
    for x in xs[:3]:
        a.encode(x)
    a.encode(np.linspace(-1, 1, 70, dtype=np.float32))  # a second shape: its own residual
    state = a.export_state()
    assert sorted(state) == ["residual:numpy:float32:6,40", "residual:numpy:float32:70"]
    assert all(v.dtype == np.float32 for v in state.values())
    b = get_codec("ef(int4_block)")
    b.import_state(state)
    fresh = get_codec("ef(int4_block)")
    for x in xs[3:]:
        want = decode_encoded(a.encode(x))
        np.testing.assert_array_equal(decode_encoded(b.encode(x)), want)
        assert not np.array_equal(decode_encoded(fresh.encode(x)), want)  # without the state the encodings differ
    state["residual:numpy:float32:6,40"][:] = 7.0  # the export is a copy: the codec's residual is untouched
    assert not np.array_equal(a.residual((6, 40)), state["residual:numpy:float32:6,40"])


def test_residual_keys_round_trip_and_malformed_ones_are_refused():
    for shape in [(), (5,), (2, 3, 4)]:
        assert parse_residual_key(residual_key(shape, "float64", "paddle")) == (shape, "float64", "paddle")
    assert "/" not in residual_key((2, 3), "float32", "numpy")
    for bad in ["residual:numpy:int8:3", "residual:gpu:float32:3", "residual:numpy:float32:3x4", "res:numpy:float32:3",
                "residual:numpy:float32:-1"]:
        with pytest.raises(ValueError):
            parse_residual_key(bad)


def test_import_refuses_a_residual_of_the_wrong_shape_in_one_line_naming_the_tensor_and_keeps_its_own():
    a = get_codec("ef(int8)")
    x = _stream(1, shape=(4, 5))[0]
    a.encode(x)
    kept = a.residual((4, 5)).copy()
    with pytest.raises(CodecError, match=r"tensor 'w': residual of shape \(4, 5\) but the tensor has shape \(5, 4\)") \
            as err:
        get_codec("ef(int8)").import_state(a.export_state(), shape=(5, 4), name="tensor 'w'")
    assert "\n" not in str(err.value)
    with pytest.raises(CodecError, match=r"holds a float32 array of shape \(3,\), not the float32 \(4, 5\)"):
        a.import_state({"residual:numpy:float32:4,5": np.zeros(3, np.float32)})
    with pytest.raises(CodecError, match="NaN or Inf"):
        a.import_state({"residual:numpy:float32:4,5": np.full((4, 5), np.nan, np.float32)})
    with pytest.raises(CodecError, match="written by another version"):
        a.import_state({"residual/4,5": np.zeros((4, 5), np.float32)})
    np.testing.assert_array_equal(a.residual((4, 5)), kept)  # a refused import changes nothing
    assert set(check_state(a.export_state(), shape=(4, 5))) == {((4, 5), "float32", "numpy")}


def test_a_leaders_codec_state_round_trips_per_tensor_and_names_what_does_not_fit():
    spec = "ef(int4_block)"
    shapes = {"fragment/0": (30,), "fragment/1": (31,)}  # streaming's names hold a '/'
    codecs = {name: get_codec(spec) for name in shapes}
    for name, c in codecs.items():
        c.encode(_stream(1, shape=shapes[name], seed=len(name))[0])
    flat = pack_codec_state(spec, codecs)
    assert str(flat[CODEC_KEY]) == spec and "codec/fragment/1/residual:numpy:float32:31" in flat
    back, note = unpack_codec_state(flat, spec, shapes)
    assert note is None and sorted(back) == sorted(shapes)
    for name in shapes:
        np.testing.assert_array_equal(back[name].residual(shapes[name]), codecs[name].residual(shapes[name]))
    with pytest.raises(ValueError, match=r"tensor 'fragment/1': residual of shape \(31,\) but the tensor has shape "
                                         r"\(32,\)"):
        unpack_codec_state(flat, spec, {"fragment/0": (30,), "fragment/1": (32,)})
    with pytest.raises(ValueError, match=r"names tensors \['fragment/1'\] that this job does not send"):
        unpack_codec_state(flat, spec, {"fragment/0": (30,)})
    # a stateless codec packs its spec alone; before any mean the state is empty but says it was kept
    assert pack_codec_state("int8", {"w": get_codec("int8")}) == {CODEC_KEY: np.array("int8")}
    assert unpack_codec_state(pack_codec_state(spec, {}), spec, shapes) == ({}, None)


def test_a_checkpoint_without_codec_state_starts_from_zero_and_says_so_for_a_stateful_codec_only():
    codecs, note = unpack_codec_state({"last_sync": np.array(4)}, "ef(int8)", {"w": (3,)})
    assert codecs == {} and "holds no outer codec state" in note and "ef(int8)" in note and "\n" not in note
    assert unpack_codec_state({"last_sync": np.array(4)}, "int8", {"w": (3,)}) == ({}, None)
    other = pack_codec_state("ef(int8)", {"w": get_codec("ef(int8)")})
    other["codec/w/residual:numpy:float32:3"] = np.zeros(3, np.float32)
    codecs, note = unpack_codec_state(other, "ef(fp4)", {"w": (3,)})
    assert codecs == {} and "for ef(int8) and this job sends with ef(fp4)" in note


# -- the inner codec's state: low-rank warm starts (and their generator) ride along with the residuals -------------
LOWRANK = ["ef(lowrank(rank=4))", "ef(fp16(lowrank(energy=0.6)))", "lowrank(rank=3, power=1)"]


def _resumed_and_uninterrupted(spec: str, state_of=lambda c: c.export_state(), n: int = 8):
    """(decoded tensors of a codec run through `n` steps, those of one resumed after step n/2 from `state_of` it)."""
    xs = [x + 0.5 * np.outer(np.arange(48), np.ones(64, np.float32)) for x in _stream(n, shape=(48, 64), seed=3)]
    a = get_codec(spec)
    for x in xs[: n // 2]:
        a.encode(x)
    b = get_codec(spec)
    b.import_state(state_of(a), shape=(48, 64), name="tensor 'w'")
    pairs = [(decode_encoded(a.encode(x)), decode_encoded(b.encode(x))) for x in xs[n // 2:]]
    return [p for p, _ in pairs], [q for _, q in pairs]


@pytest.mark.parametrize("spec", LOWRANK)
def test_a_low_rank_codec_resumed_from_its_exported_state_encodes_exactly_as_the_uninterrupted_one(spec):
    want, got = _resumed_and_uninterrupted(spec)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    state = get_codec(spec).export_state()  # before any tensor: the generator's position alone
    assert [k.rpartition(".")[2] for k in state] == ["rng"] and all("/" not in k for k in state)


def test_without_the_warm_starts_a_resumed_ef_lowrank_differs_and_old_residual_only_state_still_loads():
    spec = "ef(lowrank(rank=4))"
    want, got = _resumed_and_uninterrupted(spec, lambda c: {k: v for k, v in c.export_state().items()
                                                            if k.startswith("residual:")})
    assert not np.array_equal(got[0], want[0])  # cold warm start: what the state now carries matters
    a = get_codec(spec)
    a.encode(_stream(1, shape=(48, 64))[0])
    assert sorted(a.export_state()) == ["inner.rank:numpy:float32:64", "inner.rng", "inner.warm:numpy:float32:64",
                                        "residual:numpy:float32:48,64"]


def test_a_bad_inner_state_is_refused_in_one_line_naming_the_tensor_and_the_codec_keeps_all_its_state():
    spec = "ef(lowrank(rank=4))"
    a = get_codec(spec)
    for x in _stream(3, shape=(48, 64)):
        a.encode(x)
    kept = a.export_state()
    bad = {**kept, "inner.warm:numpy:float32:64": np.zeros((64, 12), np.float64)}
    fresh = get_codec(spec)
    cases = [
        (bad, r"low-rank warm start of tensor 'w': start block 'numpy:float32:64' is a float64 array"),
        ({**kept, "inner.rng": np.zeros(5, np.uint64)}, r"tensor 'w': its generator position .* shape \(5,\)"),
        ({k: v for k, v in kept.items() if k != "inner.rank:numpy:float32:64"}, "start block or a rank but not both"),
        ({**kept, "inner.basis": np.zeros(3, np.float32)}, "key 'basis' is not rng, warm:... or rank:...; it was "
                                                          "written by another version"),
    ]
    for state, match in cases:
        with pytest.raises(CodecError, match=match) as err:
            a.import_state(state, shape=(48, 64), name="tensor 'w'")
        assert "\n" not in str(err.value)
    with pytest.raises(CodecError, match=r"tensor 'w': saved for matrices of 64 columns but the tensor has shape "
                                         r"\(64, 48\); it was saved for another model"):
        fresh.import_state({k: v for k, v in kept.items() if k.startswith("inner.")}, shape=(64, 48),
                           name="tensor 'w'")
    after = a.export_state()  # every refusal above left the residuals and the warm start as they were
    assert sorted(after) == sorted(kept)
    for k in kept:
        np.testing.assert_array_equal(after[k], kept[k])
    assert fresh.export_state().keys() == {"inner.rng"}
    with pytest.raises(CodecError, match="int8 keeps no state but got .*saved with another codec"):
        get_codec("int8").import_state({"rng": np.zeros(6, np.uint64)}, name="tensor 'w'")
    assert get_codec("int8").export_state() == {} and not get_codec("fp16(int8)").stateful
    assert get_codec("fp16(lowrank(rank=2))").stateful and get_codec("ef(int8)").stateful


def test_a_leaders_ef_lowrank_codecs_through_a_saved_checkpoint_file_compute_what_the_uninterrupted_leader_does(
        tmp_path):
    """Two leaders' codecs per tensor (the 2-D weight takes the sketch with its warm start, the bias the exact
    path), each mean decoded and averaged as `ClusterMean` does; after mean 3 leader A's state goes through an
    .npz file (as in its checkpoint) into new codecs, which then send the same bytes as the uninterrupted ones."""
    from nebula.compress import decode_from_frames, encode_to_frames

    spec = "ef(lowrank(rank=4))"
    shapes = {"layer/w": (40, 64), "layer/b": (64,)}
    rng = np.random.default_rng(7)
    grads = [{k: (rng.standard_normal(s) + np.arange(s[-1]) / 8).astype(np.float32) for k, s in shapes.items()}
             for _ in range(6)]

    def send(codecs, tensors):
        return {k: b"".join(bytes(f) for f in encode_to_frames(codecs.setdefault(k, get_codec(spec)), v))
                for k, v in tensors.items()}

    whole: dict = {}
    sent = [send(whole, g) for g in grads]
    resumed: dict = {}
    for g in grads[:3]:
        send(resumed, g)
    with open(tmp_path / "A.extra.npz", "wb") as f:
        np.savez(f, **pack_codec_state(spec, resumed))
    with np.load(tmp_path / "A.extra.npz", allow_pickle=False) as z:
        codecs, note = unpack_codec_state(dict(z), spec, shapes)
    assert note is None and sorted(codecs) == sorted(shapes)
    for i, g in enumerate(grads[3:], start=3):
        again = send(codecs, g)
        assert again == sent[i], f"mean {i + 1}: the resumed leader sends other bytes"
        for k in shapes:
            np.testing.assert_array_equal(decode_from_frames([again[k]], like="numpy"),
                                          decode_from_frames([sent[i][k]], like="numpy"))
