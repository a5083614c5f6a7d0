"""A numpy client for protocol tests: softmax regression on a synthetic, learnable task; misbehaviours by name."""
from __future__ import annotations

import os
import time

import numpy as np

from nebula.federated.client import Client


class ToyClient(Client):
    """Softmax regression trained by full-batch gradient steps; `behaviour` makes it a bad client."""

    def __init__(self, seed: int, behaviour: str = "honest", sleep_s: float = 0.0, n: int = 200, dim: int = 4) -> None:
        rng = np.random.default_rng(seed)
        true = np.random.default_rng(12345).normal(size=(dim, 3))
        x = rng.normal(size=(n, dim)).astype(np.float32)
        self.dim = dim
        self.x, self.y = x, (x @ true).argmax(1)
        self.behaviour, self.sleep_s = behaviour, sleep_s

    def num_examples(self) -> int:
        return len(self.y)

    def get_parameters(self, config):
        p = {"w": np.zeros((self.dim, 3), np.float32), "b": np.zeros(3, np.float32)}
        b = self.behaviour
        if b == "init_nan":
            p["w"][1, 1] = np.nan
        elif b == "init_backdoor":  # float64 and a tensor of its own
            p = {"w": p["w"].astype(np.float64), "b": p["b"].astype(np.float64), "backdoor": np.ones(7)}
        elif b == "init_silent":  # answers long after the controller stopped waiting
            time.sleep(self.sleep_s)
        return p

    def _probs(self, p):
        z = self.x @ p["w"] + p["b"]
        z = np.exp(z - z.max(1, keepdims=True))
        return z / z.sum(1, keepdims=True)

    def fit(self, parameters, config):
        if self.behaviour == "crash":  # the process dies in the middle of its round (after any key exchange)
            os._exit(3)
        if self.behaviour != "init_silent":
            time.sleep(self.sleep_s)
        p = {k: v.copy() for k, v in parameters.items()}
        onehot = np.eye(3, dtype=np.float32)[self.y]
        for _ in range(20):
            g = (self._probs(p) - onehot) / len(self.y)
            p["w"] -= 1.0 * self.x.T @ g
            p["b"] -= 1.0 * g.sum(0)
        b = self.behaviour
        if b == "nan":
            p["w"][0, 0] = np.nan
        elif b == "shape":
            p["w"] = np.zeros((self.dim + 1, 3), np.float32)
        elif b == "dtype":
            p["b"] = p["b"].astype(np.float64)
        elif b == "flip":
            p = {k: -10 * v for k, v in p.items()}
        elif b in ("huge_n", "scale"):  # weights of -1000, claiming 10^15 examples (or its real count)
            p = {k: np.full_like(v, -1000.0) for k, v in p.items()}
            return p, 10**15 if b == "huge_n" else len(self.y), {}
        elif b == "huge_values":  # finite, but near float32's largest
            p = {k: np.full_like(v, 3e38) for k, v in p.items()}
        return p, len(self.y), {}

    def evaluate(self, parameters, config):
        pr = self._probs(parameters)
        loss = float(-np.log(pr[np.arange(len(self.y)), self.y] + 1e-9).mean())
        return loss, len(self.y), {"accuracy": float((pr.argmax(1) == self.y).mean())}


def make_client(cluster: str, index: int, num_clients: dict, behaviours: dict | None = None,
                sleep_s: dict | None = None, dim: int = 4, n: int = 200) -> ToyClient:
    """Client `index` of `cluster`; `behaviours`/`sleep_s` map "A/0" to a misbehaviour or a delay."""
    key = f"{cluster}/{index}"
    return ToyClient(seed=sum(key.encode()) * 7 + index, behaviour=(behaviours or {}).get(key, "honest"),
                     sleep_s=(sleep_s or {}).get(key, 0.0), n=n, dim=dim)
