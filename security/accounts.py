"""Accounts (SQLite, scrypt hashes, lockout), per-account namespaces and owner-granted, audited resource access.

A home directory holds `accounts.db`, `users/<name>/{data,jobs,checkpoints}` (0700 each), and the audit log
`audit.log` with its signing key. Another account's resource is reached only through `open_resource`, which
checks for a live grant and writes an audit record either way.
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import IO

from security._text import safe_text
from security._time import iso, utcnow
from security.account_types import Account, Grant, namespace_resource
from security.audit import AuditLog, default_actor, generate_signing_key
from security.errors import AccessDenied, AccountError, AccountLocked, AuthenticationFailed, IdentityError
from security.identity import check_name
from security.passwords import SCRYPT_N, SCRYPT_P, SCRYPT_R, check_evenly, cost_of, hash_password, verify_password
from security.routes import ROUTE_SCHEMA, RouteGrant, RoutePolicy, parse_route_resource, policy_from_rows

__all__ = [
    "Accounts",
    "Account",
    "Grant",
    "RouteGrant",
    "ACCOUNT_ROLES",
    "NAMESPACE_DIRS",
    "hash_password",
    "verify_password",
    "default_actor",
    "SCRYPT_N",
]

log = logging.getLogger(__name__)

ACCOUNT_ROLES = ("admin", "user")
NAMESPACE_DIRS = ("data", "jobs", "checkpoints")
MIN_PASSWORD = 8
_READ_MODES = ("r", "rb")
_OWNER_MODES = ("r", "rb", "w", "wb", "a", "ab")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    pw_hash TEXT NOT NULL,
    failed INTEGER NOT NULL DEFAULT 0,
    locked INTEGER NOT NULL DEFAULT 0,
    created TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS grants (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    owner TEXT NOT NULL REFERENCES users(name),
    grantee TEXT NOT NULL REFERENCES users(name),
    resource TEXT NOT NULL,
    created TEXT NOT NULL,
    expires TEXT,
    revoked TEXT
);
"""


class Accounts:
    """The account store of one home directory; a context manager (closing writes the audit checkpoint)."""

    def __init__(self, home: str | os.PathLike, *, scrypt_n: int = SCRYPT_N, max_failures: int = 5,
                 create: bool = True) -> None:
        if max_failures < 1:
            raise ValueError(f"max_failures={max_failures} must be >= 1")
        if scrypt_n < 2 or scrypt_n & (scrypt_n - 1):
            raise ValueError(f"scrypt_n={scrypt_n} must be a power of two >= 2")
        self.home = Path(home)
        self.scrypt_n = scrypt_n
        self.max_failures = max_failures
        if not (self.home / "accounts.db").exists():
            if not create:
                raise AccountError(f"no account database in {self.home}; create one with "
                                   f"`nebula-admin user add --home {self.home} ...`")
            self.home.mkdir(parents=True, exist_ok=True)
            os.chmod(self.home, 0o700)
        with closing(self._db()) as db, db:
            db.executescript(_SCHEMA + ROUTE_SCHEMA)
        os.chmod(self.home / "accounts.db", 0o600)
        if not (self.home / "audit_signing.key").exists():
            generate_signing_key(self.home / "audit_signing.key")
        self.audit = AuditLog(self.home / "audit.log", self.home / "audit_signing.key")

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.home / "accounts.db", timeout=30, isolation_level=None)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA foreign_keys = ON")
        return db

    def close(self) -> None:
        """Close the audit log (writes a final signed checkpoint)."""
        self.audit.close()

    def __enter__(self) -> "Accounts":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- users
    def _user(self, db: sqlite3.Connection, name: str) -> sqlite3.Row:
        row = db.execute("SELECT * FROM users WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise AccountError(f"unknown user '{safe_text(name, 80)}' in {self.home}; see `nebula-admin user list` "
                               f"or create it with `nebula-admin user add --home {self.home} {safe_text(name, 80)}`")
        return row

    def _check_password(self, password: str) -> None:
        if not isinstance(password, str) or len(password) < MIN_PASSWORD:
            raise AccountError(f"password is too short; use at least {MIN_PASSWORD} characters")

    def add_user(self, name: str, password: str, role: str = "user", *, actor: str | None = None) -> Account:
        """Create account `name` (unique) with a scrypt-hashed password and its 0700 namespace."""
        actor = actor or default_actor()
        try:
            check_name(name, "user name")
        except IdentityError as exc:
            raise AccountError(str(exc)) from None
        if role not in ACCOUNT_ROLES:
            raise AccountError(f"role {role!r} is unknown; use one of {', '.join(ACCOUNT_ROLES)}")
        self._check_password(password)
        pw_hash = hash_password(password, n=self.scrypt_n)
        try:
            with closing(self._db()) as db:
                db.execute("INSERT INTO users (name, role, pw_hash, created) VALUES (?,?,?,?)",
                           (name, role, pw_hash, iso(utcnow())))
        except sqlite3.IntegrityError:
            self.audit.append(actor, "user.add", name, "failed", {"why": "duplicate"})
            raise AccountError(f"user {name!r} already exists; pick another name or use `user passwd`") from None
        ns = self.namespace(name)
        for sub in NAMESPACE_DIRS:
            (ns / sub).mkdir(parents=True, exist_ok=True)
            os.chmod(ns / sub, 0o700)
        os.chmod(ns, 0o700)
        os.chmod(ns.parent, 0o700)
        self.audit.append(actor, "user.add", name, "ok", {"role": role})
        return self.user(name)

    def user(self, name: str) -> Account:
        """The account `name` (AccountError if unknown)."""
        with closing(self._db()) as db:
            r = self._user(db, name)
        return Account(r["name"], r["role"], bool(r["locked"]), r["failed"], r["created"])

    def list_users(self) -> list[Account]:
        """Every account, by name."""
        with closing(self._db()) as db:
            rows = db.execute("SELECT * FROM users ORDER BY name").fetchall()
        return [Account(r["name"], r["role"], bool(r["locked"]), r["failed"], r["created"]) for r in rows]

    def set_password(self, name: str, password: str, *, actor: str | None = None) -> None:
        """Replace `name`'s password (also clears its failure counter)."""
        actor = actor or default_actor()
        self._check_password(password)
        with closing(self._db()) as db:
            self._user(db, name)
            db.execute("UPDATE users SET pw_hash = ?, failed = 0 WHERE name = ?",
                       (hash_password(password, n=self.scrypt_n), name))
        self.audit.append(actor, "user.passwd", name)

    def lock(self, name: str, *, actor: str | None = None) -> None:
        """Lock `name`: logins and resource access are refused until unlocked."""
        self._set_locked(name, True, actor or default_actor())

    def unlock(self, name: str, *, actor: str | None = None) -> None:
        """Unlock `name` and reset its failure counter."""
        self._set_locked(name, False, actor or default_actor())

    def _set_locked(self, name: str, locked: bool, actor: str) -> None:
        with closing(self._db()) as db:
            self._user(db, name)
            db.execute("UPDATE users SET locked = ?, failed = CASE WHEN ? THEN failed ELSE 0 END WHERE name = ?",
                       (int(locked), int(locked), name))
        self.audit.append(actor, "user.lock" if locked else "user.unlock", name)

    def _costs(self, db: sqlite3.Connection) -> set[tuple[int, int, int]]:
        """Every scrypt cost this store's hashes use, and the one it creates with: what each login runs."""
        costs = {cost_of(h) for (h,) in db.execute("SELECT pw_hash FROM users")}
        return {c for c in costs if c is not None} | {(self.scrypt_n, SCRYPT_R, SCRYPT_P)}

    def authenticate(self, name: str, password: str) -> Account:
        """Check `name`'s password; after `max_failures` consecutive failures the account locks.

        Every path runs the password KDF once at each cost the store holds (`security.passwords.check_evenly`), so
        an unknown or locked user, or one created with another scrypt cost, costs the same as a wrong password:
        login timing does not reveal which user names exist.
        """
        shown = safe_text(name, 80)  # the name is the caller's: records and messages get a bounded, printable copy
        with closing(self._db()) as db:
            row = db.execute("SELECT * FROM users WHERE name = ?", (name,)).fetchone()
            ok = check_evenly(password, None if row is None else row["pw_hash"], self._costs(db))
            if row is None:
                self.audit.append(shown, "login", shown, "failed", {"why": "unknown user"})
                raise AuthenticationFailed(f"login failed for '{shown}': unknown user or wrong password")
            if row["locked"]:
                self.audit.append(name, "login", name, "denied", {"why": "locked"})
                raise AccountLocked(f"account {name!r} is locked; an admin can run `nebula-admin user unlock {name}`")
            db.execute("BEGIN IMMEDIATE")
            if ok:
                db.execute("UPDATE users SET failed = 0 WHERE name = ?", (name,))
            else:
                db.execute("UPDATE users SET failed = failed + 1, locked = (failed + 1 >= ?) WHERE name = ?",
                           (self.max_failures, name))
            failed = db.execute("SELECT failed FROM users WHERE name = ?", (name,)).fetchone()[0]
            db.execute("COMMIT")
        if ok:
            self.audit.append(name, "login", name, "ok")
            return self.user(name)
        locked_now = failed >= self.max_failures
        self.audit.append(name, "login", name, "failed", {"failures": failed, "locked": locked_now})
        if locked_now:
            self.audit.append(name, "user.lock", name, "ok", {"why": f"{failed} failed logins"})
            raise AccountLocked(f"account {name!r} is now locked after {failed} failed logins; an admin can run "
                                f"`nebula-admin user unlock {name}`")
        raise AuthenticationFailed(f"login failed for {name!r}: unknown user or wrong password "
                                   f"({self.max_failures - failed} attempts left before lockout)")

    def namespace(self, name: str) -> Path:
        """The account's private directory (holds data/, jobs/, checkpoints/)."""
        check_name(name, "user name")
        return self.home / "users" / name

    # ---- grants
    def add_grant(self, owner: str, to: str, resource: str, expires: dt.datetime | None = None, *,
                  actor: str | None = None) -> Grant:
        """Let `to` read `owner`'s `resource` (a path or directory in owner's namespace) until `expires`."""
        actor = actor or default_actor()
        resource = namespace_resource(resource)
        if owner == to:
            raise AccountError(f"{owner!r} already owns {resource!r}; a grant needs another user as --to")
        if expires is not None:
            if expires.tzinfo is None:
                expires = expires.replace(tzinfo=dt.timezone.utc)
            if expires <= utcnow():
                raise AccountError(f"expiry {iso(expires)} is in the past; give a future time such as 7d")
        with closing(self._db()) as db:
            self._user(db, owner)
            self._user(db, to)
            cur = db.execute("INSERT INTO grants (owner, grantee, resource, created, expires) VALUES (?,?,?,?,?)",
                             (owner, to, resource, iso(utcnow()), None if expires is None else iso(expires)))
            gid = cur.lastrowid
        self.audit.append(actor, "grant.add", f"{owner}:{resource}",
                          detail={"id": gid, "to": to, "expires": None if expires is None else iso(expires)})
        return self.grant(gid)

    def grant(self, grant_id: int) -> Grant:
        """The grant with `grant_id`."""
        with closing(self._db()) as db:
            r = db.execute("SELECT * FROM grants WHERE id = ?", (grant_id,)).fetchone()
        if r is None:
            raise AccountError(f"grant {grant_id} does not exist; see `nebula-admin grant list`")
        return Grant(r["id"], r["owner"], r["grantee"], r["resource"], r["created"], r["expires"], r["revoked"])

    def revoke_grant(self, grant_id: int, *, actor: str | None = None) -> None:
        """Withdraw grant `grant_id` now."""
        actor = actor or default_actor()
        g = self.grant(grant_id)
        if g.revoked:
            raise AccountError(f"grant {grant_id} is already revoked (at {g.revoked})")
        with closing(self._db()) as db:
            db.execute("UPDATE grants SET revoked = ? WHERE id = ?", (iso(utcnow()), grant_id))
        self.audit.append(actor, "grant.revoke", f"{g.owner}:{g.resource}", detail={"id": grant_id, "to": g.grantee})

    def list_grants(self, owner: str | None = None, to: str | None = None) -> list[Grant]:
        """Grants, optionally only those of `owner` and/or to `to`."""
        q, args = "SELECT * FROM grants WHERE 1=1", []
        if owner is not None:
            q, args = q + " AND owner = ?", args + [owner]
        if to is not None:
            q, args = q + " AND grantee = ?", args + [to]
        with closing(self._db()) as db:
            rows = db.execute(q + " ORDER BY id", args).fetchall()
        return [Grant(r["id"], r["owner"], r["grantee"], r["resource"], r["created"], r["expires"], r["revoked"])
                for r in rows]

    # ---- route grants: which clusters and stages an account's workers may address (see security.routes)
    def add_route_grant(self, account: str, resource: str, expires: dt.datetime | None = None, *,
                        actor: str | None = None) -> RouteGrant:
        """Let `account`'s workers address `resource` (`cluster:B`, `stage:NAME`, `cluster:*`) until `expires`."""
        actor = actor or default_actor()
        kind, name = parse_route_resource(resource)
        try:
            check_name(account, "account")
        except IdentityError as exc:
            raise AccountError(str(exc)) from None
        if expires is not None:
            if expires.tzinfo is None:
                expires = expires.replace(tzinfo=dt.timezone.utc)
            if expires <= utcnow():
                raise AccountError(f"expiry {iso(expires)} is in the past; give a future time such as 7d")
        with closing(self._db()) as db:
            self._user(db, account)  # a grant for a name no account has would be a typo that grants nothing
            cur = db.execute("INSERT INTO route_grants (account, kind, name, granted_by, created, expires) "
                             "VALUES (?,?,?,?,?,?)", (account, kind, name, actor, iso(utcnow()),
                                                      None if expires is None else iso(expires)))
            gid = cur.lastrowid
        self.audit.append(actor, "grant.add", account, detail={"id": f"r{gid}", "resource": f"{kind}:{name}",
                                                               "expires": None if expires is None else iso(expires)})
        return self.route_grant(gid)

    def route_grant(self, grant_id: int) -> RouteGrant:
        """The route grant with `grant_id` (shown as r<id>)."""
        with closing(self._db()) as db:
            r = db.execute("SELECT * FROM route_grants WHERE id = ?", (grant_id,)).fetchone()
        if r is None:
            raise AccountError(f"route grant r{grant_id} does not exist; see `nebula-admin grant list`")
        return RouteGrant(r["id"], r["account"], f"{r['kind']}:{r['name']}", r["granted_by"], r["created"],
                          r["expires"], r["revoked"])

    def revoke_route_grant(self, grant_id: int, *, actor: str | None = None) -> None:
        """Withdraw route grant `grant_id` now."""
        actor = actor or default_actor()
        g = self.route_grant(grant_id)
        if g.revoked:
            raise AccountError(f"route grant r{grant_id} is already revoked (at {g.revoked})")
        with closing(self._db()) as db:
            db.execute("UPDATE route_grants SET revoked = ? WHERE id = ?", (iso(utcnow()), grant_id))
        self.audit.append(actor, "grant.revoke", g.account, detail={"id": f"r{grant_id}", "resource": g.resource})

    def list_route_grants(self, account: str | None = None) -> list[RouteGrant]:
        """Route grants, optionally only those of `account`."""
        q, args = "SELECT id FROM route_grants", []
        if account is not None:
            q, args = q + " WHERE account = ?", [account]
        with closing(self._db()) as db:
            ids = [r[0] for r in db.execute(q + " ORDER BY id", args).fetchall()]
        return [self.route_grant(i) for i in ids]

    def route_policy(self) -> RoutePolicy:
        """A snapshot of the live route grants (what a switch enforces; `security.routes.load_route_policy` reads
        the same without opening the audit log)."""
        with closing(self._db()) as db:
            rows = db.execute("SELECT account, kind, name, expires, revoked FROM route_grants").fetchall()
        return policy_from_rows([tuple(r) for r in rows])

    def allowed_clusters(self, account: str) -> frozenset[str] | None:
        """Clusters `account`'s workers may address (`*` = any); None while no cluster grant exists in this store."""
        return self.route_policy().allowed_clusters(account)

    # ---- the one access path to resources
    def open_resource(self, actor: str, owner: str, resource: str, mode: str = "rb") -> IO:
        """Open `owner`'s `resource` for `actor`: owners freely, others read-only with a live grant; audited."""
        target = f"{owner}:{resource}"
        try:
            handle, how = self._open_checked(actor, owner, resource, mode)
        except AccountError as exc:
            self.audit.append(actor, "data.open", target, "denied", {"mode": mode, "why": str(exc)})
            raise
        self.audit.append(actor, "data.open", target, "ok", {"mode": mode, "via": how})
        return handle

    def _open_checked(self, actor: str, owner: str, resource: str, mode: str) -> tuple[IO, str]:
        with closing(self._db()) as db:
            a = self._user(db, actor)
            self._user(db, owner)
        if a["locked"]:
            raise AccountLocked(f"account {actor!r} is locked; an admin can run `nebula-admin user unlock {actor}`")
        rel = namespace_resource(resource)
        how = "owner"
        if actor != owner:
            if mode not in _READ_MODES:
                raise AccessDenied(f"{actor!r} may only read {owner!r}'s resources (grants are read-only); "
                                   f"open with mode 'rb'")
            grants = [g for g in self.list_grants(owner=owner, to=actor) if g.covers(rel)]
            live = [g for g in grants if g.status == "active"]
            if not live:
                if any(g.status == "expired" for g in grants):
                    last = max(g.expires for g in grants if g.status == "expired")
                    raise AccessDenied(f"grant for {actor!r} on {owner}:{rel} expired at {last}; ask {owner!r} "
                                       f"for a new one (`nebula-admin grant add --owner {owner} --to {actor} "
                                       f"--resource {rel}`)")
                raise AccessDenied(f"{actor!r} has no grant on {owner}:{rel}; ask {owner!r} to run "
                                   f"`nebula-admin grant add --owner {owner} --to {actor} --resource {rel}`")
            how = f"grant {live[0].id}"
        elif mode not in _OWNER_MODES:
            raise AccountError(f"mode {mode!r} is not supported; use one of {', '.join(_OWNER_MODES)}")
        ns = self.namespace(owner).resolve()
        path = (ns / rel).resolve()
        if path != ns and ns not in path.parents:  # a symlink inside the namespace must not lead out of it
            raise AccessDenied(f"resource {owner}:{rel} resolves outside {owner!r}'s namespace; refused")
        try:
            if mode in _READ_MODES:
                return open(path, mode), how
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC), 0o600)
            return os.fdopen(fd, mode), how
        except FileNotFoundError:
            raise AccountError(f"resource {owner}:{rel} does not exist") from None
        except IsADirectoryError:
            raise AccountError(f"resource {owner}:{rel} is a directory; name a file inside it") from None
