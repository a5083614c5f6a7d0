"""What the controller and combiners share: their identity, their audit log (with refusals counted, not written one
by one), the checks on an update's header, and the job grants a combiner checks its clients against."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from nebula.config.worker import load_worker_config

__all__ = ["ActorAudit", "JobGrants", "Refusal", "RefusalTally", "check_update_header"]

log = logging.getLogger(__name__)


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


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a message is refused: `kind` (a small fixed set: what refusals are counted by) and the one-line reason."""

    kind: str
    reason: str

    def __str__(self) -> str:
        return self.reason


@dataclass(slots=True)
class _Count:
    count: int = 0
    reason: str = ""
    clients: list[str] = field(default_factory=list)


class RefusalTally:
    """Refusals that a sender can repeat at will (late, uninvited or duplicate updates, hellos, messages of another
    run) are counted by (action, kind), not written one by one: `flush` writes one audit record per (action, kind)
    with the count, the first reason and the first few senders, and `take` gives the same as entries of a round's
    rejected list. So 3000 late updates cost one record and one entry per round, not 3000."""

    KEEP = 8  # senders named per entry

    def __init__(self) -> None:
        self._audit: dict[tuple[str, str], _Count] = {}
        self._trail: dict[tuple[str, str], _Count] = {}

    def add(self, action: str, refusal: Refusal, who: str, trail: bool = True) -> None:
        """Count one refusal of `who` (`trail`: also for the next round's rejected list)."""
        for book in (self._audit, self._trail) if trail else (self._audit,):
            c = book.setdefault((action, refusal.kind), _Count(reason=refusal.reason))
            c.count += 1
            if len(c.clients) < self.KEEP and who not in c.clients:
                c.clients.append(who)

    def __bool__(self) -> bool:
        return bool(self._audit)

    def flush(self, audit: "ActorAudit", **detail: Any) -> None:
        """One audit record per (action, kind) counted since the last flush."""
        for (action, kind), c in self._audit.items():
            audit.record(action, _name(c), "refused",
                         {**detail, "kind": kind, "count": c.count, "clients": c.clients, "reason": c.reason})
        self._audit = {}

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


def check_update_header(head: Mapping[str, Any], *, job: str, round: int, version: int, known_version: int,
                        expected: set[str], seen: set[str], who: str, tensors: list,
                        max_examples: int) -> Refusal | None:
    """Why this update must be refused, or None. `known_version` is the newest model version the actor knows,
    `max_examples` the job's max_examples_per_client."""
    if head.get("pushed") and not head.get("inline"):
        return Refusal("malformed", "a pushed update must carry its pieces inside the header's message (inline); "
                       "update the client")
    if head.get("job") != job:
        return Refusal("job", f"update belongs to job {_show(head.get('job'))}, not {job!r}; start the client "
                       "with this job's file")
    v = head.get("version")
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        return Refusal("version", f"unknown model version {_show(v)}; train from a version the combiner sent")
    if v > known_version:
        return Refusal("version", f"future model version {v} (newest is {known_version}); train from a version "
                       "the combiner sent")
    if head.get("round") != round or v != version:
        return Refusal("late", f"late: trained for round {_show(head.get('round'))} from version {v}, the round "
                       f"in progress is {round} (version {version}); a synchronous round never averages updates of "
                       "another round")
    if who not in expected:
        return Refusal("uninvited", f"not asked to take part in round {round}; wait for a task")
    if who in seen:
        return Refusal("duplicate", f"duplicate update in round {round}; send one update per round")
    n = head.get("num_examples")
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        return Refusal("examples", f"num_examples={_show(n)} must be a positive integer")
    if n > max_examples:
        return Refusal("examples", f"num_examples={n} exceeds the job's max_examples_per_client={max_examples}; "
                       "raise it in the job file if clients really hold that many")
    why = _tensor_refusal(head.get("tensors"), tensors)
    return None if why is None else Refusal("tensors", why)


def _tensor_refusal(got: Any, tensors: list) -> str | None:
    if got == tensors:
        return None
    if not isinstance(got, list) or not all(
            isinstance(t, list) and len(t) == 3 and isinstance(t[0], str) and isinstance(t[1], str)
            and isinstance(t[2], list) for t in got):
        return "malformed tensors list (each entry must be [name, dtype, shape]); send models with Messenger.send_model"
    have, theirs = {t[0]: t for t in tensors}, {t[0]: t for t in got}
    missing, extra = sorted(set(have) - set(theirs)), sorted(set(theirs) - set(have))
    if missing or extra:
        return f"keys differ from the global model's (missing {_few(missing)}, unexpected {_few(extra)})"
    for k, t in have.items():
        if theirs[k][1] != t[1]:
            return f"{k!r} has dtype {theirs[k][1][:32]}, expected {t[1]}"
        if theirs[k][2] != list(t[2]):
            return f"{k!r} has shape {tuple(theirs[k][2][:8])}, expected {tuple(t[2])}"
    return "tensors listed in a different order than the global model's"


def _show(value: Any, n: int = 40) -> str:
    """repr of a value a peer sent, cut to `n` characters."""
    r = repr(value)
    return r if len(r) <= n else r[: n - 3] + "..."


def _few(names: list[str], n: int = 5) -> str:
    """At most `n` names, each cut to 64 characters: a peer's names never make a long line."""
    shown = [x[:64] for x in names[:n]]
    return repr(shown) if len(names) <= n else f"{shown!r} and {len(names) - n} more"
