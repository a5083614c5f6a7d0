"""Secure aggregation end to end: controller, combiners and clients as processes talking through TLS switch servers.
Each combiner learns only its clients' sum; the reducer adds the sums. Every client signs with its own certificate
(`issue_signers`, as `nebula-admin cert issue` writes them): the job file requires it."""
from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest

from nebula.channel import Endpoint
from nebula.federated.messages import ClientHello, GetParameters, Parameters, Stop, TrainTask, UpdateDropped
from nebula.federated.secagg import AdvertiseKeys
from nebula.federated.controller.trail import ModelTrail
from nebula.federated.actor_channels import FIRST_CLIENT_RANK
from nebula.federated.transport import ActorMessenger
from nebula.messaging import PUSH_BYTES, Peer
from testbed.fedjob import (federation, start_client, start_clients, start_cluster, wait_exit,
                                     write_job)
from testbed.federation import wait_until
from testbed.fedruns import SECURE, issue_signers, survivors_mean
from testbed.toy_client import make_client

def _audit(tmp_path, cluster: str, job_dir: str = "fl") -> list[dict]:
    return [json.loads(x) for x in (tmp_path / job_dir / f"combiner-{cluster}" / "audit.log").read_text().splitlines()]


def _client_audit(tmp_path, client: str) -> list[dict]:
    """The complete records of client `client`'s audit log so far (a line being written is left out)."""
    path = tmp_path / "fl" / "clients" / client / "audit.log"
    text = path.read_text() if path.exists() else ""
    return [json.loads(x) for x in text.splitlines(keepends=True) if x.endswith("\n")]


def test_secagg_fedavg_equals_plain_fedavg_within_the_stated_quantisation_bound(procs, tmp_path):
    workers = federation(procs, tmp_path)
    n = {"A": 3, "B": 3}
    issue_signers(tmp_path, workers, n)
    # the same clients, one job with and one without secure aggregation, side by side on the same switches; a
    # coarse fixed point (clip_range 1000: 2^19 steps per unit) so that the rounding is the visible difference
    jobs = [write_job(tmp_path / name, workers, n, job=name, rounds=1, validity={"min_updates": 6},
                      controller={"cluster": "A", "dir": str(tmp_path / name)}, **over)
            for name, over in (("plain", {}), ("secure", {"secure_aggregation": SECURE}))]
    started = [[start_cluster(procs, j, c) for c in "AB"] + [start_clients(procs, j, c) for c in "AB"] for j in jobs]
    out = wait_exit(started[1][0], 120)
    for p in started[0] + started[1][1:]:
        wait_exit(p, 60)
    with ModelTrail(tmp_path / "plain" / "trail") as t:
        want, _ = t.load(2)
    with ModelTrail(tmp_path / "secure" / "trail") as t:
        got, _ = t.load(2)
        (r1,) = t.rounds()
    assert r1.status == "valid" and r1.num_updates == 6 and r1.num_examples == 1200, out
    bound = r1.detail["secure"]["error_bound"]
    # the stated bound: n/(2s) on each combiner's sum of 3 (s = 2^19), times W/C = 1000/600 on its mean
    assert bound == (3 / (2 * 2.0**19)) * 1000 / 600
    for k in want:
        diff = np.abs(got[k].astype(np.float64) - want[k])
        ulp = np.spacing(np.abs(want[k]).astype(np.float32)).astype(np.float64)
        assert (diff <= bound + 4 * ulp).all(), (k, diff.max(), bound)
        assert diff.max() > 0  # the rounding is there, and bounded
    for c in "AB":
        sums = [r for r in _audit(tmp_path, c, "secure") if r["action"] == "fl.secagg"]
        assert [r["outcome"] for r in sums] == ["summed"] and len(sums[0]["detail"]["survivors"]) == 3
        # the combiner never took an update in the clear
        assert all(r["detail"].get("masked") for r in _audit(tmp_path, c, "secure") if r["action"] == "fl.update")


@pytest.mark.slow  # ~20 s of deadlines and sleeps; the same cases run fast in test_secagg (pure protocol)
def test_dropouts_mid_round_close_with_the_survivors_sum_and_a_late_client_is_refused_and_audited(procs, tmp_path):
    """Of twelve clients, two die during their training (after sharing their keys) and one sends its masked input
    after the round's deadline: a quarter drop out of round 1, which still closes with the nine survivors' sum (their
    masks and the dead clients' pairwise masks removed from the shares of the others); the late input is refused
    and audited. Round 2 goes on with those still there."""
    workers = federation(procs, tmp_path)
    issue_signers(tmp_path, workers, {"A": 7, "B": 5})
    behaviours = {"A/1": "crash", "B/3": "crash"}
    # B's clients take 4.5 s to train in every round, so round 2 (from 6 s) still runs when A/4 comes back (7.5 s)
    sleeps = {"A/4": 7.5, **{f"B/{i}": 4.5 for i in (0, 1, 2, 4)}}
    job = write_job(tmp_path, workers, {"A": 7, "B": 5}, rounds=2, deadline_s=6,
                    secure_aggregation={**SECURE, "max_dropout": 0.3},
                    client={"factory": "testbed.toy_client:make_client",
                            "args": {"behaviours": behaviours, "sleep_s": sleeps}})
    actors = [start_cluster(procs, job, c) for c in "AB"]
    crashing = [start_client(procs, job, "A", 1), start_client(procs, job, "B", 3)]
    clients = [start_clients(procs, job, "A", [0, 2, 3, 4, 5, 6]), start_clients(procs, job, "B", [0, 1, 2, 4])]
    out = wait_exit(actors[0], 120)
    wait_exit(actors[1], 30)
    for p in clients:
        wait_exit(p, 30)
    assert [p.wait(10) for p in crashing] == [3, 3]
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        r1, r2 = t.rounds()
        v2, _ = t.load(2)
    assert r1.status == "valid" and r1.num_updates == 9, out
    assert r1.detail["secure"]["dropped"] == ["A/3", "A/6", "B/5"]
    assert sorted(r1.detail["missing"]) == ["A/3", "A/6", "B/5"]
    want = survivors_mean({"A": [0, 2, 3, 5, 6], "B": [0, 1, 2, 4]})
    bound = r1.detail["secure"]["error_bound"]
    for k in want:
        ulp = np.spacing(np.abs(want[k]).astype(np.float32)).astype(np.float64)
        assert (np.abs(v2[k] - want[k]) <= bound + 4 * ulp).all(), k
    # round 2: the dead and the late are not asked again until heard from; the late one was heard from
    assert r2.status == "valid" and r2.num_updates == 9 and r2.detail["secure"]["dropped"] == []
    audit = _audit(tmp_path, "A")
    late = [r for r in audit if r["action"] == "fl.secagg" and r["outcome"] == "refused"
            and "A/6" in [r["target"], *r["detail"].get("clients", [])]]
    assert late and "late" in late[0]["detail"]["reason"], [r for r in audit if r["action"] == "fl.secagg"]
    summed = [r["detail"] for r in audit if r["action"] == "fl.secagg" and r["outcome"] == "summed"]
    assert summed[0]["dropped"] == ["A/3", "A/6"] and summed[0]["survivors"] == ["A/2", "A/4", "A/5", "A/7", "A/8"]


def test_a_client_of_a_secure_job_sends_nothing_in_the_clear_whatever_its_combiner_asks(procs, tmp_path):
    """A combiner (here the test, speaking as A's combiner rank through the real switch) that asks for an update in
    the clear, or for a secure round too small to hide anyone, gets nothing from a client whose job file sets
    secure_aggregation; a proper secure task gets its keys; a roster that does not decode, addressed to the client,
    and one with a neighbour's key substituted (signed with the cluster's worker credential, which the combiner
    holds) are refused and audited by the client."""
    from cryptography.hazmat.primitives.asymmetric import ec

    from nebula.config.worker import load_worker_config
    from nebula.federated.secagg import KeyRoster, crypto, load_signer

    workers = federation(procs, tmp_path, clusters=("A",))
    issue_signers(tmp_path, workers, {"A": 3})
    job = write_job(tmp_path, workers, {"A": 3}, secure_aggregation=SECURE)
    client = start_client(procs, job, "A", 0)
    me, model = Peer("A", 2), {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}
    ep = Endpoint.connect(workers["A"], job="fltest", rank=1, timeout_s=30)
    try:
        mb = ActorMessenger(ep, 4096, Peer("A", 0))
        got = mb.poll([me], 30)
        assert got is not None and isinstance(got[1], ClientHello)
        nonce = got[1].nonce

        def task(round_: int, **secure) -> None:
            mb.send_model(me, TrainTask(round=round_, version=1, deadline_s=5, push_bytes=PUSH_BYTES, to=nonce,
                                        **secure), model, inline=True)

        task(1)  # in the clear: refused
        task(2, session=bytes(16), cohort=("A/2", "A/3"))  # two clients cannot hide one
        task(3, session=bytes(16), cohort=("A/9", "A/3", "A/4"))  # not among them
        task(4, session=bytes(16), cohort=("A/2", "A/3", "A/4"))
        # the client serves its tasks in order on this one channel: its first answer is the proper task's keys,
        # so nothing was sent for the three before it
        keys = mb.poll([me], 30)
        assert keys is not None and isinstance(keys[1], AdvertiseKeys) and keys[1].round == 4, keys
        assert keys[1].client == "A/2"
        mb.send(me, {"type": "sa_roster", "round": 4, "keys": [{"client": 5}], "to": nonce})  # does not decode
        task(5, session=bytes(16), cohort=("A/2", "A/3", "A/4"))
        keys = mb.poll([me], 30)
        assert keys is not None and isinstance(keys[1], AdvertiseKeys) and keys[1].round == 5, keys
        k = keys[1]
        # the lying combiner: A/3's keys replaced by its own, signed with the credential it holds
        tls = load_worker_config(workers["A"]).tls
        worker = load_signer(tls.cert, tls.key)
        _, cpk = crypto.keypair()
        _, mpk = crypto.keypair()
        fake = worker.sign(b"any statement")
        assert isinstance(worker.key, ec.EllipticCurvePrivateKey)
        mb.send(me, KeyRoster(round=5, to=nonce, keys=(k, AdvertiseKeys("A/3", 5, cpk, mpk, worker.chain, fake))))
        wait_until(lambda: any(r["action"] == "fl.secagg" and r["outcome"] == "refused" and r["target"] == "5"
                               for r in _client_audit(tmp_path, "A-0")), 30, "the client to refuse the roster")
        mb.send(me, Stop(to=nonce))
        assert ep.flush(30)
    finally:
        ep.close(flush_s=1)
    out = wait_exit(client, 30)
    assert "round 1 not joined: the combiner asks for an update in the clear" in out
    assert "round 2 not joined: secure aggregation needs at least secure_aggregation.min_clients=3" in out
    assert "round 3 not joined: the round's cohort names ['A/9']" in out
    assert "the keys of 'A/3' are not vouched for by its certificate" in out
    refused = [r for r in _client_audit(tmp_path, "A-0") if r["action"] == "fl.secagg" and r["outcome"] == "refused"]
    assert [r["target"] for r in refused] == ["1", "2", "3", "4", "5"], refused
    assert "the combiner's answer to the keys of round 4 does not decode" in refused[3]["detail"]["reason"]
    assert "sa_roster.keys[0].client: expected str, got 5" in refused[3]["detail"]["reason"]
    assert "substituted key" in refused[-1]["detail"]["reason"]
    assert "spiffe://" in refused[-1]["detail"]["reason"]  # named: the certificate is not client-1's


def test_a_round_client_s_bad_keys_and_another_round_s_keys_are_refused_told_and_audited(procs, tmp_path):
    """The test speaks as client A/5 of a secure round through the real switch: its malformed public keys are
    refused (it is out of the round, told why, audited one by one with the reason) and its repeated keys of
    another round are counted and audited with theirs; the three honest clients' round still closes with their sum."""
    workers = federation(procs, tmp_path, clusters=("A",))
    issue_signers(tmp_path, workers, {"A": 4})
    job = write_job(tmp_path, workers, {"A": 4}, rounds=1, deadline_s=10, secure_aggregation=SECURE,
                    validity={"min_updates": 3}, initial_clients=3)
    actor = start_cluster(procs, job, "A")
    honest = start_clients(procs, job, "A", [0, 1, 2])
    me = Peer("A", FIRST_CLIENT_RANK + 3)
    combiner, nonce = Peer("A", 1), "f" * 16
    ep = Endpoint.connect(workers["A"], job="fltest", rank=me.rank, timeout_s=30)
    told = []
    try:
        mb = ActorMessenger(ep, 4096, Peer("A", 0))
        mb.send(combiner, ClientHello(job="fltest", num_examples=200, nonce=nonce))
        task = None
        while task is None:
            got = mb.poll([Peer("A", 0), combiner], 60)
            assert got is not None, "no task for the test's client"
            peer, msg, _ = got
            if isinstance(msg, GetParameters):  # the controller asks for an initial model: the toy client's
                c = make_client("A", 3, {})
                mb.send_model(peer, Parameters(job="fltest", run=msg.run), c.get_parameters({}))
            elif isinstance(msg, TrainTask):
                task = msg
        assert task.session is not None and str(me) in task.cohort
        mb.send(combiner, AdvertiseKeys(str(me), task.round, b"x" * 5, b"y" * 5))
        for _ in range(3):
            mb.send(combiner, AdvertiseKeys(str(me), task.round + 7, bytes(32), bytes(32)))
        end = time.monotonic() + 30
        while len(told) < 4 and time.monotonic() < end:
            got = mb.poll([combiner], 1)
            if got is not None and isinstance(got[1], UpdateDropped):
                told.append(got[1].reason)
    finally:
        ep.close(flush_s=1)
    out = wait_exit(actor, 90)
    wait_exit(honest, 30)
    assert len(told) == 4 and all("\n" not in r for r in told), told
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        (r1,) = t.rounds()
    assert r1.status == "valid" and r1.num_updates == 3, out
    refused = [r for r in _audit(tmp_path, "A") if r["action"] == "fl.secagg" and r["outcome"] == "refused"]
    first = [r for r in refused if r["target"] == str(me) and "count" not in r["detail"]]
    assert len(first) == 1 and first[0]["detail"]["round"] == task.round, refused
    assert "key" in first[0]["detail"]["reason"] and first[0]["detail"]["reason"] == told[0]
    counted = [r for r in refused if r["detail"].get("kind") == "late"]
    assert counted and counted[0]["detail"]["count"] == 3 and counted[0]["detail"]["clients"] == [str(me)], refused
    assert "round" in counted[0]["detail"]["reason"]
    summed = [r["detail"] for r in _audit(tmp_path, "A") if r["action"] == "fl.secagg" and r["outcome"] == "summed"]
    assert summed[0]["survivors"] == ["A/2", "A/3", "A/4"]


def test_a_bad_dealer_is_excluded_blamed_and_not_invited_again_while_the_honest_round_closes(procs, tmp_path):
    """The test speaks as client A/5 through the real switch, with its own certificate: it deals A/2 a share that
    is not on its signed commitments. A/2 complains with that share's key; the combiner opens the share, finds it
    off the polynomial, leaves A/5 out before any masked input and blames it (audited, never A/2); round 1 closes
    with the three honest clients' sum, and round 2 does not invite A/5."""
    from nebula.config.worker import load_worker_config
    from nebula.federated.config import load_federated_job
    from nebula.federated.secagg import (EncryptedShare, KeyRoster, SecAggClient, ShareCheck, ShareDelivery,
                                         ShareVerdict, crypto, load_signer, load_verifier, model_digest)
    from nebula.federated.secagg.client import share_aad, share_info

    workers = federation(procs, tmp_path, clusters=("A",))
    issue_signers(tmp_path, workers, {"A": 4})
    job = write_job(tmp_path, workers, {"A": 4}, rounds=2, deadline_s=10, secure_aggregation=SECURE,
                    validity={"min_updates": 3}, initial_clients=3)
    cfg = load_federated_job(job).secure_aggregation
    actor = start_cluster(procs, job, "A")
    honest = start_clients(procs, job, "A", [0, 1, 2])
    me, combiner, nonce = Peer("A", FIRST_CLIENT_RANK + 3), Peer("A", 1), "e" * 16
    kit = workers["A"].parent
    signer = load_signer(kit / "signers" / "client-3.pem", kit / "signers" / "client-3.key")
    tls = load_worker_config(workers["A"]).tls
    verifier = load_verifier(tls.ca, tls.crl, load_worker_config(workers["A"]).federation,
                             lambda c: cfg.signer_name(c, FIRST_CLIENT_RANK))
    ep = Endpoint.connect(workers["A"], job="fltest", rank=me.rank, timeout_s=30)
    tasks, verdict, victim = [], None, "A/2"
    try:
        mb = ActorMessenger(ep, 4096, Peer("A", 0))
        mb.send(combiner, ClientHello(job="fltest", num_examples=200, nonce=nonce))
        end = time.monotonic() + 90
        sa = None
        while time.monotonic() < end:
            got = mb.poll([Peer("A", 0), combiner], 1)
            if got is None:
                continue
            peer, msg, parts = got
            if isinstance(msg, GetParameters):
                c = make_client("A", 3, {})
                mb.send_model(peer, Parameters(job="fltest", run=msg.run), c.get_parameters({}))
            elif isinstance(msg, TrainTask):
                tasks.append(msg)
                model = mb.recv_model(peer, msg, 30, inline=parts)
                if len(tasks) > 1:
                    continue
                length = sum(int(v.size) for v in model.values())
                params = cfg.round_params(msg.round, msg.cohort, length, msg.session, version=msg.version,
                                          model=model_digest(model))
                sa = SecAggClient(str(me), params, signer, verifier)
                mb.send(combiner, sa.advertise())
            elif isinstance(msg, KeyRoster):
                shared = sa.share_keys(msg)
                rows = []
                for e in shared.shares:
                    ct = e.ciphertext
                    if e.receiver == victim:  # sealed under the true key, so the key check holds: off the polynomial
                        key = crypto.agree(sa._cipher_sk, sa._roster[victim].cipher_pk,
                                           share_info(sa.tag, str(me), victim))
                        ct = crypto.seal(key, bytes(132), share_aad(sa.tag, str(me), victim))
                    rows.append(EncryptedShare(e.sender, e.receiver, ct, e.key_check))
                mb.send(combiner, dataclasses.replace(shared, shares=tuple(rows)))
            elif isinstance(msg, ShareDelivery):
                mb.send(combiner, ShareCheck(str(me), msg.round))
            elif isinstance(msg, ShareVerdict):
                verdict = msg
            elif isinstance(msg, Stop):
                break
    finally:
        ep.close(flush_s=1)
    out = wait_exit(actor, 90)
    wait_exit(honest, 30)
    assert verdict is None and len(tasks) == 1, (verdict, tasks)  # no verdict for the excluded, no second task
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        r1, r2 = t.rounds()
        v2, _ = t.load(2)
    assert r1.status == "valid" and r1.num_updates == 3 and r1.detail["missing"] == [], out
    (why,) = [r["reason"] for r in r1.rejected if r["client"] == str(me)]  # refused with what it did, not missing
    assert "dealt 'A/2' a bad share" in why and "not on the dealer's committed polynomial" in why
    want = survivors_mean({"A": [0, 1, 2]})
    for k in want:
        ulp = np.spacing(np.abs(want[k]).astype(np.float32)).astype(np.float64)
        assert (np.abs(v2[k] - want[k]) <= r1.detail["secure"]["error_bound"] + 4 * ulp).all(), k
    assert r2.status == "valid" and r2.num_updates == 3
    audit = [r for r in _audit(tmp_path, "A") if r["action"] == "fl.secagg"]
    blamed = [r for r in audit if r["outcome"] == "blamed"]
    assert [r["target"] for r in blamed] == [str(me)], audit
    assert "dealt 'A/2' a bad share" in blamed[0]["detail"]["reason"] and blamed[0]["detail"]["round"] == 1
    summed = [r["detail"] for r in audit if r["outcome"] == "summed"]
    assert summed[0]["survivors"] == ["A/2", "A/3", "A/4"] and summed[0]["excluded"] == [str(me)]
    assert summed[1]["survivors"] == ["A/2", "A/3", "A/4"] and summed[1]["excluded"] == []
    assert str(me) in r2.detail["assignment"]["A/1"], r2.detail  # the controller asks it, the combiner does not
    assert "leaves out 1 client(s) found cheating earlier" in out
    journal = (tmp_path / "fl" / "combiner-A" / "secagg-blamed").read_text().splitlines()
    assert [line.split("\t")[:2] for line in journal] == [["fltest", str(me)]]  # what a restarted combiner reads
    victim_audit = [json.loads(x) for x in (tmp_path / "fl" / "clients" / "A-0" / "audit.log").read_text()
                    .splitlines()]
    assert [r["detail"]["dealer"] for r in victim_audit if r["outcome"] == "complained"] == [str(me)]


class _Combiner:
    """What blamed_clients reads of a combiner: its job's name and its workdir."""

    def __init__(self, workdir, job: str) -> None:
        self.workdir, self.job = workdir, type("Job", (), {"job": job})()


def test_a_restarted_combiner_still_refuses_the_clients_blamed_earlier_in_the_job_and_only_that_job(tmp_path):
    from nebula.federated.combiner.secure import _remember_blamed, blamed_clients

    first = _Combiner(tmp_path, "fltest")
    _remember_blamed(first, "A/5", "dealt 'A/2' a bad share\twith a tab\nand a newline")
    assert blamed_clients(first) == {"A/5": "dealt 'A/2' a bad share with a tab and a newline"}  # one line
    again = _Combiner(tmp_path, "fltest")  # the same workdir after a restart: a new process, a new object
    assert blamed_clients(again) == {"A/5": "dealt 'A/2' a bad share with a tab and a newline"}
    assert blamed_clients(_Combiner(tmp_path, "another-job")) == {}


def test_a_revealed_round_that_did_not_count_stops_the_job_with_the_reason_when_no_combiner_can_advance(
        procs, tmp_path):
    """One of four clients dies while training: round 1 unmasks the three survivors' sum on the initial model, but
    their 600 of 800 examples fall below validity.min_fraction_examples, so it does not count. The survivors would
    refuse a second sum on that model (the difference would expose one), so the controller leaves the combiner out
    of rounds on it; with no other combiner, the job stops at round 2 and the trail, the status file and the audit
    log say why, in one line."""
    workers = federation(procs, tmp_path, clusters=("A",))
    issue_signers(tmp_path, workers, {"A": 4})
    job = write_job(tmp_path, workers, {"A": 4}, rounds=3, deadline_s=8, secure_aggregation=SECURE,
                    validity={"min_updates": 1, "min_fraction_examples": 0.9},
                    client={"factory": "testbed.toy_client:make_client",
                            "args": {"behaviours": {"A/3": "crash"}}})
    actor = start_cluster(procs, job, "A")
    crashing = start_client(procs, job, "A", 3)
    clients = start_clients(procs, job, "A", [0, 1, 2])
    out = wait_exit(actor, 90)
    wait_exit(clients, 30)
    assert crashing.wait(10) == 3
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        r1, r2 = t.rounds()
        assert t.head().version == 1  # the initial model: nothing advanced it
    assert r1.status == "invalid" and r1.num_updates == 3 and "min_fraction_examples=0.9" in r1.detail["why"], out
    assert r1.detail["secure"]["dropped"] == ["A/5"]  # its masks removed: the sum was revealed
    assert r2.status == "stopped" and "no combiner can advance model version 1: A/1 already revealed" in \
        r2.detail["why"] and "relax validity" in r2.detail["why"] and "\n" not in r2.detail["why"]
    status = json.loads((tmp_path / "fl" / "status.json").read_text())
    assert status["state"] == "stopped" and status["reason"] == r2.detail["why"]
    ctl = [json.loads(x) for x in (tmp_path / "fl" / "controller" / "audit.log").read_text().splitlines()]
    assert [r["detail"]["reason"] for r in ctl if r["action"] == "fl.stop" and r["outcome"] == "secure"] == \
        [r2.detail["why"]]
