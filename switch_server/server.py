"""The switch server: its lifecycle, routing between the local ZeroMQ side and the peer TLS links, and reload."""
from __future__ import annotations

__all__ = ["SwitchError", "SwitchServer", "load_curve_keys", "status_path"]

import asyncio
import logging
import socket
import time
from pathlib import Path
from typing import Any

import zmq.auth

from nebula.config import PeerConfig, SwitchConfig
from nebula.config.budgets import Budgets, resolve
from security.audit import AuditLog, safe_text
from security.errors import AuditError
from switch_server.auditlimit import AuditThrottle
from switch_server.authz import PeerPolicy
from switch_server.budget import ALL, MemoryBudget, Party
from switch_server.checkpoints import CheckpointExchange, is_security
from switch_server.incarnations import Incarnations
from switch_server.lifecycle import bind, close_audit, reload
from switch_server.link import OutboundLink
from switch_server.local import LocalSide
from switch_server.metrics import AccountIds, SwitchMetrics
from switch_server.memtrim import MemoryTrim
from switch_server.peers import PeerTrust, SwitchError, accept_peer
from switch_server.routegrants import RouteGrants
from switch_server.router import Router
from switch_server.session import InboundSession
from switch_server.shaper import TokenBucket
from switch_server.state import SwitchState, state_dir
from switch_server.status import status_path, switch_status
from switch_server.tlstransport import Listener  # (the WAN listener, bound by lifecycle.bind)
from switch_server.upkeep import upkeep

log = logging.getLogger(__name__)


def load_curve_keys(path: str) -> tuple[bytes, bytes]:
    """(public, secret) Z85 keys from a ZeroMQ certificate file; SwitchError if unusable."""
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise SwitchError(f"{path}: cannot read the CURVE key pair ({exc}); provision it again") from None
    if not secret:
        raise SwitchError(f"{path}: has no secret-key; use the *.key_secret file written by provisioning")
    return public, secret


def _safe_detail(value: Any) -> Any:
    """An audit detail with every string in it one printable, bounded line: names in it (accounts, jobs, stages,
    channels) are chosen by workers and peers, and an admin reads and copies what the log shows."""
    if isinstance(value, str):
        return safe_text(value, 400)
    if isinstance(value, dict):
        return {safe_text(k, 80): _safe_detail(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_safe_detail(v) for v in value]
    return value


class SwitchServer:
    """One cluster's switch server (create, `await start()`, then `await wait_closed()`)."""

    def __init__(self, cfg: SwitchConfig, config_path: str | Path | None = None) -> None:
        self.cfg = cfg
        self.config_path = Path(config_path) if config_path else None
        self.state = SwitchState(state_dir(cfg))
        self.metrics = SwitchMetrics(None if cfg.metrics.account_names else AccountIds(self.state.dir))
        self.epoch = 0
        self.budgets = resolve(cfg)
        self.budget = MemoryBudget(self.budgets.memory_cap, self._hold)
        self.links: dict[str, OutboundLink] = {}
        self.sessions: dict[str, InboundSession] = {}
        self.accepting: set[asyncio.Task] = set()  # connections in their TLS handshake or session
        self.link_in: dict[str, dict[str, int]] = {}
        self.account_buckets: dict[str, TokenBucket] = {}
        self.tasks: list[asyncio.Task] = []
        self.wan_server: Listener | None = None
        self.wan_address = ""
        self.metrics_address = ""
        self.local_tls = ""  # host:port of the TLS endpoint for workers (`local.tls_endpoint`), once bound
        self.audit_log: AuditLog | None = None
        self.closed = asyncio.Event()
        self.started = False
        self.started_at: float | None = None  # wall clock of the start, for status (uptime)
        self.fatal: str | None = None  # why the switch must stop (its own certificate revoked), once it must
        self.must_stop = asyncio.Event()
        self.reloads: dict[str, Any] = {"count": 0}  # the last reload's outcome, for `nebula-switch reload`
        self._last_status: dict[str, Any] = {}
        self.audit_limited = AuditThrottle(self.audit)
        self.trust = PeerTrust(self.metrics, self.audit, self.actor, self.audit_limited)
        self.trust.load(cfg)
        self.checkpoints = CheckpointExchange(self.state, self.audit, self.actor)
        self.policy = PeerPolicy(cfg)
        self.unidentified: dict[asyncio.Task, None] = {}  # WAN connections not identified yet, oldest first
        self.penalties: dict[str, float] = {}  # peer cluster -> until when its connections are refused
        self.strikes: dict[str, int] = {}  # peer cluster -> times it was cut for breaking the link protocol
        self._trim = MemoryTrim()
        self.route_grants = RouteGrants(cfg.accounts_home, self._route_grants_reloaded)  # fail closed if unreadable
        public, secret = load_curve_keys(cfg.local.curve_secret_key)
        self.incs = Incarnations(self.state)
        self.router = Router(self)
        self.route, self.route_refused, self.refuse_remote = (self.router.route, self.router.route_refused,
                                                              self.router.refuse_remote)
        self.incarnation_ended, self.peer_incarnation_ended = (self.router.incarnation_ended,
                                                               self.router.peer_incarnation_ended)
        self.local = LocalSide(self, cfg.local, public, secret, self.incs)

    # ---- lifecycle ----
    async def start(self) -> tuple[str, str]:
        """Take the state directory, open the audit log, bind the metrics endpoint, the local side and the WAN
        listener, then take the next boot epoch and dial the peers. A start that fails (SwitchError naming the
        address, the config key and the fix) leaves the epoch as it was: no peer or worker saw this boot."""
        self.state.lock(self.cfg.cluster, self.config_path)
        try:
            self.audit_log = AuditLog(self.cfg.audit.log, self.cfg.audit.signing_key,
                                      checkpoint_every=self.cfg.audit.checkpoint_every)
        except (AuditError, OSError) as exc:
            raise SwitchError(f"audit log {self.cfg.audit.log}: {exc}") from None
        self.checkpoints.log = self.audit_log
        try:
            local_endpoint, bound = await bind(self, self._accepted)
        except SwitchError as exc:
            self.audit(self.actor, "switch_start_failed", self.cfg.listen, "error", {"reason": str(exc)[:300]})
            raise
        self.epoch = self.state.next_epoch()
        self.incs.start(self.epoch)
        self.wan_address = bound
        for peer in self.cfg.peers:
            self.add_link(peer)
        self.tasks = [asyncio.create_task(self._periodic())]
        self.started = True
        self.started_at = time.time()
        self.write_status()
        self.audit(self.actor, "switch_started", self.wan_address, "ok",
                   {"epoch": self.epoch, "local": local_endpoint, "peers": [p.cluster for p in self.cfg.peers]})
        log.info("switch %s epoch %d listening wan=%s local=%s metrics=%s tls_workers=%s", self.cfg.cluster,
                 self.epoch, self.wan_address, local_endpoint, self.metrics_address, self.local_tls or "-")
        return self.wan_address, local_endpoint

    async def stop(self) -> None:
        """Stop everything; the audit log ends with `switch_stopped` and a closing checkpoint handed to the connected
        peers (`lifecycle.close_audit`) before the peer connections close."""
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.wan_server is not None:
            self.wan_server.close()
        await self.local.stop()  # (workers first: nothing of theirs is recorded after the closing checkpoint)
        if self.started:  # (a start that failed leaves the last status of the switch that ran before)
            self.write_status()
            await close_audit(self)
        for link in list(self.links.values()):
            await link.stop()
        for s in list(self.sessions.values()):
            s.close()
        if self.audit_log is not None:
            self.audit_log.close()
        self.state.unlock()
        self.closed.set()

    @property
    def actor(self) -> str:
        """This switch's name in audit records."""
        return f"switch:{self.cfg.cluster}"

    def add_link(self, peer: PeerConfig) -> None:
        """Dial `peer` (and keep its link up) from now on."""
        link = self.links[peer.cluster] = OutboundLink(self, peer)
        self.metrics.link_up.labels(peer=peer.cluster).set(0)
        link.start()

    def _accepted(self, conn: socket.socket, peer: Any) -> None:
        if len(self.unidentified) >= self.cfg.limits.max_unauthenticated:
            # each such connection holds a buffer and a TLS state: beyond the cap the oldest is closed, so that
            # connections held open to fill the cap cannot keep a real peer from reconnecting
            oldest = next(iter(self.unidentified))
            self.unidentified.pop(oldest)
            oldest.cancel()
            self.metrics.handshake_failures.labels(reason="too_many_unauthenticated").inc()
            self.audit_limited(("peer_rejected", "too_many_unauthenticated"), self.actor, "peer_rejected", "?",
                               "denied", {"reason": "too_many_unauthenticated", "address": f"{peer[0]}:{peer[1]}",
                                          "limit": self.cfg.limits.max_unauthenticated,
                                          "detail": "the oldest connection that had not identified itself was closed"})
        task = asyncio.create_task(accept_peer(self, conn, peer))
        self.accepting.add(task)
        task.add_done_callback(self.accepting.discard)

    def audit(self, actor: str, action: str, target: str, outcome: str = "ok", detail: dict | None = None) -> None:
        """Append one audit record (never raises: a failing audit write is logged loudly)."""
        if self.audit_log is None:
            return
        try:
            self.audit_log.append(actor, action, target, outcome, _safe_detail(detail))
        except Exception:
            log.exception("cannot write audit record %s %s", action, target)
            return
        if is_security(action, outcome):
            self.checkpoints.urgent()  # (peers hold a signed head covering it within about a second)

    def _hold(self, party: Party, held: bool) -> None:
        """The memory budget holds back (or resumes) a party: the whole local side while over the total cap."""
        if party == ALL:
            self.local.hold_back(held)

    def _route_grants_reloaded(self, outcome: str, home: str, detail: dict) -> None:
        self.audit(self.actor, "route_grants_reload", home, outcome, detail)

    def account_bucket(self, account: str) -> TokenBucket:
        """Token bucket of `account` (limits.account_rate_mbit)."""
        b = self.account_buckets.get(account)
        if b is None:
            b = self.account_buckets[account] = TokenBucket(self.cfg.limits.account_rate_mbit)
        return b

    def place(self, key: Any, nbytes: int) -> memoryview | None:
        """See `LinkHost.place`."""
        return self.local.conns.place(key, nbytes)

    def link_window(self) -> int:
        """Bytes one peer may have queued here before it runs out of credit."""
        return self.budgets.peer_window

    def set_budgets(self, budgets: Budgets) -> None:
        """Enforce new budgets (hot reload): the total cap, and every local account's share."""
        self.budgets = budgets
        self.budget.set_cap(budgets.memory_cap)
        for party, share in self.budget.shares.items():
            if party[0] == "account":
                share.cap_bytes = budgets.account

    def link_in_state(self, cluster: str) -> dict[str, int]:
        """Receive state of `cluster`'s link: its epoch and the last link sequence number received."""
        st = self.link_in.get(cluster)
        if st is None:
            st = self.link_in[cluster] = {"epoch": 0, "last": 0}
        return st

    def welcome_meta(self) -> dict[str, Any]:
        """WELCOME meta for workers: our epoch, limits and the state of every peer link."""
        return {
            "boot": self.epoch,
            "cluster": self.cfg.cluster,
            "chunk_bytes": self.cfg.link.chunk_bytes,
            "max_message_bytes": self.cfg.link.max_message_bytes,
            "peers": {c: {"up": l.up, "epoch": l.peer_epoch, "down_since": l.down_since} for c, l in self.links.items()},
        }

    def link_changed(self, peer_restarted: bool = False) -> None:
        """A link went up or down (or the peer restarted): tell every worker at once."""
        self.local.broadcast(self.welcome_meta)

    # ---- reload ----
    def reload(self) -> bool:
        """Re-read the config file, certificates, CRL, routes and limits without dropping healthy sessions."""
        return reload(self)

    # ---- periodic work and status ----
    async def _periodic(self) -> None:
        await upkeep(self)

    def status(self) -> dict[str, Any]:
        """Snapshot of links, sessions, queues and throughput."""
        return switch_status(self, self._last_status)

    def write_status(self) -> None:
        """Write status.json into the state directory (read by `nebula-switch status`)."""
        st = self.status()
        self._last_status = st
        self.state.write_json("status.json", st)
