"""Error feedback's state leaves the codec and comes back: `export_state` / `import_state` of `ef(...)`, the keys
they use, the checks on the way in, and the per-tensor codec state a data-parallel leader packs into its checkpoint
(`nebula.dataparallel.allmean.pack_codec_state` / `unpack_codec_state`)."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.compress import CodecError, decode, get_codec
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
        want = decode(a.encode(x))
        np.testing.assert_array_equal(decode(b.encode(x)), want)
        assert not np.array_equal(decode(fresh.encode(x)), want)  # without the state the encodings differ
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
