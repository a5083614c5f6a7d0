"""Audit records of repeated events, bounded: the first of a kind is written at once, the rest of the same kind
within a period are counted and written as one summary record (so a flood cannot become an audit-log flood)."""
from __future__ import annotations

__all__ = ["AuditThrottle"]

import time
from typing import Callable, Hashable

MAX_KINDS = 1024  # distinct kinds tracked at once; beyond that, kinds of one action share one entry


class _Kind:
    __slots__ = ("last", "suppressed", "record")

    def __init__(self) -> None:
        self.last = 0.0
        self.suppressed = 0
        self.record: tuple = ()


class AuditThrottle:
    """Writes at most one audit record per kind (e.g. action, peer, reason) per `period_s`; the others are
    counted in the next record of that kind, or in a summary record `flush` writes once the period is over."""

    def __init__(self, audit: Callable[..., None], period_s: float = 1.0) -> None:
        self.audit = audit
        self.period_s = period_s
        self._kinds: dict[Hashable, _Kind] = {}

    def __call__(self, kind: Hashable, actor: str, action: str, target: str, outcome: str = "ok",
                 detail: dict | None = None) -> bool:
        """Audit this event unless one of its kind was written within the period; True if written now."""
        if kind not in self._kinds and len(self._kinds) >= MAX_KINDS:
            kind = (action, "*")
        k = self._kinds.get(kind)
        if k is None:
            k = self._kinds[kind] = _Kind()
        now = time.monotonic()
        k.record = (actor, action, target, outcome, detail)
        if now - k.last < self.period_s:
            k.suppressed += 1
            return False
        self._write(k, now)
        return True

    def _write(self, k: _Kind, now: float) -> None:
        actor, action, target, outcome, detail = k.record
        detail = dict(detail or {})
        if k.suppressed:
            detail["suppressed"] = k.suppressed  # like records within the period before this one
        self.audit(actor, action, target, outcome, detail)
        k.last, k.suppressed = now, 0

    def flush(self) -> None:
        """Write a summary record for every kind with events counted but not yet written; forget idle kinds."""
        now = time.monotonic()
        for kind, k in list(self._kinds.items()):
            if now - k.last < self.period_s:
                continue
            if k.suppressed:
                self._write(k, now)
            else:
                del self._kinds[kind]
