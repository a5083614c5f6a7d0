"""FedOptima and OWL as `nebula fl start` runs them (`algorithm: fedoptima | owl` in the job file).

Each cluster runs its actors as threads, each its own authenticated rank behind the cluster's switch: in the
controller's cluster the server (the controller's rank, 0), and in every cluster its clients (ranks 2, 3, ...)
as FedOptima devices or OWL workers. What they train is the job's `task: module:factory`, called with
`num_clients={cluster: n}`, `seed` and the `client.args` of the job. The server writes the controller's status
file (state, algorithm, its measurements when done) and ends the run early when `nebula fl stop` asks. What differs
between the two is an `ActorAlgorithm`: its server and its client (`FEDOPTIMA`, `OWL`).

Every actor keeps its own signed, hash-chained audit log (`nebula.federated._actor.ActorAudit`), where FEDn's
actors keep theirs: the server's in `controller.dir`/controller, a client's in `controller.dir`/clients/CLUSTER-INDEX.
It holds a start record (`fl.start`), an `fl.owl` / `fl.fedoptima` record for the first refusal of each (peer,
message type, field) (peer, message, field, value, expected: the runtimes report each refusal through a `refused`
callable and know nothing of files), its repeats counted (`RefusalTally`) and written as one record with their count
at most once a second and at the end, and an end record (`fl.stop`: ok, failed, or stopped by SIGTERM), then the
closing checkpoint.
SIGTERM ends the actors cleanly while `run_actors` runs: the runtimes poll `check_terminated` while they wait.
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from nebula.federated._actor import ActorAudit, RefusalTally, Terminated, stop_on_sigterm
from nebula.federated.actor_channels import CONTROLLER_RANK, FIRST_CLIENT_RANK
from nebula.federated.checks import Refusal
from nebula.federated.config import FederatedJob
from nebula.federated.runfiles import RunFiles
from nebula.heap import keep_freed_memory
from nebula.paddle_threads import dygraph_before_threads

__all__ = ["ROLES", "ActorAlgorithm", "FEDOPTIMA", "OWL", "audit_dir", "load_task", "run_actors"]

log = logging.getLogger(__name__)
ROLES = ("cluster", "controller", "clients", "client")
Actor = tuple[str, int]  # (cluster, rank)
VALUE_CHARS = 160  # of a refused value in its audit record: a peer chooses it, so its size is bounded here


@dataclass(frozen=True, slots=True)
class ActorAlgorithm:
    """The server (`serve(ep, clients, task, job, should_stop, refused) -> result`) and client (`client(ep, server,
    me, clients, task, job, refused) -> result`) of one algorithm; `refused(peer, field, value, expected)` audits a
    refusal."""

    name: str
    serve: Callable[..., Any]
    client: Callable[..., Any]


def _fedoptima_server(ep: Any, clients: list[Actor], task: Any, job: FederatedJob, should_stop: Callable,
                      refused: Callable) -> dict:
    from nebula.federated.fedoptima.runtime import serve

    return dataclasses.asdict(serve(ep, clients, task, job.fedoptima, should_stop=should_stop, refused=refused))


def _fedoptima_device(ep: Any, server: Actor, me: Actor, clients: list[Actor], task: Any, job: FederatedJob,
                      refused: Callable) -> Any:
    from nebula.federated.fedoptima.runtime import run_device
    from nebula.federated.fedoptima.split import DeviceInfo, measure_flops_per_s

    k = clients.index(me)
    # device information for the pre-processor: measured FLOP/s (under the simulated slowdown) and the upload
    # bandwidth the job file gives
    info = DeviceInfo(flops_per_s=measure_flops_per_s(slowdown=job.fedoptima.slowdown_of(k)),
                      bandwidth_bytes_per_s=job.fedoptima.bandwidth_bytes_per_s)
    return run_device(ep, server, k, len(clients), task, job.fedoptima, info, refused=refused)


def _owl_server(ep: Any, clients: list[Actor], task: Any, job: FederatedJob, should_stop: Callable,
                refused: Callable) -> dict:
    from nebula.federated.owl.runtime import serve_owl

    return dataclasses.asdict(serve_owl(ep, clients, task, job.owl, should_stop=should_stop, refused=refused))


def _owl_worker(ep: Any, server: Actor, me: Actor, clients: list[Actor], task: Any, job: FederatedJob,
                refused: Callable) -> Any:
    from nebula.federated.owl.runtime import run_owl_worker

    return run_owl_worker(ep, server, task, job.owl, refused=refused)


FEDOPTIMA = ActorAlgorithm("fedoptima", _fedoptima_server, _fedoptima_device)
OWL = ActorAlgorithm("owl", _owl_server, _owl_worker)


def audit_dir(job: FederatedJob, cluster: str, rank: int) -> Path:
    """Where actor `cluster`/`rank` keeps its audit log, as FEDn's actors do: the server (the controller's rank) in
    `controller.dir`/controller, client i of a cluster in `controller.dir`/clients/CLUSTER-i."""
    base = Path(job.controller.dir)
    if rank == CONTROLLER_RANK:
        return base / "controller"
    return base / "clients" / f"{cluster}-{rank - FIRST_CLIENT_RANK}"


def _open_audit(job: FederatedJob, cluster: str, rank: int, algorithm: str) -> ActorAudit:
    """The audit log of one actor (made here, before any actor starts: a directory that cannot be made is one
    line naming it and the fix)."""
    d = audit_dir(job, cluster, rank)
    role = f"{algorithm}-server" if rank == CONTROLLER_RANK else f"{algorithm}-client"
    try:
        return ActorAudit(d, job.cluster(cluster).worker, role, cluster, rank)
    except OSError as exc:
        raise ValueError(f"controller.dir: the audit directory {d} of {cluster}/{rank} cannot be made or written "
                         f"({exc.strerror or exc}); set controller.dir in the job file to a directory this user "
                         "can write") from None


def _refusals(audit: ActorAudit, action: str, tally: RefusalTally) -> Callable[..., bool]:
    """The `refused(peer, field, value, expected, message="")` a runtime calls: the first of each (peer, message
    type, field) one `action` record (outcome refused, count 1), the repeats counted in `tally` and flushed as one
    record with their count when due; True when the refusal gets its log line (at most one per (peer, message, field)
    and interval)."""
    def refused(peer: str, field: str, value: Any, expected: str, message: str = "") -> bool:
        d = {"peer": str(peer)[:VALUE_CHARS], "message": str(message)[:32], "field": str(field)[:VALUE_CHARS],
             "value": str(value)[:VALUE_CHARS], "expected": str(expected)[:2 * VALUE_CHARS]}
        kind = f"{d['message']}.{d['field']}" if d["message"] else d["field"]  # (types and fields: the code's own)
        why = Refusal(kind, f"{d['field']}={d['value']}, expected {d['expected']}")
        loud = tally.loud(action, why, d["peer"])
        if tally.first(action, why, d["peer"]):
            audit.record(action, d["peer"], "refused", {**d, "count": 1})
        else:
            tally.add(action, why, d["peer"], trail=False, first=d)
        if tally.due():
            tally.flush(audit)
        return loud
    return refused


def load_task(job: FederatedJob) -> Any:
    """The job's FedOptima/OWL task: `task` ("module:factory") called with the clients and client args."""
    mod, _, name = job.task.partition(":")
    try:
        factory = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"task {job.task!r} cannot be loaded ({exc}); name an importable 'module:factory'") from None
    task = factory(num_clients={c.id: c.num_clients for c in job.clusters}, seed=job.seed, **job.client.args)
    batch = getattr(task, "batch", None)  # what bounds a peer's counts: examples per update, activation rows
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"task {job.task!r}: batch={batch!r}, expected a positive integer attribute `batch` (the "
                         "most examples one of its batches holds); give the task's class a batch size")
    return task


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
    dygraph_before_threads()  # the actors' threads train Paddle models; this thread may use Paddle after them
    task = load_task(job)
    clients = [(c.id, FIRST_CLIENT_RANK + i) for c in job.clusters for i in range(c.num_clients)]
    server = (job.controller.cluster, CONTROLLER_RANK)
    files = RunFiles(job.controller.dir)
    results: dict = {}
    errors: list = []

    def status(state: str, **extra: Any) -> None:
        files.write_status({"job": job.job, "algorithm": algorithm.name, "state": state, **extra})

    def run_server(ep: Any, refused: Callable) -> dict:
        stop = files.stop_watch()
        status("running")
        try:
            res = algorithm.serve(ep, clients, task, job, stop, refused)
        except Terminated:
            status("stopped", ended="SIGTERM")
            raise
        except Exception as exc:
            status("failed", error=repr(exc))
            raise
        rounds = res.get("rounds", len(res.get("round_s", [])))  # OWL counts its rounds by their times
        summary = {k: res[k] for k in ("accuracy", "initial_accuracy", "idle_s", "busy_s", "wall_s", "ended",
                                        "num_groups") if k in res}
        status("stopped" if stop() else "finished", round=rounds, result={"rounds": rounds, **summary})
        return res

    def actor(rank: int, audit: ActorAudit) -> None:
        tally = RefusalTally(by_sender=True)
        refused = _refusals(audit, f"fl.{algorithm.name}", tally)
        outcome, detail = "ok", {"algorithm": algorithm.name}
        try:
            audit.record("fl.start", job.job, "ok", detail)
            with Endpoint.connect(me.worker, job=job.job, rank=rank, timeout_s=job.startup_timeout_s) as ep:
                if rank == CONTROLLER_RANK:
                    results["server"] = run_server(ep, refused)
                else:
                    results[f"{cluster}/{rank}"] = algorithm.client(ep, server, (cluster, rank), clients, task, job,
                                                                    refused)
        except Terminated:  # SIGTERM: an end asked for, not a failure
            log.warning("%s %s/%d stopped by SIGTERM", algorithm.name, cluster, rank)
            results["server" if rank == CONTROLLER_RANK else f"{cluster}/{rank}"] = {"ended": "SIGTERM"}
            outcome, detail = "stopped", {**detail, "ended": "SIGTERM"}
        except Exception as exc:  # reported with the results: one actor's failure must not hide the others'
            log.exception("%s %s/%d failed", algorithm.name, cluster, rank)
            errors.append(f"{cluster}/{rank}: {exc!r}")
            outcome, detail = "failed", {**detail, "error": repr(exc)[:2 * VALUE_CHARS]}
        finally:  # the counted refusals, the end record and the closing checkpoint, whatever ended the actor
            try:
                tally.flush(audit)
                audit.record("fl.stop", job.job, outcome, detail)
            finally:
                audit.close()

    ranks = [CONTROLLER_RANK] if role in ("cluster", "controller") and cluster == server[0] else []
    if role in ("cluster", "clients"):
        ranks += [FIRST_CLIENT_RANK + i for i in range(me.num_clients)]
    elif role == "client":
        ranks = [FIRST_CLIENT_RANK + index]
    audits: dict[int, ActorAudit] = {}
    try:
        for r in ranks:
            audits[r] = _open_audit(job, cluster, r, algorithm.name)
    except ValueError:
        for a in audits.values():  # (the ones opened before: closed, not left without their checkpoint)
            a.close()
        raise
    threads = [threading.Thread(target=actor, args=(r, audits[r]), name=f"{algorithm.name}-{cluster}-{r}",
                                daemon=True) for r in ranks]
    before = signal.getsignal(signal.SIGTERM)
    # SIGTERM (`nebula fl start` stopped by its supervisor) ends the actors at their next poll, each with its end
    # record and closing checkpoint; the handler before is back once they are done
    hooked = stop_on_sigterm()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        if hooked:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)
    if errors:
        results["errors"] = errors
    return results
