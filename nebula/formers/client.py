"""Federated clients that fine-tune a library causal LM on their own share of a text file (`mode: federated`).

In a federated job file::

    client: {factory: "nebula.formers:make_client", args: {from_pretrained: ckpt/tiny-llama, data: train.txt}}

Clients are numbered across clusters in job order; client k of n holds the k-th of n contiguous blocks of the
file's lines (a file grouped by source, such as one language's catalogs after another, gives each client its
own kind of text) and keeps the last `eval_fraction` of its block to evaluate the global model on.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from nebula.federated.client import Client
from nebula.mean import Weights
from nebula.formers.checkpoint import resolve_pretrained
from nebula.formers.data import TokenData, load_tokenizer, read_lines
from nebula.formers.families import family_of
from nebula.formers.layers import CausalLMLayers

__all__ = ["CausalLMClient", "make_client", "client_block"]


def client_block(num_lines: int, num_clients: Mapping[str, int], cluster: str, index: int) -> np.ndarray:
    """Line indices of client `index` of `cluster`: its contiguous block (clients in job order)."""
    order = [(c, i) for c, n in num_clients.items() for i in range(n)]
    if (cluster, index) not in order:
        raise ValueError(f"client {index} of cluster {cluster} is not in the job (clients: {num_clients})")
    k = order.index((cluster, index))
    return np.array_split(np.arange(num_lines), len(order))[k]


class CausalLMClient(Client):
    """The whole causal LM on one client: `fit` trains it on its lines with AdamW, `evaluate` gives the held-out
    loss and perplexity. A task's config may carry `epochs`, `lr` and `batch_size`."""

    def __init__(self, layers: CausalLMLayers, train: np.ndarray, test: np.ndarray, *, epochs: int = 1,
                 batch_size: int = 8, lr: float = 1e-3, seed: int = 0) -> None:
        import paddle

        from nebula.hybrid.layered import build_layers

        self.layers, self.train_ids, self.test_ids = layers, train, test
        self.epochs, self.batch_size, self.lr = epochs, batch_size, lr
        self.rng = np.random.default_rng(seed)
        self.model = paddle.nn.Sequential(*build_layers(layers, 0, layers.num_layers, seed))

    def num_examples(self) -> int:
        return int(len(self.train_ids))

    def get_parameters(self, config: Mapping[str, Any]) -> Weights:
        return {k: v.numpy().copy() for k, v in self.model.state_dict().items()}

    def set_parameters(self, parameters: Mapping[str, np.ndarray]) -> None:
        """Load `parameters` (names and shapes as get_parameters gives them)."""
        import paddle

        self.model.set_state_dict({k: paddle.to_tensor(v) for k, v in parameters.items()})

    def _loss(self, ids: np.ndarray) -> Any:
        lm = self.layers
        return lm.loss(self.model(lm.inputs(ids)), lm.targets(ids))

    def fit(self, parameters: Weights, config: Mapping[str, Any]) -> tuple[Weights, int, dict]:
        import paddle

        self.set_parameters(parameters)
        opt = paddle.optimizer.AdamW(learning_rate=float(config.get("lr", self.lr)),
                                     parameters=self.model.parameters(), weight_decay=0.0)
        bs = int(config.get("batch_size", self.batch_size))
        self.model.train()
        losses = []
        for _ in range(int(config.get("epochs", self.epochs))):
            order = self.rng.permutation(self.train_ids)
            for i in range(0, len(order), bs):
                loss = self._loss(order[i: i + bs])
                loss.backward()
                opt.step()
                opt.clear_grad()
                losses.append(float(loss))
        return self.get_parameters(config), self.num_examples(), {"train_loss": float(np.mean(losses))}

    def evaluate(self, parameters: Weights, config: Mapping[str, Any]) -> tuple[float, int, dict]:
        import paddle

        self.set_parameters(parameters)
        self.model.eval()
        with paddle.no_grad():
            loss = float(self._loss(self.test_ids))
        return loss, int(len(self.test_ids)), {"perplexity": float(np.exp(min(loss, 50.0)))}


def make_client(cluster: str, index: int, num_clients: Mapping[str, int], from_pretrained: str, data: str,
                seq_len: int = 64, epochs: int = 1, lr: float = 1e-3, batch_size: int = 8,
                eval_fraction: float = 0.1, seed: int = 0, device: str = "cpu", kernels: Any = "auto",
                max_examples: int | None = None) -> CausalLMClient:
    """Client `index` of `cluster` (a `client.factory` of a federated job)."""
    import paddle

    if not 0 < eval_fraction < 1:
        raise ValueError(f"eval_fraction={eval_fraction} must be between 0 and 1")
    paddle.set_device(device)
    info = resolve_pretrained(from_pretrained)
    family_of(info.model_type)
    texts = read_lines(data)[:max_examples]
    block = client_block(len(texts), num_clients, cluster, index)
    if len(block) < 2:
        raise ValueError(f"data: {data} has {len(texts)} lines, too few for {sum(num_clients.values())} clients "
                         "(each needs one to train on and one to evaluate)")
    n_eval = max(1, int(round(len(block) * eval_fraction)))
    tokens = TokenData(texts, load_tokenizer(info.path), seq_len)
    layers = CausalLMLayers(info, tokens, kernels=kernels, lr=lr)
    return CausalLMClient(layers, block[:-n_eval], block[-n_eval:], epochs=epochs, batch_size=batch_size, lr=lr,
                          seed=seed + index)
