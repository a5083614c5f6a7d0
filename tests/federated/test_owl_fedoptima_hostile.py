"""OWL and FedOptima against a hostile member: real server and honest peers as `nebula fl start` processes behind
real TLS switch servers, the hostile member in this test process on the same job. Every bad field a peer controls
(an index, a count, a round or version, the sender against the channel, tensors' keys and shapes, labels) is
refused with one line naming the sender, the field, the value and what was expected, and audited in the receiving
actor's signed audit log (which `nebula-admin audit verify` finds intact), and the honest ones finish every round.
A refusal the peer repeats is counted: its first on a record of its own, the repeats as records with their count,
and its log line at most once per (peer, field) and interval."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from nebula.messaging import ProtocolError, decode
from testbed.federation import BIN, start_switches


def _job(tmp_path: Path, workers: dict, job: str, algorithm: str, block: dict, task: str, fl: str = "fl") -> str:
    """A job file of `algorithm`: the server in A, three clients in B (ranks 2, 3, 4; the hostile one is B/4)."""
    doc = {"job": job, "mode": "federated", "controller": {"cluster": "A", "dir": fl}, "algorithm": algorithm,
           "clusters": [{"id": "A", "worker": str(workers["A"]), "num_clients": 0},
                        {"id": "B", "worker": str(workers["B"]), "num_clients": 3}],
           "startup_timeout_s": 60, "task": f"tests.federated.fedoptima_task:{task}", algorithm: block}
    f = tmp_path / f"{job}.yaml"
    f.write_text(yaml.safe_dump(doc))
    return str(f)


def _start(procs, job: str) -> tuple:  # noqa: ANN001
    """The server (A's controller role) and the two honest clients of B (indices 0 and 1), each a process."""
    server = procs.start([str(BIN / "nebula"), "fl", "start", job, "--cluster", "A", "--role", "controller"])
    return server, [procs.start([str(BIN / "nebula"), "fl", "start", job, "--cluster", "B", "--role", "client",
                                 "--index", str(i)]) for i in (0, 1)]


def _result(p, timeout_s: float) -> tuple[dict, str]:
    """The one actor's result a `nebula fl start` process printed, and all it printed."""
    out, _ = p.communicate(timeout=timeout_s)
    assert p.returncode == 0, out
    res = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert len(res) == 1, res
    return next(iter(res.values())), out


def _audited(log: Path, action: str) -> list[dict]:
    """The refusal records (peer, field, value, expected) of an actor's audit log, after checking that it starts
    with `fl.start`, ends with a clean `fl.stop` and its closing checkpoint, and that `nebula-admin audit verify`
    finds it intact (exit 0)."""
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert records[0]["action"] == "fl.start" and records[-2]["action"] == "fl.stop", records
    assert records[-2]["outcome"] == "ok" and records[-1]["action"] == "audit.checkpoint", records[-2:]
    v = subprocess.run([str(BIN / "nebula-admin"), "audit", "verify", "--log", str(log)], capture_output=True,
                       text=True, timeout=60)
    assert v.returncode == 0 and v.stdout.startswith("OK"), (v.stdout, v.stderr)
    return [r["detail"] for r in records if r["action"] == action and r["outcome"] == "refused"]


def _has(refusals: list[dict], peer: str, field: str, value: str, expected: str) -> bool:
    return any(r["peer"] == peer and r["field"] == field and r["value"].startswith(value)
               and r["expected"].startswith(expected) for r in refusals)


def _counted(refusals: list[dict], peer: str, field: str, message: str = "update") -> list[int]:
    """The counts of the records of `peer`'s refusals of `field` of a `message` type (the first's record counts 1)."""
    return [r["count"] for r in refusals if r["peer"] == peer and r["field"] == field and r["message"] == message]


def _poll(mb, chans: dict, deadline: float):  # noqa: ANN001
    """The next (peer, header, arrays) from any of `chans`, or None past `deadline`."""
    while time.monotonic() < deadline:
        for peer, ch in chans.items():
            try:
                parts = ch.recv_parts(timeout_s=0.1)
            except TimeoutError:
                continue
            return (peer, *mb.receive_arrays(peer, parts, 10))
    return None


def _say(mb, peer, parts: list) -> None:  # noqa: ANN001
    """Send packed `parts` to `peer` on the control lane, as OWL's and FedOptima's actors send their messages."""
    mb.channel(peer).send(parts, lane="control")


# ---- OWL ----
def _owl_attack(mb, rnd: int, model: dict) -> None:  # noqa: ANN001
    """One round of a hostile worker B/4 (not its cluster's combiner, the source of no group)."""
    from nebula.federated.owl.messages import GroupPull, ModelGroup, OwlUpdate, Stop
    from nebula.messaging import Peer, pack, pack_message

    server, combiner, peer = Peer("A", 0), Peer("B", 2), Peer("B", 3)
    junk = {"x": np.zeros(3, np.float32)}
    # the server: an update from a worker that is not a combiner, a pull past the groups (the IndexError that
    # crashed the server), a pull whose index the decoder refuses, an update of a round to come
    mb.send_model(server, OwlUpdate(round=rnd, num_examples=32), model, inline=True)
    _say(mb, server, pack_message(GroupPull(round=rnd, groups=(7,))))
    _say(mb, server, pack({"type": "pull", "round": rnd, "groups": [-1]}))
    mb.send_model(server, OwlUpdate(round=rnd + 50, num_examples=32), model, inline=True)
    # another worker: a group it does not pull from B/4, a group past the plan's, a STOP, an update (no combiner)
    mb.send_model(peer, ModelGroup(round=rnd, group=0), model, inline=True)
    mb.send_model(peer, ModelGroup(round=rnd, group=7), model, inline=True)
    _say(mb, peer, pack_message(Stop()))
    mb.send_model(peer, OwlUpdate(round=rnd, num_examples=32), model, inline=True)
    # its combiner: an update claiming five workers, one claiming more examples than local_steps x batch (2 x 32),
    # one with tensors of another model, then its real update
    mb.send_model(combiner, OwlUpdate(round=rnd, num_examples=32, num_updates=5), model, inline=True)
    mb.send_model(combiner, OwlUpdate(round=rnd, num_examples=10**6), model, inline=True)
    mb.send_model(combiner, OwlUpdate(round=rnd, num_examples=32), junk, inline=True)
    mb.send_model(combiner, OwlUpdate(round=rnd, num_examples=32), model, inline=True)


def _owl_hostile(worker_file, rounds: int) -> int:  # noqa: ANN001
    """Worker B/4 of the OWL job, attacking every round; the rounds it attacked (until the server's STOP)."""
    from nebula.channel import Endpoint
    from nebula.federated.owl.messages import TO_WORKER, ModelGroup, Stop
    from nebula.messaging import Messenger, Peer

    attacked = 0
    with Endpoint.connect(worker_file, job="owl", rank=4) as ep:
        mb = Messenger(ep, TO_WORKER, channel="owl")
        chans = {p: mb.channel(p) for p in (Peer("A", 0), Peer("B", 2))}
        deadline = time.monotonic() + 120
        while (got := _poll(mb, chans, deadline)) is not None:
            peer, head, arrays = got
            msg = decode(head, TO_WORKER)
            if isinstance(msg, Stop) and peer == Peer("A", 0):
                break
            if isinstance(msg, ModelGroup):  # the whole model (one group), forwarded by its central worker B/2
                _owl_attack(mb, msg.round, arrays)
                attacked += 1
        ep.flush(timeout_s=10)
    return attacked


def test_owl_refuses_and_audits_every_bad_field_of_a_hostile_worker_and_the_others_finish(procs, tmp_path):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    rounds = 3
    block = dict(rounds=rounds, local_steps=2, lr=0.1, num_groups=1, combine="cluster", round_timeout_s=60,
                 peer_timeout_s=30)
    server, honest = _start(procs, _job(tmp_path, workers, "owl", "owl", block, "towers_task"))
    assert _owl_hostile(workers["B"], rounds) == rounds
    res, server_log = _result(server, 120)
    (combiner, c_log), (other, o_log) = (_result(w, 60) for w in honest)
    # every round went on, with the hostile worker's one well-formed update averaged in by its combiner
    assert res["updates"] == [3] * rounds and res["wan_updates"] == [1] * rounds
    assert res["pulls_served"] == 0  # a pull past the groups sent nothing
    assert combiner["rounds"] == other["rounds"] == rounds
    for line in ("update from B/4 refused: sender=B/4, expected its cluster's combiner",
                 "pull from B/4 refused: groups=7, expected a group index in 0..0",
                 "update from B/4 refused: round=50, expected 0",
                 "message from ('B', 4) refused: pull: groups=[-1] must be distinct group indices"):
        assert line in server_log, (line, server_log)
    for line in ("group from B/4 refused: sender=B/4, expected the server or the worker the plan names",
                 "group from B/4 refused: group=7, expected a group index in 0..0",
                 "stop from B/4 refused: sender=B/4, expected the server",
                 "update from B/4 refused: sender=B/4, expected a worker of its cluster []"):
        assert line in o_log, (line, o_log)
    for line in ("update from B/4 refused: num_updates=5, expected one update of its own per round",
                 "update from B/4 refused: num_examples=1000000, expected 1..64 (local_steps x the task's batch)",
                 "update from B/4 refused: model=B/4: keys differ from the global model's"):
        assert line in c_log, (line, c_log)
    # and each refusal is a record of the refusing actor's audit log, whose chain and checkpoints verify
    fl = tmp_path / "fl"
    audited = _audited(fl / "controller" / "audit.log", "fl.owl")
    for field, value, expected in (("sender", "B/4", "its cluster's combiner"), ("groups", "7", "a group index"),
                                   ("round", "50", "0 (the round in progress)"),
                                   ("message", "pull: groups=[-1]", "a well-formed message")):
        assert _has(audited, "B/4", field, value, expected), (field, audited)
    audited = _audited(fl / "clients" / "B-1" / "audit.log", "fl.owl")  # B/3
    for field, value, expected in (("sender", "B/4", "the server or the worker"), ("group", "7", "a group index"),
                                   ("sender", "B/4", "the server (only"), ("sender", "B/4", "a worker of its")):
        assert _has(audited, "B/4", field, value, expected), (field, audited)
    audited = _audited(fl / "clients" / "B-0" / "audit.log", "fl.owl")  # B/2, its cluster's combiner
    assert _has(audited, "B/4", "num_updates", "5", "one update of its own")
    assert _has(audited, "B/4", "num_examples", "1000000", "1..64 (local_steps x the task's batch)")
    assert _has(audited, "B/4", "model", "B/4: keys differ", "this model's tensors")
    assert all(r["peer"] == "B/4" for r in audited)  # the honest ones' messages: none refused
    # a refusal repeated round after round (the combiner takes all of B/4's messages of a round before its own
    # update): its first on a record of its own, the repeats counted; the counts sum to the rounds
    for field in ("num_updates", "num_examples", "model"):
        counts = _counted(audited, "B/4", field)
        assert counts[0] == 1 and sum(counts) == rounds, (field, counts)


# ---- FedOptima ----
REPEATS = 20  # malformed hellos the hostile device sends in a burst


def _fedoptima_hostile(worker_file, max_s: float) -> dict:  # noqa: ANN001
    """Device B/4 of the FedOptima job: joins honestly, then sends each kind of bad field (a malformed hello
    REPEATS times); what it saw."""
    from nebula.channel import Endpoint
    from nebula.federated.fedoptima.messages import (TO_DEVICE, Activations, DeviceBye, DeviceHello, DeviceModel,
                                                    Init, SendSlot, Stop)
    from nebula.messaging import Messenger, Peer, pack, pack_message

    seen = {"init": 0, "grants": 0, "attacks": 0, "stop": 0}
    with Endpoint.connect(worker_file, job="fo", rank=4) as ep:
        server = Peer("A", 0)
        mb = Messenger(ep, TO_DEVICE, channel="fedoptima")
        ch = mb.channel(server)
        ch.send(pack_message(DeviceHello(flops_per_s=1e9, bandwidth_bytes_per_s=1e6)), lane="control")
        deadline = time.monotonic() + max_s
        while (got := _poll(mb, {server: ch}, deadline)) is not None:
            _, head, arrays = got
            msg = decode(head, TO_DEVICE)
            if isinstance(msg, Stop):
                seen["stop"] += 1
                ch.send(pack({"type": "bye", "stats": {"idle_s": "lots"}}), lane="control")
                ch.send(pack_message(DeviceBye(stats={"idle_s": 1.0})), lane="control")
                break
            if isinstance(msg, Init):
                seen["init"] += 1
                model = arrays
                for _ in range(REPEATS):
                    ch.send(pack({"type": "hello", "flops_per_s": -1.0, "bandwidth_bytes_per_s": 1.0}),
                            lane="control")
                # a model from a version never issued, one with another model's tensors, then its own
                mb.send_model(server, DeviceModel(version=999), model, inline=True)
                mb.send_model(server, DeviceModel(version=0), {"d.x": np.zeros(2, np.float32)}, inline=True)
                mb.send_model(server, DeviceModel(version=0), model, inline=True)
            elif isinstance(msg, SendSlot):
                seen["grants"] += 1
                bad = [{"h": np.zeros((4, 3), np.float32), "y": np.zeros(4, np.int64)},  # not the split's width
                       {"h": np.zeros((4, 32), np.float32), "y": np.full(4, 99, np.int64)},  # label 99 of 4
                       {"h": np.zeros((33, 32), np.float32), "y": np.zeros(33, np.int64)}]  # more rows than batch
                h = bad[seen["attacks"] % 3]
                if seen["attacks"] < 6:  # (a refused batch frees its slot: a new grant comes; after 6, silence)
                    ch.send(pack_message(Activations(), h), lane="activation")
                    seen["attacks"] += 1
        ep.flush(timeout_s=10)
    return seen


def test_fedoptima_refuses_and_audits_every_bad_field_of_a_hostile_device_and_the_others_finish(procs, tmp_path):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    block = dict(omega=2, local_iterations=4, max_rounds=6, duration_s=60, lr_device=0.1, lr_server=0.1,
                 join_timeout_s=20, idle_timeout_s=15, global_timeout_s=10, grant_timeout_s=3, split=2)
    server, honest = _start(procs, _job(tmp_path, workers, "fo", "fedoptima", block, "blobs_task"))
    seen = _fedoptima_hostile(workers["B"], 90)
    res, log = _result(server, 120)
    for d in honest:
        stats, _ = _result(d, 60)
        assert stats["iterations"] >= 4 and stats["rounds"] >= 1
    assert seen["init"] == 1 and seen["stop"] == 1 and seen["attacks"] >= 3  # a refused batch freed its slot
    # the run ended on its rounds with the honest devices' activations (none of the hostile one's trained on)
    assert res["ended"] == "6 rounds" and res["used"]["B/2"] > 0 and res["used"]["B/3"] > 0
    assert res["used"].get("B/4", 0) == 0 and set(res["devices"]) == {"B/2", "B/3", "B/4"}
    assert res["devices"]["B/4"] == {"idle_s": 1.0}  # its well-formed BYE, the malformed one refused
    for line in ("'model' from ('B', 4) refused: version=999, expected <= ",
                 "'model' from ('B', 4) refused: ('B', 4): keys differ from the global model's",
                 "'act' from ('B', 4) refused: h=float32[4, 3], expected float32[batch, 32]",
                 "'act' from ('B', 4) refused: y holds label 99, expected 0..3",
                 "'act' from ('B', 4) refused: rows=33, expected 1..32 (the task's batch)",
                 "'bye' from ('B', 4) refused: bye: stats 'idle_s'=lots is not a short name with a finite"):
        assert line in log, (line, log)
    # and each refusal is a record of the server's audit log, whose chain and checkpoints verify; the honest
    # devices' logs hold none
    fl = tmp_path / "fl"
    audited = _audited(fl / "controller" / "audit.log", "fl.fedoptima")
    for field, value, expected in (("version", "999", "<= "), ("model", "('B', 4): keys differ", ""),
                                   ("h", "float32[4, 3]", "float32[batch, 32]"), ("act", "y holds label 99", "0..3"),
                                   ("rows", "33", "1..32 (the task's batch)"),
                                   ("message", "hello: flops_per_s=-1.0", "a well-formed message"),
                                   ("message", "bye: stats 'idle_s'=lots", "a well-formed message")):
        assert _has(audited, "B/4", field, value, expected), (field, audited)
    assert all(r["peer"] == "B/4" for r in audited)
    # the same bad hello REPEATS times: its first record, then the repeats counted, at most one record a second;
    # the counts sum to REPEATS, and its log line is not repeated REPEATS times
    counts = _counted(audited, "B/4", "message", "hello")
    assert counts[0] == 1 and sum(counts) == REPEATS and len(counts) < REPEATS and max(counts) > 1, counts
    assert log.count("'hello' from ('B', 4) refused") < REPEATS // 2, log
    for i in (0, 1):
        assert _audited(fl / "clients" / f"B-{i}" / "audit.log", "fl.fedoptima") == []


def test_an_audit_directory_that_cannot_be_made_stops_the_actor_with_one_line_naming_controller_dir(tmp_path, capsys):
    from nebula.cli import main

    (tmp_path / "blocker").write_text("")  # a file where controller.dir's parent must be a directory
    workers = {"A": tmp_path / "a.yaml", "B": tmp_path / "b.yaml"}
    job = _job(tmp_path, workers, "owl", "owl", {"rounds": 1}, "towers_task", fl="blocker/fl")
    assert main(["fl", "start", job, "--cluster", "B", "--role", "client", "--index", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("nebula fl start: controller.dir: the audit directory "), err
    assert "cannot be made or written (Not a directory)" in err, err
    assert str(tmp_path / "blocker" / "fl" / "clients" / "B-1") in err and "set controller.dir" in err, err


def test_a_failed_server_audits_its_failure_and_closes_its_log(procs, tmp_path):
    """No worker ever answers: the OWL server's round fails; its log still ends with the failure and the closing
    checkpoint, and verifies."""
    from nebula.federated.actors import OWL, run_actors
    from nebula.federated.config import load_federated_job

    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = load_federated_job(_job(tmp_path, workers, "owl", "owl", {"rounds": 1, "round_timeout_s": 1},
                                  "towers_task"))
    res = run_actors(job, "A", OWL, "controller")
    assert "server" not in res and "no worker sent an update" in res["errors"][0], res
    log = tmp_path / "fl" / "controller" / "audit.log"
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["action"] for r in records[-2:]] == ["fl.stop", "audit.checkpoint"], records
    assert records[-2]["outcome"] == "failed" and "no worker sent an update" in records[-2]["detail"]["error"]
    v = subprocess.run([str(BIN / "nebula-admin"), "audit", "verify", "--log", str(log)], capture_output=True,
                       text=True, timeout=60)
    assert v.returncode == 0, (v.stdout, v.stderr)


# ---- the static bounds, as the decoders apply them ----
@pytest.mark.parametrize("family, head, field", [
    ("owl.TO_WORKER", {"type": "group", "round": 0, "group": -3}, "group=-3"),
    ("owl.TO_WORKER", {"type": "group", "round": -1, "group": 0}, "round=-1"),
    ("owl.TO_SERVER", {"type": "pull", "round": 0, "groups": [1, 1]}, "groups=[1, 1]"),
    ("owl.TO_SERVER", {"type": "pull", "round": 0, "groups": []}, "groups=[]"),
    ("owl.TO_SERVER", {"type": "update", "round": 0, "num_examples": 0}, "num_examples=0"),
    ("owl.TO_SERVER", {"type": "update", "round": 0, "num_examples": 3, "num_updates": 0}, "num_updates=0"),
    ("owl.TO_WORKER", {"type": "plan", "workers": ["B/1"], "groups": [[0]], "pulls": [[[5, -1]]], "rounds": 1},
     "pull (5, -1)"),
    ("owl.TO_WORKER", {"type": "plan", "workers": ["B"], "groups": [[0]], "pulls": [[[0, -1]]], "rounds": 1},
     "worker 'B' is not cluster/rank"),
    ("fedoptima.TO_SERVER", {"type": "hello", "flops_per_s": float("nan"), "bandwidth_bytes_per_s": 1.0},
     "flops_per_s=nan"),
    ("fedoptima.TO_SERVER", {"type": "hello", "flops_per_s": 1.0, "bandwidth_bytes_per_s": -2.0},
     "bandwidth_bytes_per_s=-2.0"),
    ("fedoptima.TO_SERVER", {"type": "model", "version": -1}, "version=-1"),
    ("fedoptima.TO_SERVER", {"type": "bye", "stats": {str(i): 1.0 for i in range(65)}}, "at most 64"),
    ("fedoptima.TO_DEVICE", {"type": "init", "split": 0, "version": 0}, "split=0"),
    ("fedoptima.TO_DEVICE", {"type": "global", "version": -5}, "version=-5"),
])
def test_decoders_refuse_out_of_range_fields_naming_them(family, head, field):
    from nebula.federated.fedoptima import messages as fedoptima
    from nebula.federated.owl import messages as owl

    mod, name = family.split(".")
    with pytest.raises(ProtocolError, match=r"^" + head["type"]) as exc:
        decode(head, getattr({"owl": owl, "fedoptima": fedoptima}[mod], name))
    assert field in str(exc.value)


def test_fedoptima_server_takes_one_waiting_model_per_device_and_byes_only_from_its_devices(caplog):
    from nebula.federated.fedoptima.runtime import _on_message
    from nebula.federated.fedoptima.scheduler import TaskScheduler

    s = TaskScheduler(devices=["d0", "d1"], omega=2)
    model = {"d.w": np.ones(2, np.float32), "a.w": np.ones(1, np.float32)}
    refused: list = []  # what the actor's audit gets: (peer, field, value, expected)
    _on_message(s, None, {}, "d0", {"type": "model", "version": 0}, model,
                refused=lambda *r, **_: refused.append(r))
    _on_message(s, None, {}, "d0", {"type": "model", "version": 0}, model,  # the first still waits: refused
                refused=lambda *r, **_: refused.append(r))
    assert len(s.model_queue) == 1 and "version=0, expected no model while its previous one waits" in caplog.text
    assert refused == [("d0", "version", "0", "no model while its previous one waits (one per global model "
                                              "received)")]
    _on_message(s, None, {}, "d1", {"type": "model", "version": 0}, model)  # another device's: taken
    assert len(s.model_queue) == 2
    _on_message(s, None, {}, "d9", {"type": "bye", "stats": {}}, {},  # not a device of the run
                refused=lambda *r, **_: refused.append(r))
    assert "sender=d9, expected a device that joined" in caplog.text
    assert refused[1] == ("d9", "sender", "d9", "a device that joined (['d0', 'd1'])")
