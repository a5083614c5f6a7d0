"""Shared-memory payloads between a switch and the workers on its host: the allocator, the arena, and real
switches carrying channels through it, falling back to the socket, and refusing a worker that misuses it."""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml
import zmq
import zmq.auth

from nebula.channel import ChannelError, Endpoint
from nebula.wire import ChannelKey, FrameType, WireError, decode_frame, encode_frame
from nebula.wire.shm import SHM_MIN_BYTES, SHM_TAG, Arena, Ring, pack_desc, unpack_desc
from security.curve import local_password
from switch_server.framestream import OWN_BUFFER_BYTES
from tests.switch.conftest import worker_yaml, worker_yaml_as

# ---- the allocator ----
from testbed.federation import edit_yaml, start_switch


def test_ring_reuses_space_in_order_and_refuses_what_does_not_fit():
    r = Ring(100)
    a, b, c = r.alloc(40), r.alloc(40), r.alloc(30)
    assert (a, b, c) == (0, 40, None)  # 20 bytes left at the end: not enough
    assert r.alloc(20) == 80 and r.used == 100
    assert r.free(b) and r.alloc(10) is None  # b is free, but a (older) still holds the ring's tail
    assert r.free(a) and r.used == 20
    assert r.alloc(70) == 0  # wraps to the start, now that a and b are both free
    assert r.alloc(11) is None and r.alloc(10) == 70
    assert not r.free(55) and not r.free(a + 1000)  # no allocation there: a stale or forged release
    assert r.alloc(0) is None and r.alloc(101) is None
    for off in (80, 0, 70):
        assert r.free(off)
    assert r.used == 0 and r.alloc(100) == 0  # empty again: the whole ring


def test_ring_never_hands_out_overlapping_regions():
    rng = random.Random(7)
    r = Ring(1 << 16)
    live: dict[int, int] = {}
    for _ in range(20000):
        if live and rng.random() < 0.45:
            off = rng.choice(list(live))
            assert r.free(off)
            del live[off]
            continue
        n = rng.choice([1, 100, 4096, 20000, 40000])
        off = r.alloc(n)
        if off is None:
            continue
        assert 0 <= off and off + n <= r.size
        for o, m in live.items():
            assert off + n <= o or o + m <= off, f"[{off},{off + n}) overlaps [{o},{o + m})"
        live[off] = n
        assert r.used == sum(live.values())


# ---- the arena ----


def test_arena_is_shared_sealed_and_checked():
    arena = Arena.create(1 << 20)
    try:
        mapped = Arena.open(os.getpid(), arena.fd, arena.token, 1 << 20)
        mapped.up[5:10] = b"hello"
        assert bytes(arena.up[5:10]) == b"hello"
        arena.down[0:3] = b"abc"
        assert bytes(mapped.region(mapped.down, 0, 3)) == b"abc"
        with pytest.raises(WireError, match="outside the arena"):
            mapped.region(mapped.up, (1 << 20) - 2, 3)
        with pytest.raises(OSError, match="not the arena"):
            Arena.open(os.getpid(), arena.fd, arena.token ^ 2, 1 << 20)
        with pytest.raises(OSError, match="announced"):
            Arena.open(os.getpid(), arena.fd, arena.token, 1 << 19)
        fd = os.open(f"/proc/{os.getpid()}/fd/{arena.fd}", os.O_RDWR)
        try:
            with pytest.raises(PermissionError):  # sealed: a worker cannot shrink it under the switch's feet
                os.ftruncate(fd, 4096)
        finally:
            os.close(fd)
    finally:
        arena.close_fd()
    assert unpack_desc(pack_desc(3, 4, 5)) == (3, 4, 5)
    with pytest.raises(WireError, match="descriptor has 3 bytes"):
        unpack_desc(b"abc")


# ---- through real switches ----


def _status(sw, pred, timeout_s: float = 20.0) -> dict:
    """The switch's status.json once `pred` holds for it (it is rewritten every second)."""
    path = sw.config.parent / "state" / "status.json"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            st = json.loads(path.read_text())
            if pred(st):
                return st
        except (OSError, ValueError):
            st = None
        if time.monotonic() > deadline:
            raise AssertionError(f"status of {sw.cluster} never matched: {st}")
        time.sleep(0.2)


@pytest.mark.parametrize("transport", ["unix", "ipc"])
def test_same_host_workers_move_payloads_through_shared_memory(two_switches, tmp_path, transport):
    """Over the stream socket and over ZeroMQ's IPC endpoint alike."""
    fed, a, b = two_switches
    rng = random.Random(3)
    sizes = [0, 100, SHM_MIN_BYTES - 1, SHM_MIN_BYTES, 9000, 300_000, 700_000] * 3
    wa, wb = (worker_yaml_as(fed, c, tmp_path / f"{c}.yaml", transport=transport) for c in "AB")
    with Endpoint.connect(wa, job="j", rank=0) as ea, Endpoint.connect(wb, job="j", rank=1) as eb:
        assert ea._io.transport == eb._io.transport == transport
        ca, cb = ea.channel("B", 1, "s"), eb.channel("A", 0, "s")
        for src, dst in ((ca, cb), (cb, ca)):
            msgs = [rng.randbytes(n) for n in sizes]
            for m in msgs:  # one at a time: messages queued together would share batch frames
                src.send(m, lane=rng.choice(["activation", "bulk"])).result(timeout=60)
            assert [dst.recv(timeout_s=60) for _ in msgs] == msgs
        # the fixture's 256 KiB chunks split the larger messages; every chunk of at least SHM_MIN_BYTES went
        # through the arenas, up at the sending switch and down at the receiving one; every frame of at least
        # OWN_BUFFER_BYTES was decrypted straight into the receiving worker's arena
        chunks = [min(256 * 1024, n - i) for n in sizes for i in range(0, n, 256 * 1024)]
        shm = sum(c for c in chunks if c >= SHM_MIN_BYTES)
        placed = sum(c for c in chunks if c >= OWN_BUFFER_BYTES)
        assert 0 < placed < shm
        for sw in (a, b):
            st = _status(sw, lambda s: s["shm_bytes"]["in"] >= shm and s["shm_bytes"]["out"] >= shm)
            assert st["shm_workers"] == 1 and st["shm_bytes"] == {"in": shm, "out": shm, "placed": placed}


def test_shared_memory_off_or_too_small_falls_back_to_the_socket(procs, federation):
    # 2 MiB chunks; switch A offers arenas of 1 MiB per direction, which a 1.5 MiB chunk cannot use; switch B
    # offers none
    edit_yaml(Path(federation["clusters"]["A"]["switch_yaml"]),
              lambda d: (d["local"].update(shm_bytes=1 << 20), d["link"].update(chunk_bytes=2 << 20)))
    edit_yaml(Path(federation["clusters"]["B"]["switch_yaml"]),
              lambda d: (d["local"].update(shm_bytes=0), d["link"].update(chunk_bytes=2 << 20)))
    a = start_switch(procs, Path(federation["clusters"]["A"]["switch_yaml"]))
    b = start_switch(procs, Path(federation["clusters"]["B"]["switch_yaml"]))
    big, small = os.urandom(1_500_000), os.urandom(500_000)
    with Endpoint.connect(worker_yaml(federation, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(federation, "B"), job="j", rank=0) as eb:
        ca, cb = ea.channel("B", 0, "f"), eb.channel("A", 0, "f")
        for m in (big, small, big):
            ca.send(m)
        assert [cb.recv(timeout_s=60) for _ in range(3)] == [big, small, big]
        cb.send(big)
        assert ca.recv(timeout_s=60) == big
    st = _status(a, lambda s: s["shm_bytes"]["in"] >= len(small))
    assert st["shm_bytes"] == {"in": len(small), "out": 0, "placed": 0}
    assert _status(b, lambda s: True)["shm_bytes"] == {"in": 0, "out": 0, "placed": 0}


def test_full_arena_sends_through_the_socket_without_loss(procs, federation):
    """A slow link keeps switch A holding the regions of frames it has not sent yet: the worker's small arena
    fills, the worker waits a little for releases, then sends through the socket, and nothing is lost."""
    edit_yaml(Path(federation["clusters"]["A"]["switch_yaml"]),
              lambda d: (d["local"].update(shm_bytes=1 << 20), d["link"].update(shape={"rate_mbit": 40.0})))
    a = start_switch(procs, Path(federation["clusters"]["A"]["switch_yaml"]))
    start_switch(procs, Path(federation["clusters"]["B"]["switch_yaml"]))
    msgs = [os.urandom(250_000) for _ in range(24)]
    with Endpoint.connect(worker_yaml(federation, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(federation, "B"), job="j", rank=0) as eb:
        ca, cb = ea.channel("B", 0, "full"), eb.channel("A", 0, "full")
        for m in msgs:
            ca.send(m, lane="bulk")
        assert [cb.recv(timeout_s=60) for _ in msgs] == msgs
    st = _status(a, lambda s: s["shm_bytes"]["in"] > 0)
    assert 0 < st["shm_bytes"]["in"] < sum(map(len, msgs))


def test_worker_without_shared_memory_keeps_the_socket(two_switches, tmp_path):
    fed, a, b = two_switches
    data = yaml.safe_load(Path(worker_yaml(fed, "A")).read_text())
    data.update(curve_key=str(Path(worker_yaml(fed, "A")).parent / data["curve_key"]), shared_memory=False)
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(data))
    payload = os.urandom(100_000)
    with Endpoint.connect(tmp_path / "plain.yaml", job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=0) as eb:
        ea.channel("B", 0, "p").send(payload)
        assert eb.channel("A", 0, "p").recv(timeout_s=30) == payload
        st = _status(a, lambda s: s["workers"] == 1)
        assert st["shm_workers"] == 0 and st["shm_bytes"]["in"] == 0


class _RawIPCWorker:
    """A hand-driven worker on switch A's IPC endpoint, to send what a well-behaved endpoint never would."""

    def __init__(self, fed) -> None:
        file = Path(worker_yaml(fed, "A"))
        cfg = yaml.safe_load(file.read_text())
        public, secret = zmq.auth.load_certificate(file.parent / cfg["curve_key"])
        self.account = cfg["account"]
        s = self.sock = zmq.Context.instance().socket(zmq.DEALER)
        s.linger = 0
        s.rcvtimeo = 10000
        s.plain_username = public
        s.plain_password = local_password(secret.decode(), cfg["switch_curve_public_key"]).encode()
        s.connect(cfg["ipc_endpoint"])

    def next(self, ftype: FrameType):
        while True:
            parts = self.sock.recv_multipart()
            f = decode_frame(parts[0], parts[1] if len(parts) == 2 else b"")
            if f.type == ftype:
                return f

    def hello(self, token: int) -> None:
        meta = {"job": "j", "rank": 7, "account": self.account, "name": "worker", "shm": token}
        if getattr(self, "inc", 0):
            meta["inc"] = self.inc
        self.sock.send(encode_frame(FrameType.HELLO, meta))

    def welcome(self):
        """The next WELCOME; its incarnation is ours from now on."""
        f = self.next(FrameType.WELCOME)
        self.inc = f.meta["inc"]
        return f

    def send_desc(self, key: ChannelKey, n: int, token: int, off: int, seq: int = 1) -> None:
        head = encode_frame(FrameType.DATA, {**key.to_meta(), "inc": self.inc}, b"\0" * n, channel_id=key.id, seq=seq)
        self.sock.send_multipart([head, SHM_TAG, pack_desc(token, off, n)])


def test_arena_misuse_is_refused_and_the_switch_keeps_serving(two_switches):
    fed, a, b = two_switches
    w = _RawIPCWorker(fed)
    try:
        w.hello(0)
        offer = w.welcome().meta["shm"]
        arena = Arena.open(offer["pid"], offer["fd"], offer["token"], offer["bytes"])
        w.hello(arena.token)
        w.welcome()
        key = ChannelKey("j", w.account, "A", 7, "B", 0, "raw")
        # a region outside the arena: refused, naming the channel, so the sender's message fails
        w.send_desc(key, 100_000, arena.token, offer["bytes"] - 10)
        err = w.next(FrameType.ERROR).meta
        assert err["code"] == "bad_shm" and "outside the arena" in err["message"] and err["channel"]["name"] == "raw"
        # a malformed descriptor
        w.sock.send_multipart([encode_frame(FrameType.DATA, key.to_meta(), b"x", channel_id=key.id), SHM_TAG, b"xyz"])
        assert w.next(FrameType.ERROR).meta["code"] == "bad_shm"
        w.sock.send_multipart([encode_frame(FrameType.DATA, key.to_meta(), b"x", channel_id=key.id), b"x", b"y", b"z"])
        err = w.next(FrameType.ERROR).meta
        assert err["code"] == "bad_parts" and "got 4 parts" in err["message"]
        with Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=0) as eb:
            rx = eb.channel("A", 7, "raw")
            # another arena's token (as after a switch restart): dropped without a word, nothing delivered
            w.send_desc(key, 20_000, arena.token ^ 6, 0)
            with pytest.raises(TimeoutError):
                rx.recv(timeout_s=1.0)
            # a sound one is relayed, and its region handed back once the peer switch has it
            payload = os.urandom(20_000)
            arena.up[4096 : 4096 + len(payload)] = payload
            w.send_desc(key, len(payload), arena.token, 4096)
            assert rx.recv(timeout_s=30) == payload
            rel = w.next(FrameType.SHM_RELEASE).meta
            assert rel == {"token": arena.token, "offsets": [4096]}
    finally:
        w.sock.close(0)
    # and real workers are served as before
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=0) as eb:
        ea.channel("B", 0, "ok").send(b"y" * 50_000)
        assert eb.channel("A", 0, "ok").recv(timeout_s=30) == b"y" * 50_000


def test_shm_release_frames_are_checked():
    with pytest.raises(WireError, match="offsets"):
        decode_frame(encode_frame(FrameType.SHM_RELEASE, {"token": 1, "offsets": [1, -2]}))
    with pytest.raises(WireError, match="token"):
        decode_frame(encode_frame(FrameType.SHM_RELEASE, {"offsets": []}))


def test_restarted_switch_offers_a_new_arena_and_nothing_is_lost(procs, federation):
    a = start_switch(procs, Path(federation["clusters"]["A"]["switch_yaml"]))
    start_switch(procs, Path(federation["clusters"]["B"]["switch_yaml"]))
    msgs = [os.urandom(200_000 + i) for i in range(40)]
    with Endpoint.connect(worker_yaml(federation, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(federation, "B"), job="j", rank=0) as eb:
        ca, cb = ea.channel("B", 0, "r"), eb.channel("A", 0, "r")
        for m in msgs[:20]:
            ca.send(m)
        first = ea._io.shm.arena.token
        a.kill9()
        a = start_switch(procs, a.config)
        for m in msgs[20:]:
            ca.send(m)
        assert [cb.recv(timeout_s=90) for _ in msgs] == msgs
        assert ea._io.shm.arena is not None and ea._io.shm.arena.token != first
        assert _status(a, lambda s: s["shm_bytes"]["in"] > 0)["shm_workers"] >= 1
    with pytest.raises(ChannelError):
        ca.send(b"closed").result(timeout=5)


def _arena_rss(pid: int) -> int:
    """Bytes of a process's shared-memory arenas resident in its memory (its smaps)."""
    total, inside = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):  # a mapping's first line; its fields follow
            inside = "nebula-shm-" in line
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def test_arenas_past_the_memory_budget_give_freed_pages_back(procs, federation):
    """Three workers move 4.8 MB through switch A's arenas, more than its link.memory_cap_bytes (2 MiB): once their
    pages in memory pass it, every region handed back returns its pages at once, so the arenas end up holding
    about the budget, and every message arrived."""
    edit_yaml(Path(federation["clusters"]["A"]["switch_yaml"]),
              lambda d: (d["local"].update(shm_bytes=1 << 20), d["link"].update(memory_cap_bytes=2 << 20)))
    a = start_switch(procs, Path(federation["clusters"]["A"]["switch_yaml"]))
    start_switch(procs, Path(federation["clusters"]["B"]["switch_yaml"]))
    msgs = [os.urandom(200_000) for _ in range(4)]
    with Endpoint.connect(worker_yaml(federation, "B"), job="j", rank=9) as eb:
        eps = [Endpoint.connect(worker_yaml(federation, "A"), job="j", rank=r) for r in range(3)]
        try:
            assert all(ep._io.shm.arena is not None for ep in eps)
            for r, ep in enumerate(eps):  # up through each worker's arena, and down through it
                for m in msgs:
                    ep.channel("B", 9, f"c{r}").send(m)
                    eb.channel("A", r, f"c{r}").send(m)
            for r, ep in enumerate(eps):
                assert [eb.channel("A", r, f"c{r}").recv(timeout_s=60) for _ in msgs] == msgs
                assert [ep.channel("B", 9, f"c{r}").recv(timeout_s=60) for _ in msgs] == msgs
            st = _status(a, lambda s: s["shm_bytes"]["in"] >= 3 * sum(map(len, msgs))
                         and s["shm_bytes"]["out"] >= 3 * sum(map(len, msgs)))
            assert st["shm_workers"] == 3
            deadline = time.monotonic() + 30
            limit = (2 << 20) + 256 * 1024  # (the budget, and pages that regions share at their ends)
            while _arena_rss(a.proc.pid) > limit and time.monotonic() < deadline:
                time.sleep(0.1)  # (regions come back in batches, once the peer link has them)
            assert _arena_rss(a.proc.pid) <= limit
        finally:
            for ep in eps:
                ep.close(flush_s=0)


_RECEIVER = """
import hashlib, sys
from nebula.channel import Endpoint
with Endpoint.connect(sys.argv[1], job="lag", rank=0) as ep:
    ch = ep.channel("A", 0, "lag")
    print("ready", flush=True)
    got = [ch.recv(timeout_s=60) for _ in range(int(sys.argv[2]))]
    print(hashlib.sha256(b"".join(got)).hexdigest(), flush=True)
"""


@pytest.mark.parametrize("transit_bytes,all_placed", [(1 << 20, True), (1 << 30, False)])
def test_a_receiver_that_falls_behind_keeps_its_switch_on_the_arena_path(procs, federation, transit_bytes,
                                                                           all_placed):
    """Frames for a worker are decrypted into its arena (4 MiB a direction here) unless the arena is full; then the
    switch decrypts them into its own memory and copies them again, the costlier the further the worker lags. A
    sender keeps at most `transit_bytes` on its way (sent, not yet received): with 1 MiB, a receiver stopped while
    10 MiB are sent still gets every frame through its arena; with 1 GiB, not."""
    edit_yaml(Path(federation["clusters"]["B"]["switch_yaml"]), lambda d: d["local"].update(shm_bytes=4 << 20))
    start_switch(procs, Path(federation["clusters"]["A"]["switch_yaml"]))
    b = start_switch(procs, Path(federation["clusters"]["B"]["switch_yaml"]))
    msgs = [os.urandom(256 * 1024) for _ in range(40)]
    rx = procs.start([sys.executable, "-c", _RECEIVER, worker_yaml(federation, "B"), str(len(msgs))])
    assert rx.stdout.readline().strip() == "ready"
    with Endpoint.connect(worker_yaml(federation, "A"), job="lag", rank=0, window_bytes=1 << 30,
                          transit_bytes=transit_bytes) as ea:
        tx = ea.channel("B", 0, "lag")
        os.kill(rx.pid, signal.SIGSTOP)  # (shorter than the 3 s after which a silent rank is let go)
        try:
            futs = [tx.send(m, lane="bulk") for m in msgs]
            time.sleep(1.5)  # the lag under test: the receiver stays stopped this long while the sends pile up
        finally:
            os.kill(rx.pid, signal.SIGCONT)
        assert rx.stdout.readline().strip() == hashlib.sha256(b"".join(msgs)).hexdigest()
        assert all(f.result(timeout=30) is None for f in futs)
    done, total = time.time(), sum(map(len, msgs))
    status = b.config.parent / "state" / "status.json"
    st = _status(b, lambda s: status.stat().st_mtime > done + 0.1)  # (written after the last frame went)
    assert (st["shm_bytes"]["placed"] == total) is all_placed, st["shm_bytes"]
