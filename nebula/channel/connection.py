"""A worker's ZeroMQ connection to its switch: keys, transport, and what a failed handshake means.

The connection is CURVE over TCP, mutual TLS to the switch's `local.tls_endpoint` (then the same key and derived
password as on IPC), or, for a worker on the switch's own host, its Unix stream socket or IPC endpoint with a
password derived from the same CURVE keys (the kernel carries those bytes, so they need no encryption).
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Any

import zmq
import zmq.auth

from nebula.channel.errors import ChannelError, SwitchRefused
from nebula.channel.streamsock import StreamSocket, TLSTarget
from nebula.config.switch import split_host_port
from nebula.config.worker import WorkerConfig, local_endpoint
from nebula.wire import HEADER_BYTES, MAX_META_BYTES, MAX_PAYLOAD_BYTES
from nebula.wire.stream import CERT_REFUSED
from security.curve import local_password
from security.errors import TLSConfigError
from security.preflight import check_key_file
from security.tls import PeerRejected, check_peer, client_context

__all__ = ["SNDHWM", "connect", "handshake_failure", "poll_ms", "silent_switch"]

SNDHWM = 16  # frames inside ZeroMQ; more wait in our lanes so a small activation can overtake bulk frames
WAITING_SAY_S = 2.0  # a switch that has not answered for this long is named in a warning (once per wait)

log = logging.getLogger(__name__)
# address -> when connecting to it first failed, for the connections that have not reached their switch yet
_waiting: dict[str, float] = {}
_said: set[str] = set()


def poll_ms(seconds: float) -> int:
    """A wait of `seconds` as ZeroMQ's poll takes it: whole milliseconds, rounded up. ZeroMQ truncates, so a
    deadline less than a millisecond away would return at once, and a loop waiting for it would spin until it
    passed (the receiving I/O thread spun 3-4 times a message that way, waiting for an owed acknowledgement)."""
    return max(0, math.ceil(seconds * 1000))


def connect(cfg: WorkerConfig) -> tuple[zmq.Context | None, Any, Any, str, str]:
    """A DEALER socket connecting to the switch as `cfg` says: (context, socket, its monitor, address, transport);
    over the Unix stream endpoint a `StreamSocket` instead, with no context and a queue of its events for a
    monitor."""
    try:
        check_key_file(cfg.curve_key, "worker CURVE key")  # a key others can read is not the worker's alone
    except TLSConfigError as exc:
        raise ChannelError(str(exc)) from None
    try:
        public, secret = zmq.auth.load_certificate(cfg.curve_key)
    except (OSError, ValueError) as exc:
        raise ChannelError(f"cannot read the worker CURVE key {cfg.curve_key} ({exc}); check worker.yaml") from None
    if not secret:
        raise ChannelError(f"{cfg.curve_key} holds no secret key; use the worker.key_secret file")
    address, transport = local_endpoint(cfg)
    if transport in ("unix", "tls"):  # (no ZeroMQ: events the monitor would report are queued for the I/O thread)
        events: deque[dict] = deque()
        password = local_password(secret.decode(), cfg.switch_curve_public_key).encode()
        stream = StreamSocket(address, public, password, MAX_PAYLOAD_BYTES + HEADER_BYTES + MAX_META_BYTES,
                              events.append, _tls_target(cfg) if transport == "tls" else None)
        return None, stream, events, address, transport
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    if transport == "ipc":
        s.plain_username = public
        s.plain_password = local_password(secret.decode(), cfg.switch_curve_public_key).encode()
    else:
        s.curve_publickey = public
        s.curve_secretkey = secret
        s.curve_serverkey = cfg.switch_curve_public_key.encode()
    s.sndhwm = SNDHWM
    s.reconnect_ivl = 100
    s.reconnect_ivl_max = 2000
    monitor = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                   | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_CONNECTED)
    s.connect(address)
    return ctx, s, monitor, address, transport


def _tls_target(cfg: WorkerConfig) -> TLSTarget:
    """How to dial the switch's TLS endpoint: the worker's certificate, and the switch's checked against the CA,
    the CRL and the identity of this cluster's switch."""
    assert cfg.tls is not None  # (WorkerConfig requires it with a tls_endpoint)
    try:
        ctx = client_context(cfg.tls.ca, cfg.tls.cert, cfg.tls.key, cfg.tls.crl)
    except TLSConfigError as exc:
        raise ChannelError(f"worker.yaml tls: {exc}") from None

    def verify(sock: Any) -> str:
        try:
            check_peer(sock, role="switch", cluster=cfg.cluster, federation=cfg.federation)
        except PeerRejected as exc:
            return f"the switch is not this cluster's: {exc}"
        return ""

    host, port = split_host_port(cfg.tls_endpoint, "tls_endpoint")
    return TLSTarget(host, port, ctx, verify)


def handshake_failure(ev: dict[str, Any], cfg: WorkerConfig, address: str, transport: str) -> ChannelError | None:
    """The error a monitor event means for this worker (naming the fix), or None if it is no failure. A switch that
    does not answer is no failure yet: after WAITING_SAY_S the worker says, once, that it waits for it."""
    if ev["event"] in (zmq.EVENT_CONNECT_RETRIED, zmq.EVENT_CONNECTED):
        _waiting_for(ev["event"] == zmq.EVENT_CONNECTED, cfg, address)
        return None
    key_refused = ev["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH and not str(ev["value"]).startswith(CERT_REFUSED)
    if transport == "tls" and not key_refused and ev["event"] in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                                                                  zmq.EVENT_HANDSHAKE_FAILED_AUTH):
        return SwitchRefused(f"TLS with the switch at {address} failed: {ev['value']}; check tls in worker.yaml "
                             f"(its cert must be worker {cfg.name!r} of cluster {cfg.cluster}, issued by the CA "
                             "in tls.ca and not revoked: ask the admin for a new kit if it was), that tls_endpoint "
                             f"is this cluster's switch, and that worker {cfg.name!r}'s key is under its "
                             "local.workers")
    if key_refused:
        hint = ("; if it is listed, check that switch_curve_public_key in worker.yaml is this switch's key "
                "(the IPC password is derived from it)" if transport in ("ipc", "unix", "tls") else "")
        return SwitchRefused(f"switch at {address} refused our key (ZAP status {ev['value']}): "
                            f"ask its admin to add worker {cfg.name!r}'s public key under local.workers{hint}")
    if ev["event"] == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        what = ("PLAIN handshake" if transport == "ipc" else "CURVE handshake")
        fix = ("is that endpoint the switch's local.ipc_endpoint?" if transport == "ipc"
               else "switch_curve_public_key is probably wrong")
        return ChannelError(f"{what} with {address} failed: {fix}")
    return None


def _waiting_for(connected: bool, cfg: WorkerConfig, address: str) -> None:
    """Track a connection that nothing answers yet; warn once when it has waited WAITING_SAY_S."""
    now = time.monotonic()
    if connected:
        since = _waiting.pop(address, None)
        if address in _said:
            _said.discard(address)
            log.warning("worker %s of cluster %s: its switch at %s answers now (after %.0f s)", cfg.name, cfg.cluster,
                        address, now - since if since is not None else 0.0)
        return
    first = _waiting.setdefault(address, now)
    if now - first >= WAITING_SAY_S and address not in _said:
        _said.add(address)
        log.warning("worker %s of cluster %s: waiting for its switch at %s, where nothing answers yet: start the "
                    "switch (`nebula-switch serve --config switch.yaml` on its host), or fix `endpoint`/"
                    "`ipc_endpoint` in its worker.yaml", cfg.name, cfg.cluster, address)


def silent_switch(address: str, transport: str, timeout_s: float) -> ChannelError:
    """The error for a switch that did not welcome us in time, with the likely causes."""
    hint = ("is its local.ipc_endpoint the ipc_endpoint in worker.yaml? (transport: tcp avoids IPC)"
            if transport in ("ipc", "unix") else "is tls_endpoint in worker.yaml its local.tls_endpoint?"
            if transport == "tls" else "is switch_curve_public_key in worker.yaml the switch's key?")
    return ChannelError(f"switch at {address} did not answer within {timeout_s} s; is it running, and {hint}")
