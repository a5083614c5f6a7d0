"""FedOptima and OWL through `nebula fl start|status|stop` (`algorithm: fedoptima | owl` in the job file).

Each cluster runs its actors as threads, each its own authenticated rank behind the cluster's switch: in the
controller's cluster the server (the controller's rank, 0), and in every cluster its clients (ranks 2, 3, ...)
as FedOptima devices or OWL workers. What they train is the job's `task: module:factory`, called with
`num_clients={cluster: n}`, `seed` and the `client.args` of the job. The server writes the controller's status
file (state, algorithm, its measurements when done) and ends the run early when `nebula fl stop` asks.
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import threading
from pathlib import Path
from typing import Any

from nebula.federated.runfiles import RunFiles
from nebula.federated.transport import CONTROLLER_RANK, FIRST_CLIENT_RANK

__all__ = ["ROLES", "load_task", "run_mode"]

log = logging.getLogger(__name__)
ROLES = ("cluster", "controller", "clients", "client")


def load_task(job, mode) -> Any:
    """The job's FedOptima/OWL task: `mode.task` ("module:factory") called with the clients and client args."""
    mod, _, name = mode.task.partition(":")
    try:
        factory = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"task {mode.task!r} cannot be loaded ({exc}); name an importable 'module:factory'") from None
    return factory(num_clients={c.id: c.num_clients for c in job.clusters}, seed=job.seed, **job.client.args)


def _write_status(job, state: str, algorithm: str, **extra: Any) -> None:
    RunFiles(job.controller.dir).write_status({"job": job.job, "algorithm": algorithm, "state": state, **extra})


def run_mode(job_file: str | Path, cluster: str, role: str = "cluster", index: int = 0) -> dict:
    """Run `cluster`'s actors of the job's algorithm until the server stops them; each actor's result (and
    `errors` if any failed). role: cluster (server where the controller runs, and every client), controller
    (the server only), clients (every client), client (client `index`)."""
    from nebula.channel import Endpoint
    from nebula.federated.config import load_federated_job
    from nebula.federated.fedoptima.runtime import run_device, serve
    from nebula.federated.fedoptima.split import DeviceInfo, measure_flops_per_s
    from nebula.federated.owl.runtime import run_owl_worker, serve_owl

    job = mode = load_federated_job(job_file)
    if mode.algorithm not in ("fedoptima", "owl"):
        raise ValueError(f"{job_file}: algorithm is {mode.algorithm!r}; FEDn rounds start with the combiner roles")
    if role not in ROLES:
        raise ValueError(f"role {role!r}: algorithm {mode.algorithm} has no combiner; use one of {', '.join(ROLES)}")
    me = job.cluster(cluster)
    if role == "controller" and cluster != job.controller.cluster:
        raise ValueError(f"the server runs in the controller's cluster {job.controller.cluster}, not {cluster}")
    if role == "client" and not 0 <= index < me.num_clients:
        raise ValueError(f"client index {index} is outside cluster {cluster}'s num_clients={me.num_clients}")
    task = load_task(job, mode)
    clients = [(c.id, FIRST_CLIENT_RANK + i) for c in job.clusters for i in range(c.num_clients)]
    server = (job.controller.cluster, CONTROLLER_RANK)
    results: dict = {}
    errors: list = []

    def run_server(ep) -> dict:
        stop = RunFiles(job.controller.dir).stop_watch()
        _write_status(job, "running", mode.algorithm)
        try:
            if mode.algorithm == "fedoptima":
                res = dataclasses.asdict(serve(ep, clients, task, mode.fedoptima, should_stop=stop))
            else:
                res = dataclasses.asdict(serve_owl(ep, clients, task, mode.owl, should_stop=stop))
        except Exception as exc:
            _write_status(job, "failed", mode.algorithm, error=repr(exc))
            raise
        rounds = res.get("rounds", len(res.get("round_s", [])))  # OWL counts its rounds by their times
        summary = {k: res[k] for k in ("accuracy", "initial_accuracy", "idle_s", "busy_s", "wall_s", "ended",
                                        "num_groups") if k in res}
        _write_status(job, "stopped" if stop() else "finished", mode.algorithm, round=rounds,
                      result={"rounds": rounds, **summary})
        return res

    def actor(rank: int) -> None:
        try:
            with Endpoint.connect(me.worker, job=job.job, rank=rank, timeout_s=job.startup_timeout_s) as ep:
                if rank == CONTROLLER_RANK:
                    results["server"] = run_server(ep)
                elif mode.algorithm == "fedoptima":
                    k = clients.index((cluster, rank))
                    # device information for the pre-processor: measured FLOP/s (under the simulated slowdown)
                    # and the upload bandwidth the job file gives
                    info = DeviceInfo(flops_per_s=measure_flops_per_s(slowdown=mode.fedoptima.slowdown_of(k)),
                                      bandwidth_bytes_per_s=mode.fedoptima.bandwidth_bytes_per_s)
                    results[f"{cluster}/{rank}"] = run_device(ep, server, k, len(clients), task, mode.fedoptima, info)
                else:
                    results[f"{cluster}/{rank}"] = run_owl_worker(ep, server, task, mode.owl)
        except Exception as exc:  # reported with the results: one actor's failure must not hide the others'
            log.exception("%s %s/%d failed", mode.algorithm, cluster, rank)
            errors.append(f"{cluster}/{rank}: {exc!r}")

    ranks = [CONTROLLER_RANK] if role in ("cluster", "controller") and cluster == server[0] else []
    if role in ("cluster", "clients"):
        ranks += [FIRST_CLIENT_RANK + i for i in range(me.num_clients)]
    elif role == "client":
        ranks = [FIRST_CLIENT_RANK + index]
    threads = [threading.Thread(target=actor, args=(r,), name=f"{mode.algorithm}-{cluster}-{r}", daemon=True)
               for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        results["errors"] = errors
    return results
