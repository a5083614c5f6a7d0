"""The switch server: routes frames between the local ZeroMQ side and peer TLS links; reload, audit, metrics, status."""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import zmq.auth
from cryptography import x509

from nebula.config import ConfigError, SwitchConfig, split_host_port
from nebula.config.switch import load_switch_config
from nebula.wire import ChannelKey, FrameType, Lane, encode_frame
from security.audit import AuditLog, Checkpoint, verify_checkpoint
from security.errors import AuditError, SecurityError
from security.tls import PeerRejected, check_peer, client_context, crl_serials, describe_tls_error, server_context
from switch_server.framestream import FrameStream
from switch_server.link import HANDSHAKE_TIMEOUT_S, InboundSession, OutboundLink, write_frame
from switch_server.local import LocalSide
from switch_server.metrics import SwitchMetrics
from switch_server.shaper import TokenBucket
from switch_server.state import SwitchState
from switch_server.tlstransport import Listener, accept_tls
from nebula.wire import WireError

log = logging.getLogger(__name__)

STATUS_EVERY_S = 1.0
CHECKPOINT_EVERY_S = 30.0
CRL_POLL_S = 5.0  # the CRL file is re-read this often, so a revoked live peer is cut well within 60 s


class SwitchError(Exception):
    """The switch cannot start: a file or setting is unusable; the message names it and the fix."""


def load_curve_keys(path: str) -> tuple[bytes, bytes]:
    """(public, secret) Z85 keys from a ZeroMQ certificate file; SwitchError if unusable."""
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise SwitchError(f"{path}: cannot read the CURVE key pair ({exc}); provision it again") from None
    if not secret:
        raise SwitchError(f"{path}: has no secret-key; use the *.key_secret file written by provisioning")
    return public, secret


class SwitchServer:
    """One cluster's switch server (create, `await start()`, then `await wait_closed()`)."""

    def __init__(self, cfg: SwitchConfig, config_path: str | Path | None = None) -> None:
        self.cfg = cfg
        self.config_path = Path(config_path) if config_path else None
        state_dir = cfg.state_dir or str(Path(cfg.audit.log).parent / "state")
        self.state = SwitchState(state_dir)
        self.metrics = SwitchMetrics()
        self.epoch = 0
        self.mem_used = 0
        self.paused = False
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
        self._crl_mtime = 0.0
        self._pinned = self.state.read_json("peer_audit_keys.json", {})
        self._last_status: dict[str, Any] = {}
        self._load_tls()
        public, secret = load_curve_keys(cfg.local.curve_secret_key)
        self.local = LocalSide(self, cfg.local, public, secret)

    # ---- lifecycle ----
    def _load_tls(self) -> None:
        tls = self.cfg.tls
        passphrase = None
        if tls.key_passphrase_env:
            passphrase = os.environ.get(tls.key_passphrase_env)
            if passphrase is None:
                raise SwitchError(f"tls.key_passphrase_env names {tls.key_passphrase_env!r}, which is not set")
        try:
            self.server_ctx = server_context(tls.ca, tls.cert, tls.key, tls.crl, passphrase)
            self.client_ctx = client_context(tls.ca, tls.cert, tls.key, tls.crl, passphrase)
            self.revoked = crl_serials(tls.crl)
        except SecurityError as exc:
            raise SwitchError(str(exc)) from None
        self._crl_mtime = _mtime(tls.crl)
        try:
            cert = x509.load_pem_x509_certificate(Path(tls.cert).read_bytes())
        except ValueError as exc:
            raise SwitchError(f"{tls.cert}: not a PEM certificate ({exc})") from None
        self.cert_not_after = cert.not_valid_after_utc.timestamp()
        self.metrics.cert_expiry.set(self.cert_not_after - time.time())

    async def start(self) -> tuple[str, str]:
        """Open the audit log, the metrics endpoint, the local side, the WAN listener and the peer links."""
        self.epoch = self.state.next_epoch()
        try:
            self.audit_log = AuditLog(self.cfg.audit.log, self.cfg.audit.signing_key,
                                      checkpoint_every=self.cfg.audit.checkpoint_every)
        except (AuditError, OSError) as exc:
            raise SwitchError(f"audit log {self.cfg.audit.log}: {exc}") from None
        if self.cfg.metrics.listen:
            host, port = split_host_port(self.cfg.metrics.listen, "metrics.listen")
            mhost, mport = self.metrics.serve(host, port)
            self.metrics_address = f"{mhost}:{mport}"
        local_endpoint = await self.local.start()
        host, port = split_host_port(self.cfg.listen, "listen")
        self.wan_server = Listener(host, port, self._accepted)
        bound_host, bound_port = self.wan_server.address()
        self.wan_address = f"{bound_host}:{bound_port}"
        for peer in self.cfg.peers:
            self._add_link(peer)
        self.tasks = [asyncio.create_task(self._periodic())]
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
        self.write_status()
        if self.audit_log is not None:
            self.audit(self.actor, "switch_stopped", self.wan_address)
            self.audit_log.close()
        self.closed.set()

    @property
    def actor(self) -> str:
        return f"switch:{self.cfg.cluster}"

    def _add_link(self, peer: Any) -> None:
        link = self.links[peer.cluster] = OutboundLink(self, peer)
        self.metrics.link_up.labels(peer=peer.cluster).set(0)
        link.start()

    # ---- audit ----
    def audit(self, actor: str, action: str, target: str, outcome: str = "ok", detail: dict | None = None) -> None:
        """Append one audit record (never raises: a failing audit write is logged loudly)."""
        if self.audit_log is None:
            return
        try:
            self.audit_log.append(actor, action, target, outcome, detail)
        except Exception:
            log.exception("cannot write audit record %s %s", action, target)

    # ---- routing ----
    def route(self, frame: Any, head: bytes, payload: Any, origin: Any, from_peer: str | None = None) -> tuple[str, str] | None:
        """Send a DATA/ACK/ERROR frame on towards its destination; return (code, reason) if it cannot go anywhere."""
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
        if t == FrameType.DATA:
            cluster, rank, lane = key.dst_cluster, key.dst_rank, frame.header.lane
        else:
            cluster, rank, lane = key.src_cluster, key.src_rank, Lane.CONTROL
        if cluster == self.cfg.cluster:
            self.local.deliver(key.account, key.job, rank, lane, head, payload, origin)
            return None
        if from_peer is not None:
            return "unknown_destination", f"switch {self.cfg.cluster} does not relay to cluster {cluster!r}"
        link = self.links.get(cluster)
        if link is None:
            known = ", ".join(sorted(self.links)) or "none"
            return "unknown_destination", f"no route to cluster {cluster!r}; this switch knows: {known}"
        link.enqueue(lane, head, payload)
        if self.mem_used > self.cfg.link.memory_cap_bytes and not self.paused:
            self.paused = True
            self.local.hold_back(True)
        return None

    def maybe_resume(self) -> None:
        """Start reading worker frames again once queued bytes fall well below the cap."""
        if self.paused and self.mem_used < self.cfg.link.memory_cap_bytes * 0.8:
            self.paused = False
            self.local.hold_back(False)

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
        return max(self.cfg.link.chunk_bytes * 4, self.cfg.link.memory_cap_bytes // max(1, len(self.cfg.peers)))

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

    # ---- TLS peers ----
    def tls_reason(self, exc: BaseException) -> str:
        """Short reason code of a TLS failure."""
        return describe_tls_error(exc)

    def peer_rejected(self, who: str, address: str, reason: str, detail: str, outgoing: bool) -> None:
        """Count and audit a refused peer."""
        self.metrics.handshake_failures.labels(reason=reason).inc()
        log.warning("peer %s (%s) rejected: %s: %s", who, address, reason, detail)
        self.audit(self.actor, "peer_rejected", who, "denied",
                   {"reason": reason, "address": address, "detail": detail[:300], "direction": "out" if outgoing else "in"})

    def serial_of(self, ssl_obj: Any) -> int | None:
        """Serial number of the peer certificate of a TLS connection."""
        der = ssl_obj.getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number if der else None

    def check_switch(self, ssl_obj: Any, cluster: str | None, address: str, outgoing: bool) -> Any:
        """Identity of a peer switch if it is one the route table expects; None (audited) otherwise."""
        try:
            ident = check_peer(ssl_obj, role="switch", cluster=cluster, federation=self.cfg.federation,
                               revoked=self.revoked)
            if cluster is None and ident.cluster not in self.links:
                raise PeerRejected("wrong_cluster",
                                   f"peer {ident.uri} is of cluster {ident.cluster!r}, which is not in this switch's peers")
        except PeerRejected as exc:
            self.peer_rejected(cluster or "?", address, exc.reason_code, exc.message, outgoing)
            return None
        self.audit(self.actor, "peer_accepted", ident.cluster or "?",
                   "ok", {"address": address, "identity": ident.uri, "direction": "out" if outgoing else "in"})
        return ident

    def _accepted(self, conn: socket.socket, peer: Any) -> None:
        task = asyncio.create_task(self._accept(conn, peer))
        self.accepting.add(task)
        task.add_done_callback(self.accepting.discard)

    async def _accept(self, conn: socket.socket, peer: Any) -> None:
        address = f"{peer[0]}:{peer[1]}" if peer else "?"
        session: InboundSession | None = None
        writer = FrameStream(self.cfg.link.chunk_bytes)
        try:
            try:
                await accept_tls(conn, self.server_ctx, writer, HANDSHAKE_TIMEOUT_S)
            except (ssl.SSLError, ConnectionError, OSError, asyncio.TimeoutError) as exc:
                reason = describe_tls_error(exc) if isinstance(exc, ssl.SSLError) else "handshake_failed"
                self.peer_rejected("?", address, reason, f"{type(exc).__name__}: {exc}", outgoing=False)
                return
            ssl_obj = writer.get_extra_info("ssl_object")
            ident = self.check_switch(ssl_obj, None, address, outgoing=False)
            if ident is None:
                return
            frame, _, _ = await writer.read_frame(HANDSHAKE_TIMEOUT_S)
            if frame.type != FrameType.LINK_HELLO or frame.meta["cluster"] != ident.cluster:
                raise WireError("bad_handshake",
                                f"expected LINK_HELLO from cluster {ident.cluster}, got {frame.type.name} {frame.meta}")
            session = InboundSession(self, ident.cluster, writer, self.serial_of(ssl_obj))
            old = self.sessions.get(ident.cluster)
            if old is not None:
                old.close("replaced by a new connection")
            self.sessions[ident.cluster] = session
            await session.run(frame.meta["epoch"])
        except WireError as exc:
            self.metrics.refused.labels(reason=exc.code).inc()
            self.audit(self.actor, "frame_refused", session.cluster if session else address, "denied",
                       {"reason": exc.code, "detail": exc.message[:300]})
            try:
                write_frame(writer, encode_frame(FrameType.ERROR, {"code": exc.code, "message": exc.message}))
                await asyncio.wait_for(writer.drain(), 1.0)
            except Exception:
                pass
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError, OSError) as exc:
            log.info("session from %s ended: %s", session.cluster if session else address, type(exc).__name__)
        except Exception:
            log.exception("session from %s failed", address)
        finally:
            if session is not None:
                session.close()
                if self.sessions.get(session.cluster) is session:
                    del self.sessions[session.cluster]
            if writer.transport is not None:
                writer.transport.abort()

    # ---- audit checkpoints with peers ----
    def _checkpoint_frame(self) -> bytes | None:
        if self.audit_log is None:
            return None
        try:
            cp = self.audit_log.checkpoint()
        except Exception:
            log.exception("cannot write an audit checkpoint")
            return None
        return encode_frame(FrameType.CHECKPOINT, {"checkpoint": cp.to_json()})

    def send_checkpoint(self, link: OutboundLink) -> None:
        """Send our latest signed audit checkpoint on an outgoing link."""
        head = self._checkpoint_frame()
        if head is not None and link.writer is not None:
            write_frame(link.writer, head)

    def send_checkpoint_to(self, session: InboundSession) -> None:
        """Answer a peer's checkpoint with ours on its session."""
        head = self._checkpoint_frame()
        if head is not None and not session.closed:
            write_frame(session.writer, head)

    def receive_checkpoint(self, cluster: str, text: str) -> None:
        """Verify a peer's checkpoint against its pinned key and keep it (audited if it fails)."""
        try:
            cp = Checkpoint.from_json(text)
            pinned = self._pinned.get(cluster)
            if pinned is not None and pinned["signer"] != cp.signer:
                raise AuditError(f"signed by a key other than the one pinned for cluster {cluster}")
            if pinned is not None and cp.seq < pinned["seq"]:
                raise AuditError(f"its seq {cp.seq} is below seq {pinned['seq']} seen before: the log was rewound")
            verify_checkpoint(cp)
            assert self.audit_log is not None
            self.audit_log.store_peer_checkpoint(cluster, cp)
        except AuditError as exc:
            log.warning("checkpoint from %s refused: %s", cluster, exc)
            self.audit(self.actor, "peer_checkpoint_rejected", cluster, "denied", {"reason": str(exc)[:300]})
            return
        self._pinned[cluster] = {"signer": cp.signer, "seq": cp.seq}
        self.state.write_json("peer_audit_keys.json", self._pinned)

    # ---- reload ----
    def reload(self) -> bool:
        """Re-read the config file, certificates, CRL, routes and limits without dropping healthy sessions."""
        try:
            if self.config_path is None:
                raise ConfigError("no config file to reload")
            new = load_switch_config(self.config_path)
            if (new.cluster, new.federation) != (self.cfg.cluster, self.cfg.federation):
                raise ConfigError("cluster and federation cannot change on reload; restart the switch")
            old_cfg = self.cfg
            self.cfg = new
            try:
                self._load_tls()
            except SwitchError:
                self.cfg = old_cfg
                raise
        except (ConfigError, SwitchError) as exc:
            log.error("reload refused, keeping the running configuration: %s", exc)
            self.audit(self.actor, "reload", str(self.config_path), "error", {"reason": str(exc)[:300]})
            return False
        new_peers = {p.cluster: p for p in new.peers}
        for cluster in list(self.links):
            if cluster not in new_peers:
                link = self.links.pop(cluster)
                asyncio.ensure_future(link.stop())
                s = self.sessions.get(cluster)
                if s is not None:
                    s.close("peer removed from the route table")
            elif new_peers[cluster].address != self.links[cluster].address:
                self.links[cluster].address = new_peers[cluster].address
                self.links[cluster].drop_session("peer address changed")
        for cluster, peer in new_peers.items():
            if cluster not in self.links:
                self._add_link(peer)
        for link in self.links.values():
            link.set_limits()
        for account, bucket in self.account_buckets.items():
            bucket.set_rate(new.limits.account_rate_mbit)
        self.local.set_workers(new.local.workers)
        self._cut_revoked()
        self.audit(self.actor, "reload", str(self.config_path), "ok",
                   {"peers": sorted(new_peers), "revoked": len(self.revoked)})
        self.link_changed()
        return True

    def _reload_crl(self) -> None:
        try:
            self._load_tls()
        except SwitchError as exc:
            log.error("CRL changed but cannot be used, keeping the previous one: %s", exc)
            self.audit(self.actor, "crl_reload", self.cfg.tls.crl, "error", {"reason": str(exc)[:300]})
            self._crl_mtime = _mtime(self.cfg.tls.crl)
            return
        self.audit(self.actor, "crl_reload", self.cfg.tls.crl, "ok", {"revoked": len(self.revoked)})
        self._cut_revoked()

    def _cut_revoked(self) -> None:
        for cluster, s in list(self.sessions.items()):
            if s.serial in self.revoked:
                self.audit(self.actor, "peer_rejected", cluster, "denied", {"reason": "revoked", "live": True})
                self.metrics.handshake_failures.labels(reason="revoked").inc()
                s.close("certificate revoked")
        for cluster, link in self.links.items():
            if link.up and link.peer_serial in self.revoked:
                self.audit(self.actor, "peer_rejected", cluster, "denied", {"reason": "revoked", "live": True})
                self.metrics.handshake_failures.labels(reason="revoked").inc()
                link.drop_session("peer certificate revoked")

    # ---- periodic work and status ----
    async def _periodic(self) -> None:
        last_cp = time.monotonic()
        last_crl = time.monotonic()
        while True:
            await asyncio.sleep(STATUS_EVERY_S)
            try:
                now = time.monotonic()
                self.local.sweep()
                self.metrics.cert_expiry.set(self.cert_not_after - time.time())
                for c, link in self.links.items():
                    self.metrics.queue_bytes.labels(peer=c).set(link.queued_bytes())
                self.metrics.queue_bytes.labels(peer="local").set(self.mem_used)
                if now - last_crl >= CRL_POLL_S:
                    last_crl = now
                    if _mtime(self.cfg.tls.crl) != self._crl_mtime:
                        self._reload_crl()
                if now - last_cp >= CHECKPOINT_EVERY_S:
                    last_cp = now
                    for link in self.links.values():
                        if link.up:
                            self.send_checkpoint(link)
                self.write_status()
            except Exception:
                log.exception("periodic maintenance failed")

    def status(self) -> dict[str, Any]:
        """Snapshot of links, sessions, queues and throughput."""
        now = time.time()
        prev = self._last_status
        dt_s = max(1e-3, now - prev.get("time", now - 1))
        links = {}
        for c, link in self.links.items():
            before = prev.get("links", {}).get(c, {}).get("bytes_out", link.bytes_out)
            links[c] = {
                "address": link.address,
                "up": link.up,
                "peer_epoch": link.peer_epoch,
                "rtt_ms": None if link.rtt_s is None else round(link.rtt_s * 1000, 3),
                "queued_bytes": link.queued_bytes(),
                "unacked_bytes": link.rtx_bytes,
                "bytes_out": link.bytes_out,
                "mbit_out": round((link.bytes_out - before) * 8 / dt_s / 1e6, 3),
                "last_error": link.last_error,
            }
        sessions = {}
        for c, s in self.sessions.items():
            before = prev.get("sessions", {}).get(c, {}).get("bytes_in", s.bytes_in)
            sessions[c] = {"bytes_in": s.bytes_in, "mbit_in": round((s.bytes_in - before) * 8 / dt_s / 1e6, 3)}
        return {
            "time": now,
            "cluster": self.cfg.cluster,
            "epoch": self.epoch,
            "pid": os.getpid(),
            "wan": self.wan_address,
            "local": self.local.endpoint,
            "local_ipc": self.cfg.local.ipc_endpoint,
            "metrics": self.metrics_address,
            "workers": len(self.local.by_ident),
            # workers whose payloads go through shared memory, and the bytes that did (nebula.wire.shm)
            "shm_workers": sum(1 for r in self.local.by_ident.values() if r.shm is not None and r.shm.ready),
            "shm_bytes": dict(self.metrics.shm_bytes),
            "queued_bytes": self.mem_used,
            "links": links,
            "sessions": sessions,
            "certificate_expires": dt.datetime.fromtimestamp(self.cert_not_after, dt.timezone.utc).isoformat(),
        }

    def write_status(self) -> None:
        """Write status.json into the state directory (read by `nebula-switch status`)."""
        st = self.status()
        self._last_status = st
        self.state.write_json("status.json", st)


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def status_path(cfg: SwitchConfig) -> Path:
    """Where a running switch with config `cfg` writes its status."""
    return Path(cfg.state_dir or str(Path(cfg.audit.log).parent / "state")) / "status.json"


__all__ = ["SwitchServer", "SwitchError", "load_curve_keys", "status_path"]
