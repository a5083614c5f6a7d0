"""The centrally trained baseline: the same model on all training data at once, one epoch per federated round
(the same number of examples seen), held-out accuracy after each; `python -m recipes.federated.central`."""
from __future__ import annotations

import argparse
import json

import numpy as np

from recipes.federated.data import densify, load_prepared

__all__ = ["train_central", "test_accuracy"]


def test_accuracy(model, d: dict) -> float:
    """Accuracy of `model` on the held-out test split."""
    import paddle

    x = densify(d["test_indices"], d["test_indptr"], np.arange(len(d["test_labels"])))
    model.eval()
    with paddle.no_grad():
        pred = model(paddle.to_tensor(x)).numpy().argmax(-1)
    return float((pred == d["test_labels"]).mean())


def train_central(data: str, epochs: int, lr: float = 3e-3, batch_size: int = 32, hidden: int = 64,
                  seed: int = 0) -> list[float]:
    """Held-out accuracy after each epoch of central training."""
    import paddle
    import paddle.nn.functional as F

    from recipes.federated.model import LangIdModel

    d = load_prepared(data)
    y = d["train_labels"]
    x = densify(d["train_indices"], d["train_indptr"], np.arange(len(y)))
    model = LangIdModel(num_langs=len(d["langs"]), hidden=hidden, seed=seed)
    opt = paddle.optimizer.Adam(learning_rate=lr, parameters=model.parameters())
    rng = np.random.default_rng(seed)
    accs = []
    for _ in range(epochs):
        model.train()
        order = rng.permutation(len(y))
        for i in range(0, len(y), batch_size):
            idx = order[i : i + batch_size]
            loss = F.cross_entropy(model(paddle.to_tensor(x[idx])), paddle.to_tensor(y[idx].reshape(-1, 1)))
            loss.backward()
            opt.step()
            opt.clear_grad()
        accs.append(test_accuracy(model, d))
    return accs


def main() -> None:
    """Print one JSON line per epoch: {"epoch", "accuracy"}."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--out", help="also write the list of accuracies here (JSON)")
    args = p.parse_args()
    accs = train_central(args.data, args.epochs)
    for e, a in enumerate(accs, 1):
        print(json.dumps({"epoch": e, "accuracy": round(a, 4)}), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(accs, f)


if __name__ == "__main__":
    main()
