"""TLS trust of peer switches: contexts, certificate checks, the CRL (polled), refusals; accepting peer sessions."""
from __future__ import annotations

__all__ = ["PeerTrust", "SwitchError", "accept_peer", "cut_revoked", "mtime"]

import asyncio
import logging
import os
import socket
import ssl
import time
from pathlib import Path
from typing import Any, Callable

from cryptography import x509

from nebula.config import SwitchConfig
from nebula.wire import FrameType, WireError, encode_frame
from security.errors import SecurityError
from security.tls import PeerRejected, check_peer, client_context, crl_serials, describe_tls_error, server_context
from switch_server.framestream import FrameStream, write_frame
from switch_server.link import HANDSHAKE_TIMEOUT_S
from switch_server.session import InboundSession
from switch_server.metrics import SwitchMetrics
from switch_server.tlstransport import accept_tls

log = logging.getLogger(__name__)

Audit = Callable[..., None]


class SwitchError(Exception):
    """The switch cannot start: a file or setting is unusable; the message names it and the fix."""


class PeerTrust:
    """The TLS contexts, own certificate and revocation list of one switch, and the identity checks of its peers."""

    def __init__(self, metrics: SwitchMetrics, audit: Audit, actor: str) -> None:
        self.metrics = metrics
        self.audit = audit
        self.actor = actor
        self.server_ctx: ssl.SSLContext | None = None
        self.client_ctx: ssl.SSLContext | None = None
        self.revoked: set[int] = set()
        self.cert_not_after = 0.0
        self.crl_mtime = 0.0

    def load(self, cfg: SwitchConfig) -> None:
        """(Re)load certificates, key and CRL of `cfg.tls`; SwitchError naming the problem (state unchanged then)."""
        tls = cfg.tls
        passphrase = None
        if tls.key_passphrase_env:
            passphrase = os.environ.get(tls.key_passphrase_env)
            if passphrase is None:
                raise SwitchError(f"tls.key_passphrase_env names {tls.key_passphrase_env!r}, which is not set")
        try:
            server_ctx = server_context(tls.ca, tls.cert, tls.key, tls.crl, passphrase)
            client_ctx = client_context(tls.ca, tls.cert, tls.key, tls.crl, passphrase)
            revoked = crl_serials(tls.crl)
        except SecurityError as exc:
            raise SwitchError(str(exc)) from None
        try:
            cert = x509.load_pem_x509_certificate(Path(tls.cert).read_bytes())
        except ValueError as exc:
            raise SwitchError(f"{tls.cert}: not a PEM certificate ({exc})") from None
        self.server_ctx, self.client_ctx, self.revoked = server_ctx, client_ctx, revoked
        self.crl_mtime = mtime(tls.crl)
        self.cert_not_after = cert.not_valid_after_utc.timestamp()
        self.metrics.cert_expiry.set(self.cert_not_after - time.time())

    def crl_changed(self, cfg: SwitchConfig) -> bool:
        """Whether the CRL file changed since it was last read."""
        return mtime(cfg.tls.crl) != self.crl_mtime

    def tls_reason(self, exc: BaseException) -> str:
        """Short reason code of a TLS failure."""
        return describe_tls_error(exc)

    def peer_rejected(self, who: str, address: str, reason: str, detail: str, outgoing: bool) -> None:
        """Count and audit a refused peer."""
        self.metrics.handshake_failures.labels(reason=reason).inc()
        log.warning("peer %s (%s) rejected: %s: %s", who, address, reason, detail)
        self.audit(self.actor, "peer_rejected", who, "denied",
                   {"reason": reason, "address": address, "detail": detail[:300], "direction": "out" if outgoing else "in"})

    @staticmethod
    def serial_of(ssl_obj: Any) -> int | None:
        """Serial number of the peer certificate of a TLS connection."""
        der = ssl_obj.getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number if der else None

    def check_switch(self, ssl_obj: Any, cluster: str | None, address: str, outgoing: bool, *,
                     federation: str, peers: Any) -> Any:
        """Identity of a peer switch if it is one of `peers` (cluster names); None (audited) otherwise."""
        try:
            ident = check_peer(ssl_obj, role="switch", cluster=cluster, federation=federation, revoked=self.revoked)
            if cluster is None and ident.cluster not in peers:
                raise PeerRejected("wrong_cluster",
                                   f"peer {ident.uri} is of cluster {ident.cluster!r}, which is not in this switch's peers")
        except PeerRejected as exc:
            self.peer_rejected(cluster or "?", address, exc.reason_code, exc.message, outgoing)
            return None
        self.audit(self.actor, "peer_accepted", ident.cluster or "?",
                   "ok", {"address": address, "identity": ident.uri, "direction": "out" if outgoing else "in"})
        return ident


def mtime(path: str) -> float:
    """Modification time of `path`, 0 if it cannot be read."""
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


async def accept_peer(host: Any, conn: socket.socket, peer: Any) -> None:
    """Serve one accepted WAN connection: TLS handshake, identity check, LINK_HELLO, then its session
    (`host` is the switch server: its trust, sessions and config)."""
    address = f"{peer[0]}:{peer[1]}" if peer else "?"
    trust: PeerTrust = host.trust
    session: InboundSession | None = None
    writer = FrameStream(host.cfg.link.chunk_bytes)
    try:
        try:
            await accept_tls(conn, trust.server_ctx, writer, HANDSHAKE_TIMEOUT_S)
        except (ssl.SSLError, ConnectionError, OSError, asyncio.TimeoutError) as exc:
            reason = describe_tls_error(exc) if isinstance(exc, ssl.SSLError) else "handshake_failed"
            trust.peer_rejected("?", address, reason, f"{type(exc).__name__}: {exc}", outgoing=False)
            return
        ssl_obj = writer.get_extra_info("ssl_object")
        ident = trust.check_switch(ssl_obj, None, address, outgoing=False, federation=host.cfg.federation,
                                   peers=host.links)
        if ident is None:
            return
        frame, _, _ = await writer.read_frame(HANDSHAKE_TIMEOUT_S)
        if frame.type != FrameType.LINK_HELLO or frame.meta["cluster"] != ident.cluster:
            raise WireError("bad_handshake",
                            f"expected LINK_HELLO from cluster {ident.cluster}, got {frame.type.name} {frame.meta}")
        session = InboundSession(host, ident.cluster, writer, trust.serial_of(ssl_obj))
        old = host.sessions.get(ident.cluster)
        if old is not None:
            old.close("replaced by a new connection")
        host.sessions[ident.cluster] = session
        await session.run(frame.meta["epoch"])
    except WireError as exc:
        host.metrics.refused.labels(reason=exc.code).inc()
        host.audit(host.actor, "frame_refused", session.cluster if session else address, "denied",
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
            if host.sessions.get(session.cluster) is session:
                del host.sessions[session.cluster]
        if writer.transport is not None:
            writer.transport.abort()


def cut_revoked(host: Any) -> None:
    """Close live sessions and links whose peer certificate is now on the CRL (audited)."""
    revoked = host.trust.revoked
    for cluster, s in list(host.sessions.items()):
        if s.serial in revoked:
            host.audit(host.actor, "peer_rejected", cluster, "denied", {"reason": "revoked", "live": True})
            host.metrics.handshake_failures.labels(reason="revoked").inc()
            s.close("certificate revoked")
    for cluster, link in host.links.items():
        if link.up and link.peer_serial in revoked:
            host.audit(host.actor, "peer_rejected", cluster, "denied", {"reason": "revoked", "live": True})
            host.metrics.handshake_failures.labels(reason="revoked").inc()
            link.drop_session("peer certificate revoked")
