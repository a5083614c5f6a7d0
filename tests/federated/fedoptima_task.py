"""A small real classification task for FedOptima and OWL tests: Gaussian classes in 16 dimensions, each device
holding mostly two of the four classes (non-IID), an MLP (or a two-tower model for OWL), held-out test data."""
from __future__ import annotations

import numpy as np

NUM_CLASSES = 4
DIM = 16


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    centers = np.random.default_rng(7).standard_normal((NUM_CLASSES, DIM)).astype(np.float32) * 1.2
    rng = np.random.default_rng(seed)
    y = rng.integers(0, NUM_CLASSES, n)
    x = centers[y] + rng.standard_normal((n, DIM)).astype(np.float32)
    return x.astype(np.float32), y.astype(np.int64)


class BlobsTask:
    """The FedOptima Task protocol over Gaussian blobs."""

    num_classes = NUM_CLASSES

    def __init__(self, batch: int = 32, seed: int = 0) -> None:
        self.batch, self.seed = batch, seed

    def layers(self) -> list:
        import paddle
        import paddle.nn as nn

        paddle.seed(self.seed)
        return [nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES)]

    def sample(self) -> np.ndarray:
        return _data(4, 99)[0]

    def batches(self, device: int, num_devices: int):
        x, y = _data(4000, 1000 + device)
        # non-IID: device d keeps classes d and d+1 (mod 4) for 90% of its examples
        mine = (y == device % NUM_CLASSES) | (y == (device + 1) % NUM_CLASSES)
        rng = np.random.default_rng(device)
        keep = mine | (rng.random(len(y)) < 0.1 * mine.mean() / max(1e-9, 1 - mine.mean()))
        x, y = x[keep], y[keep]
        while True:
            idx = rng.permutation(len(y))
            for i in range(0, len(idx) - self.batch + 1, self.batch):
                j = idx[i : i + self.batch]
                yield x[j], y[j]

    def test_data(self) -> tuple[np.ndarray, np.ndarray]:
        return _data(1000, 5)


class TowersTask:
    """The OWL task: the same blobs, a model with `num_towers` parallel towers, then a classifier."""

    def __init__(self, num_towers: int = 4, width: int = 32, batch: int = 32, seed: int = 0) -> None:
        self.num_towers, self.width, self.batch, self.seed = num_towers, width, batch, seed

    def model(self):
        import paddle
        import paddle.nn as nn

        from nebula.federated.owl.model import Parallel

        paddle.seed(self.seed)
        w = self.width
        towers = [nn.Sequential(nn.Linear(DIM, w), nn.ReLU(), nn.Linear(w, w // 2)) for _ in range(self.num_towers)]
        return nn.Sequential(Parallel(*towers), nn.ReLU(), nn.Linear(self.num_towers * (w // 2), NUM_CLASSES))

    def batches(self, worker: int, num_workers: int):
        return BlobsTask(self.batch).batches(worker, num_workers)

    def test_data(self) -> tuple[np.ndarray, np.ndarray]:
        return _data(1000, 5)


def blobs_task(num_clients: dict, seed: int = 0, batch: int = 32, **_: object) -> BlobsTask:
    """`task:` factory of a job file (`tests.federated.fedoptima_task:blobs_task`) for FedOptima."""
    return BlobsTask(batch=batch, seed=seed)


def towers_task(num_clients: dict, seed: int = 0, batch: int = 32, **_: object) -> TowersTask:
    """`task:` factory of a job file for OWL."""
    return TowersTask(batch=batch, seed=seed)
