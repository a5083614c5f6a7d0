"""Process entry points of the federated mode: a cluster's actors (combiner, plus the controller where it runs),
and one client; `python -m nebula.federated.run cluster JOB --cluster A` / `client JOB --cluster A --index 0`."""
from __future__ import annotations

import argparse
import logging
import sys
import threading
from pathlib import Path

from nebula.federated.client import load_client, run_client
from nebula.federated.combiner import Combiner
from nebula.federated.config import load_federated_job
from nebula.federated.controller import Controller

__all__ = ["run_cluster", "run_one_client", "run_clients", "main"]

log = logging.getLogger(__name__)


def run_cluster(job_file: str | Path, cluster: str, controller: bool | None = None) -> int | None:
    """Run `cluster`'s combiner, and the controller when the job puts it here; the final head version (or None)."""
    job = load_federated_job(job_file)
    job.cluster(cluster)
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
    return run_client(job, cluster, index, load_client(job, cluster, index))


def run_clients(job_file: str | Path, cluster: str, indices: list[int] | None = None) -> dict[int, int]:
    """Run several clients of `cluster` in this process (one thread and one switch connection each): many
    lightweight clients without a process each. Rounds trained, by index."""
    job = load_federated_job(job_file)
    c = job.cluster(cluster)
    indices = list(range(c.num_clients)) if indices is None else indices
    done: dict[int, int] = {}

    def serve(i: int) -> None:
        done[i] = run_client(job, cluster, i, load_client(job, cluster, i))

    threads = [threading.Thread(target=serve, args=(i,), name=f"client-{cluster}-{i}", daemon=True) for i in indices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done


def main(argv: list[str] | None = None) -> int:
    """`python -m nebula.federated.run cluster|client ...`."""
    p = argparse.ArgumentParser(prog="python -m nebula.federated.run", description=__doc__)
    p.add_argument("role", choices=["cluster", "client", "clients", "controller", "combiner"])
    p.add_argument("job")
    p.add_argument("--cluster", required=True)
    p.add_argument("--index", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.role == "client":
        n = run_one_client(args.job, args.cluster, args.index)
        print(f"client {args.cluster}/{args.index} trained {n} rounds", flush=True)
    elif args.role == "clients":
        done = run_clients(args.job, args.cluster)
        print(f"clients of {args.cluster} trained {sum(done.values())} rounds in all", flush=True)
    elif args.role == "controller":
        job = load_federated_job(args.job)
        print(f"head version {Controller(job).run()}", flush=True)
    elif args.role == "combiner":
        Combiner(load_federated_job(args.job), args.cluster).run()
    else:
        head = run_cluster(args.job, args.cluster)
        print(f"cluster {args.cluster} done" + (f", head version {head}" if head is not None else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
