"""Streaming DiLoCo in `mode: data_parallel` without switches: its settings, its schedule, its checkpointed state,
and one cluster training in this process (a checkpoint taken while a slice is in flight, the run resumed from it)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import yaml

from nebula.config.job import load_job_config
from nebula.config.schema import ConfigError
from nebula.dataparallel import OuterState, pack_state, unpack_state
from nebula.dataparallel.streaming import Fragments, flatten_f32, merge, unflatten_f32


def _job(tmp_path, clusters=({"id": "A"}, {"id": "B"}), steps=4, name="job.yaml", **extra):
    doc = {"job": "stream", "mode": "data_parallel", "recipe": {"factory": "recipes.toy:ToyRecipe"},
           "clusters": list(clusters), "train": {"steps": steps, "global_batch": 8, "micro_batches": 1, "seed": 3},
           "metrics": {"dir": "metrics", "progress": False}, **extra}
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def test_job_file_loads_streaming_settings(tmp_path):
    cfg = load_job_config(_job(tmp_path, data_parallel={
        "sync_every": 8, "outer": {"codec": "int8"}, "streaming": {"fragments": 4, "delay": 1}}))
    st = cfg.data_parallel.streaming
    assert (st.fragments, st.delay, st.merge_alpha) == (4, 1, 0.5)
    assert load_job_config(_job(tmp_path, data_parallel={"sync_every": 8})).data_parallel.streaming is None


@pytest.mark.parametrize("dp, message", [
    ({"sync_every": 4, "streaming": {"fragments": 5}},
     r"data_parallel.streaming.fragments=5 must be from 1 to data_parallel.sync_every \(4\).*lower fragments"),
    ({"sync_every": 4, "streaming": {"fragments": 0}}, r"data_parallel.streaming.fragments=0 must be >= 1"),
    ({"sync_every": 4, "streaming": {"fragments": 2, "delay": 4}},
     r"data_parallel.streaming.delay=4 must be from 0 to data_parallel.sync_every - 1 \(3\)"),
    ({"sync_every": 4, "streaming": {"delay": -1}}, r"data_parallel.streaming.delay=-1 must be >= 0"),
    ({"sync_every": 4, "streaming": {"merge_alpha": 1.5}}, r"data_parallel.streaming.merge_alpha=1.5 must be in"),
    ({"sync_every": 4, "streaming": {"fragments": 2.5}}, r"data_parallel.streaming.fragments"),
    ({"sync_every": 4, "streaming": {"chunks": 2}}, r"unknown key data_parallel.streaming.chunks"),
])
def test_bad_streaming_settings_are_refused_in_one_line_with_their_path(tmp_path, dp, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_job_config(_job(tmp_path, data_parallel=dp))
    assert "\n" not in str(err.value)


def test_each_fragment_is_sent_once_per_interval_at_the_engines_offset_and_all_after_the_last_step():
    fr = Fragments(size=103, fragments=4, sync_every=8, delay=1)
    assert list(fr.cuts) == list(np.linspace(0, 103, 5).round().astype(int))
    # nebula.quality.engine: fragment f goes after step s when (s + 1) % H == ((f + 1) * H // F) % H
    for done in range(1, 40):
        want = [f for f in range(4) if done % 8 == ((f + 1) * 8 // 4) % 8]
        assert fr.sends(done, steps=100) == want
    sent = [f for done in range(1, 17) for f in fr.sends(done, steps=100)]
    assert sorted(sent) == [0, 0, 1, 1, 2, 2, 3, 3]  # two intervals: each slice twice, one at a time
    assert fr.sends(37, steps=37) == [0, 1, 2, 3]
    assert fr.peak_fraction() == pytest.approx(26 / 103)
    with pytest.raises(ValueError, match="fragments=5 must be from 1 to sync_every"):
        Fragments(size=10, fragments=5, sync_every=4)
    with pytest.raises(ValueError, match="delay=4"):
        Fragments(size=10, fragments=2, sync_every=4, delay=4)


def test_flat_model_round_trip_and_merge():
    like = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float32)}
    flat = flatten_f32(like)
    assert flat.dtype == np.float32 and flat.size == 10
    back = unflatten_f32(flat * 2, like)
    np.testing.assert_array_equal(back["a"], like["a"] * 2)
    assert back["a"].shape == (2, 3) and list(back) == ["a", "b"]
    r, o = np.array([1.0, 3.0], np.float32), np.array([3.0, 5.0], np.float32)
    np.testing.assert_array_equal(merge(r, o, 0.5), [2.0, 4.0])
    np.testing.assert_array_equal(merge(r, o, 0.0), o)
    with pytest.raises(ValueError, match="does not fit"):
        unflatten_f32(flat[:9], like)


def test_streaming_outer_state_round_trips_and_plain_state_stays_as_it_was():
    model = {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    fb = {0: np.full(4, 0.5, np.float32), 1: np.full(5, -1.0, np.float32)}
    got = unpack_state(pack_state(OuterState(model, None, 7, fb, ((1, 9),))), model)
    assert got.pending == ((1, 9),) and got.last_sync == 7 and got.buf is None
    assert sorted(got.fragment_bufs) == [0, 1]
    np.testing.assert_array_equal(got.fragment_bufs[1], fb[1])
    fresh = unpack_state(pack_state(OuterState(model, None, 0, {})), model)  # before any outer step
    assert fresh.fragment_bufs == {} and fresh.pending == ()
    plain = unpack_state(pack_state(OuterState(model, None, 4)), model)
    assert plain.fragment_bufs is None and plain.pending == ()


def _final(tmp, steps):
    import paddle

    out = {}
    for f in sorted((tmp / "ckpt" / "A").glob(f"step_{steps:08d}/*/model.pdparams")):
        out.update({f"{f.parent.name}.{k}": v.numpy() for k, v in paddle.load(str(f)).items()})
    assert out
    return out


def test_one_cluster_resumes_from_a_checkpoint_taken_while_a_slice_was_in_flight(tmp_path):
    """H 4, F 2, delay 1: a slice leaves after steps 2, 4, 6, ... and merges a step later; of the checkpoints every
    3 steps, those after steps 6 and 12 are taken while the slice just sent is in flight. They change nothing, and
    the run restarted from step 6 ends with the weights of the straight one."""
    from nebula.modes import run

    dp = {"sync_every": 4, "outer": {"algorithm": "diloco", "lr": 0.7, "momentum": 0.9},
          "streaming": {"fragments": 2, "delay": 1}}
    steps = 13
    (tmp_path / "straight").mkdir()
    straight = load_job_config(_job(tmp_path / "straight", clusters=[{"id": "A"}], steps=steps, data_parallel=dp,
                                    checkpoint={"dir": "ckpt"}))
    ref = run(straight, "A")
    (tmp_path / "ck").mkdir()
    job = _job(tmp_path / "ck", clusters=[{"id": "A"}], steps=steps, data_parallel=dp,
               checkpoint={"dir": "ckpt", "every": 3, "keep": 10})
    first = run(load_job_config(job), "A")
    from nebula.pipeline import read_metrics

    recs = read_metrics(tmp_path / "straight" / "metrics" / "A.rank0.jsonl")
    assert [(r["step"] + 1, r["fragments_sent"]) for r in recs if r["synced"]] == \
        [(2, [0]), (4, [1]), (6, [0]), (8, [1]), (10, [0]), (12, [1]), (13, [0, 1])]
    assert [(r["step"] + 1, r["fragments_merged"]) for r in recs if r["fragments_merged"]] == \
        [(3, [0]), (5, [1]), (7, [0]), (9, [1]), (11, [0]), (13, [0, 1])]
    assert first.losses == ref.losses  # draining the slices in flight at a checkpoint changes nothing
    for k, v in _final(tmp_path / "straight", steps).items():
        np.testing.assert_array_equal(_final(tmp_path / "ck", steps)[k], v)
    from nebula.pipeline import checkpoint as ckpt

    extra = ckpt.load_extra(ckpt.step_dir(tmp_path / "ck" / "ckpt" / "A", 6), "A")
    assert extra["pending"].tolist() == [[0, 7]]  # slice 0, sent after step 6, merges after step 7
    for s in (9, 12, 13):  # the run stopped after step 6: restarted, it resumes there
        shutil.rmtree(ckpt.step_dir(tmp_path / "ck" / "ckpt" / "A", s))
    again = run(load_job_config(job), "A")
    assert again.start_step == 6
    assert {s: again.losses[s] for s in range(6, steps)} == {s: ref.losses[s] for s in range(6, steps)}
    for k, v in _final(tmp_path / "straight", steps).items():
        np.testing.assert_array_equal(_final(tmp_path / "ck", steps)[k], v)
    plain = _job(tmp_path / "ck", clusters=[{"id": "A"}], steps=steps + 1, name="plain.yaml",
                 data_parallel={"sync_every": 4}, checkpoint={"dir": "ckpt"})
    with pytest.raises(ConfigError, match="written with data_parallel.streaming and this job has none"):
        run(load_job_config(plain), "A")
