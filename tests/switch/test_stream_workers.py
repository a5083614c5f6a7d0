"""Workers on the switch's Unix stream socket (`transport: auto` on the switch's host, or `unix`): the IPC
credentials without ZeroMQ, against real switches. A connection that does not authenticate first, or breaks the
framing, or announces a message over the bound is ended and audited, and the switch keeps serving the rest."""
from __future__ import annotations

import socket
import struct
import weakref
from collections import deque
from pathlib import Path

import pytest
import yaml
import zmq.auth

from nebula.channel import Endpoint
from nebula.config import stream_path
from nebula.wire import FrameType, decode_frame, encode_frame
from nebula.wire.stream import AUTH, AUTH_NO, AUTH_OK, MessageParser, frame_parts
from security.curve import local_password
from switch_server.localstream import AUTH_WITHIN_S, MAX_UNPROVEN
from testbed.federation import wait_audit
from tests.switch.conftest import exchange, worker_yaml


def _raw(fed, cluster: str) -> socket.socket:
    path = stream_path(yaml.safe_load(Path(worker_yaml(fed, cluster)).read_text())["ipc_endpoint"])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect("\0" + path[1:] if path.startswith("@") else path)
    return s


def _send(s: socket.socket, parts: list[bytes]) -> None:
    s.sendall(b"".join(bytes(p) for p in frame_parts(parts)))


# per raw connection: its parser and the messages read but not yet taken (one recv may bring several)
_streams: weakref.WeakKeyDictionary[socket.socket, tuple[MessageParser, deque]] = weakref.WeakKeyDictionary()


def _read(s: socket.socket) -> list[bytes] | None:
    """The next message, or None when the switch closed the connection."""
    parser, ready = _streams.setdefault(s, (MessageParser(1 << 24), deque()))
    while not ready:
        buf = parser.buffer()
        try:
            n = s.recv_into(buf)
        except ConnectionResetError:  # (aborted: unread bytes of ours made it a reset)
            return None
        if n == 0:
            return None
        ready.extend([bytes(p) for p in msg] for msg in parser.taken(n))
    return ready.popleft()


def _until_closed(s: socket.socket, limit: int = 100) -> list[list[bytes]]:
    """The messages the switch still sends before it closes the connection; fails if it keeps it open."""
    late = []
    for _ in range(limit):
        msg = _read(s)
        if msg is None:
            return late
        late.append(msg)
    raise AssertionError(f"the switch kept the connection open through {limit} messages")


def _credentials(fed, cluster: str) -> tuple[bytes, bytes]:
    wy = Path(worker_yaml(fed, cluster))
    doc = yaml.safe_load(wy.read_text())
    public, secret = zmq.auth.load_certificate(wy.parent / doc["curve_key"])
    return public, local_password(secret.decode(), doc["switch_curve_public_key"]).encode()


def test_provisioned_same_host_workers_take_the_stream_socket(two_switches):
    """Provisioned workers on the switches' host connect over the stream socket (audited as such, naming the
    process the kernel vouches for) and carry messages both ways, through shared memory and inline."""
    fed, a, b = two_switches
    assert exchange(worker_yaml(fed, "A"), worker_yaml(fed, "B")) == ("unix", "unix")
    rec = wait_audit(a, lambda r: r["action"] == "worker_accepted")
    assert rec["detail"]["transport"] == "unix" and rec["target"].startswith("unix:pid ")


@pytest.mark.parametrize("first", [[b"HELLO"], [AUTH, b"k" * 40, b"wrong"]])
def test_a_connection_that_does_not_authenticate_is_answered_closed_and_audited(two_switches, first):
    fed, a, _b = two_switches
    s = _raw(fed, "A")
    try:
        _send(s, first)
        answer = _read(s)
        assert answer is not None and answer[0] == AUTH_NO and b"unknown key" in answer[1]
        assert _read(s) is None  # closed
    finally:
        s.close()
    rec = wait_audit(a, lambda r: r["action"] == "worker_rejected")
    assert rec["outcome"] == "denied" and rec["target"].startswith("unix:pid ")


def test_a_message_over_the_bound_ends_only_that_connection_audited(two_switches):
    """An authenticated connection announcing a message far over the socket's bound is closed before the
    message is read (audited as connection_dropped, transport unix); a frame before it was handled, and another
    worker on the same socket goes on."""
    fed, a, _b = two_switches
    s = _raw(fed, "A")
    try:
        _send(s, [AUTH, *_credentials(fed, "A")])
        answer = _read(s)
        assert answer == [AUTH_OK, b"worker/nebula"]
        _send(s, [encode_frame(FrameType.HELLO, {"job": "j", "rank": 3, "account": "nebula", "name": "worker"})])
        assert _read(s) is not None  # WELCOME: the connection works
        s.sendall(struct.pack(">IB", 1 << 30, 2))  # 1 GiB announced
        late = _until_closed(s)  # (its heartbeat answers may still come before the close)
        assert all(decode_frame(m[0]).type == FrameType.WELCOME for m in late), late
    finally:
        s.close()
    rec = wait_audit(a, lambda r: r["action"] == "connection_dropped")
    assert rec["detail"]["transport"] == "unix" and rec["detail"]["peer"].startswith("pid ")
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=0) as eb:
        ea.channel("B", 0, "ok").send(b"still fine")
        assert eb.channel("A", 0, "ok").recv(timeout_s=30) == b"still fine"


def test_more_than_an_auth_before_authenticating_ends_the_connection_audited(two_switches):
    """Before it has authenticated a connection may send an AUTH's few bytes, no more: a larger first message
    ends it (connection_dropped, audited) before the switch buffers it."""
    fed, a, _b = two_switches
    s = _raw(fed, "A")
    try:
        _send(s, [b"x" * 100_000])
        assert _read(s) is None
    finally:
        s.close()
    rec = wait_audit(a, lambda r: r["action"] == "connection_dropped")
    assert rec["detail"]["transport"] == "unix" and rec["outcome"] == "denied"


def test_connections_that_do_not_authenticate_are_bounded_in_number(two_switches):
    """Connections that never authenticate hold a switch's descriptors only so many at once (MAX_UNPROVEN: the
    next is ended as it comes); a worker that authenticates meanwhile is served."""
    fed, _a, _b = two_switches
    idle = [_raw(fed, "A") for _ in range(MAX_UNPROVEN)]
    try:
        extra = _raw(fed, "A")
        assert _read(extra) is None  # ended at once
        extra.close()
    finally:
        for s in idle:
            s.close()
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=0) as eb:
        ea.channel("B", 0, "ok").send(b"still fine")
        assert eb.channel("A", 0, "ok").recv(timeout_s=30) == b"still fine"


@pytest.mark.slow
def test_a_connection_that_does_not_authenticate_in_time_is_ended(two_switches):
    """A connection that sends nothing is ended once AUTH_WITHIN_S has passed, and a worker is served after."""
    fed, _a, _b = two_switches
    s = _raw(fed, "A")
    try:
        s.settimeout(AUTH_WITHIN_S + 10)
        assert _read(s) is None
    finally:
        s.close()
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=0) as ea:
        assert ea._io.transport == "unix"


def test_small_messages_of_one_loop_turn_go_to_the_worker_in_one_write_and_in_order():
    """A receiving switch tells its worker of each frame (head and shared-memory descriptor, a few dozen bytes):
    those of one turn of the event loop leave in one write, a large message goes after what waits, and the worker
    reads every message in the order sent."""
    import asyncio

    from switch_server.localstream import COALESCE_BYTES, StreamWorkers, _Conn

    small = [[b"head-%d" % i, b"SHM", b"d" * 24] for i in range(3)]
    large = [b"head-large", b"x" * (COALESCE_BYTES + 1)]
    last = [b"head-last", b"SHM", b"e" * 24]

    async def main() -> tuple[list[int], list[list[bytes]]]:
        ours, worker = socket.socketpair()
        workers = StreamWorkers(lambda *a: None, lambda parts: None, lambda: False, lambda ident: None,
                                lambda: 1 << 20, lambda *a: None)
        conn = _Conn(workers, b"\x01w")
        await asyncio.get_running_loop().connect_accepted_socket(lambda: conn, ours)
        workers.conns[conn.ident] = conn
        writes: list[int] = []  # payload bytes of each write the transport was asked for
        write, writelines = conn.transport.write, conn.transport.writelines
        inside = []  # (a transport's writelines may call its write: one write all the same)

        def counted_write(data) -> None:
            if not inside:
                writes.append(len(data))
            write(data)

        def counted_writelines(parts) -> None:
            writes.append(sum(len(p) for p in parts))
            inside.append(1)
            try:
                writelines(parts)
            finally:
                inside.pop()

        conn.transport.write, conn.transport.writelines = counted_write, counted_writelines
        for msg in [*small, large, last]:  # (one callback: one turn of the loop)
            workers.send_multipart([conn.ident, *msg])
        assert writes[:1] == [sum(len(p) for m in small for p in frame_parts(m))]  # the three small ones, at once
        await asyncio.sleep(0.05)
        worker.settimeout(5)
        got = [_read(worker) for _ in range(5)]
        conn.transport.close()
        await asyncio.sleep(0.01)
        assert _read(worker) is None  # nothing more came
        return writes, got

    writes, got = asyncio.run(main())
    assert len(writes) == 3  # the small ones, the large one, the last small one: not five
    assert got == [*small, large, last]


def test_a_stream_of_small_messages_leaves_nothing_for_the_cyclic_collector(two_switches):
    """What a sending worker keeps per message in flight (its message, its future, the batch frames that carried
    it) is freed by reference counting once acknowledged: a reference cycle per batch would be left to full
    collections, whose cost grows with all a stream keeps in flight."""
    import gc

    from nebula.channel.sender import OutBatch, OutMessage
    from nebula.channel.sendfuture import SendFuture

    fed, _, _ = two_switches
    kinds = (OutMessage, OutBatch, SendFuture)
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=0) as eb:
        tx, rx = ea.channel("B", 0, "gc"), eb.channel("A", 0, "gc")
        msgs = [bytes([i % 251]) * 16384 if i % 2 else bytearray([i % 251]) * 4096 for i in range(600)]
        gc.collect()
        gc.disable()  # (what the stream leaves unreachable stays for the look below)
        try:
            futures = [tx.send(m) for m in msgs]  # (back to back: small messages share batch frames)
            assert [rx.recv(timeout_s=30) for _ in msgs] == msgs
            assert ea.flush(timeout_s=30) and all(f.done() and f.exception() is None for f in futures)
            del futures
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            left = [o for o in gc.garbage if isinstance(o, kinds)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert ea._io.transport == "unix"
        assert left == [], f"{len(left)} objects of a send were freed only by the collector"
