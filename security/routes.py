"""Route grants: which destination clusters (and job stages) an account's workers may address, as the switch sees it,
and which federated jobs its clients may join, as a combiner sees it.

Grants are kept in an account home's `accounts.db` (table `route_grants`) and administered with
`nebula-admin grant add --to ACCOUNT --resource cluster:B` (or `stage:NAME`, `job:NAME`, or `cluster:*` for any
cluster).
A kind of route grant is enforced once any grant of that kind exists in the store: from then on an account
reaches only what it holds a live (unrevoked, unexpired) grant for. A store that never had a `cluster:` grant
restricts no cluster, so federations that do not use route grants keep working unchanged.

Stage grants are only as good as the stage map they are checked against, and today that is the map a worker
declares in its HELLO (switch_server.local): a worker that declares no map, or moves or renames its job's stages,
is checked against what it declared, and only cluster grants bound where it sends. Closing this needs a map the
worker does not choose: the admin records each job's map in the account home (e.g. `stage:NAME@CLUSTER` grants, or
a job's map registered from its job file), `RoutePolicy` checks a declared map against it, and the switch refuses a
HELLO whose map differs or is missing while stage grants are in use.
"""
from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from security._text import safe_text
from security._time import Lifecycle, iso, utcnow
from security.errors import AccountError
from security.identity import check_name

__all__ = ["ROUTE_KINDS", "ANY", "RouteGrant", "RoutePolicy", "parse_route_resource", "is_route_resource",
           "load_route_policy", "policy_from_rows", "ROUTE_SCHEMA"]

ROUTE_KINDS = ("cluster", "stage", "job")
ANY = "*"
ROUTE_SCHEMA = """
CREATE TABLE IF NOT EXISTS route_grants (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    account TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    granted_by TEXT NOT NULL,
    created TEXT NOT NULL,
    expires TEXT,
    revoked TEXT
);
"""


def is_route_resource(resource: str) -> bool:
    """True if `resource` names a route (`cluster:X`, `stage:X`, `job:X`) rather than a path in an owner's namespace."""
    return isinstance(resource, str) and resource.split(":", 1)[0] in ROUTE_KINDS and ":" in resource


def parse_route_resource(resource: str) -> tuple[str, str]:
    """(kind, name) of `cluster:B`, `stage:encoder` or `cluster:*`; AccountError naming the accepted forms."""
    kind, _, name = resource.partition(":") if isinstance(resource, str) else ("", "", "")
    if kind not in ROUTE_KINDS or not name:
        raise AccountError(f"route resource {resource!r} is not one of cluster:NAME, stage:NAME, job:NAME, cluster:*, "
                           "stage:*, job:*")
    if name != ANY:
        try:
            check_name(name, kind)
        except ValueError as exc:
            raise AccountError(f"route resource {resource!r}: {exc}") from None
    return kind, name


@dataclass(frozen=True, slots=True)
class RouteGrant(Lifecycle):
    """Permission for `account`'s workers to address `resource` (`cluster:B`, `stage:encoder`, `cluster:*`)."""

    id: int
    account: str
    resource: str
    granted_by: str
    created: str
    expires: str | None
    revoked: str | None


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    """A snapshot of the live route grants: per kind, None (not in use: unrestricted) or account -> names."""

    clusters: Mapping[str, frozenset[str]] | None
    stages: Mapping[str, frozenset[str]] | None
    jobs: Mapping[str, frozenset[str]] | None = None

    def allowed_clusters(self, account: str) -> frozenset[str] | None:
        """Clusters `account` may address (`*` = any); None when cluster grants are not in use."""
        return None if self.clusters is None else self.clusters.get(account, frozenset())

    def allowed_stages(self, account: str) -> frozenset[str] | None:
        """Stages `account` may run or address (`*` = any); None when stage grants are not in use."""
        return None if self.stages is None else self.stages.get(account, frozenset())

    def allowed_jobs(self, account: str) -> frozenset[str] | None:
        """Federated jobs `account`'s clients may join (`*` = any); None when job grants are not in use."""
        return None if self.jobs is None else self.jobs.get(account, frozenset())

    def job_refusal(self, account: str, job: str) -> str | None:
        """Why `account`'s clients may not join federated job `job`, with the fix; None when they may."""
        allowed = self.allowed_jobs(account)
        if allowed is not None and ANY not in allowed and job not in allowed:
            return _no_grant(account, "job", job)
        return None

    def refusal(self, account: str, cluster: str | None, stages: Iterable[str] = ()) -> str | None:
        """Why `account` may not address `cluster` (None: not checked) and `stages`, with the fix; None when it may."""
        checks = [("cluster", self.allowed_clusters(account), (cluster,))] if cluster is not None else []
        if stages and self.stages is not None:
            checks.append(("stage", self.allowed_stages(account), stages))
        for kind, allowed, names in checks:
            if allowed is None or ANY in allowed:
                continue
            for name in names:
                if name not in allowed:
                    return _no_grant(account, kind, name)
        return None


def _no_grant(account: str, kind: str, name: str) -> str:
    """The refusal for a missing grant, with the command that fixes it. The names may come from a worker or client
    (a declared stage, a job): they are printed bounded and escaped, so the line stays one honest line wherever it
    is logged or audited, and a name that is no valid name gets no command to copy."""
    acc, shown = safe_text(account, 64), safe_text(name, 64)
    why = f"account '{acc}' holds no grant for {kind} '{shown}'"
    if not (_valid(account) and (name == ANY or _valid(name))):
        return f"{why}; {kind} and account names are 1-63 letters, digits, '.', '_' or '-': fix the job or config"
    return f"{why}; an admin can run `nebula-admin grant add --to {account} --resource {kind}:{name}`"


def _valid(name: str) -> bool:
    try:
        check_name(name, "name")
    except ValueError:
        return False
    return True


def load_route_policy(home: str | os.PathLike) -> RoutePolicy:
    """Read the live route grants of the account home `home` (read-only; nothing is written, not even the audit).

    A missing home or database is an error (fail closed): pass a home made by `nebula-admin user add`.
    """
    db_path = Path(home) / "accounts.db"
    if not db_path.exists():
        raise AccountError(f"no account database {db_path}; create the home with `nebula-admin user add --home "
                           f"{home} ...` or fix the path")
    try:
        with closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            rows = db.execute("SELECT account, kind, name, expires, revoked FROM route_grants").fetchall() \
                if "route_grants" in tables else []
    except sqlite3.Error as exc:
        raise AccountError(f"cannot read route grants from {db_path} ({exc}); check the file") from None
    return policy_from_rows(rows)


def policy_from_rows(rows: list[tuple[str, str, str, str | None, str | None]]) -> RoutePolicy:
    """RoutePolicy from (account, kind, name, expires, revoked) rows."""
    now = iso(utcnow())
    used = {kind for _, kind, _, _, _ in rows}
    live: dict[str, dict[str, set[str]]] = {k: {} for k in ROUTE_KINDS}
    for account, kind, name, expires, revoked in rows:
        if revoked is None and (expires is None or expires > now) and kind in live:
            live[kind].setdefault(account, set()).add(name)
    frozen = {k: {a: frozenset(n) for a, n in v.items()} if k in used else None for k, v in live.items()}
    return RoutePolicy(clusters=frozen["cluster"], stages=frozen["stage"], jobs=frozen["job"])
