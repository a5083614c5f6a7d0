"""The `secure_aggregation` section of a federated job file, and the per-round parameters it gives a combiner.

    secure_aggregation: {protocol: secagg+, clip_range: 0.05, max_weight: 1000, max_dropout: 0.1, stage_timeout_s: 10}

`clip_range` bounds each parameter's change a client sends (larger ones are clipped: pick it above the typical
per-round change, e.g. from an unmasked trial round); `max_weight` caps a client's num_examples in the weighted
mean (1: unweighted); `max_dropout` is the fraction of a combiner's clients the round must survive losing, which
sets the default degree; `degree` and `threshold` (0: derived) override the graph. `stage_timeout_s`: a combiner
closes a key stage or the unmask stage once this long passes without a new answer from the clients still in it
(a key stage within half the round's deadline); the masked inputs are waited for until the round's deadline.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from nebula.federated.secagg.graph import default_degree, majority_threshold
from nebula.federated.secagg.messages import MIN_CLIENTS, SecAggParams
from nebula.federated.secagg.quantize import Quantizer

__all__ = ["SecAggConfig"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SecAggConfig:
    """Validated `secure_aggregation` settings."""

    protocol: str = "secagg+"
    clip_range: float = 1.0
    max_weight: int = 1000
    max_dropout: float = 0.1
    degree: int = 0
    threshold: int = 0
    stage_timeout_s: float = 10.0

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
        Quantizer(self.clip_range, MIN_CLIENTS, self.max_weight)  # clip_range and max_weight alone

    def round_params(self, round_: int, clients: Sequence[str], vector_length: int, session: bytes,
                     word_bits: int = 32) -> SecAggParams:
        """The parameters of one combiner's round over `clients` (ValueError when they cannot be met)."""
        n = len(clients)
        if n < MIN_CLIENTS:
            raise ValueError(f"secure aggregation needs at least {MIN_CLIENTS} clients at a combiner, it has {n}; "
                             "give the cluster more clients or drop secure_aggregation")
        k = min(self.degree or default_degree(n, self.max_dropout), n - 1)
        if k < n - 1 and k % 2:
            raise ValueError(f"secure_aggregation.degree={self.degree} must be even (or >= {n - 1}: everyone)")
        return SecAggParams(round=round_, session=session, clients=tuple(clients), degree=k,
                            threshold=self.threshold or majority_threshold(k), vector_length=vector_length,
                            quantizer=Quantizer(self.clip_range, n, self.max_weight, word_bits))
