"""The language-identification task under FedOptima or OWL (`algorithm: fedoptima | owl` and
`task: recipes.federated.modes:LangIdTask` in the job file), each client on its Dirichlet share of the training
data (the same split the FEDn clients use). Run a cluster with `nebula fl start JOB --cluster A` (or
`python -m recipes.federated.modes JOB --cluster A`, the same actors).
The model is the recipe's n-gram MLP with one more hidden layer, so that FedOptima has layers to keep on the
device; for OWL it is one branch (a linear model), passed on whole from the central worker.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from recipes.federated.client import client_share
from recipes.federated.data import NUM_BUCKETS, densify, load_prepared

__all__ = ["LangIdTask", "run_cluster"]


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
    """Run `cluster`'s actors of the job's algorithm until the server stops them (as `nebula fl start` does)."""
    from nebula.modes import start

    return start(job_file, cluster).result


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
