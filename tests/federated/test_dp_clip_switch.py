"""Central differential privacy's clip holds at the combiner through a real round over TLS switch servers: a hostile
client that skips its own clipping (it runs without the job's `differential_privacy`) and sends a change of norm
~3900 (7700 times clip_norm), moves the model no further than an honest one can; its update is clipped, audited and
counted, raw or compressed; the sampler run (Poisson) is named in the round's record."""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from nebula.federated.trail import ModelTrail, RoundRecord
from tests.federated.harness import federation, start_cluster, start_clients, wait_exit, write_job

CLIP = 0.5
# every client a round (q = 1: the Poisson draw takes them all), noise small beside the clip so the bound is sharp
DP = {"clip_norm": CLIP, "noise_multiplier": 0.01, "mode": "central", "sampler": "poisson"}


@dataclass(frozen=True)
class ClipRun:
    """What a central-DP round with a hostile client left: its record, the models, the released change's norm, the
    combiners' audit records by cluster, the controller's output."""

    round: RoundRecord
    models: list
    change: float
    audit: dict[str, list[dict]]
    out: str


def clip_round(procs, tmp_path, codec: str) -> ClipRun:
    """One central-DP round through real switches in which B's client skips its clipping and sends weights of
    -1000 (`codec`: the job's update_codec)."""
    workers = federation(procs, tmp_path)
    common = {"rounds": 1, "update_codec": codec, "validity": {"min_updates": 3},
              "controller": {"cluster": "A", "dir": str(tmp_path / "fl")}}
    job = write_job(tmp_path, workers, {"A": 2, "B": 1}, differential_privacy=DP, **common)
    # B's client: the same job without differential_privacy (so it does not clip), weights of -1000 (the toy
    # model's change is then of norm 1000·√15 ≈ 3873)
    hostile = write_job(tmp_path / "hostile", workers, {"A": 2, "B": 1}, **common,
                        client={"factory": "tests.federated.toy_client:make_client",
                                "args": {"behaviours": {"B/0": "scale"}}})
    actors = [start_cluster(procs, job, c) for c in ("A", "B")]
    clients = [start_clients(procs, job, "A"), start_clients(procs, hostile, "B")]
    out = wait_exit(actors[0], 120)
    for p in actors[1:] + clients:
        wait_exit(p, 30)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        (rnd,), models = t.rounds(), t.models()
        before, after = t.load(models[0].version)[0], t.load(models[1].version)[0]
    change = np.sqrt(sum(float(np.sum((after[k].astype(np.float64) - before[k]) ** 2)) for k in before))
    audit = {c: [json.loads(x) for x in (tmp_path / "fl" / f"combiner-{c}" / "audit.log").read_text().splitlines()]
             for c in ("A", "B")}
    return ClipRun(rnd, models, change, audit, out)


@pytest.mark.parametrize("codec", ["none", "topk(0.5)"])
def test_a_hostile_clients_huge_update_is_clipped_at_the_combiner(procs, tmp_path, codec):
    run = clip_round(procs, tmp_path, codec)
    rnd, models, change, out = run.round, run.models, run.change, run.out
    assert rnd.status == "valid" and rnd.num_updates == 3 and models[1].clients == ["A/2", "A/3", "B/2"], out
    assert (rnd.detail["privacy"]["sampler"], rnd.detail["privacy"]["sampled"]) == ("poisson", 3)
    # the released change: (Σ of 3 clipped changes + noise) / 3, so at most CLIP plus the noise's share (std
    # 0.01·0.5/3 on each of 15 values, a norm of about 0.006); unclipped, the hostile update alone would move it
    # by about 1291
    assert 0 < change < CLIP + 0.05, change
    audit_b = run.audit["B"]
    (acc,) = [r for r in audit_b if r["action"] == "fl.update" and r["outcome"] == "accepted"]
    # as decoded: what is aggregated (topk(0.5) keeps 8 of the 15 values: 1000·√8 ≈ 2828)
    assert acc["target"] == "B/2" and acc["detail"]["clipped"] is True and acc["detail"]["norm"] > 2500
    assert [r["detail"]["clipped"] for r in audit_b if r["action"] == "fl.dp"] == [1]
    audit_a = run.audit["A"]
    honest = [r["detail"]["norm"] for r in audit_a if r["action"] == "fl.update" and r["outcome"] == "accepted"]
    assert len(honest) == 2 and all(n <= CLIP * 1.05 for n in honest)  # they clipped themselves
