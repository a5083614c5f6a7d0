"""Incarnations of the local ranks: the number this switch gives each start of a worker process, and checks.

A worker's first HELLO names no incarnation; the switch answers with a new one in its WELCOME: its own boot epoch
in the high 32 bits and a counter in the low, so a later start of a rank has a larger number than any earlier one,
whatever the clocks of the hosts say (`nebula.channel.delivery` orders starts by it). The numbers given are kept
in the state directory, so a worker that reconnects after a switch restart keeps its own, and a connection may
use only the one given to its rank: every DATA and ACK it sends must carry it. A peer switch's frames are bounded
by that peer's boot epoch (it cannot have given a number from a later boot).
"""
from __future__ import annotations

__all__ = ["EPOCH_SHIFT", "Incarnations", "peer_inc_refusal"]

from typing import Any

EPOCH_SHIFT = 32
FILE = "incarnations.json"
MAX_KEPT = 100_000  # ranks remembered (oldest forgotten first): a rank forgotten gets a new number on return

Address = tuple[str, str, int]  # (account, job, rank)


def _key(addr: Address) -> str:
    return f"{addr[0]}\x00{addr[1]}\x00{addr[2]}"


class Incarnations:
    """The incarnations this switch gave its local ranks (persisted through `state`, a SwitchState)."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.epoch = 0  # set by `start`
        self.counter = 0
        given = state.read_json(FILE, {})
        self.given: dict[str, int] = {k: v for k, v in given.items() if isinstance(v, int)} if isinstance(given, dict) else {}

    def start(self, epoch: int) -> None:
        """Numbers from now on are of boot `epoch` (the switch's, persisted: larger at every start)."""
        if not 0 < epoch < (1 << 31):
            raise ValueError(f"boot epoch {epoch} must be in [1, 2^31)")
        self.epoch, self.counter = epoch, 0

    def assign(self, addr: Address) -> int:
        """A new incarnation for a new start of the rank at `addr`."""
        self.counter += 1
        inc = (self.epoch << EPOCH_SHIFT) | self.counter
        k = _key(addr)
        self.given.pop(k, None)  # (re-inserted last: the oldest entries are the ones forgotten)
        self.given[k] = inc
        while len(self.given) > MAX_KEPT:
            del self.given[next(iter(self.given))]
        self.state.write_json(FILE, self.given)
        return inc

    def current(self, addr: Address) -> int:
        """The incarnation last given to the rank at `addr` (0: none)."""
        return self.given.get(_key(addr), 0)

    def refusal(self, addr: Address, inc: int) -> str | None:
        """Why a new connection may not speak as incarnation `inc` of the rank at `addr`, or None if it may."""
        given = self.current(addr)
        if inc == given:
            return None
        if inc < given:
            return (f"incarnation {inc} of rank {addr[2]} of job {addr[1]!r} (account {addr[0]!r}) has been "
                    f"replaced by a later start ({given}); this process is stale: stop it")
        return (f"incarnation {inc} of rank {addr[2]} of job {addr[1]!r} (account {addr[0]!r}) was not given by "
                f"this switch (it gave {given or 'none'}); restart the worker so that it takes a new one")


def peer_inc_refusal(peer: str, epoch: int, meta: dict[str, Any]) -> str | None:
    """Why a peer's DATA or ACK names an incarnation that peer's switch cannot have given (one from a boot after
    its current `epoch`), or None."""
    inc = meta.get("inc", 0)
    if inc >> EPOCH_SHIFT > epoch:
        return (f"frame names incarnation {inc} of a rank of cluster {peer!r}, from boot {inc >> EPOCH_SHIFT} of its "
                f"switch, which is at boot {epoch}: no switch gives such a number")
    return None
