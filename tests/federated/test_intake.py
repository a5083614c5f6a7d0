"""Updates taken in streaming at a combiner (spooled when large, refused whole when bad) and compressed updates with
error feedback, through real switch servers."""
from __future__ import annotations

import math

import numpy as np
import pytest

from nebula.channel import Endpoint
from nebula.compress import encode_to_frames
from nebula.config.schema import ConfigError
from nebula.mean import RunningMean
from nebula.federated.config import load_federated_job
from nebula.federated.intake import GlobalModel, Refused, UpdateEncoder, change_sumsq, receive_update
from nebula.federated.messages import ClientUpdate
from nebula.federated.controller.trail import ModelTrail
from nebula.federated.transport import ActorMessenger
from nebula.messaging import Peer, piece_plan, tensor_specs
from testbed.fedjob import federation, run_job, write_job

PIECE = 4096


@pytest.fixture
def pair(procs, tmp_path):
    """A combiner-side and a client-side mailbox of one job on a real switch."""
    w = federation(procs, tmp_path, clusters=("A",))["A"]
    eps = [Endpoint.connect(w, job="intake", rank=r, timeout_s=30) for r in (1, 2)]
    yield ActorMessenger(eps[0], PIECE), ActorMessenger(eps[1], PIECE)
    for ep in eps:
        ep.close(flush_s=1)


def _send(mb: ActorMessenger, weights: dict, **extra) -> dict:
    head = mb.model_header(ClientUpdate(**extra), weights)
    mb.send_pieces(Peer("A", 1), weights)
    return head


def test_a_large_update_is_spooled_and_folded_piece_by_piece(pair, tmp_path):
    comb, cli = pair
    rng = np.random.default_rng(0)
    w = {"a": rng.normal(size=(3000,)).astype(np.float32), "b": rng.normal(size=(5, 7)).astype(np.float32)}
    head = _send(cli, w)
    upd = receive_update(comb, Peer("A", 2), head, 10, codec="none", spool_dir=tmp_path, spool_over=0)
    assert upd.held is None and upd.spool is not None  # waited on disk, not in memory
    assert upd.nbytes == sum(v.nbytes for v in w.values())
    mean = RunningMean(w)
    mean.begin(3)
    for k, off, v in upd.pieces():
        mean.add_part(k, v, off)
    upd.close()
    for k in w:
        np.testing.assert_array_equal(mean.result()[k], w[k])


def test_a_bad_last_piece_refuses_the_whole_update_and_the_channel_stays_in_step(pair, tmp_path):
    comb, cli = pair
    w = {"a": np.ones(3000, np.float32)}
    w["a"][-1] = np.nan  # in the last of three pieces
    head = _send(cli, w)
    with pytest.raises(Refused, match="'a' holds NaN or Inf"):
        receive_update(comb, Peer("A", 2), head, 10, codec="none", spool_dir=tmp_path, spool_over=0)
    good = {"a": np.full(3000, 2.0, np.float32)}
    head = _send(cli, good)
    upd = receive_update(comb, Peer("A", 2), head, 10, codec="none", spool_dir=tmp_path)
    assert [float(v[0]) for _, _, v in upd.pieces()] == [2.0, 2.0, 2.0]


def test_change_norms_match_float64_and_keep_nan_inf_and_overflow_apart():
    rng = np.random.default_rng(1)
    base = rng.normal(size=100_003).astype(np.float32)
    vals = (base + rng.normal(scale=1e-3, size=base.size)).astype(np.float32)
    exact = math.fsum((float(v) - float(b)) ** 2 for v, b in zip(vals.tolist(), base.tolist()))
    assert change_sumsq(vals, base) == pytest.approx(exact, rel=1e-6)
    assert change_sumsq(vals - base, None) == pytest.approx(exact, rel=1e-6)
    assert change_sumsq(np.arange(5, dtype=np.int64), None) == 30.0  # other dtypes: summed in float64
    huge = np.full(10, 1e20, np.float32)  # finite, but its float32 squares overflow: that block is redone in float64
    assert change_sumsq(huge, None) == pytest.approx(10 * float(np.float32(1e20)) ** 2, rel=1e-6)
    for bad in (np.nan, np.inf, -np.inf):
        v = vals.copy()
        v[77_777] = bad
        assert not math.isfinite(change_sumsq(v, base))


def test_nan_is_refused_when_the_change_is_measured_and_huge_finite_values_are_not(pair, tmp_path):
    """With the global model at hand the norm pass stands in for the NaN/Inf scan: a NaN is still refused, and
    finite values whose float32 squares overflow are measured (in float64), not mistaken for Inf."""
    comb, cli = pair
    base = GlobalModel({"a": np.zeros(3000, np.float32)}, tmp_path)
    w = {"a": np.ones(3000, np.float32)}
    w["a"][2500] = np.nan
    with pytest.raises(Refused, match="'a' holds NaN or Inf"):
        receive_update(comb, Peer("A", 2), _send(cli, w), 10, codec="none", spool_dir=tmp_path, base=base)
    w = {"a": np.full(3000, 1e20, np.float32)}
    upd = receive_update(comb, Peer("A", 2), _send(cli, w), 10, codec="none", spool_dir=tmp_path, base=base)
    assert upd.norm == pytest.approx(math.sqrt(3000) * float(np.float32(1e20)), rel=1e-6)
    upd.close()


def test_compressed_pieces_decode_to_the_change_and_a_wrong_codec_is_refused(pair, tmp_path):
    comb, cli = pair
    rng = np.random.default_rng(1)
    base = {"a": rng.normal(size=(3000,)).astype(np.float32)}
    new = {"a": base["a"] + rng.normal(size=(3000,)).astype(np.float32)}
    enc = UpdateEncoder("fp16", PIECE)
    head = cli.model_header(ClientUpdate(codec="fp16"), new)
    sent = 0
    for frames in enc.frames(new, base):
        cli.send_parts(Peer("A", 1), frames)
        sent += sum(len(memoryview(f).cast("B")) for f in frames)
    upd = receive_update(comb, Peer("A", 2), head, 10, codec="fp16", spool_dir=tmp_path)
    got = np.concatenate([v for _, _, v in upd.pieces()])
    np.testing.assert_allclose(got, new["a"] - base["a"], rtol=1e-3, atol=1e-3)
    assert upd.nbytes == sent < new["a"].nbytes * 0.6  # half the bytes, plus one small header per piece
    with pytest.raises(Refused, match="update_codec is 'int8'"):
        receive_update(comb, Peer("A", 2), head, 10, codec="int8", spool_dir=tmp_path)


def test_error_feedback_carries_each_pieces_residual_across_rounds():
    from nebula.compress import decode_from_frames

    rng = np.random.default_rng(2)
    base = {"a": np.zeros(3000, np.float32)}
    x = {"a": rng.normal(size=(3000,)).astype(np.float32)}
    err = {}
    for spec in ("topk(0.05)", "ef(topk(0.05))"):
        enc = UpdateEncoder(spec, PIECE)
        total = np.zeros(3000, np.float64)
        for _ in range(400):  # the same change every round, sent 5% at a time
            total += np.concatenate([decode_from_frames(f) for f in enc.frames(x, base)])
        err[spec] = np.linalg.norm(total / 400 - x["a"]) / np.linalg.norm(x["a"])
    # without feedback the other 95% never arrive; with it (one residual per piece) the sum catches up
    assert err["topk(0.05)"] > 0.5 and err["ef(topk(0.05))"] < 0.1, err
    assert len(enc.codecs) == 3


def test_update_codec_is_checked_when_the_job_is_loaded(tmp_path):
    job = write_job(tmp_path, {"A": tmp_path / "w.yaml"}, {"A": 1}, update_codec="ef(topk(0.1))")
    assert load_federated_job(job).update_codec == "ef(topk(0.1))"
    with pytest.raises(ConfigError, match="update_codec='zip' is not a valid codec spec: unknown codec 'zip'"):
        load_federated_job(write_job(tmp_path, {"A": tmp_path / "w.yaml"}, {"A": 1}, update_codec="zip"))
    with pytest.raises(ConfigError, match="needs a synchronous strategy"):
        load_federated_job(write_job(tmp_path, {"A": tmp_path / "w.yaml"}, {"A": 1}, update_codec="fp16",
                                     strategy={"name": "fedasync", "options": {}}))


def _wire_bytes(codec: str, weights: dict) -> int:
    """Bytes of one update encoded piece by piece with `codec` (as a client sends it)."""
    return sum(sum(len(memoryview(f).cast("B")) for f in encode_to_frames(codec, np.ones(c, np.float32) * 0.5))
               for _, _, c in piece_plan(tensor_specs(weights), 4 * 1024 * 1024))


def test_compressed_updates_with_error_feedback_learn_through_switches_on_fewer_bytes(procs, tmp_path):
    workers = federation(procs, tmp_path, clusters=("A",))
    dim = 256
    job = write_job(tmp_path, workers, {"A": 3}, rounds=4, update_codec="ef(topk(0.1))",
                    client={"factory": "testbed.toy_client:make_client", "args": {"dim": dim}})
    out = run_job(procs, job, clusters=("A",), timeout_s=180)
    like = {"w": np.zeros((dim, 3), np.float32), "b": np.zeros(3, np.float32)}
    raw = sum(v.nbytes for v in like.values())
    expected = _wire_bytes("topk(0.1)", like)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        models, rounds = t.models(), t.rounds()
    assert [r.status for r in rounds] == ["valid"] * 4 and all(r.num_updates == 3 for r in rounds), out
    for r in rounds:  # what crossed the wire: the encoded pieces, as the codec sizes them
        assert r.detail["update_bytes"] == pytest.approx(3 * expected, rel=0.02)
    assert expected < raw / 3  # 10% of the values with their indices (8 bytes each), plus each piece's header
    # it learns: the clients' evaluation of the global model improves round after round
    assert models[-1].metrics["parent_accuracy"] > models[1].metrics["parent_accuracy"] + 0.2, out
