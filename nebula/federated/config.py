"""Federated job file (`mode: federated`): clusters and their clients, rounds, deadline, validity, strategy, and
the algorithm it runs (FEDn's rounds, FedOptima or OWL), read in one pass.

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
    max_examples_per_client: 1000000           # an update (or hello) claiming more examples is refused
    max_update_norm: 1.0e6                     # L2 norm of an update's change from the global model; null: off
    initial_model: null                        # .npz of the initial model; null: asked of initial_clients clients
    initial_clients: 3                         # the model most of their valid answers agree on becomes version 1
    initial_wait_s: 30                         # how long each asked client has to answer
    max_model_bytes: 2147483648                # a model (initial or update) larger than this is refused
    model_dtypes: [float32]                    # the tensors' allowed dtypes
    algorithm: rounds                          # rounds (FEDn's, above) | fedoptima | owl
    task: "recipes.federated.modes:LangIdTask" # fedoptima/owl: "module:factory" of what they train, called with
                                               # num_clients={cluster: n}, seed=<job seed> and client.args
    fedoptima: {omega: 8, max_rounds: 10}      # FedOptima's options (nebula.federated.fedoptima.config)
    owl: {distribution: owl, rounds: 5}        # OWL's options (nebula.federated.owl.config)
    secure_aggregation: {protocol: secagg+, clip_range: 1.0, max_weight: 1000}   # null: off (secagg.config)
    differential_privacy: {clip_norm: 1.0, noise_multiplier: 1.0, mode: central, delta: 1.0e-5,
                           target_epsilon: 8, accountant: rdp, sampler: poisson} # null: off (privacy.mechanism)

`secure_aggregation` and `differential_privacy` apply to FEDn's synchronous rounds, with a strategy whose
combiners only add (fedavg, fedprox, fedadam, fedyogi, fedadagrad); secure aggregation masks 32-bit words
(`update_codec: none`) or 16-bit ones (`fp16`, `bf16`), and needs at least 3 clients at each combiner with any;
differential privacy weighs every client the same (with secure aggregation: `max_weight: 1`), takes no
error-feedback codec (`ef(...)`), and its `distributed` mode needs secure aggregation while its `central` mode
(the combiner clips each update) refuses it. Anything else is refused at load, in one line.

Every count that sizes memory is bounded (`MAX_CLIENTS` clients per cluster) and every number of seconds or norm
must be finite: a bad value is one line naming its key path and the limit.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nebula.config.fields import CodecSpec
from nebula.config.schema import ConfigError, check_fields, from_dict
from nebula.federated.fedoptima.config import FedOptimaSpec
from nebula.federated.owl.config import OwlSpec
from nebula.federated.privacy.mechanism import DPConfig
from nebula.federated.secagg.config import SecAggConfig

__all__ = ["FederatedJob", "FederatedCluster", "ControllerSpec", "ClientSpec", "ValiditySpec", "StrategySpec",
           "load_federated_job", "MAX_CLIENTS", "MAX_WAIT_S", "ALGORITHMS"]

ALGORITHMS = ("rounds", "fedoptima", "owl")

MAX_CLIENTS = 100_000  # client ranks per cluster: the combiner keeps a peer and its channels for each
MAX_ROUNDS = 10_000_000
MAX_WAIT_S = 7 * 86400.0  # any number of seconds in a job: at most a week
MAX_PIECE_BYTES = 64 * 1024**2  # a piece must fit a switch's default queue
MAX_INITIAL_CLIENTS = 100


def _seconds(key: str, value: float) -> None:
    """ValueError unless `value` is a finite number of seconds in (0, MAX_WAIT_S]."""
    if not (math.isfinite(value) and 0 < value <= MAX_WAIT_S):
        raise ValueError(f"{key}={value} must be a finite number of seconds in (0, {MAX_WAIT_S:.0f}]")


def _at_most(key: str, value: int, lo: int, hi: int, why: str = "") -> None:
    if not lo <= value <= hi:
        raise ValueError(f"{key}={value} must be between {lo} and {hi}{why}")


def _uses_error_feedback(spec: str) -> bool:
    """Whether codec `spec` has an error-feedback stage (`ef(...)`) anywhere in it."""
    from nebula.compress.spec import SpecNode, parse_spec

    def walk(node: object) -> bool:
        return isinstance(node, SpecNode) and (node.name == "ef" or any(walk(a) for a in node.args)
                                               or any(walk(v) for _, v in node.kwargs))

    return spec != "none" and walk(parse_spec(spec))


def _finite_options(prefix: str, value: Any) -> None:
    """ValueError naming the key path of the first non-finite float under `value`."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{prefix}={value} must be a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            _finite_options(f"{prefix}.{k}", v)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _finite_options(f"{prefix}[{i}]", v)


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
        _at_most("num_clients", self.num_clients, 0, MAX_CLIENTS,
                 f" (cluster {self.id}); split the clients over more clusters")


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
        _at_most("validity.min_updates", self.min_updates, 1, MAX_CLIENTS * 1000)
        if not 0 <= self.min_fraction_examples <= 1:
            raise ValueError(f"validity.min_fraction_examples={self.min_fraction_examples} must be in [0, 1]")


@dataclass(frozen=True, kw_only=True, slots=True)
class StrategySpec:
    """Strategy by registered name (nebula.federated.strategy_names()) and its options."""

    name: str = "fedavg"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from nebula.federated.strategy import get_strategy

        _finite_options("options", self.options)
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
    update_codec: CodecSpec = "none"
    piece_bytes: int = 4 * 1024 * 1024
    seed: int = 0
    startup_timeout_s: float = 120.0  # how long actors wait for their switch and for the first clients
    # what an update may claim and carry (refused and audited beyond): example count, L2 norm of its change from
    # the global model (None: no bound), and what any model may be (initial or update): bytes and dtypes
    max_examples_per_client: int = 1_000_000
    max_update_norm: float | None = 1.0e6
    max_model_bytes: int = 2 * 1024**3
    model_dtypes: tuple[str, ...] = ("float32",)
    # the initial model (an empty trail): this .npz file, or asked of `initial_clients` clients at once (each
    # given `initial_wait_s`), of whose valid answers the one most agree on (tensor names, dtypes, shapes) is taken
    initial_model: str | None = None
    initial_clients: int = 3
    initial_wait_s: float = 30.0
    # what the job runs: FEDn's rounds (every key above), or FedOptima or OWL on `task` with their own section
    algorithm: str = "rounds"
    task: str = ""
    fedoptima: FedOptimaSpec = field(default_factory=FedOptimaSpec)
    owl: OwlSpec = field(default_factory=OwlSpec)
    # privacy (FEDn's synchronous rounds only): each combiner learns only its clients' sum, the reducer sums of
    # sums (nebula.federated.secagg); client-level DP with an accountant (nebula.federated.privacy). None: off
    secure_aggregation: SecAggConfig | None = None
    differential_privacy: DPConfig | None = None

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm={self.algorithm!r} must be one of {', '.join(ALGORITHMS)} (rounds: FEDn's "
                             "synchronous or asynchronous rounds)")
        if self.algorithm != "rounds" and ":" not in self.task:
            raise ValueError(f"task={self.task!r}: algorithm {self.algorithm} needs `task: module:factory` naming "
                             "what it trains (e.g. recipes.federated.modes:LangIdTask)")
        if not self.job or "/" in self.job:
            raise ValueError(f"job {self.job!r} must be a non-empty name without '/'")
        ids = [c.id for c in self.clusters]
        if not ids:
            raise ValueError("clusters is empty; list each cluster with its worker.yaml and num_clients")
        if len(set(ids)) != len(ids):
            raise ValueError(f"a cluster is listed twice under clusters: {ids}")
        if self.controller.cluster not in ids:
            raise ValueError(f"controller.cluster {self.controller.cluster!r} is not under clusters ({', '.join(ids)})")
        _at_most("rounds", self.rounds, 1, MAX_ROUNDS)
        _at_most("clients_per_round", self.clients_per_round, 0, MAX_CLIENTS * len(ids),
                 " (0: every connected client)")
        for key in ("deadline_s", "startup_timeout_s", "initial_wait_s"):
            _seconds(key, getattr(self, key))
        _at_most("piece_bytes", self.piece_bytes, 4096, MAX_PIECE_BYTES)
        _at_most("max_examples_per_client", self.max_examples_per_client, 1, 2**53)
        _at_most("max_model_bytes", self.max_model_bytes, 1, 2**40)
        _at_most("initial_clients", self.initial_clients, 1, MAX_INITIAL_CLIENTS)
        if self.max_update_norm is not None and not (math.isfinite(self.max_update_norm) and self.max_update_norm > 0):
            raise ValueError(f"max_update_norm={self.max_update_norm} must be a finite number > 0, or null for no "
                             "bound")
        self._check_dtypes()
        check_fields(self)
        if self.update_codec != "none":
            from nebula.federated.strategy import get_strategy

            if not get_strategy(self.strategy.name, self.strategy.options).synchronous:
                raise ValueError(f"update_codec {self.update_codec!r} needs a synchronous strategy (the combiner "
                                 f"of an asynchronous one keeps no base model to add changes to); drop it or use "
                                 f"fedavg")
        if self.secure_aggregation is not None or self.differential_privacy is not None:
            self._check_privacy()
        if self.secure_aggregation is not None and not self.secure_aggregation.signers:
            raise ValueError(self.secure_aggregation.SIGNERS_REQUIRED)

    def _check_privacy(self) -> None:
        """The combinations secure aggregation and differential privacy refuse (one line each, with the fix)."""
        from nebula.federated.secagg.compose import check_codec_precision, check_strategy, word_bits_for_codec
        from nebula.federated.secagg.messages import MIN_CLIENTS
        from nebula.federated.secagg.quantize import Quantizer
        from nebula.federated.strategy import Strategy, get_strategy

        sa, dp = self.secure_aggregation, self.differential_privacy
        if self.algorithm != "rounds":
            raise ValueError(f"secure_aggregation and differential_privacy apply to algorithm: rounds, not "
                             f"{self.algorithm}; drop them or run FEDn's rounds")
        strategy = get_strategy(self.strategy.name, self.strategy.options)
        if sa is not None:
            check_strategy(strategy)
            bits = word_bits_for_codec(self.update_codec)
            for i, c in enumerate(self.clusters):
                if 0 < c.num_clients < MIN_CLIENTS:
                    raise ValueError(f"clusters[{i}] ({c.id}): num_clients={c.num_clients}, but secure_aggregation "
                                     f"needs at least {MIN_CLIENTS} clients at each combiner to hide one in a sum; "
                                     "give the cluster more clients (or none) or drop secure_aggregation")
                if c.num_clients:
                    check_codec_precision(self.update_codec, Quantizer(sa.clip_range, c.num_clients, sa.max_weight,
                                                                       bits))
        if dp is None:
            return
        if not strategy.synchronous or type(strategy).combine is not Strategy.combine:
            raise ValueError(f"differential_privacy calibrates its noise to a sum of clipped updates, which strategy "
                             f"{strategy.name!r} does not take; use fedavg, fedprox, fedadam, fedyogi or fedadagrad")
        if dp.mode == "distributed" and sa is None:
            raise ValueError("differential_privacy.mode=distributed splits the noise among the clients of a secure "
                             "sum; add secure_aggregation: {protocol: secagg+} or use mode: central or local")
        if sa is not None and sa.max_weight != 1:
            raise ValueError(f"differential_privacy needs a fixed weighting (one client's data size must not move "
                             f"the mean's denominator), but secure_aggregation.max_weight={sa.max_weight}; set "
                             "secure_aggregation.max_weight: 1 (every client weighs the same)")
        if sa is not None and dp.mode == "central":
            raise ValueError("differential_privacy.mode=central with secure_aggregation: central DP has the combiner "
                             "clip every update to clip_norm, which it cannot do to masked updates; use mode: "
                             "distributed (the clients' noise survives the secure sum) or drop secure_aggregation")
        if _uses_error_feedback(self.update_codec):
            raise ValueError(f"update_codec={self.update_codec!r} with differential_privacy: error feedback adds "
                             "what earlier rounds' compression left out to each update, so a clipped change is sent "
                             "over clip_norm (and the clip at the combiner would cut the residual it carries); use "
                             "the codec without ef(...) (e.g. its inner codec) or drop differential_privacy")

    def _check_dtypes(self) -> None:
        import numpy as np

        if not self.model_dtypes:
            raise ValueError("model_dtypes is empty; list the model's dtypes, e.g. [float32]")
        for d in self.model_dtypes:
            try:
                ok = np.issubdtype(np.dtype(d), np.floating) and np.dtype(d).name == d
            except TypeError:
                ok = False
            if not ok:
                raise ValueError(f"model_dtypes: {d!r} is not a numpy floating dtype name (float16, float32, "
                                 "float64)")

    def cluster(self, cid: str) -> FederatedCluster:
        """The cluster named `cid`; ConfigError naming the known ones."""
        for c in self.clusters:
            if c.id == cid:
                return c
        raise ConfigError(f"no cluster {cid!r} in federated job {self.job!r}; known: "
                          f"{', '.join(c.id for c in self.clusters)}")


def load_federated_job(file: str | Path) -> FederatedJob:
    """Load a `mode: federated` job file; relative paths are taken against the file's directory."""
    from nebula.config import read_yaml

    file = Path(file)
    raw = read_yaml(file) or {}  # (bounded: security._yaml; errors name the file and key)
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
        cfg, initial_model=None if cfg.initial_model is None else res(cfg.initial_model),
        controller=dataclasses.replace(cfg.controller, dir=res(cfg.controller.dir)),
        clusters=tuple(dataclasses.replace(c, worker=res(c.worker),
                                           accounts_home=None if c.accounts_home is None else res(c.accounts_home))
                       for c in cfg.clusters))

