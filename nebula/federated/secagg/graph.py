"""The SecAgg+ communication graph (Bell et al., CCS 2020, §3): a Harary graph H(k, n) on randomly labelled
clients, so each client shares masks and secrets with only k = O(log n) neighbours instead of all n − 1.

Clients sit on a ring in an order drawn from the round's public seed; each is joined to the k/2 nearest on either
side (k even), or to everyone when k ≥ n − 1 (the original SecAgg of Bonawitz et al. 2017). Every client computes
the graph itself from the round's parameters, so the server cannot hand it a different neighbourhood.

Sizes: a client's secrets are shared among itself and its k neighbours with a majority threshold
t = ⌊(k + 1)/2⌋ + 1 (see `SecAggParams`); a dropped client is recoverable when t of its k neighbours survive.
`default_degree` picks the smallest even k for which, with each client dropping independently with probability
`max_dropout`, the chance that some client of n is unrecoverable is at most `failure` — k grows as log n.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import numpy as np

__all__ = ["harary_graph", "majority_threshold", "default_degree", "unrecoverable_probability", "components",
           "colluders", "safe_threshold"]


def majority_threshold(degree: int) -> int:
    """The smallest threshold above half of the k + 1 holders of a client's shares."""
    return (degree + 1) // 2 + 1


def colluders(n: int, max_corrupt: float) -> int:
    """Corrupt clients a round of n must withstand besides the combiner: ⌈γ·n⌉ for γ = `max_corrupt`, and at least
    one (any one client may be hostile)."""
    return max(1, math.ceil(max_corrupt * n - 1e-9))


def safe_threshold(degree: int, corrupt: int) -> int:
    """The smallest threshold t with 2t > k + 1 + c: of a client's k + 1 share holders, c corrupt ones hold both
    of its shares; the honest rest each reveal one kind only (once a round, on a survivor set at least t signed),
    so the combiner cannot gather t shares of both its self-mask seed and its mask key (Bonawitz et al. 2017 §4,
    Bell et al. 2020 §4: the worst case, all c corrupt clients among one client's neighbours)."""
    return (degree + 1 + min(degree, corrupt)) // 2 + 1


def unrecoverable_probability(n: int, degree: int, max_dropout: float, threshold: int | None = None) -> float:
    """Union bound on P(some dropped client of n has fewer than the threshold of its k neighbours alive)."""
    t, p = threshold or majority_threshold(degree), 1.0 - max_dropout
    tail = sum(math.comb(degree, i) * p ** i * (1 - p) ** (degree - i) for i in range(min(t, degree + 1)))
    return min(1.0, n * tail)


def default_degree(n: int, max_dropout: float = 0.1, failure: float = 1e-6, max_corrupt: float | None = None) -> int:
    """The smallest even degree (at most n − 1) whose round fails to unmask with probability <= `failure`, with the
    majority threshold, or with `safe_threshold` against ⌈γ·n⌉ colluders when `max_corrupt` (γ) is given."""
    if n < 2:
        raise ValueError(f"secure aggregation needs at least 2 clients, got {n}")
    if not 0 <= max_dropout < 0.5:
        raise ValueError(f"secure_aggregation.max_dropout={max_dropout} must be in [0, 0.5): a majority threshold "
                         "cannot recover a client when half its neighbours are gone")
    for k in range(2, n - 1, 2):
        t = majority_threshold(k) if max_corrupt is None else safe_threshold(k, colluders(n, max_corrupt))
        if t <= k and unrecoverable_probability(n, k, max_dropout, t) <= failure:
            return k
    return n - 1


def harary_graph(clients: Sequence[str], degree: int, seed: bytes) -> dict[str, frozenset[str]]:
    """Client -> its neighbours in H(degree, n) over the ring order drawn from `seed` (at least 8 bytes)."""
    n = len(clients)
    if len(set(clients)) != n:
        raise ValueError("a client is listed twice in the round")
    if degree >= n - 1:
        everyone = frozenset(clients)
        return {c: everyone - {c} for c in clients}
    if degree < 2 or degree % 2:
        raise ValueError(f"secure_aggregation.degree={degree} must be even and >= 2 (or >= {n - 1}: everyone)")
    order = [clients[i] for i in np.random.Generator(np.random.PCG64(int.from_bytes(seed, "big"))).permutation(n)]
    half = degree // 2
    return {order[i]: frozenset(order[(i + j) % n] for j in range(-half, half + 1) if j) for i in range(n)}


def components(nodes: Iterable[str], neighbours: Mapping[str, Iterable[str]]) -> list[set[str]]:
    """Connected components of the graph restricted to `nodes`."""
    left, out = set(nodes), []
    while left:
        start = left.pop()
        comp, stack = {start}, [start]
        while stack:
            for v in neighbours[stack.pop()]:
                if v in left:
                    left.remove(v)
                    comp.add(v)
                    stack.append(v)
        out.append(comp)
    return out
