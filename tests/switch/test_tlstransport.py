"""switch_server.tlstransport: OpenSSL on the socket itself, driven by the event loop, over real loopback TLS."""
from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import ssl
from pathlib import Path

import pytest

from security.tls import client_context, server_context
from switch_server.tlstransport import Listener, accept_tls, open_connection


def _contexts(fed: dict) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    def files(c: str) -> list[str]:
        d = Path(fed["clusters"][c]["dir"])
        return [str(d / "../ca/ca.pem"), str(d / "switch.pem"), str(d / "switch.key"), str(d / "../ca/crl.pem")]
    return server_context(*files("A")), client_context(*files("B"))


class Sink(asyncio.BufferedProtocol):
    """Hashes what arrives; pauses reading after every buffer and resumes a moment later (a slow consumer)."""

    def __init__(self, slow: bool) -> None:
        self.buf = bytearray(100_000)  # not a multiple of the 16 KiB record size: records straddle reads
        self.digest = hashlib.sha256()
        self.got = 0
        self.slow = slow
        self.done = asyncio.get_running_loop().create_future()
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.buf)[: 1 + self.got % len(self.buf)]  # odd sizes too

    def buffer_updated(self, n: int) -> None:
        self.digest.update(self.buf[:n])
        self.got += n
        if self.slow:
            self.transport.pause_reading()
            asyncio.get_running_loop().call_later(0.0005, self.transport.resume_reading)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            self.done.set_result(exc)


class Source(asyncio.BufferedProtocol):
    """Counts pause/resume_writing calls and the bytes the peer sends back."""

    def __init__(self) -> None:
        self.pauses = self.resumes = self.received = 0
        self.transport = None
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(bytearray(1024))

    def buffer_updated(self, n: int) -> None:
        self.received += n

    def pause_writing(self) -> None:
        self.pauses += 1

    def resume_writing(self) -> None:
        self.resumes += 1

    def connection_lost(self, exc) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


@pytest.mark.parametrize("slow", [False, True])
def test_bytes_arrive_intact_through_flow_control(federation, slow):
    """Many writes of odd sizes (heads joined to payloads, views kept unjoined) arrive byte for byte, also when
    the reader keeps pausing (records OpenSSL decrypted before a pause are delivered after the resume); the writer
    is paused above the high-water mark and resumed below it; close() flushes before it closes."""
    sctx, cctx = _contexts(federation)

    async def main() -> None:
        sink = Sink(slow)
        accepted = []
        listener = Listener("127.0.0.1", 0, lambda conn, _peer: accepted.append(
            asyncio.create_task(accept_tls(conn, sctx, sink, 10))))
        src = Source()
        tr = await open_connection("127.0.0.1", listener.address()[1], cctx, src, 10)
        await asyncio.wait_for(asyncio.gather(*accepted), 10)
        assert tr.get_extra_info("ssl_object").version() in ("TLSv1.3", "TLSv1.2")
        rng = os.urandom(3 * 1024 * 1024)
        want = hashlib.sha256()
        pos = 0
        for size in [0, 1, 7, 16_384, 16_385, 65_536, 1_048_576, 3, 300_000] * 3:
            piece = memoryview(rng)[pos % 1_000_000 : pos % 1_000_000 + size]
            head = size.to_bytes(4, "big")
            tr.writelines([head, piece])
            want.update(head + bytes(piece))
            pos += size + 13
        total = sum(4 + s for s in [0, 1, 7, 16_384, 16_385, 65_536, 1_048_576, 3, 300_000] * 3)
        tr.close()
        assert tr.is_closing()
        await asyncio.wait_for(sink.done, 60)
        assert sink.got == total and sink.digest.hexdigest() == want.hexdigest()
        await asyncio.wait_for(src.lost, 10)
        assert src.pauses >= 1 and src.resumes == src.pauses  # megabytes were queued behind a 256 KiB mark
        listener.close()

    asyncio.run(main())


def test_plaintext_and_silent_clients_fail_the_handshake(federation):
    """A client that speaks no TLS gets an SSLError; one that says nothing times out; the listener keeps
    accepting, and a real client then connects."""
    sctx, cctx = _contexts(federation)

    async def main() -> None:
        results: list = []

        def on_conn(conn, _peer) -> None:
            async def run() -> None:
                try:
                    await accept_tls(conn, sctx, Source(), 0.5)
                    results.append("ok")
                except (ssl.SSLError, TimeoutError, ConnectionError) as exc:
                    results.append(type(exc).__name__)
            asyncio.create_task(run())

        listener = Listener("127.0.0.1", 0, on_conn)
        port = listener.address()[1]
        plain = socket.create_connection(("127.0.0.1", port))
        plain.sendall(b"GET / HTTP/1.0\r\n\r\n")
        silent = socket.create_connection(("127.0.0.1", port))
        for _ in range(100):
            if len(results) == 2:
                break
            await asyncio.sleep(0.05)
        assert sorted(results) == ["SSLError", "TimeoutError"]
        tr = await open_connection("127.0.0.1", port, cctx, Source(), 10)
        for _ in range(100):
            if len(results) == 3:
                break
            await asyncio.sleep(0.05)
        assert results[-1] == "ok"
        tr.abort()
        plain.close()
        silent.close()
        listener.close()

    asyncio.run(main())


def test_framestream_dispatch_and_serve(federation):
    """Frames queued before dispatch() go to the handler first and in order, later ones as they are parsed;
    serve() raises TimeoutError when the peer falls silent, and the handler's own exception when it raises
    (frames behind that one are not handled)."""
    from nebula.wire import FrameType, WireError, encode_frame
    from switch_server.framestream import FrameStream

    sctx, cctx = _contexts(federation)

    def ping(i: int) -> bytes:
        return encode_frame(FrameType.PING, {"t": i})

    async def main() -> None:
        streams: asyncio.Queue = asyncio.Queue()

        def on_conn(conn, _peer) -> None:
            async def run() -> None:
                stream = FrameStream(1 << 20)
                await accept_tls(conn, sctx, stream, 10)
                await streams.put(stream)
            asyncio.create_task(run())

        listener = Listener("127.0.0.1", 0, on_conn)
        port = listener.address()[1]

        # 1: queued, then dispatched, then idle
        client = await open_connection("127.0.0.1", port, cctx, Source(), 10)
        stream = await asyncio.wait_for(streams.get(), 10)
        client.writelines([ping(0), ping(1), ping(2)])
        while len(stream._frames) < 3:
            await asyncio.sleep(0.01)
        seen: list[int] = []
        stream.dispatch(lambda frame, head, payload: seen.append(frame.meta["t"]))
        assert seen == [0, 1, 2]
        client.write(ping(3) + ping(4))
        with pytest.raises(asyncio.TimeoutError):
            await stream.serve(0.5)
        assert seen == [0, 1, 2, 3, 4]
        client.abort()

        # 2: the handler refuses the second frame; the third is never handled
        client = await open_connection("127.0.0.1", port, cctx, Source(), 10)
        stream = await asyncio.wait_for(streams.get(), 10)
        handled: list[int] = []

        def strict(frame, head, payload) -> None:
            handled.append(frame.meta["t"])
            if frame.meta["t"] == 1:
                raise WireError("bad_type", "no second frame")

        stream.dispatch(strict)
        client.write(ping(0) + ping(1) + ping(2))
        with pytest.raises(WireError, match="no second frame"):
            await stream.serve(10)
        assert handled == [0, 1]
        client.abort()
        listener.close()

    asyncio.run(main())



@pytest.mark.parametrize("piece", [16_384, 1_000, 4 << 20])
def test_framestream_reads_large_payloads_where_its_placer_says(piece):
    """A placer names where a large frame's payload is read, whether the frame comes in records (`piece` bytes at
    a time) or is found whole in the staging buffer: the handler gets a view of that very buffer, byte for byte. A
    frame the placer declines, and a small one (never offered), gets a buffer of its own."""
    from nebula.wire import ChannelKey, FrameType, encode_frame
    from switch_server.framestream import OWN_BUFFER_BYTES, STAGING_BYTES, FrameStream

    key = ChannelKey("j", "acct", "B", 0, "A", 0, "s")
    sizes = [OWN_BUFFER_BYTES, 300_000, 100, 70_000, 1 << 20, OWN_BUFFER_BYTES + 1, 5, 40_000]
    payloads = [os.urandom(n) for n in sizes]
    offered: list[int] = []
    places: dict[int, bytearray] = {}

    def placer(frame, n: int):
        t = frame.header.seq
        offered.append(t)
        assert n == sizes[t] and frame.key() == key
        if t % 2:
            return None  # declined: read into a buffer of the stream's own
        places[t] = bytearray(n)
        return memoryview(places[t])

    got: list = []
    stream = FrameStream(2 << 20)
    stream.connection_made(type("Transport", (), {"pause_reading": lambda self: None})())
    stream.placer = placer
    stream.dispatch(lambda frame, head, payload: got.append((frame.header.seq, payload)))
    data = b"".join(encode_frame(FrameType.DATA, key.to_meta(), p, channel_id=key.id, seq=t) + p
                    for t, p in enumerate(payloads))
    pos = 0
    while pos < len(data):  # as TLS hands records to the protocol
        buf = stream.get_buffer(-1)
        n = min(len(buf), piece, len(data) - pos)
        buf[:n] = data[pos : pos + n]
        stream.buffer_updated(n)
        pos += n
    assert stream.error is None and [t for t, _ in got] == list(range(len(sizes)))
    for t, payload in got:
        assert bytes(payload) == payloads[t]
        assert (t in places) == (memoryview(payload).obj is places.get(t))  # read where the placer said
    assert offered == [t for t, n in enumerate(sizes) if n >= OWN_BUFFER_BYTES - 200]
    assert sorted(places) == [0, 4] and STAGING_BYTES < sizes[4]
