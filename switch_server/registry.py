"""The local ranks a switch knows: one registration per worker connection that said HELLO, found by connection or
by (account, job, rank); what each may address; and what each has sent, which bounds what may be acknowledged to it.
Pure state: the local side (`switch_server.local`) does the I/O."""
from __future__ import annotations

__all__ = ["MAX_CHANNELS", "RANK_HELD_S", "Address", "Registration", "WorkerRegistry", "stage_routes"]

import time
from dataclasses import dataclass, field
from typing import Iterator

from switch_server.localshm import WorkerShm

RANK_HELD_S = 3.0  # a rank whose connection sent a HELLO this recently is not handed to another connection
MAX_CHANNELS = 1 << 16  # sending channels one connection may open: each costs the switch a little state

Address = tuple[str, str, int]  # (account, job, rank)


def stage_routes(stages: dict[str, str] | None, here: str) -> dict[str, tuple[str, ...]]:
    """Per cluster, the stages a worker of a job with stage map `stages` addresses when it sends there from
    cluster `here`: the job's stages here (which it runs) and those at that cluster; key `here`: its own only."""
    if not stages:
        return {}
    own = tuple(s for s, c in stages.items() if c == here)
    routes = {c: own + tuple(s for s, c2 in stages.items() if c2 == c) for c in set(stages.values()) if c != here}
    routes[here] = own
    return routes


@dataclass(slots=True)
class Registration:
    """A worker connection that said hello: who it is, which start of its rank, and what it may address."""

    ident: bytes
    account: str
    job: str
    rank: int
    name: str
    last_seen: float
    inc: int = 0  # the incarnation this switch gave this start of the rank (switch_server.incarnations)
    shm: WorkerShm | None = None
    stages: dict[str, str] | None = None  # the job's stage -> cluster map, as its HELLO declared it
    routes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # stage_routes(stages)
    sent: dict[int, int] = field(default_factory=dict)  # channel id -> highest message number sent on it

    @property
    def addr(self) -> Address:
        return (self.account, self.job, self.rank)

    def note_sent(self, channel_id: int, seq: int) -> bool:
        """Record that message `seq` went out on `channel_id`; False if that would open one channel too many."""
        prev = self.sent.get(channel_id)
        if prev is None:
            if len(self.sent) >= MAX_CHANNELS:
                return False
            self.sent[channel_id] = seq
        elif seq > prev:
            self.sent[channel_id] = seq
        return True

    def ack_refusal(self, channel_id: int, seq: int) -> str | None:
        """Why an acknowledgement of message `seq` on `channel_id` cannot be true for this connection (it never
        sent that many), or None. A channel it has not sent on here (e.g. since this switch restarted) is left
        to the worker, which bounds it by its own count."""
        sent = self.sent.get(channel_id)
        if sent is not None and seq > sent:
            return f"it acknowledges message #{seq}, but rank {self.rank} sent only {sent} on that channel"
        return None


class WorkerRegistry:
    """Registrations by connection identity and by (account, job, rank)."""

    def __init__(self) -> None:
        self.by_ident: dict[bytes, Registration] = {}
        self.by_addr: dict[Address, bytes] = {}

    def __len__(self) -> int:
        return len(self.by_ident)

    def __iter__(self) -> Iterator[Registration]:
        return iter(list(self.by_ident.values()))

    def get(self, ident: bytes) -> Registration | None:
        return self.by_ident.get(ident)

    def at(self, addr: Address) -> Registration | None:
        """The registration holding rank `addr`, if any."""
        ident = self.by_addr.get(addr)
        return None if ident is None else self.by_ident.get(ident)

    def held_by_other(self, addr: Address, ident: bytes, now: float) -> bool:
        """True if another live connection holds `addr`: two processes claiming one rank would steal each
        other's frames; a restarted worker's old connection falls silent, so the newcomer gets the rank after
        RANK_HELD_S."""
        old = self.by_addr.get(addr)
        return old is not None and old != ident and now - self.by_ident[old].last_seen < RANK_HELD_S

    def add(self, ident: bytes, account: str, job: str, rank: int, name: str, inc: int,
            stages: dict[str, str] | None, here: str) -> Registration:
        """Register connection `ident` as rank (account, job, rank); a registration it had before is dropped."""
        prev = self.by_ident.get(ident)
        if prev is not None and self.by_addr.get(prev.addr) == ident:
            del self.by_addr[prev.addr]
        reg = Registration(ident, account, job, rank, name, time.monotonic(), inc=inc, stages=stages,
                           routes=stage_routes(stages, here))
        self.by_ident[ident] = reg
        self.by_addr[reg.addr] = ident
        return reg

    def remove(self, ident: bytes) -> Registration | None:
        """Forget connection `ident`; its registration, if it had one."""
        reg = self.by_ident.pop(ident, None)
        if reg is not None and self.by_addr.get(reg.addr) == ident:
            del self.by_addr[reg.addr]
        return reg

    def others_active(self, account: str) -> bool:
        """True if a connection of another account is registered."""
        return any(r.account != account for r in self.by_ident.values())

    def of_job(self, account: str, job: str, but: bytes | None = None) -> list[Registration]:
        """The registrations of (account, job), but connection `but`."""
        return [r for r in self.by_ident.values() if r.account == account and r.job == job and r.ident != but]
