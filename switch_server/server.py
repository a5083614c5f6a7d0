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
from nebula.wire import ChannelKey, FrameType, Lane, encode_frame
from security.audit import AuditLog, safe_text
from security.errors import AuditError
from switch_server.auditlimit import AuditThrottle
from switch_server.authz import PeerPolicy
from switch_server.budget import ALL, MemoryBudget, Party
from switch_server.checkpoints import CheckpointExchange
from switch_server.host import Origin
from switch_server.incarnations import Incarnations
from switch_server.lifecycle import bind, reload, reload_crl
from switch_server.link import OutboundLink
from switch_server.local import LocalSide
from switch_server.metrics import SwitchMetrics
from switch_server.memtrim import MemoryTrim, free_heap_bytes
from switch_server.peers import PeerTrust, SwitchError, accept_peer, cut_untrusted
from switch_server.routegrants import RouteGrants
from switch_server.session import InboundSession
from switch_server.shaper import TokenBucket
from switch_server.state import SwitchState, state_dir
from switch_server.status import status_path, switch_status
from switch_server.tlstransport import Listener  # (the WAN listener, bound by lifecycle.bind)

log = logging.getLogger(__name__)

STATUS_EVERY_S = 1.0
CHECKPOINT_EVERY_S = 30.0
CRL_POLL_S = 5.0  # the CRL file is re-read this often, so a revoked live peer is cut well within 60 s


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
        self.metrics = SwitchMetrics()
        self.epoch = 0
        self.budget = MemoryBudget(cfg.link.memory_cap_bytes, self._hold)
        self.links: dict[str, OutboundLink] = {}
        self.sessions: dict[str, InboundSession] = {}
        self.accepting: set[asyncio.Task] = set()  # connections in their TLS handshake or session
        self.link_in: dict[str, dict[str, int]] = {}
        self.account_buckets: dict[str, TokenBucket] = {}
        self.tasks: list[asyncio.Task] = []
        self.wan_server: Listener | None = None
        self.wan_address = ""
        self.metrics_address = ""
        self.audit_log: AuditLog | None = None
        self.closed = asyncio.Event()
        self.started = False
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
        self.write_status()
        self.audit(self.actor, "switch_started", self.wan_address, "ok",
                   {"epoch": self.epoch, "local": local_endpoint, "peers": [p.cluster for p in self.cfg.peers]})
        log.info("switch %s epoch %d listening wan=%s local=%s metrics=%s", self.cfg.cluster, self.epoch,
                 self.wan_address, local_endpoint, self.metrics_address)
        return self.wan_address, local_endpoint

    async def stop(self) -> None:
        """Stop everything and write the final audit checkpoint."""
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for link in list(self.links.values()):
            await link.stop()
        for s in list(self.sessions.values()):
            s.close()
        if self.wan_server is not None:
            self.wan_server.close()
        await self.local.stop()
        if self.started:  # (a start that failed leaves the last status of the switch that ran before)
            self.write_status()
            self.audit(self.actor, "switch_stopped", self.wan_address)
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

    def _hold(self, party: Party, held: bool) -> None:
        """The memory budget holds back (or resumes) a party: the whole local side while over the total cap."""
        if party == ALL:
            self.local.hold_back(held)

    # ---- routing ----
    def route(self, frame: Any, head: bytes, payload: Any, origin: Origin | None,
              from_peer: str | None = None, party: Party | None = None,
              stages: tuple[str, ...] = ()) -> tuple[str, str] | None:
        """Send a DATA/ACK/ERROR frame on towards its destination, its bytes charged to `party` (the local account
        that sent it; `stages`: those its job runs here and at the destination cluster, checked against the
        account's stage grants); return (code, reason) if it cannot go anywhere."""
        t = frame.type
        if t == FrameType.ERROR:
            ch = frame.meta.get("channel")
            if ch is None:
                log.warning("peer %s reports: %s: %s", from_peer, frame.meta["code"], frame.meta["message"])
                if origin is not None:
                    origin.release(len(head) + len(payload))
                return None
            key = ChannelKey.from_meta(ch)
        else:
            key = frame.key()
        src = None
        if t == FrameType.DATA:
            cluster, rank, lane = key.dst_cluster, key.dst_rank, frame.header.lane
            src = (key.src_cluster, key.src_rank, frame.meta.get("inc", 0))
        else:
            cluster, rank, lane = key.src_cluster, key.src_rank, Lane.CONTROL
        if cluster == self.cfg.cluster:
            if t == FrameType.ACK:
                refused = self.local.ack_refusal(frame)
                if refused is not None:
                    if refused[2]:
                        return refused[0], refused[1]
                    self.metrics.refused.labels(reason=refused[0]).inc()  # (quietly: an earlier start's ACK)
                    if origin is not None:
                        origin.release(len(head) + len(payload))
                    return None
            return self.local.deliver(key, rank, lane, head, payload, origin, party, src)
        if from_peer is not None:
            return "unknown_destination", f"switch {self.cfg.cluster} does not relay to cluster {cluster!r}"
        if t in (FrameType.DATA, FrameType.ACK):  # (every frame a worker sends to another cluster)
            why = self.route_grants.refusal(key.account, cluster, stages)
            if why is not None:
                return self.route_refused(key.account, cluster, why, stages)
        link = self.links.get(cluster)
        if link is None:
            known = ", ".join(sorted(self.links)) or "none"
            return "unknown_destination", f"no route to cluster {cluster!r}; this switch knows: {known}"
        link.enqueue(lane, head, payload, party)
        return None

    def incarnation_ended(self, account: str, job: str, rank: int, inc: int) -> None:
        """A start of one of our ranks ended (BYE, replaced by a later start, or long silent): what it sent that
        waits for ranks not connected, here or at any peer, expires (it is meant for no later start of them)."""
        self.local.delivery.sender_ended(account, job, self.cfg.cluster, rank, inc)
        head = encode_frame(FrameType.ENDED, {"account": account, "job": job, "rank": rank, "inc": inc})
        for link in self.links.values():
            link.enqueue(Lane.CONTROL, head, b"")

    def peer_incarnation_ended(self, peer: str, meta: dict[str, Any]) -> None:
        """A peer says a start of one of its ranks ended."""
        n = self.local.delivery.sender_ended(meta["account"], meta["job"], peer, meta["rank"], meta["inc"])
        if n:
            log.info("dropped %d frames held from ended start %d of %s/%d (job %s)", n, meta["inc"], peer,
                     meta["rank"], meta["job"])

    def route_refused(self, account: str, cluster: str, why: str, stages: tuple[str, ...] = ()) -> tuple[str, str]:
        """Count and audit (rate-limited) a local worker's frame (or registration) to a cluster or stage its
        account holds no grant for."""
        known = cluster if cluster in self.links or cluster == self.cfg.cluster else "unknown"  # (bounded labels)
        self.metrics.route_refused.labels(account=account, cluster=known).inc()
        detail: dict[str, Any] = {"account": account, "cluster": cluster, "reason": why}
        if stages:
            detail["stages"] = list(stages)
        self.audit_limited(("route_refused", account, known, bool(stages)), self.actor, "route_refused", account,
                           "denied", detail)
        return "not_authorized", why

    def _route_grants_reloaded(self, outcome: str, home: str, detail: dict) -> None:
        self.audit(self.actor, "route_grants_reload", home, outcome, detail)

    def refuse_remote(self, frame: Any, code: str, message: str) -> None:
        """Tell the original sender (a worker of a peer cluster) why its frame was refused here."""
        self.metrics.refused.labels(reason=code).inc()
        if frame.type not in (FrameType.DATA, FrameType.ACK):
            return
        key = frame.key()
        head = encode_frame(FrameType.ERROR, {"code": code, "message": message, "channel": key.to_meta()},
                            seq=frame.header.seq)
        link = self.links.get(key.src_cluster)
        if link is not None:
            link.enqueue(Lane.CONTROL, head, b"")

    def account_bucket(self, account: str) -> TokenBucket:
        """Token bucket of `account` (limits.account_rate_mbit)."""
        b = self.account_buckets.get(account)
        if b is None:
            b = self.account_buckets[account] = TokenBucket(self.cfg.limits.account_rate_mbit)
        return b

    def link_window(self) -> int:
        """Bytes one peer may have queued here before it runs out of credit."""
        configured = self.cfg.limits.peer_memory_bytes
        share = configured or self.cfg.link.memory_cap_bytes // max(1, len(self.cfg.peers))
        return max(self.cfg.link.chunk_bytes * 4, share)

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
        last_cp = time.monotonic()
        last_crl = time.monotonic()
        while True:
            await asyncio.sleep(STATUS_EVERY_S)
            try:
                now = time.monotonic()
                self.local.sweep()
                self.route_grants.refresh()  # (revocations apply also while no worker sends)
                self.metrics.cert_expiry.set(self.trust.cert_not_after - time.time())
                for c, link in self.links.items():
                    self.metrics.queue_bytes.labels(peer=c).set(link.queued_bytes())
                self.metrics.queue_bytes.labels(peer="local").set(self.budget.used)
                if now - last_crl >= CRL_POLL_S:
                    last_crl = now
                    if self.trust.crl_changed(self.cfg):
                        reload_crl(self)
                if now - last_cp >= CHECKPOINT_EVERY_S:
                    last_cp = now
                    for link in self.links.values():
                        if link.up:
                            link.send_checkpoint()
                cut_untrusted(self)  # (certificates expire while sessions live)
                self.audit_limited.flush()
                self._trim.maybe(free_heap_bytes(), now)
                self.write_status()
            except Exception:
                log.exception("periodic maintenance failed")

    def status(self) -> dict[str, Any]:
        """Snapshot of links, sessions, queues and throughput."""
        return switch_status(self, self._last_status)

    def write_status(self) -> None:
        """Write status.json into the state directory (read by `nebula-switch status`)."""
        st = self.status()
        self._last_status = st
        self.state.write_json("status.json", st)
