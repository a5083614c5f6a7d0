"""ZeroMQ authentication of the local side (ZAP): CURVE keys over TCP, PLAIN with a derived password over IPC,
each mapped to a worker credential and its account."""
from __future__ import annotations

__all__ = ["ZAP_DOMAIN", "ZAP_ENDPOINT", "ZapHandler"]

import hmac
import logging
from typing import Any, Callable

import zmq
import zmq.asyncio
from zmq.utils import z85

from security.curve import local_password
from switch_server.metrics import SwitchMetrics

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"nebula"


class ZapHandler:
    """Answers ZeroMQ's authentication requests for the local ROUTER; every decision is audited."""

    def __init__(self, secret_key: bytes, metrics: SwitchMetrics, audit: Callable[..., None]) -> None:
        self.secret_key = secret_key
        self.metrics = metrics
        self.audit = audit
        self.keys: dict[str, Any] = {}  # z85 public key -> WorkerIdentity
        self.passwords: dict[str, bytes] = {}
        self.sock: zmq.asyncio.Socket | None = None
        # called before each request is answered, while the connection asking is surely open (its handshake waits
        # for the answer): the local side's connection watch takes its descriptor then
        self.before_reply: Callable[[], None] | None = None

    def set_workers(self, workers: tuple) -> None:
        """Replace the accepted worker keys (hot reload)."""
        self.keys = {w.curve_public_key: w for w in workers}
        secret = self.secret_key.decode()
        self.passwords = {k: local_password(secret, k).encode() for k in self.keys}

    def bind(self, ctx: zmq.asyncio.Context) -> None:
        """Bind the handler's socket (before the ROUTER it authenticates for)."""
        self.sock = ctx.socket(zmq.REP)
        self.sock.linger = 0
        self.sock.bind(ZAP_ENDPOINT)

    async def serve(self) -> None:
        """Answer requests until cancelled."""
        assert self.sock is not None
        while True:
            msg = await self.sock.recv_multipart()
            try:
                if self.before_reply is not None:
                    self.before_reply()
                reply = self.reply(msg)
            except Exception:  # never let one bad request stop authentication for everyone
                log.exception("ZAP request failed")
                reply = [b"1.0", msg[1] if len(msg) > 1 else b"", b"500", b"internal error", b"", b""]
            await self.sock.send_multipart(reply)

    def reply(self, msg: list[bytes]) -> list[bytes]:
        """The ZAP reply to one request: 200 with User-Id "name/account", or 400 with the reason."""
        version, request_id, domain, address, _identity, mechanism = msg[:6]
        user, why = self.decide(mechanism, msg[6:], address.decode(errors="replace"))
        if user is None:
            return [version, request_id, b"400", why.encode(), b"", b""]
        # User-Id carries "name/account" so every frame names its credential and account
        return [version, request_id, b"200", b"OK", user.encode(), b""]

    def check_stream(self, username: bytes, password: bytes, addr: str, transport: str = "unix",
                     cert_name: str | None = None) -> str | None:
        """The User-Id of a worker on a stream endpoint (`switch_server.localstream`: `addr` names the process or,
        over TLS, the address) that presents `username` (its public key) and `password` as it would to PLAIN over
        IPC; over TLS the key must be that of the worker its certificate names (`cert_name`). None if refused
        (audited)."""
        return self.decide(b"PLAIN", [username, password], addr, transport, cert_name)[0]

    def decide(self, mechanism: bytes, creds: list[bytes], addr: str, transport: str = "ipc",
               cert_name: str | None = None) -> tuple[str | None, str]:
        """("name/account", "") for an accepted worker, (None, why) for a refused one; each decision audited."""
        if mechanism == b"PLAIN" and len(creds) == 2:  # only the IPC listener (and the stream one) speak PLAIN
            key = creds[0].decode(errors="replace")
            expected = self.passwords.get(key)
            if expected is not None and not hmac.compare_digest(creds[1], expected):
                self.metrics.refused.labels(reason="bad_local_password").inc()
                self.audit("worker", "worker_rejected", addr, "denied",
                           {"reason": "bad_password", "curve_public_key": key, "transport": transport})
                return None, "wrong password for this key"
        elif mechanism == b"CURVE" and creds and len(creds[0]) == 32:
            key, transport = z85.encode(creds[0]).decode(), "tcp"
        else:
            self.audit("worker", "worker_rejected", addr, "denied", {"reason": "not_curve"})
            return None, "CURVE required"
        worker = self.keys.get(key)
        if worker is None:
            self.metrics.refused.labels(reason="unknown_worker_key").inc()
            self.audit("worker", "worker_rejected", addr, "denied", {"reason": "unknown_key", "curve_public_key": key})
            return None, "unknown CURVE key; add it under local.workers"
        if cert_name is not None and worker.name != cert_name:
            self.metrics.refused.labels(reason="certificate_key_mismatch").inc()
            self.audit(f"worker:{cert_name}", "worker_rejected", addr, "denied",
                       {"reason": "certificate_key_mismatch", "key_of": worker.name, "transport": transport})
            return None, f"this key is worker {worker.name}'s, the certificate worker {cert_name}'s"
        self.audit(f"worker:{worker.name}", "worker_accepted", addr, "ok",
                   {"account": worker.account, "transport": transport})
        return f"{worker.name}/{worker.account}", ""

    def close(self) -> None:
        """Close the handler's socket."""
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None
