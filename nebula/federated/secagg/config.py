"""The `secure_aggregation` section of a federated job file, and the per-round parameters it gives a combiner.

    secure_aggregation: {protocol: secagg+, clip_range: 0.05, max_weight: 1000, max_dropout: 0.1, max_corrupt: 0.1,
                         min_clients: 5, stage_timeout_s: 10, signers: "signers/client-{index}"}

`clip_range` bounds each parameter's change a client sends (larger ones are clipped: pick it above the typical
per-round change, e.g. from an unmasked trial round); `max_weight` caps a client's num_examples in the weighted
mean (1: unweighted); `max_dropout` is the fraction of a combiner's clients the round must survive losing, which
sets the default degree; `degree` and `threshold` (0: derived) override the graph. `stage_timeout_s`: a combiner
closes a key stage or the unmask stage once this long passes without a new answer from the clients still in it
(a key stage within half the round's deadline); the masked inputs are waited for until the round's deadline.

Against whom (Bell et al. 2020's γ and δ): `max_corrupt` γ is the fraction of a round's clients that may collude
with the combiner (c = max(1, ⌈γ·n⌉): any one client at least), `max_dropout` δ the fraction that may drop out.
The threshold is the smallest t with 2t > k + 1 + min(k, c) (`graph.safe_threshold`: all c colluders among one
client's neighbours, the worst case a combiner that picks the session could grind for), the degree the smallest
even k whose round, losing each client with probability δ, still unmasks with probability 1 − 10⁻⁶ (else
everyone). Every client derives k and t from its own job file and refuses a round with fewer than `min_clients`
(a combiner cannot shrink the cohort, the degree or the threshold). The defaults: γ = 0.1, δ = 0.1, at least 3
clients (a round of 3 then has t = 3 of its 3 holders: no dropout is recoverable, nor is any one client's input
exposed by the combiner with one colluder).

`signers` (required): where each client's signing credential lies, `{index}` (and `{cluster}`, if given) filled
in, relative to the cluster's worker.yaml: PEM files `<stem>.pem` and `<stem>.key` of a worker certificate named as
the stem's last part (what `nebula-admin cert issue --ca CA --role worker --cluster C --name N --out DIR` writes), and
every client requires a neighbour's certificate to carry that name. Each client signs its keys, share commitments,
weight and survivor set with it. (The cluster's worker.yaml certificate will not do: all clients of a cluster and
its combiner share it, so a lying combiner could sign in any client's name.) A job file with secure_aggregation
and no `signers` is refused when it is read (`SIGNERS_REQUIRED`); the pure protocol state (tests, benchmarks) may
leave it empty.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Sequence

from nebula.federated.secagg.graph import colluders, default_degree, safe_threshold
from nebula.federated.secagg.messages import MIN_CLIENTS, SecAggParams
from nebula.federated.secagg.quantize import Quantizer

__all__ = ["SecAggConfig", "UNMASK_STAGES"]

UNMASK_STAGES = 2  # a combiner's unmask stage lasts at most this many stage_timeout_s (the reducer waits for it)


@dataclass(frozen=True, kw_only=True, slots=True)
class SecAggConfig:
    """Validated `secure_aggregation` settings."""

    protocol: str = "secagg+"
    clip_range: float = 1.0
    max_weight: int = 1000
    max_dropout: float = 0.1
    degree: int = 0
    threshold: int = 0
    max_corrupt: float = 0.1
    min_clients: int = MIN_CLIENTS
    stage_timeout_s: float = 10.0
    signers: str = ""

    SIGNERS_REQUIRED: ClassVar[str] = (
        "secure_aggregation.signers is empty: each client needs its own signing certificate (the cluster's worker.yaml "
        "one is shared with the combiner); issue one per client with `nebula-admin cert issue --ca CA --role "
        "worker --cluster C --name client-<index> --out DIR` and set secure_aggregation.signers: "
        "\"DIR/client-{index}\" (relative to the cluster's worker.yaml)")

    def __post_init__(self) -> None:
        if self.protocol != "secagg+":
            raise ValueError(f"secure_aggregation.protocol={self.protocol!r} is not known; use secagg+")
        if not 0 <= self.max_dropout < 0.5:
            raise ValueError(f"secure_aggregation.max_dropout={self.max_dropout} must be in [0, 0.5)")
        if self.degree < 0 or self.threshold < 0:
            raise ValueError(f"secure_aggregation.degree={self.degree} and threshold={self.threshold} must be >= 0 "
                             "(0: derived from the number of clients)")
        if not (math.isfinite(self.stage_timeout_s) and 0 < self.stage_timeout_s <= 3600):
            raise ValueError(f"secure_aggregation.stage_timeout_s={self.stage_timeout_s} must be a number of seconds "
                             "in (0, 3600] (how long a combiner waits for the clients of a key or unmask stage)")
        if not 0 <= self.max_corrupt < 0.5:
            raise ValueError(f"secure_aggregation.max_corrupt={self.max_corrupt} must be in [0, 0.5): the fraction of "
                             "a round's clients that may collude with the combiner (at least one is assumed)")
        if isinstance(self.min_clients, bool) or not MIN_CLIENTS <= self.min_clients <= 100_000:
            raise ValueError(f"secure_aggregation.min_clients={self.min_clients} is below the minimum {MIN_CLIENTS}: a "
                             "combiner with one colluding client would learn a single client's update; use 3 or more")
        if self.signers and "{index}" not in self.signers.rsplit("/", 1)[-1]:
            raise ValueError(f"secure_aggregation.signers={self.signers!r} must name each client's credential with "
                             "{index} in its last part, e.g. signers/client-{index}")
        Quantizer(self.clip_range, MIN_CLIENTS, self.max_weight)  # clip_range and max_weight alone
        self.round_params(0, [f"c{i}" for i in range(self.min_clients)], 1, bytes(16))  # the smallest round allowed

    def signer_name(self, client: str, first_rank: int) -> str | None:
        """The certificate name `signers` gives round client `client` ("cluster/rank", the client of index
        rank − `first_rank`), or None (any worker of its cluster)."""
        if not self.signers:
            return None
        cluster, _, rank = client.partition("/")
        index = int(rank) - first_rank if rank.isdigit() else -1
        return self.signers.format(cluster=cluster, index=index).rsplit("/", 1)[-1]

    def round_params(self, round_: int, clients: Sequence[str], vector_length: int, session: bytes,
                     word_bits: int = 32, *, version: int = 0, model: bytes = bytes(32)) -> SecAggParams:
        """The parameters of one combiner's round over `clients` on model `version` (`model`: its digest), as every
        client derives them from its own job file (ValueError when they cannot be met)."""
        n = len(clients)
        if n < self.min_clients:
            raise ValueError(f"secure aggregation needs at least secure_aggregation.min_clients={self.min_clients} "
                             f"clients in a round, it has {n}; give the cluster more clients or lower min_clients")
        c = colluders(n, self.max_corrupt)
        k = min(self.degree or default_degree(n, self.max_dropout, max_corrupt=self.max_corrupt), n - 1)
        if k < n - 1 and k % 2:
            raise ValueError(f"secure_aggregation.degree={self.degree} must be even (or >= {n - 1}: everyone)")
        floor = safe_threshold(k, c)
        t = self.threshold or floor
        if t < floor or t > k + 1:
            raise ValueError(f"secure_aggregation.threshold={t} with degree {k} for {n} clients must be in "
                             f"[{floor}, {k + 1}]: above (k + 1 + {c} colluders)/2, so the combiner and "
                             f"{c} colluding client(s) never gather both shares of one client; raise it or set 0")
        if self.max_dropout > 0 and t > k:
            small = self.degree and k < n - 1
            if small:
                raise ValueError(f"secure_aggregation.degree={self.degree} gives threshold {t} above the degree "
                                 f"for {n} clients: no dropped client could be recovered under max_dropout="
                                 f"{self.max_dropout}; raise the degree or set it 0 (derived)")
        return SecAggParams(round=round_, session=session, clients=tuple(clients), degree=k, threshold=t,
                            vector_length=vector_length, quantizer=Quantizer(self.clip_range, n, self.max_weight,
                                                                             word_bits),
                            version=version, model=model)
