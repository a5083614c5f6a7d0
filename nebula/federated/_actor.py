"""What the controller and combiners share: their identity, their audit log (with refusals counted, not written one
by one), and the job grants a combiner checks its clients against. (The rules a client's messages are checked by:
nebula.federated.checks.)"""
from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from nebula.config.worker import load_worker_config
from nebula.federated.checks import Refusal

__all__ = ["ActorAudit", "RefusalSink", "JobGrants", "RefusalTally", "Terminated", "stop_on_sigterm", "check_terminated"]

log = logging.getLogger(__name__)
_TERMINATE = threading.Event()  # set by SIGTERM: the process's actors end their run at their next poll


class Terminated(Exception):
    """SIGTERM asked this process to stop: an actor ends its run with an audit record and its closing checkpoint
    instead of dying with a tail that no one witnessed."""


def stop_on_sigterm() -> bool:
    """Make SIGTERM end this process's actors cleanly (they raise `Terminated` at their next poll, within about a
    second); False where a handler cannot be installed (not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, lambda *_: _TERMINATE.set())
    return True


def check_terminated() -> None:
    """Raise `Terminated` once SIGTERM came (see `stop_on_sigterm`)."""
    if _TERMINATE.is_set():
        raise Terminated("SIGTERM")


# where a runtime reports a refusal: refused(peer, field, value, expected, message="") (message: the refused
# message's type, when known); FedOptima and OWL get one from nebula.federated.actors, which audits it (counted:
# RefusalTally). It returns False when the refusal's log line is to be left out (a repeat of the same (peer, message,
# field) within the interval); None or True: log it
RefusalSink = Callable[..., "bool | None"]


class ActorAudit:
    """Hash-chained audit log of one actor (security.audit), signed with the actor's own key in its directory."""

    def __init__(self, workdir: str | Path, worker_file: str, role: str, cluster: str, rank: int) -> None:
        from security.audit import AuditLog, generate_signing_key

        d = Path(workdir)
        d.mkdir(parents=True, exist_ok=True)
        key = d / "audit_signing.key"
        if not key.exists():
            generate_signing_key(key)
        account = load_worker_config(worker_file).account
        self.actor = f"{account}@{cluster}/{rank}:{role}"
        self.log = AuditLog(d / "audit.log", key)

    def record(self, action: str, target: str, outcome: str, detail: Mapping[str, Any] | None = None) -> None:
        """One audit record by this actor."""
        self.log.append(self.actor, action, target, outcome, dict(detail or {}))

    def close(self) -> None:
        """Write the final checkpoint."""
        self.log.close()


class JobGrants:
    """The `job:NAME` grants (security.routes) of one account home, re-read at most every `refresh_s` so that a
    grant added or revoked with `nebula-admin grant` takes effect while the job runs. An unreadable home stops the
    combiner at start (fail closed); one that becomes unreadable later keeps the grants last read."""

    def __init__(self, home: str | Path, refresh_s: float = 1.0) -> None:
        from security.routes import load_route_policy

        self.home, self.refresh_s = str(home), refresh_s
        self.policy = load_route_policy(self.home)
        self._read = time.monotonic()

    def refusal(self, account: str, job: str) -> str | None:
        """Why `account`'s clients may not join `job` (with the fix), or None."""
        from security.errors import SecurityError
        from security.routes import load_route_policy

        if time.monotonic() - self._read > self.refresh_s:
            self._read = time.monotonic()
            try:
                self.policy = load_route_policy(self.home)
            except SecurityError as exc:
                log.warning("job grants of %s unreadable (%s); keeping those read before", self.home, exc)
        why = self.policy.job_refusal(account, job)
        return None if why is None else f"{why} (account home {self.home})"


@dataclass(slots=True)
class _Count:
    count: int = 0
    reason: str = ""
    clients: list[str] = field(default_factory=list)
    first: dict = field(default_factory=dict)  # the first counted refusal's own fields, written with the count


class RefusalTally:
    """Refusals that a sender can repeat at will (late, uninvited or duplicate updates, hellos, messages of another
    run) are counted by (action, kind), not written one by one: `flush` writes one audit record per (action, kind)
    with the count, the first reason and the first few senders, and `take` gives the same as entries of a round's
    rejected list. So 3000 late updates cost one record and one entry per round, not 3000.

    `by_sender` (OWL's and FedOptima's actors) counts by (action, kind, sender) instead: the caller audits the
    `first` refusal of each at once, `add`s the repeats and `flush`es them when `due` (at most every `interval_s`,
    and at the end); `loud` says which refusals get a log line (the first, then at most one per interval)."""

    KEEP = 8  # senders named per entry

    def __init__(self, by_sender: bool = False, interval_s: float = 1.0) -> None:
        self._audit: dict[tuple[str, ...], _Count] = {}
        self._trail: dict[tuple[str, ...], _Count] = {}
        self.by_sender, self.interval_s = by_sender, interval_s
        self._seen: set[tuple[str, ...]] = set()  # (action, kind, sender) already refused once
        self._logged: dict[tuple[str, ...], float] = {}  # (action, kind, sender) -> when its last log line went
        self._flushed = time.monotonic()

    def add(self, action: str, refusal: Refusal, who: str, trail: bool = True,
            first: Mapping[str, Any] | None = None) -> None:
        """Count one refusal of `who` (`trail`: also for the next round's rejected list; `first`: fields written
        with the count, those of the first refusal counted)."""
        key = (action, refusal.kind, who) if self.by_sender else (action, refusal.kind)
        for book in (self._audit, self._trail) if trail else (self._audit,):
            c = book.setdefault(key, _Count(reason=refusal.reason, first=dict(first or {})))
            c.count += 1
            if len(c.clients) < self.KEEP and who not in c.clients:
                c.clients.append(who)

    def __bool__(self) -> bool:
        return bool(self._audit)

    def flush(self, audit: "ActorAudit", **detail: Any) -> None:
        """One audit record per (action, kind) counted since the last flush."""
        for (action, kind, *_), c in self._audit.items():
            audit.record(action, _name(c), "refused", {**detail, **c.first, "kind": kind, "count": c.count,
                                                      "clients": c.clients, "reason": c.reason})
        self._audit = {}
        self._flushed = time.monotonic()

    def first(self, action: str, refusal: Refusal, who: str) -> bool:
        """Whether this is `who`'s first refusal of (action, kind): the caller audits that one at once, on a record
        of its own, and `add`s the repeats."""
        key = (action, refusal.kind, who)
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def loud(self, action: str, refusal: Refusal, who: str) -> bool:
        """Whether this refusal gets a log line: the first of each (action, kind, sender), then at most one per
        `interval_s` (a peer repeating a bad message must not flood the log; every one is still counted)."""
        key, now = (action, refusal.kind, who), time.monotonic()
        if now - self._logged.get(key, float("-inf")) < self.interval_s:
            return False
        self._logged[key] = now
        return True

    def due(self) -> bool:
        """Whether counted refusals wait and `interval_s` has passed since the last `flush`."""
        return bool(self._audit) and time.monotonic() - self._flushed >= self.interval_s

    def take(self) -> list[dict]:
        """The counted refusals as rejected-list entries ({client, reason, count, clients}); the count restarts."""
        out = [{"client": _name(c), "reason": c.reason, "count": c.count, "clients": c.clients}
               for c in self._trail.values()]
        self._trail = {}
        return out


def _name(c: _Count) -> str:
    if c.count == 1:
        return c.clients[0]
    more = "" if len(c.clients) < RefusalTally.KEEP else ", ..."
    return f"{c.count} from {', '.join(c.clients)}{more}"
