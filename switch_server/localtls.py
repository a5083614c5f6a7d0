"""The local side's TLS endpoint (`local.tls_endpoint`): workers on other hosts without CURVE.

A worker dials with its certificate (role `worker`, this cluster, this federation, not revoked: checked by
OpenSSL against the federation CA and CRL, then by `security.tls.check_peer` against the newest revocations), and
once the handshake is done it authenticates as on the Unix stream socket: its key and derived password, which
must be those of the worker its certificate names. The connection is then one of `StreamWorkers`' like any other.
OpenSSL's AES-GCM costs a fraction of CURVE's CPU per byte, and the switch reads and writes it through
`tlstransport` (decrypting straight into the stream's buffer). Every refusal is audited.
"""
from __future__ import annotations

__all__ = ["cut_untrusted_workers", "open_tls"]

import asyncio
import logging
import socket
from typing import Any, Callable

from cryptography import x509

from nebula.config import split_host_port
from nebula.wire.stream import CERT_REFUSED
from security.tls import PeerRejected, check_peer, describe_tls_error
from switch_server.localstream import AUTH_WITHIN_S, StreamWorkers
from switch_server.tlstransport import Listener, accept_tls

log = logging.getLogger(__name__)
CLOSE_AFTER_S = 1.0  # a refused handshake's socket is closed this long after its alert went out


def open_tls(side: Any, streams: StreamWorkers) -> str:
    """Listen on `side`'s (a LocalSide's) `local.tls_endpoint` for `streams`; the bound host:port (OSError if it
    cannot be bound)."""
    server = side.server
    cfg = server.cfg
    tasks = streams.handshakes

    def check_cert(ssl_obj: Any, peer: str) -> tuple[str, int, float] | str:
        try:
            ident = check_peer(ssl_obj, role="worker", cluster=cfg.cluster, federation=cfg.federation,
                               revoked=server.trust.revoked)
            cert = x509.load_der_x509_certificate(ssl_obj.getpeercert(binary_form=True))
        except PeerRejected as exc:
            server.metrics.refused.labels(reason="worker_certificate").inc()
            server.audit_limited(("worker_rejected", exc.reason_code), "worker", "worker_rejected",
                                 f"tls:{peer}", "denied",
                                 {"reason": exc.reason_code, "transport": "tls", "detail": exc.message})
            return f"{CERT_REFUSED}: {exc.message}"
        return ident.name, cert.serial_number, cert.not_valid_after_utc.timestamp()

    async def handshake(sock: socket.socket, peer: str, conn: Any) -> None:
        try:
            await accept_tls(sock, server.trust.server_ctx, conn, AUTH_WITHIN_S, close_after_s=CLOSE_AFTER_S)
        except (OSError, asyncio.TimeoutError) as exc:  # (ssl.SSLError is an OSError)
            streams.forget(conn)
            reason = "timeout" if isinstance(exc, asyncio.TimeoutError) else describe_tls_error(exc)
            server.metrics.refused.labels(reason="worker_tls_handshake").inc()
            server.audit_limited(("worker_rejected", f"tls_{reason}"), "worker", "worker_rejected",
                                 f"tls:{peer}", "denied", {"reason": f"tls_{reason}", "transport": "tls",
                                                           "detail": str(exc)[:200]})

    def on_conn(sock: socket.socket, addr: Any) -> None:
        peer = f"{addr[0]}:{addr[1]}"
        conn = streams.accept_tls()
        if conn is None:  # (beyond MAX_UNPROVEN: descriptors are finite)
            sock.close()
            server.audit_limited(("worker_rejected", "too_many_unproven"), "worker", "worker_rejected",
                                 f"tls:{peer}", "denied", {"reason": "too_many_unproven", "transport": "tls"})
            return
        task = asyncio.create_task(handshake(sock, peer, conn))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    streams.check_cert = check_cert
    # a worker on another host cannot map the switch's memory: its HELLO's ask for an arena gets none
    side.conns.same_host = lambda ident: (c := streams.conns.get(bytes(ident))) is None or c.kind != "tls"
    host, port = split_host_port(cfg.local.tls_endpoint, "local.tls_endpoint")
    streams.tls_listener = Listener(host, port, on_conn)
    bound_host, bound_port = streams.tls_listener.address()
    return f"{bound_host}:{bound_port}"


def cut_untrusted_workers(server: Any, why: Callable[[int | None, float], str | None]) -> None:
    """End the TLS connections of workers whose certificate `why` finds revoked or expired (audited)."""
    streams = server.local.streams
    for conn in list(streams.conns.values()) if streams is not None else []:
        reason = why(conn.cert[1], conn.cert[2]) if conn.cert is not None else None
        if reason is not None and conn.transport is not None:
            server.metrics.refused.labels(reason="worker_certificate").inc()
            server.audit(f"worker:{conn.cert[0]}", "worker_rejected", f"tls:{conn.peer}", "denied",
                         {"reason": reason, "transport": "tls", "live": True})
            conn.transport.abort()
