"""Audit records of repeated events, bounded: up to `burst` of a kind are written per period, the rest are counted
and written as one summary record (so a flood of connections or frames cannot become an audit-log flood). No event
is lost: each record stands for its own event and `suppressed` earlier ones of its kind not written one by one."""
from __future__ import annotations

__all__ = ["AuditThrottle"]

import time
from typing import Callable, Hashable

MAX_KINDS = 1024  # distinct kinds tracked at once; beyond that, kinds of one action share one entry


class _Kind:
    __slots__ = ("start", "written", "suppressed", "record")

    def __init__(self) -> None:
        self.start = 0.0
        self.written = 0
        self.suppressed = 0
        self.record: tuple = ()


class AuditThrottle:
    """Writes at most `burst` audit records per kind (e.g. action, peer, reason) and `period_s`; the others are
    counted (`suppressed`) in the next record of that kind, or in a summary record `flush` writes."""

    def __init__(self, audit: Callable[..., None], period_s: float = 1.0, burst: int = 5) -> None:
        self.audit = audit
        self.period_s = period_s
        self.burst = burst
        self._kinds: dict[Hashable, _Kind] = {}

    def __call__(self, kind: Hashable, actor: str, action: str, target: str, outcome: str = "ok",
                 detail: dict | None = None) -> bool:
        """Audit this event unless its kind used up its records of this period; True if written now."""
        if kind not in self._kinds and len(self._kinds) >= MAX_KINDS:
            kind = (action, "*")
        k = self._kinds.get(kind)
        if k is None:
            k = self._kinds[kind] = _Kind()
        now = time.monotonic()
        if now - k.start >= self.period_s:
            k.start, k.written = now, 0
        k.record = (actor, action, target, outcome, detail)
        if k.written >= self.burst:
            k.suppressed += 1
            return False
        self._write(k)
        return True

    def _write(self, k: _Kind) -> None:
        actor, action, target, outcome, detail = k.record
        detail = dict(detail or {})
        if k.suppressed:
            detail["suppressed"] = k.suppressed  # like events not written one by one before this record
        self.audit(actor, action, target, outcome, detail)
        k.written += 1
        k.suppressed = 0

    def flush(self, force: bool = False) -> None:
        """Write a summary record for every kind with events counted but not written (of a period ended, or with
        `force` of every kind: at a stop, so that no count is lost); forget idle kinds."""
        now = time.monotonic()
        for kind, k in list(self._kinds.items()):
            if now - k.start < self.period_s and not (force and k.suppressed):
                continue
            if k.suppressed:
                k.start, k.written = now, 0
                k.suppressed -= 1  # (the record written is the last of them: it stands for itself and the rest)
                self._write(k)
            else:
                del self._kinds[kind]
