"""Sub-groups of a cluster's ranks, created so that a loaded machine cannot leave them half connected.

The cause of the failures: for every new group on gloo, Paddle runs two rendezvous through the store it is given
(the job's one TCP store): its collective context under keys prefixed by the group id, and the `ProcessGroupGloo`
constructor's own full mesh under the bare group-rank keys "0", "1", ... Those bare keys already hold the addresses
of earlier groups (the job's own group's first), and a rank only waits for a key to exist: a rank that reaches the
rendezvous before its peer has written its key reads the peer's address of an earlier group, connects there (refused
once that listener is gone, or parked by a listener that expects no one) and the peer waits for a connection that
never comes (a hang, or gloo's timeout). Ranks that run together seldom hit it; a rank starved of CPU on a loaded
machine hits it at once (tests/pipeline/test_groups.py, a rank stopped 100 ms of every 110: the first group hung).

What `create_groups` does about it: every attempt at a group gets a TCP store of its own (served by the group's first
rank on a fresh port, announced through the job's store), so its bare keys exist only once their rank wrote them
and no rank can read a stale address, however late its peer. Groups are created one at a time in the same order on
every rank; before each attempt every rank meets at a barrier kept in the job's TCP store; after it every rank
reports success or failure through the store (a gloo collective would itself time out while a peer is stuck), and
if any rank failed all ranks retry that group together under a fresh group id and a fresh store, up to `attempts`
times, then raise `GroupSetupError` naming the group, the last error and the fix. A group of every rank is the
job's own group (no rendezvous at all).

The store's own sockets wait: Paddle's TCP store client writes each command in several small segments with Nagle's
algorithm on, so every call waits out the server's delayed acknowledgement (measured: 44 ms per `add` on loopback,
0.1 ms with TCP_NODELAY); a barrier kept in the store cost about 0.1 s, a one-way step with k = 2 0.45 s instead of
0.27 s. `job_store` turns Nagle off on this process's store connections (and, on the rank that serves the store, on
its listening and accepted sockets); a group's own store is made fast the same way. (Before groups had stores of
their own, group creation ran at Nagle's pace, which let peers write their bare keys in time more often.)
"""
from __future__ import annotations

import itertools
import os
import socket
import time
from typing import Any, Callable, Iterator, Sequence

__all__ = ["GroupSetupError", "StoreBarrier", "create_groups", "job_store", "set_no_delay", "store_port",
           "tcp_sockets"]

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


def store_port() -> int | None:
    """The TCP store's port as Paddle finds its endpoint (MASTER_ADDR/MASTER_PORT, else PADDLE_MASTER, else the first
    of PADDLE_TRAINER_ENDPOINTS); None if none is set."""
    endpoint = os.environ.get("MASTER_PORT") if os.environ.get("MASTER_ADDR") else None
    if endpoint is None:
        endpoint = os.environ.get("PADDLE_MASTER") or os.environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")[0]
    try:
        return int(str(endpoint).rsplit(":", 1)[-1])
    except ValueError:
        return None


def tcp_sockets(port: int) -> Iterator[socket.socket]:
    """This process's TCP sockets to or from `port` (listening ones included), each valid until the next."""
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=int(name))
        except OSError:  # not a socket (or closed meanwhile)
            continue
        try:
            if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                continue
            try:
                peer = sock.getpeername()[1]
            except OSError:  # listening
                peer = None
            if port in (peer, sock.getsockname()[1]):
                yield sock
        except OSError:
            continue
        finally:
            sock.detach()  # the descriptor stays its owner's


def set_no_delay(port: int, value: int | dict[int, int]) -> dict[int, int]:
    """Set TCP_NODELAY on this process's TCP sockets to or from `port` (listening ones pass it on to the connections
    they accept): `value` for all, or per descriptor (others left alone); returns what each had before."""
    before = {}
    for sock in tcp_sockets(port):
        fd = sock.fileno()
        before[fd] = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        want = value if isinstance(value, int) else value.get(fd)
        if want is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, want)
    return before


_FAST_DONE = False  # job_store made this process's store connections fast already
_GROUP_STORES: list[Any] = []  # every group's own store lives as long as the process (its group holds it too)


def job_store() -> Any:
    """The job's TCP store (Paddle's, set by init_parallel_env), its connections made to answer without delay."""
    global _FAST_DONE
    from paddle.distributed import collective

    store = collective._default_store  # the job's TCP store (set by init_parallel_env)
    if not _FAST_DONE and (port := store_port()) is not None and os.path.isdir("/proc/self/fd"):
        set_no_delay(port, 1)
        _FAST_DONE = True
    return store


class _PaddleStores:
    """Per attempt, a TCP store of the group's own, put where Paddle's `new_group` takes its store from."""

    def __init__(self, sync: StoreBarrier, timeout_s: float) -> None:
        import paddle.distributed as dist

        self.sync, self.timeout_s = sync, timeout_s
        self.rank = dist.get_rank()
        self.endpoints = list(dist.ParallelEnv().trainer_endpoints)

    def _serve(self, key: str, ranks: list[int]) -> Any:
        from paddle.base import core

        host = self.endpoints[ranks[0]].rsplit(":", 1)[0] if ranks[0] < len(self.endpoints) else "127.0.0.1"
        wait = max(1, int(self.timeout_s))
        if self.rank == ranks[0]:  # the first rank serves it on a free port, announced through the job's store
            with socket.socket() as probe:
                probe.bind(("", 0))
                port = probe.getsockname()[1]
            self.sync.store.add(f"{key}/port", port)
            store = core.TCPStore(host, port, True, len(ranks), wait)
        else:
            deadline = time.monotonic() + self.timeout_s
            while (port := int(self.sync.store.add(f"{key}/port", 0))) == 0:
                if time.monotonic() > deadline:
                    raise GroupSetupError(f"rank {ranks[0]} did not announce the group's store within "
                                          f"{self.timeout_s:.0f} s")
                time.sleep(self.sync.poll_s)
            store = core.TCPStore(host, port, False, len(ranks), wait)
        _GROUP_STORES.append(store)
        if os.path.isdir("/proc/self/fd"):
            set_no_delay(port, 1)
        return store

    def new_group(self, key: str, ranks: list[int], new_group: Callable[[list[int]], Any]) -> Any:
        """`new_group(ranks)` with the group's own store; ranks outside the group call it too (Paddle counts group
        ids by calls), with the job's store, which they do not use."""
        from paddle.distributed import collective

        if self.rank not in ranks or len(ranks) < 2:
            return new_group(ranks)
        before = collective._default_store
        collective._default_store = self._serve(key, ranks)
        try:
            return new_group(ranks)
        finally:
            collective._default_store = before


def create_groups(rank_lists: Sequence[Sequence[int]], *, world: int, attempts: int = 3, timeout_s: float = 300.0,
                  store: Any = None, new_group: Callable[[list[int]], Any] | None = None,
                  log: Callable[[str], None] | None = None) -> list[Any]:
    """One process group per entry of `rank_lists`, in order; every rank of the job must call this with the same
    lists (ranks outside a group still take part, as Paddle's `new_group` requires).

    `store` / `new_group` default to Paddle's job store and `paddle.distributed.new_group` (tests pass others); with
    Paddle's store every attempt at a group rendezvouses in a store of the group's own (see above), and with
    Paddle's `new_group` a group of all `world` ranks is the job's own group, returned as None (Paddle's name for
    it). Raises GroupSetupError when a group still fails after `attempts` tries or a rank does not arrive."""
    if attempts < 1:
        raise ValueError(f"attempts={attempts} must be >= 1")
    whole = None  # a group of every rank is the job's own group: no new rendezvous (None stands for it in Paddle)
    if new_group is None:
        import paddle.distributed as dist

        new_group, whole = dist.new_group, list(range(world))
    sync = StoreBarrier(store if store is not None else job_store(), world, timeout_s)
    own = _PaddleStores(sync, timeout_s) if store is None else None
    make: Callable[[str, list[int]], Any] = (
        (lambda key, ranks: own.new_group(key, ranks, new_group)) if own is not None
        else (lambda key, ranks: new_group(ranks)))
    return _create(rank_lists, sync, attempts, make, log, whole)


def _create(rank_lists: Sequence[Sequence[int]], sync: StoreBarrier, attempts: int,
            new_group: Callable[[str, list[int]], Any], log: Callable[[str], None] | None,
            whole: list[int] | None) -> list[Any]:
    call = next(_SEQ)
    out = []
    for g, ranks in enumerate(rank_lists):
        ranks = sorted(int(r) for r in ranks)
        if ranks == whole:  # (every rank makes the same lists, so every rank skips it alike)
            out.append(None)
            continue
        what = f"process group {g} (ranks {ranks})"
        last = ""
        for attempt in range(attempts):
            key = f"nebula/groups/{call}/{g}/{attempt}"
            sync.wait(f"{key}/start", what)  # the group's ranks enter the rendezvous together
            group, ok = None, True
            try:
                group = new_group(key, ranks)
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
