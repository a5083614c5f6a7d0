"""Process entry points of the federated mode (FEDn's rounds): a cluster's actors (combiner, plus the controller where
it runs), the controller or the combiner alone, and clients; `start_rounds` is what `nebula fl start` runs (through
`nebula.modes`), `python -m nebula.federated.run ROLE JOB --cluster A [--index 0]` the same in a process of its own."""
from __future__ import annotations

import argparse
import logging
import sys
import threading
from pathlib import Path

from nebula.federated._actor import stop_on_sigterm
from nebula.federated.client import load_client, run_client
from nebula.federated.combiner import Combiner
from nebula.federated.config import load_federated_job
from nebula.federated.controller import Controller
from nebula.heap import keep_freed_memory

__all__ = ["ROLES", "run_cluster", "run_one_client", "run_clients", "start_rounds", "main"]

log = logging.getLogger(__name__)
ROLES = ("cluster", "controller", "combiner", "clients", "client")


def run_cluster(job_file: str | Path, cluster: str, controller: bool | None = None) -> int | None:
    """Run `cluster`'s combiner, and the controller when the job puts it here; the final head version (or None)."""
    job = load_federated_job(job_file)
    job.cluster(cluster)
    keep_freed_memory()
    with_controller = job.controller.cluster == cluster if controller is None else controller
    comb = Combiner(job, cluster)
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            comb.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
            log.exception("combiner %s failed", cluster)

    t = threading.Thread(target=serve, name=f"combiner-{cluster}", daemon=True)
    t.start()
    head = None
    if with_controller:
        head = Controller(job).run()
    t.join()
    if errors:
        raise errors[0]
    return head


def run_one_client(job_file: str | Path, cluster: str, index: int) -> int:
    """Build the job's client `index` of `cluster` and serve tasks until stopped; rounds it trained."""
    job = load_federated_job(job_file)
    c = job.cluster(cluster)
    if not 0 <= index < c.num_clients:
        raise ValueError(f"client index {index} is outside cluster {cluster}'s num_clients={c.num_clients}")
    keep_freed_memory()
    return run_client(job, cluster, index, load_client(job, cluster, index))


def run_clients(job_file: str | Path, cluster: str, indices: list[int] | None = None) -> dict[int, int]:
    """Run several clients of `cluster` in this process (one thread and one switch connection each): many
    lightweight clients without a process each. Rounds trained, by index."""
    job = load_federated_job(job_file)
    c = job.cluster(cluster)
    indices = list(range(c.num_clients)) if indices is None else indices
    keep_freed_memory()
    done: dict[int, int] = {}

    def serve(i: int) -> None:
        done[i] = run_client(job, cluster, i, load_client(job, cluster, i))

    threads = [threading.Thread(target=serve, args=(i,), name=f"client-{cluster}-{i}", daemon=True) for i in indices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done


def start_rounds(job_file: str | Path, cluster: str, role: str = "cluster", index: int = 0) -> str:
    """Run `cluster`'s actors of `role` until the run ends; one line saying what they did. Roles: cluster (the
    combiner, plus the controller where the job puts it), controller or combiner (alone), clients (every client of
    the cluster in this process), client (client `index`)."""
    if role == "client":
        return f"client {cluster}/{index} trained {run_one_client(job_file, cluster, index)} rounds"
    if role == "clients":
        return f"clients of {cluster} trained {sum(run_clients(job_file, cluster).values())} rounds in all"
    if role in ("cluster", "combiner", "controller"):
        stop_on_sigterm()  # SIGTERM ends the run cleanly: a combiner's closing checkpoint, the controller's status
    if role in ("controller", "combiner"):
        keep_freed_memory()  # (the other roles' functions set it themselves)
    if role == "controller":
        return f"head version {Controller(load_federated_job(job_file)).run()}"
    if role == "combiner":
        Combiner(load_federated_job(job_file), cluster).run()
        return f"combiner {cluster} done"
    if role != "cluster":
        raise ValueError(f"role {role!r} must be one of {', '.join(ROLES)}")
    head = run_cluster(job_file, cluster)
    return f"cluster {cluster} done" + (f", head version {head}" if head is not None else "")


def main(argv: list[str] | None = None) -> int:
    """`python -m nebula.federated.run ROLE JOB --cluster C [--index I]`."""
    p = argparse.ArgumentParser(prog="python -m nebula.federated.run", description=__doc__)
    p.add_argument("role", choices=ROLES)
    p.add_argument("job")
    p.add_argument("--cluster", required=True)
    p.add_argument("--index", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(start_rounds(args.job, args.cluster, args.role, args.index), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
