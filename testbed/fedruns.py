"""Federated runs over real switches that the tests and the trust benchmark both measure: a cluster whose accounts
home refuses the job (`job_b_refuses`, `initial_from_ungranted`), a central-DP round with a client that skips its
clipping (`clip_round`), a secure job's client signers (`issue_signers`), and the references they are checked
against (`survivors_mean`, `dp_reference`)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import dp_accounting
import numpy as np
import yaml
from dp_accounting import pld, rdp

from nebula.federated.controller.trail import ModelTrail, RoundRecord
from security.accounts import Accounts
from security.ca import CertificateAuthority
from testbed.fedjob import federation, run_job, start_cluster, start_clients, wait_exit, write_job
from testbed.toy_client import make_client

__all__ = ["CLIP", "DELTA", "SECURE", "ClipRun", "InitialRun", "accounts_home", "clip_round", "dp_reference",
           "initial_from_ungranted", "issue_signers", "job_b_refuses", "survivors_mean"]

CLIP = 0.5
# every client a round (q = 1: the Poisson draw takes them all), noise small beside the clip so the bound is sharp
DP = {"clip_norm": CLIP, "noise_multiplier": 0.01, "mode": "central", "sampler": "poisson"}
DELTA = 1e-5  # the δ every privacy check states its ε at
SECURE = {"protocol": "secagg+", "clip_range": 1000.0, "max_weight": 1000, "signers": "signers/client-{index}"}


def accounts_home(path: Path, *resources: str) -> Path:
    """An accounts home at `path` in which the clients' account (`nebula`) holds route grants for `resources`."""
    with Accounts(path, scrypt_n=1024) as acc:
        acc.add_user("nebula", "nebula-password", actor="root")  # the clients' account: grants need it to exist
        for r in resources:
            acc.add_route_grant("nebula", r, actor="admin")
    return path


def job_b_refuses(procs, tmp_path: Path, **job_options) -> tuple[Path, dict[str, Path]]:
    """(job file, accounts homes) of a job over real switches, one client per cluster, in which B's accounts home
    grants the clients' account only another job (A's grants it this one); `job_options` go to write_job."""
    workers = federation(procs, tmp_path)
    homes = {"A": accounts_home(tmp_path / "home-A", "job:fltest"),
             "B": accounts_home(tmp_path / "home-B", "job:other")}
    job = write_job(tmp_path, workers, {"A": 1, "B": 1}, validity={"min_updates": 1}, **job_options)
    doc = yaml.safe_load(job.read_text())
    for c in doc["clusters"]:
        c["accounts_home"] = str(homes[c["id"]])
    job.write_text(yaml.safe_dump(doc))
    return job, homes


@dataclass(frozen=True)
class InitialRun:
    """What a one-round job whose cluster B refuses the job left: models and rounds of the trail, the controller's
    audit records and output."""

    models: list
    rounds: list
    audit: list[dict]
    out: str


def initial_from_ungranted(procs, tmp_path: Path) -> InitialRun:
    """A one-round job over real switches in which B's accounts home holds no grant for the job (A's does)."""
    # both clients would be asked (A's combiner accepts B's client too: A's home grants the account the job)
    job, _ = job_b_refuses(procs, tmp_path, rounds=1, initial_clients=2, initial_wait_s=5)
    out = run_job(procs, job)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        models, rounds = t.models(), t.rounds()
    audit = [json.loads(line) for line in (tmp_path / "fl" / "controller" / "audit.log").read_text().splitlines()]
    return InitialRun(models, rounds, audit, out)


@dataclass(frozen=True)
class ClipRun:
    """What a central-DP round with a hostile client left: its record, the models, the released change's norm, the
    combiners' audit records by cluster, the controller's output."""

    round: RoundRecord
    models: list
    change: float
    audit: dict[str, list[dict]]
    out: str


def clip_round(procs, tmp_path: Path, codec: str) -> ClipRun:
    """One central-DP round through real switches in which B's client skips its clipping and sends weights of
    -1000 (`codec`: the job's update_codec)."""
    workers = federation(procs, tmp_path)
    common = {"rounds": 1, "update_codec": codec, "validity": {"min_updates": 3},
              "controller": {"cluster": "A", "dir": str(tmp_path / "fl")}}
    job = write_job(tmp_path, workers, {"A": 2, "B": 1}, differential_privacy=DP, **common)
    # B's client: the same job without differential_privacy (so it does not clip), weights of -1000 (the toy
    # model's change is then of norm 1000·√15 ≈ 3873)
    hostile = write_job(tmp_path / "hostile", workers, {"A": 2, "B": 1}, **common,
                        client={"factory": "testbed.toy_client:make_client",
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


def dp_reference(event: dp_accounting.DpEvent, rounds: int, kind: str, replace_one: bool = False) -> float:
    """dp-accounting's ε at DELTA for `rounds` compositions of `event`, computed without the project's accountant."""
    if kind == "pld":
        acc = pld.PLDAccountant()
    elif replace_one:
        acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    else:
        acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(event, rounds))
    return acc.get_epsilon(DELTA)


def issue_signers(tmp_path: Path, workers: dict[str, Path], clusters: dict[str, int]) -> None:
    """Each client its own worker certificate, `<kit>/signers/client-<index>` (as `nebula-admin cert issue`)."""
    ca = CertificateAuthority.open(tmp_path / "prov" / "ca")
    for cluster, n in clusters.items():
        for i in range(n):
            ca.issue(f"client-{i}", "worker", cluster, out_dir=workers[cluster].parent / "signers", stem=f"client-{i}")


def survivors_mean(job_clients: dict[str, list[int]]) -> dict[str, np.ndarray]:
    """FedAvg in float64 of the named toy clients' fits from the zero model (every toy client holds 200 examples)."""
    fits = []
    for cluster, idx in job_clients.items():
        for i in idx:
            c = make_client(cluster, i, {})
            fits.append(c.fit(c.get_parameters({}), {})[0])
    return {k: np.mean([f[k].astype(np.float64) for f in fits], axis=0) for k in fits[0]}
