"""What a switch logs about its peers: one line per change, a summary while a failure repeats.

A peer that stays down is dialed again every few seconds for as long as it is down, and a refused peer (revoked,
not in the peers list) dials us as often: one line per attempt buries everything else in the log. `LinkLog` (one
per outgoing link) says each change of state (down with the reason, up with how long it was down), a new reason
once per down period, and while the link stays down a summary every SUMMARY_EVERY_S; `RefusalLog` says the first
refusal of a peer for a reason, then a summary of its repeats every SUMMARY_EVERY_S. Both only decide what to say
(their clock is injected): the caller logs the lines, and audits every refusal itself whatever is logged.
"""
from __future__ import annotations

__all__ = ["LinkLog", "LogLine", "NOT_A_PEER", "REFUSED_ALERTS", "RefusalLog", "SUMMARY_EVERY_S", "duration",
           "not_a_peer_text"]

import logging
import time
from dataclasses import dataclass
from typing import Callable, Hashable

from security._text import duration

SUMMARY_EVERY_S = 300.0
MAX_REASONS = 8  # distinct reasons said one by one in one down period (the rest only in summaries)
MAX_KEYS = 256  # refusal kinds tracked at once (the one longest quiet is forgotten first)
Clock = Callable[[], float]
# TLS alerts a peer sends when it refuses this switch's certificate, and how they are said
REFUSED_ALERTS = (("ALERT_CERTIFICATE_REVOKED", "revoked"), ("ALERT_UNKNOWN_CA", "issued by an unknown CA"),
                  ("ALERT_CERTIFICATE_EXPIRED", "expired"), ("ALERT_BAD_CERTIFICATE", "bad"))
# the ERROR code a switch answers the LINK_HELLO of a CA-valid switch of a cluster not in its peers list with
NOT_A_PEER = "not_a_peer"


@dataclass(frozen=True)
class LogLine:
    """A line to log and its level."""

    level: int
    text: str

    def __post_init__(self) -> None:
        if self.level not in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR):
            raise ValueError(f"level {self.level} is not a logging level")


def not_a_peer_text(peer: str, me: str, address: str, revision: int | None) -> str:
    """What a switch of cluster `me` says when peer `peer` (at `address`) refuses it as not in its peers list:
    which side lacks whom, and the update to apply there (`revision`: this switch's kit revision, if known; the
    update that added `me` is of that revision or older, and any newer one for `peer` adds it too)."""
    update = f"{peer}-r{revision}.tar.gz" if revision else f"{peer}-rN.tar.gz"
    which = (f"the admin's updates/{update} (or a newer one for {peer})" if revision
             else f"the admin's newest update for {peer} (updates/{update})")
    return (f"peer {peer} ({address}) refuses this switch's certificate: {peer}'s peers list has no cluster {me} "
            f"({peer} has not applied the update that adds {me}); on {peer}, apply {which} with "
            f"`nebula-switch reload --config <{peer}'s switch.yaml> --update {update}`")


class LinkLog:
    """The log of one outgoing link to `peer`: states new (never up), up and down."""

    def __init__(self, peer: str, clock: Clock = time.monotonic, summary_every_s: float = SUMMARY_EVERY_S) -> None:
        if summary_every_s <= 0:
            raise ValueError(f"summary_every_s={summary_every_s} must be > 0")
        self.peer, self.clock, self.every = peer, clock, summary_every_s
        self.state = "new"
        self.since = clock()  # when the current state began
        self.attempts = 0  # failed attempts in this down period
        self.reasons: set[str] = set()  # reasons said in this down period
        self.last = ""  # the latest reason
        self.said_at = self.since  # when a line of this down period was last said

    def failed(self, reason: str, level: int = logging.INFO) -> LogLine:
        """A session ended or an attempt failed for `reason`: the line to say (DEBUG when nothing new)."""
        now = self.clock()
        if self.state != "down":
            was_up = self.state == "up"
            up_for = now - self.since
            self.state, self.since, self.attempts, self.reasons, self.said_at = "down", now, 1, {reason}, now
            self.last = reason
            state = f"down after {duration(up_for)} up" if was_up else "not up yet"
            return LogLine(level, f"link to {self.peer} {state}: {reason} (retrying; repeats are summarized every "
                                  f"{duration(self.every)})")
        self.attempts += 1
        self.last = reason
        if reason not in self.reasons and len(self.reasons) < MAX_REASONS:
            self.reasons.add(reason)
            self.said_at = now
            return LogLine(level, f"link to {self.peer} still down ({self.summary(now)}), now: {reason}")
        if now - self.said_at >= self.every:
            self.said_at = now
            return LogLine(max(level, logging.INFO),
                           f"link to {self.peer} down for {self.summary(now)}, last: {reason}")
        return LogLine(logging.DEBUG, f"link to {self.peer} down: {reason}")

    def summary(self, now: float) -> str:
        """How long this down period has lasted, and its failed attempts."""
        return f"{duration(now - self.since)}, {self.attempts} attempt{'s' if self.attempts != 1 else ''}"

    def up(self) -> str:
        """The session is up: what to add to its line (how long the link was down, and how many attempts)."""
        now = self.clock()
        note = f" after {duration(now - self.since)} down, {self.attempts} failed attempt" \
               f"{'s' if self.attempts != 1 else ''}" if self.state == "down" else ""
        self.state, self.since, self.attempts, self.reasons, self.last = "up", now, 0, set(), ""
        return note


class _Kind:
    __slots__ = ("first", "said_at", "repeats", "last")

    def __init__(self, now: float, text: str) -> None:
        self.first = self.said_at = now
        self.repeats = 0  # since the last line said
        self.last = text


class RefusalLog:
    """Lines for refusals of peers by kind (e.g. address and reason): the first of a kind, then every
    `summary_every_s` a summary of its repeats; a kind with no refusal for that long is forgotten (said again)."""

    def __init__(self, clock: Clock = time.monotonic, summary_every_s: float = SUMMARY_EVERY_S,
                 max_keys: int = MAX_KEYS) -> None:
        if summary_every_s <= 0 or max_keys < 1:
            raise ValueError(f"summary_every_s={summary_every_s} must be > 0 and max_keys={max_keys} >= 1")
        self.clock, self.every, self.max_keys = clock, summary_every_s, max_keys
        self._kinds: dict[Hashable, _Kind] = {}

    def refused(self, kind: Hashable, text: str, level: int = logging.WARNING) -> list[LogLine]:
        """A refusal of `kind` described by `text`: the lines to say now (summaries of other kinds that are due
        come with it; a repeat not due yet is one DEBUG line)."""
        now = self.clock()
        lines = self.due(now, but=kind)
        k = self._kinds.get(kind)
        if k is not None and now - k.said_at >= self.every and not k.repeats:
            k = None  # (quiet for a whole period: a new episode)
        if k is None:
            self._kinds.pop(kind, None)
            if len(self._kinds) >= self.max_keys:
                oldest = min(self._kinds, key=lambda x: self._kinds[x].said_at)
                lines += self._summary(oldest, self._kinds.pop(oldest), now)
            self._kinds[kind] = _Kind(now, text)
            return [*lines, LogLine(level, f"{text} (repeats are summarized every {duration(self.every)})")]
        k.repeats += 1
        k.last = text
        if now - k.said_at >= self.every:
            lines += self._summary(kind, k, now)
            return lines
        return [*lines, LogLine(logging.DEBUG, text)]

    def due(self, now: float | None = None, but: Hashable = None) -> list[LogLine]:
        """Summaries of the kinds whose period ended with repeats unsaid; kinds quiet for a period are forgotten."""
        now = self.clock() if now is None else now
        lines: list[LogLine] = []
        for kind, k in list(self._kinds.items()):
            if kind == but or now - k.said_at < self.every:
                continue
            if k.repeats:
                lines += self._summary(kind, k, now)
            else:
                del self._kinds[kind]
        return lines

    def _summary(self, kind: Hashable, k: _Kind, now: float) -> list[LogLine]:
        if not k.repeats:
            return []
        line = LogLine(logging.WARNING, f"{k.repeats} more refusal{'s' if k.repeats != 1 else ''} like this in the "
                                        f"last {duration(now - k.said_at)} ({duration(now - k.first)} since the "
                                        f"first), last: {k.last}")
        k.said_at, k.repeats = now, 0
        return [line]
