"""FedOptima's compute engines: the device's Trainer (Algorithm 1, local loss through the auxiliary network), the
server's Trainer over activations and its asynchronous Aggregator (Algorithm 4, FedAsync with a maximum delay D)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from nebula.mean import check_model_update
from nebula.federated.strategies.fedasync import FedAsync

__all__ = ["DeviceTrainer", "ServerTrainer", "AsyncAggregator", "state_of", "load_state", "split_model", "accuracy"]


def state_of(layer) -> dict[str, np.ndarray]:
    """A Paddle layer's parameters and buffers as a dict of numpy arrays."""
    return {k: v.numpy().copy() for k, v in layer.state_dict().items()}


def load_state(layer, state: Mapping[str, np.ndarray]) -> None:
    """Load numpy arrays into a Paddle layer (keys and shapes must match)."""
    import paddle

    layer.set_state_dict({k: paddle.to_tensor(np.asarray(v)) for k, v in state.items()})


def split_model(layers, split: int):
    """(device-side nn.Sequential of layers[:split], server-side nn.Sequential of layers[split:])."""
    import paddle.nn as nn

    from nebula.federated.fedoptima.split import check_split

    seq = list(layers)
    check_split(split, len(seq))
    return nn.Sequential(*seq[:split]), nn.Sequential(*seq[split:])


def accuracy(parts: list, x: np.ndarray, y: np.ndarray) -> float:
    """The share of `x` the layers `parts`, run one after another, classify as `y`."""
    import paddle

    with paddle.no_grad():
        h = paddle.to_tensor(x)
        for p in parts:
            h = p(h)
    return float((h.numpy().argmax(-1) == y).mean())


class DeviceTrainer:
    """Trains the device-side network with the auxiliary network and a local loss (no gradient from the server)."""

    def __init__(self, device_net, auxiliary, lr: float = 0.05) -> None:
        import paddle

        self.net, self.aux = device_net, auxiliary
        params = list(device_net.parameters()) + list(auxiliary.parameters())
        self.opt = paddle.optimizer.SGD(learning_rate=lr, parameters=params)

    def step(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
        """One local iteration: the activations (for the server) and the local loss."""
        import paddle
        import paddle.nn.functional as F

        h = self.net(paddle.to_tensor(x))
        loss = F.cross_entropy(self.aux(h), paddle.to_tensor(y.reshape(-1, 1).astype("int64")))
        loss.backward()
        self.opt.step()
        self.opt.clear_grad()
        return h.detach().numpy(), float(loss)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Activations only (used by offloading without an auxiliary network)."""
        import paddle

        return self.net(paddle.to_tensor(x)).numpy()

    def models(self) -> tuple[dict, dict]:
        """(device-side weights, auxiliary weights)."""
        return state_of(self.net), state_of(self.aux)

    def load(self, device_state: Mapping[str, np.ndarray], aux_state: Mapping[str, np.ndarray]) -> None:
        """Replace the local models with the aggregated ones (Algorithm 1, line 15)."""
        load_state(self.net, device_state)
        load_state(self.aux, aux_state)


class ServerTrainer:
    """Trains the server-side network centrally on activation batches, one model for all devices."""

    def __init__(self, server_net, lr: float = 0.05) -> None:
        import paddle

        self.net = server_net
        self.opt = paddle.optimizer.SGD(learning_rate=lr, parameters=server_net.parameters())

    def step(self, h: np.ndarray, y: np.ndarray, want_grad: bool = False) -> tuple[float, np.ndarray | None]:
        """One iteration on a batch of activations; the loss (and d loss / d h when `want_grad`, for offloading)."""
        import paddle
        import paddle.nn.functional as F

        ht = paddle.to_tensor(h, stop_gradient=not want_grad)
        loss = F.cross_entropy(self.net(ht), paddle.to_tensor(y.reshape(-1, 1).astype("int64")))
        loss.backward()
        self.opt.step()
        self.opt.clear_grad()
        return float(loss), (ht.grad.numpy() if want_grad else None)


class AsyncAggregator:
    """Algorithm 4, lines 12-20: mix a device's models into the global ones by FedAsync, skip if staler than D."""

    def __init__(self, device_state: Mapping[str, np.ndarray], aux_state: Mapping[str, np.ndarray],
                 alpha: float = 0.6, staleness: str = "polynomial", max_delay: int = 8) -> None:
        if isinstance(max_delay, bool) or not isinstance(max_delay, int) or max_delay < 0:
            raise ValueError(f"fedoptima max_delay={max_delay!r} must be an integer >= 0 (versions a device model "
                             "may lag behind the global one)")
        self.strategy = FedAsync(alpha=alpha, staleness=staleness)
        self.device = {k: np.asarray(v) for k, v in device_state.items()}
        self.aux = {k: np.asarray(v) for k, v in aux_state.items()}
        self.version = 0
        self.max_delay = max_delay
        self.skipped = 0

    def apply(self, device_state: Mapping[str, np.ndarray], aux_state: Mapping[str, np.ndarray],
              version: int, who: str = "device") -> bool:
        """Fold one device's models trained from `version`; False (and nothing changes) if staler than D."""
        if not isinstance(version, int) or version < 0 or version > self.version:
            raise ValueError(f"{who}: model version {version!r} is not one the server issued (latest "
                             f"{self.version}); a device trains from the global model it received")
        check_model_update(device_state, 1, who, like=self.device)
        check_model_update(aux_state, 1, who, like=self.aux)
        staleness = self.version - version
        if staleness > self.max_delay:
            self.skipped += 1
            return False
        self.device, _ = self.strategy.on_update(self.device, self.device, device_state, 1, staleness, {})
        self.aux, _ = self.strategy.on_update(self.aux, self.aux, aux_state, 1, staleness, {})
        self.version += 1
        return True
