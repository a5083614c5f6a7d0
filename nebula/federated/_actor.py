"""What the controller and combiners share: their identity, their audit log, the checks on an update's header, and
the job grants a combiner checks its clients against."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Mapping

from nebula.config.worker import load_worker_config

__all__ = ["ActorAudit", "JobGrants", "check_update_header"]

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


def check_update_header(head: Mapping[str, Any], *, job: str, round: int, version: int, known_version: int,
                        expected: set[str], seen: set[str], who: str, tensors: list) -> str | None:
    """Why this update must be refused, or None. `known_version` is the newest model version the actor knows."""
    if head.get("job") != job:
        return f"update belongs to job {head.get('job')!r}, not {job!r}; start the client with this job's file"
    v = head.get("version")
    if not isinstance(v, int) or v < 1:
        return f"unknown model version {v!r}; train from a version the combiner sent"
    if v > known_version:
        return f"future model version {v} (newest is {known_version}); train from a version the combiner sent"
    if head.get("round") != round or v != version:
        return (f"late: trained for round {head.get('round')} from version {v}, the round in progress is {round} "
                f"(version {version}); a synchronous round never averages updates of another round")
    if who not in expected:
        return f"not asked to take part in round {round}; wait for a task"
    if who in seen:
        return f"duplicate update in round {round}; send one update per round"
    n = head.get("num_examples")
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        return f"num_examples={n!r} must be a positive integer"
    got = head.get("tensors")
    if got != tensors:
        have = {t[0]: t for t in tensors}
        theirs = {t[0]: t for t in got} if isinstance(got, list) and all(isinstance(t, list) and t for t in got) else {}
        missing, extra = sorted(set(have) - set(theirs)), sorted(set(theirs) - set(have))
        if missing or extra:
            return f"keys differ from the global model's (missing {missing}, unexpected {extra})"
        for k, t in have.items():
            if theirs[k][1] != t[1]:
                return f"{k!r} has dtype {theirs[k][1]}, expected {t[1]}"
            if list(theirs[k][2]) != list(t[2]):
                return f"{k!r} has shape {tuple(theirs[k][2])}, expected {tuple(t[2])}"
        return "tensors listed in a different order than the global model's"
    return None
