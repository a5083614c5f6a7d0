"""Route grants the switch enforces: which clusters, and which stages of their jobs, each local account's workers
may address (security.routes). Workers of jobs that name stages declare the job file's stage map in their HELLO.

The policy comes from the account home named by `accounts_home` in switch.yaml. It is read at start (fail closed:
an unreadable home stops start-up), on reload, and whenever `accounts.db` changes, since `nebula-admin grant`
changes grants without signalling the switch.
"""
from __future__ import annotations

__all__ = ["RouteGrants", "REFRESH_S"]

import logging
import os
import time
from pathlib import Path
from typing import Callable

from security.errors import SecurityError
from security.routes import RoutePolicy, load_route_policy
from switch_server.peers import SwitchError

log = logging.getLogger(__name__)

REFRESH_S = 1.0  # accounts.db is looked at (one stat per file) at most this often


def _db_stamp(home: Path) -> tuple:
    """What changes when the grants do: size and mtime of accounts.db and of its write-ahead log, if any."""
    stamp = []
    for name in ("accounts.db", "accounts.db-wal"):
        try:
            st = os.stat(home / name)
            stamp.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            stamp.append(None)
    return tuple(stamp)


def read_policy(home: str | None) -> RoutePolicy | None:
    """The route policy of account home `home` (None: no home configured, nothing restricted); SwitchError naming
    the file and the fix if the home cannot be read."""
    if home is None:
        return None
    try:
        return load_route_policy(home)
    except SecurityError as exc:
        raise SwitchError(f"accounts_home {home}: {exc}; or remove accounts_home from switch.yaml to enforce no "
                          "route grants") from None


class RouteGrants:
    """The live route policy of one switch, refreshed when `accounts.db` changes."""

    def __init__(self, home: str | None, on_reload: Callable[[str, str, dict], None] | None = None) -> None:
        self.on_reload = on_reload  # (outcome, home, detail) after a change of accounts.db was read, or failed
        self.home: str | None = None
        self.policy: RoutePolicy | None = None
        self._stamp: tuple = ()
        self._checked = 0.0
        self.set_home(home)

    def set_home(self, home: str | None) -> None:
        """Enforce the grants of `home` from now on (None: none); SwitchError (nothing changed) if unreadable."""
        stamp = _db_stamp(Path(home)) if home is not None else ()
        policy = read_policy(home)
        self.home, self.policy, self._stamp, self._checked = home, policy, stamp, time.monotonic()

    def refresh(self) -> None:
        """Re-read the policy if accounts.db changed; at most one look per REFRESH_S. An unreadable db keeps the
        policy in force (as a CRL that cannot be used keeps the previous one) and is reported."""
        if self.home is None:
            return
        now = time.monotonic()
        if now - self._checked < REFRESH_S:
            return
        self._checked = now
        stamp = _db_stamp(Path(self.home))
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self.policy = read_policy(self.home)
        except SwitchError as exc:
            log.error("route grants changed but cannot be read, keeping the previous ones: %s", exc)
            if self.on_reload is not None:
                self.on_reload("error", self.home, {"reason": str(exc)[:300]})
            return
        log.info("route grants of %s re-read", self.home)
        if self.on_reload is not None:
            clusters = self.policy.clusters if self.policy is not None else None
            self.on_reload("ok", self.home, {"accounts": None if clusters is None else len(clusters)})

    def refusal(self, account: str, cluster: str | None, stages: tuple[str, ...] = ()) -> str | None:
        """Why `account`'s workers may not address `cluster` (None: not checked) and `stages` (those its job runs
        here and at `cluster`), with the fix; None when they may."""
        self.refresh()
        return None if self.policy is None else self.policy.refusal(account, cluster, stages)

    def stages_in_use(self) -> bool:
        """True when stage grants are enforced (some `stage:` grant exists in the account home)."""
        self.refresh()
        return self.policy is not None and self.policy.stages is not None
