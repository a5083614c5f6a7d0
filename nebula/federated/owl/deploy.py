"""OWL's deploying algorithm (Algorithm 2) and the centralized deployment it generates (§4.4).

For D groups the n workers are parted into D communication groups equally (worker w in group w mod D). The
first worker of communication group c (its *central* worker) pulls model group c from the server; every other
worker of c pulls it from that central worker; then each worker pulls every other group c' from a worker of
communication group c' (spread over its members), which has it first (the paper's Eq. 9). So the server sends
the model exactly once whatever n is, and workers fetch different groups at the same time (Fig. 4(c)).
Algorithm 2 tries every D = 1 .. n, profiles one round of each (here a callable; by default the transfer and
compute model of `estimate_round_s`) and keeps the fastest. D is also bounded by the number of branches. With
workers in several clusters, each cluster gets its own deployment of the same groups (`deploy_setting_for`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from nebula.federated.owl.grouping import group_branches, group_sizes

if TYPE_CHECKING:
    from nebula.federated.owl.config import OwlSpec

__all__ = ["SERVER", "Pull", "DeploySetting", "centralized", "deploy", "estimate_round_s", "server_only_round_s",
           "deploy_setting_for"]

SERVER = -1


@dataclass(frozen=True, slots=True)
class Pull:
    """Worker pulls model group `group` from `source` (a worker index, or SERVER)."""

    group: int
    source: int


@dataclass(frozen=True, slots=True)
class DeploySetting:
    """Groups of branches and, per worker, the pulls in the order it makes them."""

    num_workers: int
    groups: tuple[tuple[int, ...], ...]
    pulls: tuple[tuple[Pull, ...], ...]

    def serves(self, worker: int) -> list[tuple[int, int]]:
        """(group, destination worker) pairs that `worker` sends to peers."""
        return [(p.group, w) for w, ps in enumerate(self.pulls) for p in ps if p.source == worker]

    def from_server(self) -> list[tuple[int, int]]:
        """(group, worker) pairs the server sends."""
        return [(p.group, w) for w, ps in enumerate(self.pulls) for p in ps if p.source == SERVER]


def centralized(num_workers: int, groups: Sequence[Sequence[int]]) -> DeploySetting:
    """The centralized deployment of `groups` over `num_workers`; ValueError when there are more groups than workers."""
    d = len(groups)
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers={num_workers!r} must be a positive integer")
    if d < 1:
        raise ValueError("no groups to deploy; group the branches first")
    if d > num_workers:
        raise ValueError(f"{d} groups for {num_workers} workers: every group needs a worker that pulls it from the "
                         f"server; use at most {num_workers} groups (or leave num_groups unset to let the deploying "
                         "algorithm choose)")
    comm = [[w for w in range(num_workers) if w % d == c] for c in range(d)]
    pulls = []
    for w in range(num_workers):
        c = w % d
        idx = comm[c].index(w)
        mine = [Pull(c, SERVER if idx == 0 else comm[c][0])]
        for j in range(1, d):
            c2 = (c + j) % d
            mine.append(Pull(c2, comm[c2][idx % len(comm[c2])]))
        pulls.append(tuple(mine))
    return DeploySetting(num_workers, tuple(tuple(g) for g in groups), tuple(pulls))


def estimate_round_s(setting: DeploySetting, group_bytes: Sequence[float], group_compute_s: Sequence[float],
                     server_bytes_per_s: float, peer_bytes_per_s: float) -> float:
    """Distribution plus forward time of one round: serial uplinks and downlinks, compute as groups arrive."""
    n, d = setting.num_workers, len(setting.groups)
    have = [[None] * d for _ in range(n)]
    up = {SERVER: 0.0, **{w: 0.0 for w in range(n)}}
    down = [0.0] * n
    todo = [(p.source, w, p.group) for w, ps in enumerate(setting.pulls) for p in ps]
    while todo:
        best, best_t = None, None
        for i, (src, dst, g) in enumerate(todo):
            ready = 0.0 if src == SERVER else have[src][g]
            if ready is None:
                continue
            t = max(ready, up[src], down[dst])
            if best_t is None or t < best_t:
                best, best_t = i, t
        if best is None:
            raise ValueError("deploy setting has a pull from a worker that never gets the group (Eq. 9 broken)")
        src, dst, g = todo.pop(best)
        bw = server_bytes_per_s if src == SERVER else peer_bytes_per_s
        end = best_t + group_bytes[g] / bw
        up[src] = down[dst] = end
        have[dst][g] = end
    finish = 0.0
    for w in range(n):
        t = 0.0
        for g in sorted(range(d), key=lambda g: have[w][g]):
            t = max(t, have[w][g]) + group_compute_s[g]
        finish = max(finish, t)
    return finish


def server_only_round_s(num_workers: int, model_bytes: float, compute_s: float, server_bytes_per_s: float) -> float:
    """The same round when the server sends the whole model to every worker itself (no overlap with peers)."""
    return num_workers * model_bytes / server_bytes_per_s + compute_s


def deploy(sizes: Sequence[int], num_workers: int, profile: Callable[[DeploySetting], float] | None = None, *,
           compute_s: Sequence[float] | None = None, server_bytes_per_s: float = 1.0,
           peer_bytes_per_s: float = 1.0) -> tuple[DeploySetting, dict[int, float]]:
    """Algorithm 2: the deploy setting with the fastest profiled round over D = 1 .. min(n, M), and every D's time."""
    m = len(sizes)
    if m == 0:
        raise ValueError("no branches to deploy; segment the model first")
    comp = list(compute_s) if compute_s is not None else [0.0] * m
    if len(comp) != m:
        raise ValueError(f"{len(comp)} compute times for {m} branches; give one per branch")

    def default_profile(s: DeploySetting) -> float:
        gb = group_sizes(sizes, s.groups)
        gc = [sum(comp[i] for i in g) for g in s.groups]
        return estimate_round_s(s, gb, gc, server_bytes_per_s, peer_bytes_per_s)

    prof = profile or default_profile
    times: dict[int, float] = {}
    best = None
    for d in range(1, min(num_workers, m) + 1):
        s = centralized(num_workers, group_branches(sizes, d))
        times[d] = float(prof(s))
        if best is None or times[d] < times[len(best.groups)]:
            best = s
    return best, times


def deploy_setting_for(sizes: list[int], workers: int | Sequence[str], spec: OwlSpec) -> DeploySetting:
    """The deploy setting of a run: OWL's (given D, or Algorithm 2's choice), or server-only over the same groups.

    `workers` is their number, or each worker's cluster: then every cluster gets its own centralized deployment of
    the same groups (each group leaves the server once per cluster, and peers pass groups only inside a cluster,
    over its cluster-local path); D is chosen for, and bounded by, the smallest cluster.
    """
    clusters = ["_"] * workers if isinstance(workers, int) else list(workers)
    n = len(clusters)
    names = list(dict.fromkeys(clusters))
    members = {c: [i for i, x in enumerate(clusters) if x == c] for c in names}
    smallest = min(len(m) for m in members.values()) if members else 0
    if spec.num_groups is not None:  # more groups than branches or than workers: ValueError naming the limit
        groups = group_branches(sizes, spec.num_groups)
        centralized(smallest, groups)
    else:
        groups = list(deploy(sizes, smallest, server_bytes_per_s=spec.server_bytes_per_s,
                             peer_bytes_per_s=spec.peer_bytes_per_s)[0].groups)
    pulls: list = [None] * n
    for c, idx in members.items():
        local = centralized(len(idx), groups)
        for j, ps in enumerate(local.pulls):
            pulls[idx[j]] = tuple(Pull(p.group, SERVER if spec.distribution == "server" or p.source == SERVER
                                       else idx[p.source]) for p in ps)
    if spec.distribution == "server":
        pulls = [tuple(Pull(g, SERVER) for g in range(len(groups))) for _ in range(n)]
    return DeploySetting(n, tuple(tuple(g) for g in groups), tuple(pulls))
