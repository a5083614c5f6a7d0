"""Real federated rounds: controller, combiners and clients as processes talking through TLS switch servers."""
from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest

from nebula.cli import main
from nebula.federated.controller.trail import ModelTrail
from testbed.fedjob import federation, start_client, start_clients, start_cluster, wait_exit, write_job
from testbed.federation import wait_until


def test_rounds_through_switches_learn_reject_bad_updates_and_keep_the_trail(procs, tmp_path, capsys):
    workers = federation(procs, tmp_path)
    job = write_job(tmp_path, workers, {"A": 2, "B": 2}, rounds=3, validity={"min_updates": 2},
                    client={"factory": "testbed.toy_client:make_client",
                            "args": {"behaviours": {"B/1": "nan", "A/1": "shape"}}})
    ctl_a = start_cluster(procs, job, "A")
    comb_b = start_cluster(procs, job, "B")
    clients = [start_clients(procs, job, c) for c in "AB"]
    out = wait_exit(ctl_a, 120)
    wait_exit(comb_b, 30)
    for c in clients:
        wait_exit(c, 30)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        models = t.models()
        rounds = t.rounds()
        assert [m.version for m in models] == [1, 2, 3, 4], out
        assert [m.parent for m in models] == [None, 1, 2, 3]
        assert all(r.status == "valid" and r.num_updates == 2 for r in rounds)
        assert models[-1].clients == ["A/2", "B/2"]
        reasons = {r["client"]: r["reason"] for r in rounds[0].rejected}
        assert "NaN or Inf" in reasons["B/3"] and "has shape (5, 3), expected (4, 3)" in reasons["A/3"]
        # learning: the clients' evaluation of each round's global model improves
        assert models[-1].metrics["parent_accuracy"] > models[1].metrics["parent_accuracy"] + 0.2
        w, _ = t.load(4)
        assert np.isfinite(w["w"]).all()
    audit = [json.loads(line) for line in (tmp_path / "fl" / "combiner-B" / "audit.log").read_text().splitlines()]
    assert any(r["action"] == "fl.update" and r["outcome"] == "refused" and r["target"] == "B/3" for r in audit)
    # the CLI reads the same trail
    def cli(*argv):
        code = main(["fl", *argv])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, _ = cli("status", str(job), "--json")
    status = json.loads(out)
    assert code == 0 and status["state"] == "finished" and status["head"]["version"] == 4
    code, out, _ = cli("rounds", str(job))
    assert "B/3: 'w' holds NaN or Inf" in out and out.count(" valid ") == 3
    assert cli("models", str(job), "--export", "3", "--out", str(tmp_path / "v3.npz"))[0] == 0
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        np.testing.assert_array_equal(np.load(tmp_path / "v3.npz")["w"], t.load(3)[0]["w"])
    code, _, err = cli("models", str(job), "--export", "9", "--out", str(tmp_path / "x.npz"))
    assert code == 2 and "no model version 9" in err


def _audited(tmp_path, cluster: str, outcome: str) -> bool:
    log = tmp_path / "fl" / f"combiner-{cluster}" / "audit.log"
    return log.exists() and f'"outcome":"{outcome}"' in log.read_text()


def _versions(tmp_path) -> int:
    db = tmp_path / "fl" / "trail" / "trail.db"
    if not db.exists():
        return 0
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        return len(t.models())


def _kill(p) -> None:
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(10)


@pytest.mark.slow
def test_client_killed_mid_round_the_round_goes_on_and_it_is_not_asked_again(procs, tmp_path):
    workers = federation(procs, tmp_path)
    job = write_job(tmp_path, workers, {"A": 2, "B": 2}, rounds=2, deadline_s=3,
                    client={"factory": "testbed.toy_client:make_client", "args": {"sleep_s": {"B/1": 30}}})
    ctl = start_cluster(procs, job, "A")
    comb_b = start_cluster(procs, job, "B")
    clients = {f"{c}/{i}": start_client(procs, job, c, i) for c in "AB" for i in range(2)}
    wait_until(lambda: _audited(tmp_path, "B", "accepted"), 60, "the first round's updates")
    _kill(clients.pop("B/1"))  # in the middle of its fit
    wait_exit(ctl, 60)
    wait_exit(comb_b, 30)
    for c in clients.values():
        wait_exit(c, 30)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        r1, r2 = t.rounds()
        assert r1.status == r2.status == "valid"
        assert r1.num_updates == 3 and r1.detail["missing"] == ["B/3"]
        assert "B/3" not in sum(r2.detail["assignment"].values(), []) and r2.num_updates == 3


@pytest.mark.slow
def test_late_updates_are_never_averaged_in_sync_mode(procs, tmp_path):
    workers = federation(procs, tmp_path)
    job = write_job(tmp_path, workers, {"A": 2, "B": 1}, rounds=3, deadline_s=2,
                    client={"factory": "testbed.toy_client:make_client",
                            "args": {"sleep_s": {"A/0": 1.0, "B/0": 1.0, "A/1": 3.5}}})  # A/1 well past the deadline
    ctl = start_cluster(procs, job, "A")
    comb_b = start_cluster(procs, job, "B")
    clients = [start_client(procs, job, c, i) for c, n in (("A", 2), ("B", 1)) for i in range(n)]
    wait_exit(ctl, 90)
    wait_exit(comb_b, 30)
    for c in clients:
        wait_exit(c, 30)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        assert all("A/3" not in m.clients for m in t.models()[1:])  # [0]: the initial model, from any client
        late = [r for rd in t.rounds() for r in rd.rejected if r["client"] == "A/3"]
        assert late and all(r["reason"].startswith("late") for r in late)
        assert all(rd.status == "valid" for rd in t.rounds())
    audit = (tmp_path / "fl" / "combiner-A" / "audit.log").read_text()
    assert '"outcome":"refused"' in audit and "late" in audit


@pytest.mark.slow
def test_combiner_killed_mid_round_ends_the_round_and_its_clients_are_reassigned(procs, tmp_path):
    workers = federation(procs, tmp_path)
    deadline = 4
    job = write_job(tmp_path, workers, {"A": 1, "B": 2}, rounds=2, deadline_s=deadline,
                    client={"factory": "testbed.toy_client:make_client",
                            "args": {"sleep_s": {"B/0": 1.5, "B/1": 1.5}}})
    ctl = start_cluster(procs, job, "A")
    comb_b = start_cluster(procs, job, "B")
    clients = [start_client(procs, job, c, i) for c, n in (("A", 1), ("B", 2)) for i in range(n)]
    wait_until(lambda: _audited(tmp_path, "A", "accepted"), 60, "round 1 under way")
    _kill(comb_b)
    wait_exit(ctl, 60)
    for c in clients:
        wait_exit(c, 30)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        r1, r2 = t.rounds()
        assert r1.detail["lost_combiners"] == ["B/1"] and r1.status == "valid" and r1.num_updates == 1
        assert r1.duration_s < deadline + 5
        assert r2.detail["assignment"] == {"A/1": ["A/2", "B/2", "B/3"]}
        assert r2.status == "valid" and r2.num_updates == 3


@pytest.mark.slow
def test_controller_killed_and_restarted_resumes_from_the_trail(procs, tmp_path):
    workers = federation(procs, tmp_path)
    job = write_job(tmp_path, workers, {"A": 1, "B": 1}, rounds=4, deadline_s=10,
                    client={"factory": "testbed.toy_client:make_client",
                            "args": {"sleep_s": {"A/0": 0.5, "B/0": 0.5}}})
    ctl = start_cluster(procs, job, "A", role="controller")
    combs = [start_cluster(procs, job, c, role="combiner") for c in "AB"]
    clients = [start_client(procs, job, c, 0) for c in "AB"]
    wait_until(lambda: _versions(tmp_path) >= 3, 60, "two rounds committed")
    _kill(ctl)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        before = len(t.models())
    ctl = start_cluster(procs, job, "A", role="controller")
    wait_exit(ctl, 90)
    for p in combs + clients:
        wait_exit(p, 30)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        models = t.models()
        assert [m.parent for m in models] == [None] + [m.version for m in models[:-1]]
        assert [m.round for m in models] == [0, 1, 2, 3, 4][: len(models)] and models[-1].round == 4
        assert len(models) == 5 and before >= 3
        assert [r.round for r in t.rounds()] == [1, 2, 3, 4]


@pytest.mark.parametrize("strategy,options", [("fedasync", {"alpha": 0.6, "staleness": "polynomial"}),
                                              pytest.param("fedbuff", {"buffer_size": 2}, marks=pytest.mark.slow)])
def test_async_strategies_apply_updates_as_they_come_weighted_by_staleness(procs, tmp_path, strategy, options):
    workers = federation(procs, tmp_path)
    job = write_job(tmp_path, workers, {"A": 1, "B": 2}, rounds=5, deadline_s=20,
                    strategy={"name": strategy, "options": options},
                    client={"factory": "testbed.toy_client:make_client",
                            "args": {"sleep_s": {"B/1": 0.6}, "behaviours": {"B/0": "nan"}}})
    ctl = start_cluster(procs, job, "A")
    comb_b = start_cluster(procs, job, "B")
    clients = [start_clients(procs, job, c) for c in "AB"]
    wait_exit(ctl, 90)
    wait_exit(comb_b, 30)
    for c in clients:
        wait_exit(c, 30)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        models = t.models()
        assert [m.round for m in models] == [0, 1, 2, 3, 4, 5]
        # its NaN updates never reach the reducer (models[0] is the initial model, whose clients name the one that
        # supplied the starting parameters, any of them)
        assert all("B/2" not in m.clients for m in models[1:])
        per_step = [len(m.clients) for m in models[1:]]
        assert per_step == ([1] * 5 if strategy == "fedasync" else [2] * 5)
        # the slow client trains from older versions while the fast one moves the model on
        assert any(m.metrics["max_staleness"] > 0 for m in models[1:])
        first, last = t.load(1)[0], t.load(6)[0]
        assert np.abs(last["w"] - first["w"]).sum() > 0.1
    audit = (tmp_path / "fl" / "combiner-B" / "audit.log").read_text()
    assert "NaN or Inf" in audit


@pytest.mark.slow
def test_a_client_that_crashes_and_restarts_rejoins_on_fresh_channels(procs, tmp_path):
    workers = federation(procs, tmp_path)
    job = write_job(tmp_path, workers, {"A": 1, "B": 1}, rounds=6, deadline_s=3,
                    client={"factory": "testbed.toy_client:make_client",
                            "args": {"sleep_s": {"A/0": 0.8, "B/0": 0.8}}})
    ctl = start_cluster(procs, job, "A")
    comb_b = start_cluster(procs, job, "B")
    a0 = start_client(procs, job, "A", 0)
    b0 = start_client(procs, job, "B", 0)
    wait_until(lambda: _audited(tmp_path, "B", "accepted"), 60, "round 1 from B/2")
    _kill(b0)
    restarted = time.time()
    b0 = start_client(procs, job, "B", 0)  # the same rank again: a new incarnation
    wait_exit(ctl, 90)
    for p in (comb_b, a0, b0):
        wait_exit(p, 30)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        models = t.models()
        assert all(r.status == "valid" for r in t.rounds())
        assert "B/2" in models[1].clients  # before the crash
        # and after it (the switch holds the killed process's rank a few seconds, so not necessarily next round)
        assert any("B/2" in m.clients for m in models if m.created > restarted), [(m.round, m.clients) for m in models]
    assert (tmp_path / "fl" / "clients" / "B-0.incarnation").read_text() == "1"
