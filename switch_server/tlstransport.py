"""An asyncio transport over a non-blocking `ssl.SSLSocket`, for the peer links.

asyncio's own TLS transport runs OpenSSL over memory BIOs: every byte is copied into a BIO, out of it into a new
bytes object, and once more into the transport's buffer whenever the socket is full. Here OpenSSL reads and writes
the socket itself, and queued buffers are kept as views instead of being copied, which takes a large share of
the CPU a switch spends per relayed byte. It drives a `BufferedProtocol` (TLS decrypts straight into the
protocol's buffer) through the usual transport calls: write, writelines, pause/resume_reading, close, abort.

Buffers handed to `write` must not change until written: the peer link keeps them unchanged anyway, because it
holds them for retransmission until the peer acknowledges them.
"""
from __future__ import annotations

__all__ = ["Listener", "TLSTransport", "accept_tls", "handshake", "open_connection"]

import asyncio
import socket
import ssl
from collections import deque
from typing import Any, Callable

from nebula.wire.stream import tls_writes

# records decrypted per wake-up before other callbacks get a turn (16 KiB each: up to 1 MiB)
RECORDS_PER_WAKE = 64
# records read into the protocol's buffer before it is told (up to 256 KiB: about a quarter millisecond of
# decryption, so a small frame behind a large one waits little)
RECORDS_PER_UPDATE = 16
HIGH_WATER = 256 * 1024


class TLSTransport(asyncio.Transport):
    """Transport of one established TLS connection (handshake already done)."""

    def __init__(self, sock: ssl.SSLSocket, protocol: asyncio.BufferedProtocol, high_water: int = HIGH_WATER) -> None:
        super().__init__()
        self._loop = asyncio.get_running_loop()
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._buf: deque[memoryview] = deque()
        self._buf_bytes = 0
        self._high, self._low = high_water, high_water // 4
        self._protocol_paused = False
        self._reading = True
        self._writing = False  # a writer callback is registered
        self._write_wants_read = False  # (TLS 1.2 renegotiation only) the pending write waits for readability
        self._closing = False
        self._lost = False
        self._extra = {"ssl_object": sock, "socket": sock, "peername": _name(sock.getpeername),
                       "sockname": _name(sock.getsockname), "peercert": sock.getpeercert(), "cipher": sock.cipher()}
        protocol.connection_made(self)  # at once: the caller uses the protocol as soon as it has the transport
        self._loop.call_soon(self._start_reading)

    # ---- reading ----
    def _start_reading(self) -> None:
        if self._reading and not self._closing:
            self._loop.add_reader(self._fd, self._read_ready)
            self._read_ready()  # OpenSSL may already hold bytes that arrived with the handshake's last flight

    def _read_ready(self) -> None:
        if self._write_wants_read:
            self._write_wants_read = False
            self._write_ready()
        read, protocol = self._sock.read, self._protocol
        records = 0
        while records < RECORDS_PER_WAKE:
            if not self._reading or self._closing:
                return
            # OpenSSL returns one record per read: several fill the protocol's buffer before it looks at them, so
            # its Python work is paid per RECORDS_PER_UPDATE records, not per 16 KiB
            buf = protocol.get_buffer(-1)
            size, got, end = len(buf), 0, None
            try:
                for _ in range(RECORDS_PER_UPDATE):
                    n = read(size - got, buf[got:] if got else buf)
                    if n == 0:
                        end = "eof"
                        break
                    got += n
                    records += 1
                    if got >= size:
                        break
            except ssl.SSLWantReadError:
                end = "drained"
            except ssl.SSLWantWriteError:  # renegotiation wants to write first: retry once the socket drained
                self._loop.call_later(0.001, self._read_ready)
                end = "drained"
            except ssl.SSLZeroReturnError:  # the peer's close_notify
                end = "eof"
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                end = exc
            if got:
                try:
                    protocol.buffer_updated(got)
                except Exception as exc:  # a protocol bug must not leave a reader spinning on a dead stream
                    self._force_close(exc)
                    raise
            if end == "drained":
                return
            if end == "eof":
                self._eof()
                return
            if end is not None:
                self._force_close(end)
                return
        # OpenSSL may hold decrypted records the socket's readiness no longer announces
        self._loop.call_soon(self._read_ready)

    def _eof(self) -> None:
        self._loop.remove_reader(self._fd)
        self._reading = False
        try:
            keep_open = self._protocol.eof_received()
        except Exception as exc:
            self._force_close(exc)
            return
        if not keep_open:
            self.close()

    def pause_reading(self) -> None:
        if self._reading and not self._closing:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if not self._reading and not self._closing:
            self._reading = True
            self._loop.add_reader(self._fd, self._read_ready)
            self._loop.call_soon(self._read_ready)  # records decrypted before the pause are not signalled again

    def is_reading(self) -> bool:
        return self._reading

    # ---- writing ----
    def write(self, data: Any) -> None:
        if self._closing or not data:
            return
        view = data if isinstance(data, memoryview) else memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        self._buf.append(view)
        self._buf_bytes += len(view)
        if not self._writing:
            self._write_ready()
            if self._buf and not self._writing and not self._write_wants_read and not self._lost:
                self._writing = True
                self._loop.add_writer(self._fd, self._write_ready)
        self._check_high()

    def writelines(self, parts: Any) -> None:
        for data in tls_writes(list(parts)):
            self.write(data)

    def _write_ready(self) -> None:
        sock, buf = self._sock, self._buf
        while buf:
            view = buf[0]
            try:
                # all or nothing: OpenSSL keeps what it took of a refused write and wants the same bytes again
                sock.send(view)
            except ssl.SSLWantWriteError:
                return
            except ssl.SSLWantReadError:
                self._write_wants_read = True
                self._stop_writer()
                return
            except (OSError, ValueError) as exc:
                self._force_close(exc)
                return
            buf.popleft()
            self._buf_bytes -= len(view)
        self._stop_writer()
        if self._protocol_paused and self._buf_bytes <= self._low:
            self._protocol_paused = False
            self._protocol.resume_writing()
        if self._closing and not self._lost:
            self._connection_lost(None)

    def _stop_writer(self) -> None:
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self._fd)

    def _check_high(self) -> None:
        if not self._protocol_paused and self._buf_bytes > self._high:
            self._protocol_paused = True
            self._protocol.pause_writing()

    def get_write_buffer_size(self) -> int:
        return self._buf_bytes

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = HIGH_WATER if high is None else high
        self._low = self._high // 4 if low is None else low

    def can_write_eof(self) -> bool:
        return False

    # ---- closing ----
    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Close after what is queued has been written."""
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        if not self._buf:
            self._connection_lost(None)

    def abort(self) -> None:
        """Close now; queued bytes are dropped."""
        self._force_close(None)

    def _force_close(self, exc: BaseException | None) -> None:
        if self._lost:
            return
        self._closing = True
        self._buf.clear()
        self._buf_bytes = 0
        self._connection_lost(exc)

    def _connection_lost(self, exc: BaseException | None) -> None:
        self._lost = True
        self._loop.remove_reader(self._fd)
        self._stop_writer()
        self._loop.call_soon(self._finish, exc)

    def _finish(self, exc: BaseException | None) -> None:
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._sock.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def get_protocol(self) -> Any:
        return self._protocol


def _name(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except OSError:
        return None


async def handshake(sock: ssl.SSLSocket, timeout_s: float) -> None:
    """Run the TLS handshake of a non-blocking SSLSocket; TimeoutError after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    fd = sock.fileno()
    while True:
        try:
            sock.do_handshake()
            return
        except ssl.SSLWantReadError:
            add, remove = loop.add_reader, loop.remove_reader
        except ssl.SSLWantWriteError:
            add, remove = loop.add_writer, loop.remove_writer
        ready = loop.create_future()
        add(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await asyncio.wait_for(ready, max(0.0, deadline - loop.time()))
        finally:
            remove(fd)


async def _secure(raw: socket.socket, ctx: ssl.SSLContext, server_side: bool, protocol: asyncio.BufferedProtocol,
                  timeout_s: float, close_after_s: float = 0.0) -> TLSTransport:
    """Wrap a connected non-blocking socket, run the handshake, and connect `protocol`; closes it on failure (with
    `close_after_s`, gently: see `accept_tls`)."""
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = ctx.wrap_socket(raw, server_side=server_side, do_handshake_on_connect=False,
                               server_hostname=None)  # (the peer's identity is checked against the route table)
    except BaseException:
        raw.close()
        raise
    try:
        await handshake(sock, timeout_s)
    except BaseException:
        if not close_after_s:
            sock.close()
            raise
        try:  # (our alert, then FIN; the socket closes a moment later)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        asyncio.get_running_loop().call_later(close_after_s, sock.close)
        raise
    return TLSTransport(sock, protocol)


async def open_connection(host: str, port: int, ctx: ssl.SSLContext, protocol: asyncio.BufferedProtocol,
                          timeout_s: float) -> TLSTransport:
    """Dial `host:port`, complete the TLS handshake as a client, and connect `protocol` to the new transport."""
    loop = asyncio.get_running_loop()

    async def dial() -> TLSTransport:
        family, kind, proto, _, addr = (await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM))[0]
        raw = socket.socket(family, kind, proto)
        try:
            raw.setblocking(False)
            await loop.sock_connect(raw, addr)
        except BaseException:
            raw.close()
            raise
        return await _secure(raw, ctx, False, protocol, timeout_s)

    return await asyncio.wait_for(dial(), timeout_s)


async def accept_tls(conn: socket.socket, ctx: ssl.SSLContext, protocol: asyncio.BufferedProtocol,
                     timeout_s: float, close_after_s: float = 0.0) -> TLSTransport:
    """Complete the TLS handshake of an accepted connection as the server; the socket is closed on failure. With
    `close_after_s`, a refused handshake is closed gently: its alert (a revoked or unknown certificate) goes out
    followed by FIN, and the socket is closed that long after. Closed at once, with the client's first bytes
    unread, it would answer with RST, which can destroy the alert before the client reads why it was refused."""
    conn.setblocking(False)
    return await _secure(conn, ctx, True, protocol, timeout_s, close_after_s)


class Listener:
    """A listening TCP socket on the event loop; calls `on_conn(sock, address)` for each accepted connection."""

    def __init__(self, host: str, port: int, on_conn: Callable[[socket.socket, Any], None]) -> None:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
        self.sock = socket.socket(family, kind, proto)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(addr)
            self.sock.listen(128)
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise
        self.on_conn = on_conn
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(self.sock.fileno(), self._accept)

    def address(self) -> tuple[str, int]:
        """The bound (host, port)."""
        name = self.sock.getsockname()
        return name[0], name[1]

    def _accept(self) -> None:
        for _ in range(16):
            try:
                conn, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. out of file descriptors: try again on the next readiness
                return
            self.on_conn(conn, addr)

    def close(self) -> None:
        """Stop accepting."""
        if self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
