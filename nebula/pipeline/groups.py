"""Sub-groups of a cluster's ranks, created so that a loaded machine cannot leave them half connected.

Why this is needed: for every new group on gloo, Paddle runs two rendezvous through the job's one TCP store: its
collective context under keys prefixed by the group id, and the `ProcessGroupGloo` constructor's own full mesh under
the bare group-rank keys "0", "1", ... Those bare keys already hold the addresses of earlier groups (the global
group's first) and are shared by groups created at the same time. A rank that reaches the rendezvous before its peer
has written its key reads a stale or foreign address; its pair then connects to the wrong listener (refused once
that is gone) or waits for a connection that never comes (gloo's 30 s timeout). Ranks that arrive together seldom
hit it; on a loaded machine they arrive seconds apart.

What `create_groups` does about it: groups are created one at a time in the same order on every rank (no two
rendezvous share the bare keys at once); before each attempt every rank meets at a barrier kept in the TCP store
(so the group's ranks arrive together); after it every rank reports success or failure through the store (a gloo
collective would itself time out while a peer is stuck in its 30 s wait), and if any rank failed all ranks retry
that group together under a fresh group id, up to `attempts` times, then raise `GroupSetupError` naming the group,
the last error and the fix.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Callable, Sequence

__all__ = ["GroupSetupError", "StoreBarrier", "create_groups", "job_store"]

_SEQ = itertools.count()  # one per create_groups call; the same on every rank since every rank makes the same calls


class GroupSetupError(RuntimeError):
    """A process group could not be connected within the allowed attempts."""


class StoreBarrier:
    """Counters in a TCP store (Paddle's `TCPStore`: `add(key, n)` returns the new value): a barrier and a vote
    that do not depend on any gloo connection."""

    def __init__(self, store: Any, world: int, timeout_s: float, poll_s: float = 0.005) -> None:
        self.store, self.world, self.timeout_s, self.poll_s = store, world, timeout_s, poll_s

    def wait(self, key: str, what: str, world: int | None = None) -> None:
        """Count this rank in at `key`, then wait until `world` ranks (default: all) have."""
        n = world or self.world
        self.store.add(key, 1)
        deadline = time.monotonic() + self.timeout_s
        while self.store.add(key, 0) < n:
            if time.monotonic() > deadline:
                raise GroupSetupError(f"{what}: only {self.store.add(key, 0)} of {n} ranks arrived within "
                                      f"{self.timeout_s:.0f} s; a rank died or is stuck (see its log)")
            time.sleep(self.poll_s)

    def vote(self, key: str, ok: bool, what: str) -> int:
        """Every rank reports `ok`; returns how many ranks failed (the same answer on every rank)."""
        if not ok:
            self.store.add(f"{key}/failed", 1)
        self.wait(f"{key}/voted", what)
        return int(self.store.add(f"{key}/failed", 0))


def job_store() -> Any:
    """The job's TCP store (Paddle's, set by init_parallel_env)."""
    from paddle.distributed import collective

    return collective._default_store  # the job's TCP store (set by init_parallel_env)


def create_groups(rank_lists: Sequence[Sequence[int]], *, world: int, attempts: int = 3, timeout_s: float = 300.0,
                  store: Any = None, new_group: Callable[[list[int]], Any] | None = None,
                  log: Callable[[str], None] | None = None) -> list[Any]:
    """One process group per entry of `rank_lists`, in order; every rank of the job must call this with the same
    lists (ranks outside a group still take part, as Paddle's `new_group` requires).

    `store` / `new_group` default to Paddle's job store and `paddle.distributed.new_group` (tests pass others).
    Raises GroupSetupError when a group still fails after `attempts` tries or a rank does not arrive."""
    if attempts < 1:
        raise ValueError(f"attempts={attempts} must be >= 1")
    if new_group is None:
        import paddle.distributed as dist

        new_group = dist.new_group
    sync = StoreBarrier(store if store is not None else job_store(), world, timeout_s)
    call = next(_SEQ)
    out = []
    for g, ranks in enumerate(rank_lists):
        ranks = sorted(int(r) for r in ranks)
        what = f"process group {g} (ranks {ranks})"
        last = ""
        for attempt in range(attempts):
            key = f"nebula/groups/{call}/{g}/{attempt}"
            sync.wait(f"{key}/start", what)  # the group's ranks enter the rendezvous together
            group, ok = None, True
            try:
                group = new_group(ranks)
            except Exception as exc:  # gloo raises RuntimeError subclasses; any failure is retried together
                ok, last = False, f"{type(exc).__name__}: {exc}"
            failed = sync.vote(key, ok, what)
            if not failed:
                out.append(group)
                break
            if log:
                log(f"{what}: attempt {attempt + 1} of {attempts} failed on {failed} rank(s)"
                    + (f" ({last.splitlines()[0][:200]})" if last else "") + "; retrying")
        else:
            raise GroupSetupError(
                f"{what} failed to connect in {attempts} attempts (last error here: {last or 'on another rank'}); "
                "gloo's rendezvous times out when the machine is overloaded: retry when the load is lower, "
                "run fewer ranks per machine, or raise the attempts")
    return out
