"""The `owl:` block of a federated job file (all keys optional; defaults documented here).

Example::

    owl:
      distribution: owl          # owl (one group from the server, the rest from peers) | server (server sends all)
      num_groups: null           # D; null: the deploying algorithm picks it (at most the workers and branches)
      rounds: 5
      local_steps: 4             # SGD steps per round on each worker (the first overlapped with arrival)
      lr: 0.05
      server_bytes_per_s: 7.5e6  # the server's egress, for the deploying algorithm's round-time model
      peer_bytes_per_s: 1.25e8   # the cluster-local path between workers
      combine: cluster           # cluster: the first worker of a cluster averages its updates (one crosses the
                                 # WAN); server: every worker sends its update to the server
      combine: cluster           # cluster: the first worker of each cluster averages its cluster's updates and
                                 # one update crosses the WAN; server: every worker sends its own to the server
      round_timeout_s: 60        # updates later than this are left out of the round
      peer_timeout_s: 10         # a group a peer has not forwarded by then is pulled from the server instead
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

__all__ = ["OwlSpec"]


@dataclass(frozen=True, kw_only=True, slots=True)
class OwlSpec:
    """OWL's options: distribution, groups, rounds, bandwidths for the deploying algorithm, timeouts."""

    distribution: str = "owl"
    num_groups: Optional[int] = None
    rounds: int = 5
    local_steps: int = 4
    lr: float = 0.05
    server_bytes_per_s: float = 7.5e6
    peer_bytes_per_s: float = 1.25e8
    combine: str = "cluster"
    round_timeout_s: float = 60.0
    peer_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.distribution not in ("owl", "server"):
            raise ValueError(f"owl.distribution={self.distribution!r} must be 'owl' or 'server' (server-only "
                             "distribution, the baseline)")
        if self.combine not in ("cluster", "server"):
            raise ValueError(f"owl.combine={self.combine!r} must be 'cluster' (a combiner per cluster, one update "
                             "crosses the WAN) or 'server'")
        if self.num_groups is not None and (not isinstance(self.num_groups, int) or self.num_groups < 1):
            raise ValueError(f"owl.num_groups={self.num_groups!r} must be an integer >= 1 or null (let the "
                             "deploying algorithm choose)")
        for name in ("rounds", "local_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"owl.{name}={getattr(self, name)!r} must be >= 1")
        for name in ("lr", "server_bytes_per_s", "peer_bytes_per_s", "round_timeout_s", "peer_timeout_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"owl.{name}={v!r} must be a positive number")
