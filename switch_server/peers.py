"""TLS trust of peer switches: contexts, certificate checks, the CRL (polled), refusals; accepting peer sessions."""
from __future__ import annotations

__all__ = ["NOT_A_PEER", "NotAPeer", "PRE_HELLO_STAGING_BYTES", "PeerTrust", "SwitchError", "accept_peer",
           "cut_untrusted", "mtime"]

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
from security._text import safe_text
from security.errors import SecurityError
from security.signing import crl_number, key_fingerprint
from security.tls import PeerRejected, check_peer, client_context, describe_tls_error, load_crl, server_context
from switch_server.errors import SwitchError
from switch_server.framestream import FrameStream, write_frame
from switch_server.link import HANDSHAKE_TIMEOUT_S
from switch_server.linklog import NOT_A_PEER, REFUSED_ALERTS, RefusalLog, not_a_peer_text
from switch_server.session import InboundSession
from switch_server.metrics import SwitchMetrics
from switch_server.localtls import cut_untrusted_workers
from switch_server.tlstransport import accept_tls

log = logging.getLogger(__name__)

Audit = Callable[..., None]
# a connection that has not identified itself (LINK_HELLO) gets a small buffer and may send no payload
PRE_HELLO_STAGING_BYTES = 16 * 1024
# a peer cut for ignoring its credit or flooding control frames may not reconnect for a while
PENALIZED = frozenset({"credit_exceeded", "ping_flood", "checkpoint_flood"})
PENALTY_S = 5.0  # doubled for each further offence, up to PENALTY_MAX_S
PENALTY_MAX_S = 300.0
# A CA-valid switch of a cluster not in our peers list (added to the federation before this site applied the
# update that adds it) is told so in an ERROR frame of this code, once it has said LINK_HELLO as that cluster:
# it learns nothing it does not know (its certificate is the CA's, for that cluster), and its admin learns which
# site lacks which update. Anything else that fails the check is closed without a word.
REFUSAL_READ_S = 5.0  # how long a refused, CA-valid switch has to say its LINK_HELLO before it is closed silently


class NotAPeer(PeerRejected):
    """A CA-valid switch certificate of cluster `cluster`, which is not in this switch's peers list."""

    def __init__(self, cluster: str, message: str) -> None:
        super().__init__("wrong_cluster", message)
        self.cluster = cluster


class PeerTrust:
    """The TLS contexts, own certificate and revocation list of one switch, and the identity checks of its peers."""

    def __init__(self, metrics: SwitchMetrics, audit: Audit, actor: str, audit_limited: Audit) -> None:
        self.metrics = metrics
        self.audit = audit
        self.audit_limited = audit_limited  # refusals of unidentified connections are audited in aggregate
        self.actor = actor
        self.server_ctx: ssl.SSLContext | None = None
        self.client_ctx: ssl.SSLContext | None = None
        self.revoked: set[int] = set()
        self.own_serial = 0  # this switch's own certificate: a CRL that lists it means the federation removed us
        self.refused_us: dict[str, str] = {}  # peer cluster -> why it refuses our certificate (said once per reason)
        self.refusals = RefusalLog()  # what is logged of refused peers (each refusal is audited)
        self.cert_not_after = 0.0
        self.crl_mtime = 0.0
        self.crl_number: tuple[str, int] = ("", 0)  # (CA key fingerprint, CRL Number) of the CRL in use

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
            crl = load_crl(tls.crl)
            revoked = frozenset(r.serial_number for r in crl)
            ca = key_fingerprint(x509.load_pem_x509_certificate(Path(tls.ca).read_bytes()).public_key())
        except SecurityError as exc:
            raise SwitchError(str(exc)) from None
        except (OSError, ValueError) as exc:  # (the CA file replaced since the contexts read it)
            raise SwitchError(f"CA certificate {tls.ca} cannot be read ({exc}); check the file") from None
        number = (ca, crl_number(crl))
        if number[0] == self.crl_number[0] and number[1] < self.crl_number[1]:  # (a CRL put back: revoked peers)
            raise SwitchError(f"CRL {tls.crl} is number {number[1]}, older than number {self.crl_number[1]} in use; "
                              "put the admin's current CRL there (`nebula-admin crl`)")
        try:
            cert = x509.load_pem_x509_certificate(Path(tls.cert).read_bytes())
        except ValueError as exc:
            raise SwitchError(f"{tls.cert}: not a PEM certificate ({exc})") from None
        self.server_ctx, self.client_ctx, self.revoked, self.crl_number = server_ctx, client_ctx, revoked, number
        self.crl_mtime = mtime(tls.crl)
        self.own_serial = cert.serial_number
        self.cert_not_after = cert.not_valid_after_utc.timestamp()
        self.metrics.cert_expiry.set(self.cert_not_after - time.time())

    def crl_changed(self, cfg: SwitchConfig) -> bool:
        """Whether the CRL file changed since it was last read."""
        return mtime(cfg.tls.crl) != self.crl_mtime

    def tls_reason(self, exc: BaseException) -> str:
        """Short reason code of a TLS failure."""
        return describe_tls_error(exc)

    def peer_rejected(self, who: str, address: str, reason: str, detail: str, outgoing: bool) -> None:
        """Count and audit a refused peer (every refusal: the audit log bounds a flood in its own way, by summary
        records that count what they stand for); log the first of a peer's refusals for a reason, then a summary
        of its repeats now and then (an outgoing link's refusal is in its own log: `LinkLog`)."""
        self.metrics.handshake_failures.labels(reason=reason).inc()
        direction = "out" if outgoing else "in"
        host = address.rpartition(":")[0]
        self.audit_limited(("peer_rejected", reason, host, direction), self.actor,
                           "peer_rejected", who, "denied",
                           {"reason": reason, "address": address, "detail": detail[:300], "direction": direction})
        text = f"peer {who} ({address}) rejected: {reason}: {detail}"
        alert = next((why for needle, why in REFUSED_ALERTS if needle in detail.upper()), None)
        if alert is not None and not outgoing:  # (its alert: the dialer refuses our certificate, not we its)
            text = (f"peer {who} ({address}) ended its dial with an alert: this switch's certificate is refused there "
                    f"as {alert} ({detail})")
        if outgoing:
            log.debug("%s", text)
            return
        for line in self.refusals.refused((host, reason), text):
            log.log(line.level, "%s", line.text)

    @staticmethod
    def serial_of(ssl_obj: Any) -> int | None:
        """Serial number of the peer certificate of a TLS connection."""
        der = ssl_obj.getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number if der else None

    @staticmethod
    def not_after_of(ssl_obj: Any) -> float:
        """When the peer certificate of a TLS connection expires (epoch seconds); the session is cut then."""
        der = ssl_obj.getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).not_valid_after_utc.timestamp() if der else 0.0

    def identify_switch(self, ssl_obj: Any, cluster: str | None, *, federation: str, peers: Any) -> Any:
        """Identity of a peer switch (of `cluster`, or if None of one of `peers`); PeerRejected (NotAPeer for a
        switch of this federation whose cluster is not among `peers`) otherwise. ConnectionResetError if the peer
        closed the connection already (its alert says why: `link_down`)."""
        try:
            ssl_obj.getpeercert(binary_form=True)
        except (AttributeError, ValueError, OSError):  # (the socket is closed: the peer ended it at once)
            raise ConnectionResetError(f"peer {cluster or '?'} closed the connection right after the "
                                       "TLS handshake") from None
        ident = check_peer(ssl_obj, role="switch", cluster=cluster, federation=federation, revoked=self.revoked)
        if cluster is None and ident.cluster not in peers:
            raise NotAPeer(ident.cluster, f"peer {ident.uri} is of cluster {ident.cluster!r}, which is not in this "
                           f"switch's peers ({', '.join(sorted(peers)) or 'none'}); if the admin added "
                           f"{ident.cluster} to the federation, apply the update for this site that adds it "
                           "(`nebula-switch reload --update`)")
        return ident

    def accepted(self, ident: Any, address: str, outgoing: bool) -> None:
        """Audit an accepted peer."""
        self.audit(self.actor, "peer_accepted", ident.cluster or "?",
                   "ok", {"address": address, "identity": ident.uri, "direction": "out" if outgoing else "in"})

    def check_switch(self, ssl_obj: Any, cluster: str | None, address: str, outgoing: bool, *,
                     federation: str, peers: Any) -> Any:
        """Identity of a peer switch if it is one of `peers` (cluster names); None (audited) otherwise.
        ConnectionResetError if the peer closed the connection already (its alert says why: `link_down`)."""
        try:
            ident = self.identify_switch(ssl_obj, cluster, federation=federation, peers=peers)
        except PeerRejected as exc:
            self.peer_rejected(cluster or "?", address, exc.reason_code, exc.message, outgoing)
            return None
        except ConnectionResetError as exc:
            raise ConnectionResetError(f"{exc} ({address})") from None
        self.accepted(ident, address, outgoing)
        return ident

    def link_down(self, link: Any, exc: BaseException) -> tuple[str, int]:
        """Why outbound `link` went down (its `last_error`) and how loudly to say it (the link's `LinkLog` says it
        once): a peer that refuses our own certificate (as revoked, expired, of an unknown CA) is audited once per
        reason, and said with the fix; while it refuses us, other failures (its resets) keep that reason."""
        cluster, stream = link.cluster, link.writer
        if link.established:  # (the peer accepted us for a while: what it said before is history)
            self.refused_us.pop(cluster, None)
        text = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, asyncio.IncompleteReadError):
            text = f"the connection was closed by the peer ({type(exc).__name__})"
        if stream is not None and stream.error is not None and str(stream.error) not in text \
                and not isinstance(stream.error, asyncio.IncompleteReadError):
            text += f" ({stream.error})"  # (the peer's TLS alert, when it closed at once)
        refused = next((why for needle, why in REFUSED_ALERTS if needle in text.upper()), None)
        if refused is None:
            return self.refused_us.get(cluster, text), (logging.ERROR if cluster in self.refused_us else logging.INFO)
        why = (f"peer {cluster} ({link.address}) refuses this switch's certificate as {refused}: its CRL or CA says "
               f"so; if this cluster is still in the federation, get the current CRL (and a new kit if it was "
               f"revoked) from the federation's admin")
        self.refused_by_peer(cluster, why, refused, link.address)
        return why, logging.ERROR

    def refused_by_peer(self, cluster: str, why: str, reason: str, address: str) -> None:
        """Peer `cluster` refuses this switch (`why`, with the fix): audited once per reason until it accepts us."""
        if self.refused_us.get(cluster) != why:
            self.refused_us[cluster] = why
            self.audit(self.actor, "refused_by_peer", cluster, "denied", {"reason": reason, "address": address})

    def peer_error(self, link: Any, code: str, message: str, me: str, revision: int | None) -> tuple[str, int]:
        """Why peer `link.cluster` refused our LINK_HELLO with an ERROR frame (`code`, `message`: the peer's words,
        shown as one bounded line), and how loudly to say it."""
        if code == NOT_A_PEER:
            why = not_a_peer_text(link.cluster, me, link.address, revision)
            self.refused_by_peer(link.cluster, why, NOT_A_PEER, link.address)
            return why, logging.ERROR
        return f"peer {link.cluster} refused this switch's link: {safe_text(code, 64)}: {safe_text(message, 300)}", \
            logging.WARNING


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
    writer = FrameStream(0, PRE_HELLO_STAGING_BYTES)
    me = asyncio.current_task()
    host.unidentified[me] = None  # (oldest first: the one evicted when too many wait)
    try:
        try:
            await accept_tls(conn, trust.server_ctx, writer, HANDSHAKE_TIMEOUT_S)
        except (ssl.SSLError, ConnectionError, OSError, asyncio.TimeoutError) as exc:
            reason = describe_tls_error(exc) if isinstance(exc, ssl.SSLError) else "handshake_failed"
            trust.peer_rejected("?", address, reason, f"{type(exc).__name__}: {exc}", outgoing=False)
            return
        ssl_obj = writer.get_extra_info("ssl_object")
        try:
            ident = trust.identify_switch(ssl_obj, None, federation=host.cfg.federation, peers=host.links)
        except PeerRejected as exc:
            trust.peer_rejected("?", address, exc.reason_code, exc.message, outgoing=False)
            if isinstance(exc, NotAPeer):
                await tell_not_a_peer(writer, exc.cluster, host.cfg.cluster)
            return
        except ConnectionResetError as exc:
            raise ConnectionResetError(f"{exc} ({address})") from None
        trust.accepted(ident, address, outgoing=False)
        penalty = host.penalties.get(ident.cluster, 0.0) - time.monotonic()
        if penalty > 0:
            raise WireError("penalized", f"peer {ident.cluster} broke the link protocol (credit or flood) and may "
                            f"reconnect in {penalty:.1f} s")
        frame, _, _ = await writer.read_frame(HANDSHAKE_TIMEOUT_S)
        if frame.type != FrameType.LINK_HELLO or frame.meta["cluster"] != ident.cluster:
            raise WireError("bad_handshake",
                            f"expected LINK_HELLO from cluster {ident.cluster}, got {frame.type.name} {frame.meta}")
        host.unidentified.pop(me, None)
        writer.grow()
        session = InboundSession(host, ident.cluster, writer, trust.serial_of(ssl_obj))
        session.not_after = trust.not_after_of(ssl_obj)
        old = host.sessions.get(ident.cluster)
        if old is not None:
            old.close("replaced by a new connection")
        host.sessions[ident.cluster] = session
        await session.run(frame.meta["epoch"])
    except WireError as exc:
        if session is not None and exc.code in PENALIZED:  # reconnecting at once would only repeat it
            strikes = host.strikes[session.cluster] = host.strikes.get(session.cluster, 0) + 1
            host.penalties[session.cluster] = time.monotonic() + min(PENALTY_MAX_S, PENALTY_S * 2 ** (strikes - 1))
        host.metrics.refused.labels(reason=exc.code).inc()
        who = session.cluster if session else address
        host.audit_limited(("frame_refused", exc.code, session.cluster if session else address.rpartition(":")[0]),
                           host.actor, "frame_refused", who, "denied", {"reason": exc.code, "detail": exc.message[:300]})
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
        host.unidentified.pop(me, None)
        if session is not None:
            session.close()
            if host.sessions.get(session.cluster) is session:
                del host.sessions[session.cluster]
        if writer.transport is not None:
            writer.transport.abort()


async def tell_not_a_peer(stream: FrameStream, cluster: str, me: str) -> None:
    """Tell a CA-valid switch of `cluster`, not in our peers list, why it is refused: once it has said LINK_HELLO
    as that cluster (a client that does not speak the link protocol, or names another cluster, hears nothing).
    Its LINK_HELLO is read first, so the close that follows is a FIN, not a reset that could destroy the answer."""
    try:
        frame, _, _ = await stream.read_frame(REFUSAL_READ_S)
        if frame.type != FrameType.LINK_HELLO or frame.meta.get("cluster") != cluster:
            return
        write_frame(stream, encode_frame(FrameType.ERROR, {
            "code": NOT_A_PEER, "message": f"cluster {cluster} is not in the peers list of {me}"}))
        await asyncio.wait_for(stream.drain(), 1.0)
    except (WireError, asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, OSError):
        pass


def cut_untrusted(host: Any) -> None:
    """Close live sessions and links whose peer certificate is now on the CRL or has expired (audited)."""
    revoked, now = host.trust.revoked, time.time()

    def why(serial: int | None, not_after: float) -> str | None:
        if serial in revoked:
            return "revoked"
        return "expired" if not_after and not_after <= now else None

    for cluster, s in list(host.sessions.items()):
        reason = why(s.serial, s.not_after)
        if reason is not None:
            host.audit(host.actor, "peer_rejected", cluster, "denied", {"reason": reason, "live": True})
            host.metrics.handshake_failures.labels(reason=reason).inc()
            s.close(f"certificate {reason}")
    for cluster, link in host.links.items():
        reason = why(link.peer_serial, link.peer_not_after) if link.up else None
        if reason is not None:
            host.audit(host.actor, "peer_rejected", cluster, "denied", {"reason": reason, "live": True})
            host.metrics.handshake_failures.labels(reason=reason).inc()
            link.drop_session(f"peer certificate {reason}")
    cut_untrusted_workers(host, why)
