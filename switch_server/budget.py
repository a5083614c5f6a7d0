"""The switch's memory budget: one hard cap on queued bytes, shares per party, and the hold-back that enforces them.

Every byte the switch queues (towards a peer link or a local worker) is charged here when it is received and
released when it leaves; a party is a peer cluster (`("peer", cluster)`) or a local account
(`("account", name)`). When the total passes the cap, readers registered for the whole switch are held back
until it falls below `resume_fraction` of the cap; a party with a share of its own is held back alone when it
passes that share, so one party over its share never stalls another.
"""
from __future__ import annotations

__all__ = ["ALL", "MemoryBudget", "Party", "Share"]

from dataclasses import dataclass
from typing import Callable

Party = tuple[str, str]  # ("peer", cluster) or ("account", name)
ALL: Party = ("*", "*")  # the whole switch: its readers are held back when the total cap is passed

HoldHandler = Callable[[Party, bool], None]


@dataclass(slots=True)
class Share:
    """Bytes one party has queued, and its own cap (None: only the total cap applies)."""

    used: int = 0
    cap_bytes: int | None = None
    held: bool = False


class MemoryBudget:
    """Charges and releases queued bytes by party; holds back (and resumes) whoever is over its cap."""

    def __init__(self, cap_bytes: int, on_hold: HoldHandler, resume_fraction: float = 0.8) -> None:
        if cap_bytes <= 0:
            raise ValueError(f"memory cap {cap_bytes} must be positive; set link.memory_cap_bytes")
        self.cap_bytes = cap_bytes
        self.resume_fraction = resume_fraction
        self.used = 0
        self.held = False  # the total is over the cap: ALL is held back
        self.shares: dict[Party, Share] = {}
        self._on_hold = on_hold

    def set_cap(self, cap_bytes: int) -> None:
        """Change the total cap (hot reload); takes effect at the next charge or release."""
        self.cap_bytes = cap_bytes

    def set_share(self, party: Party, cap_bytes: int | None) -> None:
        """Give `party` a cap of its own (None: none)."""
        self.share(party).cap_bytes = cap_bytes

    def share(self, party: Party) -> Share:
        """The share of `party` (created empty on first use)."""
        s = self.shares.get(party)
        if s is None:
            s = self.shares[party] = Share()
        return s

    def charge(self, nbytes: int, party: Party | None = None, *, hold: bool = True) -> None:
        """Count `nbytes` received for `party`; with `hold`, whoever is now over its cap is held back."""
        self.used += nbytes
        if party is not None:
            s = self.share(party)
            s.used += nbytes
            if hold and s.cap_bytes is not None and s.used > s.cap_bytes and not s.held:
                s.held = True
                self._on_hold(party, True)
        if hold and not self.held and self.used > self.cap_bytes:
            self.held = True
            self._on_hold(ALL, True)

    def release(self, nbytes: int, party: Party | None = None) -> None:
        """`nbytes` of `party` left the switch; resume whoever is back well under its cap."""
        self.used -= nbytes
        if party is not None:
            s = self.shares.get(party)
            if s is not None:
                s.used -= nbytes
                if s.held and (s.cap_bytes is None or s.used < s.cap_bytes * self.resume_fraction):
                    s.held = False
                    self._on_hold(party, False)
        if self.held:
            self.maybe_resume()

    def maybe_resume(self) -> None:
        """Resume the whole switch's readers once the total is well below the cap."""
        if self.held and self.used < self.cap_bytes * self.resume_fraction:
            self.held = False
            self._on_hold(ALL, False)

    def over(self, party: Party | None = None) -> bool:
        """Whether the total (or `party`'s share) is over its cap now."""
        if party is None:
            return self.used > self.cap_bytes
        s = self.shares.get(party)
        return s is not None and s.cap_bytes is not None and s.used > s.cap_bytes
