"""Federated job file (`mode: federated`): clusters and their clients, rounds, deadline, validity, strategy.

Example::

    job: langid
    mode: federated
    controller: {cluster: A, dir: fl}          # the controller (and reducer) runs in A; trail and logs under fl/
    clusters:
      - {id: A, worker: prov/A/worker.yaml, num_clients: 4}
      - {id: B, worker: prov/B/worker.yaml, num_clients: 4, accounts_home: B/home}   # clients need job:langid there
    client: {factory: "recipes.federated.client:make_client", args: {alpha: 0.3}}
    rounds: 10
    clients_per_round: 8                       # participation: how many connected clients each round asks
    deadline_s: 60                             # a round's updates must arrive within this
    validity: {min_updates: 2, min_fraction_examples: 0.5}
    strategy: {name: fedavg, options: {}}
    wan_once: true                             # the global model crosses each WAN link once per round
    update_codec: ef(int8_block)               # clients send their change compressed (nebula.compress specs)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nebula.config._schema import ConfigError, from_dict

__all__ = ["FederatedJob", "FederatedCluster", "ControllerSpec", "ClientSpec", "ValiditySpec", "StrategySpec",
           "load_federated_job"]


@dataclass(frozen=True, kw_only=True, slots=True)
class FederatedCluster:
    """One cluster: its switch (worker.yaml), how many client ranks it has (ranks 2..num_clients+1), and the
    account home whose `job:NAME` grants its combiner requires of the clients it accepts (none: no check)."""

    id: str
    worker: str
    num_clients: int = 0
    accounts_home: str | None = None

    def __post_init__(self) -> None:
        if not self.id or not self.id.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"cluster id {self.id!r} must be letters, digits, '-' or '_'")
        if self.num_clients < 0:
            raise ValueError(f"cluster {self.id}: num_clients={self.num_clients} must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class ControllerSpec:
    """Where the controller (with the reducer) runs and where it keeps the model trail."""

    cluster: str
    dir: str = "fl"  # model trail, audit log, status file


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientSpec:
    """The user's client: `factory` is "module:function" returning a `nebula.federated.Client`."""

    factory: str = ""
    args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.factory and ":" not in self.factory:
            raise ValueError(f"client.factory {self.factory!r} must be 'module:function'")


@dataclass(frozen=True, kw_only=True, slots=True)
class ValiditySpec:
    """A round counts only with at least `min_updates` accepted updates carrying at least `min_fraction_examples`
    of the examples the asked clients hold."""

    min_updates: int = 1
    min_fraction_examples: float = 0.0

    def __post_init__(self) -> None:
        if self.min_updates < 1:
            raise ValueError(f"validity.min_updates={self.min_updates} must be >= 1")
        if not 0 <= self.min_fraction_examples <= 1:
            raise ValueError(f"validity.min_fraction_examples={self.min_fraction_examples} must be in [0, 1]")


@dataclass(frozen=True, kw_only=True, slots=True)
class StrategySpec:
    """Strategy by registered name (nebula.federated.strategy_names()) and its options."""

    name: str = "fedavg"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from nebula.federated.strategy import get_strategy

        get_strategy(self.name, self.options)  # unknown names and bad options fail on load


@dataclass(frozen=True, kw_only=True, slots=True)
class FederatedJob:
    """A whole federated job; every cluster reads the same file."""

    job: str
    mode: Literal["federated"] = "federated"
    controller: ControllerSpec
    clusters: tuple[FederatedCluster, ...]
    client: ClientSpec = field(default_factory=ClientSpec)
    rounds: int = 10  # synchronous: rounds; asynchronous strategies: global model versions to publish
    clients_per_round: int = 0  # 0: every connected client
    deadline_s: float = 60.0
    validity: ValiditySpec = field(default_factory=ValiditySpec)
    strategy: StrategySpec = field(default_factory=StrategySpec)
    wan_once: bool = True
    # clients send each piece of their change from the global model encoded with this codec (nebula.compress);
    # ef(...) keeps its residual on the client across rounds. "none": the weights themselves, raw.
    update_codec: str = "none"
    piece_bytes: int = 4 * 1024 * 1024
    seed: int = 0
    startup_timeout_s: float = 120.0  # how long actors wait for their switch and for the first clients

    def __post_init__(self) -> None:
        if not self.job or "/" in self.job:
            raise ValueError(f"job {self.job!r} must be a non-empty name without '/'")
        ids = [c.id for c in self.clusters]
        if not ids:
            raise ValueError("clusters is empty; list each cluster with its worker.yaml and num_clients")
        if len(set(ids)) != len(ids):
            raise ValueError(f"a cluster is listed twice under clusters: {ids}")
        if self.controller.cluster not in ids:
            raise ValueError(f"controller.cluster {self.controller.cluster!r} is not under clusters ({', '.join(ids)})")
        if self.rounds < 1:
            raise ValueError(f"rounds={self.rounds} must be >= 1")
        if self.clients_per_round < 0:
            raise ValueError(f"clients_per_round={self.clients_per_round} must be >= 0 (0: every connected client)")
        if not self.deadline_s > 0:
            raise ValueError(f"deadline_s={self.deadline_s} must be > 0")
        if self.piece_bytes < 4096:
            raise ValueError(f"piece_bytes={self.piece_bytes} must be >= 4096")
        if self.update_codec != "none":
            from nebula.compress import SpecError, get_codec
            from nebula.federated.strategy import get_strategy

            try:
                get_codec(self.update_codec)
            except SpecError as exc:
                raise ValueError(f"update_codec: {exc}") from None
            if not get_strategy(self.strategy.name, self.strategy.options).synchronous:
                raise ValueError(f"update_codec {self.update_codec!r} needs a synchronous strategy (the combiner "
                                 f"of an asynchronous one keeps no base model to add changes to); drop it or use "
                                 f"fedavg")

    def cluster(self, cid: str) -> FederatedCluster:
        """The cluster named `cid`; ConfigError naming the known ones."""
        for c in self.clusters:
            if c.id == cid:
                return c
        raise ConfigError(f"no cluster {cid!r} in federated job {self.job!r}; known: "
                          f"{', '.join(c.id for c in self.clusters)}")


def load_federated_job(file: str | Path) -> FederatedJob:
    """Load a `mode: federated` job file; relative paths are taken against the file's directory."""
    import yaml

    file = Path(file)
    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{file}: cannot read the job ({exc})") from None
    if isinstance(raw, dict) and raw.get("mode", "federated") != "federated":
        raise ConfigError(f"{file}: mode {raw.get('mode')!r} is not federated; start it with `nebula launch`")
    try:
        cfg = from_dict(FederatedJob, raw)
    except ConfigError as exc:
        raise ConfigError(f"{file}: {exc}") from None
    base = file.resolve().parent

    def res(p: str) -> str:
        return p if Path(p).is_absolute() else str((base / p).resolve())

    return dataclasses.replace(
        cfg, controller=dataclasses.replace(cfg.controller, dir=res(cfg.controller.dir)),
        clusters=tuple(dataclasses.replace(c, worker=res(c.worker),
                                           accounts_home=None if c.accounts_home is None else res(c.accounts_home))
                       for c in cfg.clusters))

