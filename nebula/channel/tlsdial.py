"""One attempt to reach a switch's TLS endpoint for workers without blocking the worker's I/O thread.

The I/O thread must keep serving its application while a switch is down or far away, so the TCP connect and the
TLS handshake advance a step at a time, whenever the thread polls: `TLSDial.step()` returns the connected,
verified socket once there is one. A connection that is refused, reset or too slow is worth another try later;
a handshake that fails on a certificate (ours refused, the switch's unverifiable or of another identity) is not,
and says so with the reason.
"""
from __future__ import annotations

__all__ = ["CONNECT_TIMEOUT_S", "DialFailed", "TLSDial", "certificate_refused"]

import errno
import select
import socket
import ssl
import time
from typing import Callable

CONNECT_TIMEOUT_S = 10.0  # for the TCP connect and the TLS handshake together


class DialFailed(Exception):
    """This attempt failed; `fatal` when trying again cannot help (a certificate was refused)."""

    def __init__(self, reason: str, fatal: bool) -> None:
        super().__init__(reason)
        self.fatal = fatal


def certificate_refused(exc: ssl.SSLError) -> bool:
    """Whether a TLS error is about a certificate (ours or the switch's), not about the connection."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return True
    reason = (exc.reason or "").upper()
    return "CERTIFICATE" in reason or "ALERT" in reason and "CLOSE_NOTIFY" not in reason


class TLSDial:
    """Connect to (host, port), then run the TLS handshake with `ctx`; `verify(sock)` checks the switch's identity
    and returns what is wrong with it ("" when nothing)."""

    def __init__(self, host: str, port: int, ctx: ssl.SSLContext, verify: Callable[[ssl.SSLSocket], str],
                 timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.ctx, self.verify = ctx, verify
        self.deadline = time.monotonic() + timeout_s
        self.tls: ssl.SSLSocket | None = None
        self.wants_write = True  # (the connect completes when the socket turns writable)
        try:
            family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        except OSError as exc:
            raise DialFailed(f"cannot resolve {host}: {exc}", fatal=False) from None
        self.sock = socket.socket(family, kind, proto)
        self.sock.setblocking(False)
        err = self.sock.connect_ex(addr)
        if err not in (0, errno.EINPROGRESS):
            self.close()
            raise DialFailed(f"connect: {errno.errorcode.get(err, err)}", fatal=False)

    def fileno(self) -> int:
        """What the I/O thread polls while dialling."""
        return (self.tls or self.sock).fileno()

    def step(self) -> ssl.SSLSocket | None:
        """Advance as far as possible without blocking: the socket when connected and verified, None while
        waiting; DialFailed when this attempt is over."""
        if time.monotonic() > self.deadline:
            self.close()
            raise DialFailed("no TLS handshake within the time allowed", fatal=False)
        if self.tls is None:
            if not select.select([], [self.sock], [], 0)[1]:
                return None
            err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self.close()
                raise DialFailed(f"connect: {errno.errorcode.get(err, err)}", fatal=False)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # the switch is named by the identity in its certificate (`verify`), not by host name
            self.tls = self.ctx.wrap_socket(self.sock, do_handshake_on_connect=False, server_hostname=None)
        try:
            self.tls.do_handshake()
        except ssl.SSLWantReadError:
            self.wants_write = False
            return None
        except ssl.SSLWantWriteError:
            self.wants_write = True
            return None
        except ssl.SSLError as exc:
            self.close()
            raise DialFailed(f"TLS handshake: {exc.reason or exc}", fatal=certificate_refused(exc)) from None
        except OSError as exc:
            self.close()
            raise DialFailed(f"TLS handshake: {exc}", fatal=False) from None
        wrong = self.verify(self.tls)
        if wrong:
            self.close()
            raise DialFailed(wrong, fatal=True)
        tls, self.tls = self.tls, None
        return tls

    def close(self) -> None:
        """Give up this attempt."""
        (self.tls or self.sock).close()
