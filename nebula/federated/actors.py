"""FedOptima and OWL as `nebula fl start` runs them (`algorithm: fedoptima | owl` in the job file).

Each cluster runs its actors as threads, each its own authenticated rank behind the cluster's switch: in the
controller's cluster the server (the controller's rank, 0), and in every cluster its clients (ranks 2, 3, ...)
as FedOptima devices or OWL workers. What they train is the job's `task: module:factory`, called with
`num_clients={cluster: n}`, `seed` and the `client.args` of the job. The server writes the controller's status
file (state, algorithm, its measurements when done) and ends the run early when `nebula fl stop` asks. What differs
between the two is an `ActorAlgorithm`: its server and its client (`FEDOPTIMA`, `OWL`).
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

from nebula.federated.actor_channels import CONTROLLER_RANK, FIRST_CLIENT_RANK
from nebula.federated.config import FederatedJob
from nebula.federated.runfiles import RunFiles
from nebula.heap import keep_freed_memory

__all__ = ["ROLES", "ActorAlgorithm", "FEDOPTIMA", "OWL", "load_task", "run_actors"]

log = logging.getLogger(__name__)
ROLES = ("cluster", "controller", "clients", "client")
Actor = tuple[str, int]  # (cluster, rank)


@dataclass(frozen=True, slots=True)
class ActorAlgorithm:
    """The server (`serve(ep, clients, task, job, should_stop) -> result`) and client (`client(ep, server, me,
    clients, task, job) -> result`) of one algorithm."""

    name: str
    serve: Callable[..., Any]
    client: Callable[..., Any]


def _fedoptima_server(ep: Any, clients: list[Actor], task: Any, job: FederatedJob, should_stop: Callable) -> dict:
    from nebula.federated.fedoptima.runtime import serve

    return dataclasses.asdict(serve(ep, clients, task, job.fedoptima, should_stop=should_stop))


def _fedoptima_device(ep: Any, server: Actor, me: Actor, clients: list[Actor], task: Any, job: FederatedJob) -> Any:
    from nebula.federated.fedoptima.runtime import run_device
    from nebula.federated.fedoptima.split import DeviceInfo, measure_flops_per_s

    k = clients.index(me)
    # device information for the pre-processor: measured FLOP/s (under the simulated slowdown) and the upload
    # bandwidth the job file gives
    info = DeviceInfo(flops_per_s=measure_flops_per_s(slowdown=job.fedoptima.slowdown_of(k)),
                      bandwidth_bytes_per_s=job.fedoptima.bandwidth_bytes_per_s)
    return run_device(ep, server, k, len(clients), task, job.fedoptima, info)


def _owl_server(ep: Any, clients: list[Actor], task: Any, job: FederatedJob, should_stop: Callable) -> dict:
    from nebula.federated.owl.runtime import serve_owl

    return dataclasses.asdict(serve_owl(ep, clients, task, job.owl, should_stop=should_stop))


def _owl_worker(ep: Any, server: Actor, me: Actor, clients: list[Actor], task: Any, job: FederatedJob) -> Any:
    from nebula.federated.owl.runtime import run_owl_worker

    return run_owl_worker(ep, server, task, job.owl)


FEDOPTIMA = ActorAlgorithm("fedoptima", _fedoptima_server, _fedoptima_device)
OWL = ActorAlgorithm("owl", _owl_server, _owl_worker)


def load_task(job: FederatedJob) -> Any:
    """The job's FedOptima/OWL task: `task` ("module:factory") called with the clients and client args."""
    mod, _, name = job.task.partition(":")
    try:
        factory = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"task {job.task!r} cannot be loaded ({exc}); name an importable 'module:factory'") from None
    return factory(num_clients={c.id: c.num_clients for c in job.clusters}, seed=job.seed, **job.client.args)


def run_actors(job: FederatedJob, cluster: str, algorithm: ActorAlgorithm, role: str = "cluster", index: int = 0
               ) -> dict:
    """Run `cluster`'s actors of `algorithm` until the server stops them; each actor's result (and `errors` if any
    failed). role: cluster (server where the controller runs, and every client), controller (the server only),
    clients (every client), client (client `index`)."""
    from nebula.channel import Endpoint

    if role not in ROLES:
        raise ValueError(f"role {role!r}: algorithm {algorithm.name} has no combiner; use one of {', '.join(ROLES)}")
    me = job.cluster(cluster)
    if role == "controller" and cluster != job.controller.cluster:
        raise ValueError(f"the server runs in the controller's cluster {job.controller.cluster}, not {cluster}")
    if role == "client" and not 0 <= index < me.num_clients:
        raise ValueError(f"client index {index} is outside cluster {cluster}'s num_clients={me.num_clients}")
    keep_freed_memory()
    task = load_task(job)
    clients = [(c.id, FIRST_CLIENT_RANK + i) for c in job.clusters for i in range(c.num_clients)]
    server = (job.controller.cluster, CONTROLLER_RANK)
    files = RunFiles(job.controller.dir)
    results: dict = {}
    errors: list = []

    def status(state: str, **extra: Any) -> None:
        files.write_status({"job": job.job, "algorithm": algorithm.name, "state": state, **extra})

    def run_server(ep: Any) -> dict:
        stop = files.stop_watch()
        status("running")
        try:
            res = algorithm.serve(ep, clients, task, job, stop)
        except Exception as exc:
            status("failed", error=repr(exc))
            raise
        rounds = res.get("rounds", len(res.get("round_s", [])))  # OWL counts its rounds by their times
        summary = {k: res[k] for k in ("accuracy", "initial_accuracy", "idle_s", "busy_s", "wall_s", "ended",
                                        "num_groups") if k in res}
        status("stopped" if stop() else "finished", round=rounds, result={"rounds": rounds, **summary})
        return res

    def actor(rank: int) -> None:
        try:
            with Endpoint.connect(me.worker, job=job.job, rank=rank, timeout_s=job.startup_timeout_s) as ep:
                if rank == CONTROLLER_RANK:
                    results["server"] = run_server(ep)
                else:
                    results[f"{cluster}/{rank}"] = algorithm.client(ep, server, (cluster, rank), clients, task, job)
        except Exception as exc:  # reported with the results: one actor's failure must not hide the others'
            log.exception("%s %s/%d failed", algorithm.name, cluster, rank)
            errors.append(f"{cluster}/{rank}: {exc!r}")

    ranks = [CONTROLLER_RANK] if role in ("cluster", "controller") and cluster == server[0] else []
    if role in ("cluster", "clients"):
        ranks += [FIRST_CLIENT_RANK + i for i in range(me.num_clients)]
    elif role == "client":
        ranks = [FIRST_CLIENT_RANK + index]
    threads = [threading.Thread(target=actor, args=(r,), name=f"{algorithm.name}-{cluster}-{r}", daemon=True)
               for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        results["errors"] = errors
    return results
