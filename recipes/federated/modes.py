"""The language-identification task under FedOptima or OWL (`algorithm: fedoptima | owl` in the job file).

    python -m recipes.federated.modes JOB.yaml --cluster A

runs this cluster's actors as threads, each its own authenticated rank behind the cluster's switch: in the
controller's cluster the server (rank 0), and in every cluster its clients (ranks 2, 3, ...) as FedOptima devices
or OWL workers, each on its Dirichlet share of the training data (the same split the FEDn clients use).
The model is the recipe's n-gram MLP with one more hidden layer, so that FedOptima has layers to keep on the
device; for OWL it is one branch (a linear model), passed on whole from the central worker.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading

import numpy as np

from recipes.federated.client import client_share
from recipes.federated.data import NUM_BUCKETS, densify, load_prepared

__all__ = ["LangIdTask", "run_cluster"]

FIRST_CLIENT_RANK = 2


class LangIdTask:
    """FedOptima's Task and OWL's OwlTask over the recipe's prepared data."""

    def __init__(self, data: str, num_clients: dict, alpha: float = 0.1, hidden: int = 64, seed: int = 0,
                 batch_size: int = 32, **_: object) -> None:
        self.d = load_prepared(data)
        self.num_clients, self.alpha, self.hidden, self.seed, self.batch = num_clients, alpha, hidden, seed, batch_size
        self.num_classes = len(self.d["langs"])
        self.order = [(c, i) for c, n in num_clients.items() for i in range(n)]

    def layers(self) -> list:
        import paddle
        from paddle import nn

        paddle.seed(self.seed)
        return [nn.Linear(NUM_BUCKETS, self.hidden), nn.ReLU(), nn.Linear(self.hidden, self.hidden), nn.ReLU(),
                nn.Linear(self.hidden, self.num_classes)]

    def model(self):
        from paddle import nn

        return nn.Sequential(*self.layers())

    def sample(self) -> np.ndarray:
        return densify(self.d["train_indices"], self.d["train_indptr"], np.arange(4))

    def batches(self, k: int, num: int):
        c, i = self.order[k]
        rows = client_share(self.d["train_labels"], self.num_clients, c, i, self.alpha, self.seed)
        x = densify(self.d["train_indices"], self.d["train_indptr"], rows)
        y = self.d["train_labels"][rows]
        rng = np.random.default_rng(self.seed + k)
        while True:
            idx = rng.permutation(len(y))
            for s in range(0, max(1, len(idx) - self.batch + 1), self.batch):
                j = idx[s : s + self.batch]
                yield x[j], y[j]

    def test_data(self) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.d["test_labels"])
        return densify(self.d["test_indices"], self.d["test_indptr"], np.arange(n)), self.d["test_labels"]


def run_cluster(job_file: str, cluster: str) -> dict:
    """Run `cluster`'s actors of the job's algorithm until the server stops them; each actor's result."""
    from nebula.channel import Endpoint
    from nebula.federated.fedoptima.jobfile import load_federated_modes
    from nebula.federated.fedoptima.runtime import run_device, serve
    from nebula.federated.fedoptima.split import DeviceInfo, measure_flops_per_s
    from nebula.federated.owl.runtime import run_owl_worker, serve_owl

    job, mode = load_federated_modes(job_file)
    if mode.algorithm not in ("fedoptima", "owl"):
        raise ValueError(f"{job_file}: algorithm is {mode.algorithm!r}; run FEDn rounds with `nebula fl start`")
    num_clients = {c.id: c.num_clients for c in job.clusters}
    task = LangIdTask(num_clients=num_clients, seed=job.seed, **job.client.args)
    clients = [(c.id, FIRST_CLIENT_RANK + i) for c in job.clusters for i in range(c.num_clients)]
    me = job.cluster(cluster)
    server = (job.controller.cluster, 0)
    results: dict = {}
    errors: list = []

    def actor(rank: int) -> None:
        try:
            with Endpoint.connect(me.worker, job=job.job, rank=rank, timeout_s=job.startup_timeout_s) as ep:
                if rank == 0 and mode.algorithm == "fedoptima":
                    results["server"] = dataclasses.asdict(serve(ep, clients, task, mode.fedoptima))
                elif rank == 0:
                    results["server"] = dataclasses.asdict(serve_owl(ep, clients, task, mode.owl))
                elif mode.algorithm == "fedoptima":
                    k = clients.index((cluster, rank))
                    # device information for the pre-processor: measured FLOP/s (under the simulated slowdown)
                    # and the upload bandwidth the job file gives
                    info = DeviceInfo(flops_per_s=measure_flops_per_s(slowdown=mode.fedoptima.slowdown_of(k)),
                                      bandwidth_bytes_per_s=mode.fedoptima.bandwidth_bytes_per_s)
                    results[f"{cluster}/{rank}"] = run_device(ep, server, k, len(clients), task, mode.fedoptima, info)
                else:
                    results[f"{cluster}/{rank}"] = run_owl_worker(ep, server, task, mode.owl)
        except Exception as exc:  # the CLI reports it; one actor's failure must not hide the others' results
            errors.append(f"{cluster}/{rank}: {exc!r}")

    ranks = ([0] if cluster == server[0] else []) + [FIRST_CLIENT_RANK + i for i in range(me.num_clients)]
    threads = [threading.Thread(target=actor, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        results["errors"] = errors
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description="Run a cluster's FedOptima or OWL actors of a federated job")
    ap.add_argument("job")
    ap.add_argument("--cluster", required=True)
    a = ap.parse_args()
    res = run_cluster(a.job, a.cluster)
    print("RESULT " + json.dumps(res), flush=True)
    return 1 if res.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
