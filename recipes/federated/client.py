"""The federated client of the recipe: one share of the non-IID split of the training data (data.py)."""
from __future__ import annotations

import numpy as np

from nebula.federated.client import PaddleClient
from recipes.federated.data import densify, dirichlet_split, load_prepared

__all__ = ["make_client", "client_share"]


def client_share(labels: np.ndarray, num_clients: dict, cluster: str, index: int, alpha: float,
                 seed: int) -> np.ndarray:
    """Training rows of client `index` of `cluster` (clients numbered across clusters in job order)."""
    order = [(c, i) for c, n in num_clients.items() for i in range(n)]
    parts = dirichlet_split(labels, len(order), alpha, seed)
    return parts[order.index((cluster, index))]


def make_client(cluster: str, index: int, num_clients: dict, data: str, alpha: float = 0.1, seed: int = 0,
                epochs: int = 1, lr: float = 3e-3, batch_size: int = 32, hidden: int = 64,
                device: str = "cpu") -> PaddleClient:
    """Client `index` of `cluster`: its Dirichlet(alpha) share, 10% of it held out for its own evaluation."""
    import paddle

    from recipes.federated.model import LangIdModel

    paddle.set_device(device)
    d = load_prepared(data)
    labels = d["train_labels"]
    rows = client_share(labels, num_clients, cluster, index, alpha, seed)
    rng = np.random.default_rng(seed + 7)
    rows = rng.permutation(rows)
    n_eval = max(1, len(rows) // 10)
    ev, tr = rows[:n_eval], rows[n_eval:]
    x = densify(d["train_indices"], d["train_indptr"], rows)
    train = (x[n_eval:], labels[tr])
    test = (x[:n_eval], labels[ev])
    model = LangIdModel(num_langs=len(d["langs"]), hidden=hidden, seed=seed)
    return PaddleClient(model, train, test, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed + index)
