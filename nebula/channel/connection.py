"""A worker's ZeroMQ connection to its switch: keys, transport, and what a failed handshake means.

The connection is CURVE over TCP, or, for a worker on the switch's own host, the switch's IPC endpoint with a
password derived from the same CURVE keys (the kernel carries those bytes, so they need no encryption).
"""
from __future__ import annotations

from typing import Any

import zmq
import zmq.auth

from nebula.channel.errors import ChannelError, SwitchRefused
from nebula.config.worker import WorkerConfig, local_endpoint
from security.curve import local_password
from security.errors import TLSConfigError
from security.preflight import check_key_file

__all__ = ["SNDHWM", "connect", "handshake_failure", "silent_switch"]

SNDHWM = 16  # frames inside ZeroMQ; more wait in our lanes so a small activation can overtake bulk frames


def connect(cfg: WorkerConfig) -> tuple[zmq.Context, zmq.Socket, zmq.Socket, str, str]:
    """A DEALER socket connecting to the switch as `cfg` says: (context, socket, its monitor, address, transport)."""
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
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    address, transport = local_endpoint(cfg)
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
                                   | zmq.EVENT_HANDSHAKE_SUCCEEDED)
    s.connect(address)
    return ctx, s, monitor, address, transport


def handshake_failure(ev: dict[str, Any], cfg: WorkerConfig, address: str, transport: str) -> ChannelError | None:
    """The error a monitor event means for this worker (naming the fix), or None if it is no failure."""
    if ev["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        hint = ("; if it is listed, check that switch_curve_public_key in worker.yaml is this switch's key "
                "(the IPC password is derived from it)" if transport == "ipc" else "")
        return SwitchRefused(f"switch at {address} refused our key (ZAP status {ev['value']}): "
                            f"ask its admin to add worker {cfg.name!r}'s public key under local.workers{hint}")
    if ev["event"] == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        what = ("PLAIN handshake" if transport == "ipc" else "CURVE handshake")
        fix = ("is that endpoint the switch's local.ipc_endpoint?" if transport == "ipc"
               else "switch_curve_public_key is probably wrong")
        return ChannelError(f"{what} with {address} failed: {fix}")
    return None


def silent_switch(address: str, transport: str, timeout_s: float) -> ChannelError:
    """The error for a switch that did not welcome us in time, with the likely causes."""
    hint = ("is its local.ipc_endpoint the ipc_endpoint in worker.yaml? (transport: tcp avoids IPC)"
            if transport == "ipc" else "is switch_curve_public_key in worker.yaml the switch's key?")
    return ChannelError(f"switch at {address} did not answer within {timeout_s} s; is it running, and {hint}")
