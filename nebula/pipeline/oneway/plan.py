"""Scenario I's plan: which receiver ranks each sender rank feeds (`ScatterPlan`), and how many receivers k one sender
should feed, from the measured speeds of both sides (`choose_k`).

Every cluster but the last runs a sender (e.g. one ELECTRA generator per language group); the last cluster runs
the receiver (the discriminator). Sender ranks are numbered across sender clusters in job order; sender rank s
feeds the k receiver ranks s*k .. s*k+k-1 through their root s*k (Figure 6). Receiver ranks beyond S*k (S sender
ranks) idle: they add zero gradients to the all-reduce, so every replica stays identical.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["choose_k", "ScatterPlan", "plan_for", "signatures_agree"]


def choose_k(sender_s: float, receiver_s: float, *, max_k: int | None = None) -> int:
    """k that keeps both sides busy: a sender run produces k results in k*sender_s while each receiver takes
    receiver_s for one, so k = receiver_s / sender_s rounded to the k with the smaller idle fraction.

    `sender_s` / `receiver_s`: measured seconds per micro-batch of the sender and receiver stage.
    """
    if not (sender_s > 0 and receiver_s > 0) or not (math.isfinite(sender_s) and math.isfinite(receiver_s)):
        raise ValueError(f"choose_k: times must be finite and > 0, got sender_s={sender_s}, receiver_s={receiver_s}")
    if max_k is not None and max_k < 1:
        raise ValueError(f"choose_k: max_k={max_k} must be >= 1")
    ratio = receiver_s / sender_s
    lo, hi = max(1, math.floor(ratio)), max(1, math.ceil(ratio))

    def idle(k: int) -> float:  # fraction of the slower side's period that the other side idles
        period = max(k * sender_s, receiver_s)
        return (period - k * sender_s) / period + (period - receiver_s) / period

    k = min((lo, hi), key=lambda c: (idle(c), c))
    return min(k, max_k) if max_k is not None else k


@dataclass(frozen=True, slots=True)
class ScatterPlan:
    """Which receiver ranks each sender rank feeds: sender s -> root s*k, sub-receivers s*k .. s*k+k-1."""

    senders: tuple[tuple[str, int], ...]  # (cluster, rank) of every sender rank, in job order
    receiver: str
    receiver_world: int
    k: int

    def __post_init__(self) -> None:
        if self.k < 1 or not self.senders:
            raise ValueError(f"scatter plan needs k >= 1 and at least one sender rank, got k={self.k}, "
                             f"{len(self.senders)} sender ranks")
        if self.k > self.receiver_world:
            raise ValueError(f"oneway.k={self.k} is larger than the {self.receiver_world} ranks of receiver cluster "
                             f"{self.receiver}; lower k or give the cluster more ranks")
        if self.active > self.receiver_world:
            raise ValueError(f"{len(self.senders)} sender ranks x k={self.k} need {self.active} ranks on cluster "
                             f"{self.receiver}, it has {self.receiver_world}; lower k or add ranks")

    @property
    def active(self) -> int:
        """Receiver ranks that get data (the rest idle)."""
        return len(self.senders) * self.k

    def sender_index(self, cluster: str, rank: int) -> int:
        """Global index s of sender rank `rank` of `cluster`."""
        return self.senders.index((cluster, rank))

    def root(self, s: int) -> int:
        """Receiver rank that sender s sends to."""
        return s * self.k

    def group(self, s: int) -> list[int]:
        """The k receiver ranks fed by sender s (its root first)."""
        return list(range(s * self.k, (s + 1) * self.k))

    def sender_of(self, receiver_rank: int) -> int | None:
        """Sender index feeding `receiver_rank` (None: an idle rank)."""
        return receiver_rank // self.k if receiver_rank < self.active else None

    def is_root(self, receiver_rank: int) -> bool:
        """True when `receiver_rank` receives from a sender over the WAN."""
        return receiver_rank < self.active and receiver_rank % self.k == 0


def plan_for(senders: list[tuple[str, int]], receiver: str, receiver_world: int, k: int) -> ScatterPlan:
    """Scatter plan for sender clusters given as (cluster, world size) and the receiver cluster."""
    ranks = tuple((c, r) for c, n in senders for r in range(n))
    return ScatterPlan(senders=ranks, receiver=receiver, receiver_world=receiver_world, k=k)


def signatures_agree(mine: dict, theirs: dict) -> str | None:
    """None when every key both signatures carry has the same value; else the first difference, in words."""
    for key in sorted(set(mine) & set(theirs)):
        if mine[key] != theirs[key]:
            return f"{key}: {theirs[key]!r} (sender) != {mine[key]!r} (receiver)"
    return None
