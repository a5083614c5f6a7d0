"""Abuse benchmark: the switches' peak RSS growth and a legitimate transfer's throughput while each flood runs.

Three clusters are provisioned on loopback; switches A and B run, and cluster C's certificate is the hostile peer
(an ordinary TLS client speaking the wire format). A legitimate probe (account `ops`, 64 KiB messages, B -> A, or
A -> B for the floods that share A's link to B) is timed alone, then while each flood runs; every flood is bounded
in count and time. Prints, side by side in one run: the larger RSS growth of switches A and B against their
memory cap, and the probe's throughput against its unloaded rate in the same direction (targets: growth <= the
cap, throughput >= 50%).

    .venv/bin/python benchmarks/abuse.py                 # a minute or two
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import ssl
import tempfile
import threading
import time
from pathlib import Path

import yaml

from nebula.channel import ChannelError, Endpoint
from nebula.config import split_host_port
from nebula.wire import ChannelKey, FrameType, encode_frame
from security.provision import provision
from testbed.attackers import RawPeer, add_worker, rss_bytes
from testbed.federation import start_switch
from testbed.procs import Procs

REPO = Path(__file__).resolve().parent.parent

MIB = 1024**2
CAP = 64 * MIB


class Sampler:
    """Peak RSS of a process while a block runs (sampled every 20 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.stop = pid, 0, threading.Event()
        self.base = rss_bytes(pid)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            time.sleep(0.02)

    def growth(self) -> int:
        self.stop.set()
        self.thread.join()
        return max(0, self.peak - self.base)


def probe(src: Endpoint, dst: Endpoint, n: int, size: int, way: str) -> float:
    """MB/s of `n` messages of `size` bytes from one ops worker to the other (`way`: "BA" or "AB")."""
    tx, rx = src.channel(way[1], 0, "probe"), dst.channel(way[0], 0, "probe")
    data = os.urandom(size)
    t0 = time.monotonic()
    for _ in range(n):
        tx.send(data)
    for _ in range(n):
        rx.recv(timeout_s=60)
    return n * size / (time.monotonic() - t0) / 1e6


def flood_credit(wan: str, c_yaml: str, stop: threading.Event) -> None:
    """DATA frames far past the granted credit, to a rank that never connects; reconnect when cut."""
    key = ChannelKey("j", "nebula", "C", 0, "A", 7, "flood")
    for _ in range(20):
        if stop.is_set():
            return
        try:
            c = RawPeer(wan, c_yaml)
            c.hello()
            for i in range(2000):
                if stop.is_set():
                    break
                c.data(key, bytes(200_000), seq=i + 1)
        except (ConnectionError, OSError, ssl.SSLError):
            pass
        except AssertionError:  # refused at LINK_HELLO: a peer cut for a flood is kept out a while
            stop.wait(1.0)
        finally:
            try:
                c.close()
            except UnboundLocalError:
                pass


def _flood_control(wan: str, c_yaml: str, stop: threading.Event, frame: bytes, per_burst: int,
                   num_bursts: int) -> None:
    """An identified peer sends `frame` in bursts and never reads what comes back; then holds the session."""
    c = RawPeer(wan, c_yaml)
    try:
        c.hello()
        burst = frame * per_burst
        for _ in range(num_bursts):
            if stop.is_set():
                break
            c.send(burst)
        stop.wait(30)
    except (ConnectionError, OSError):
        pass  # the switch cut the session: that is one of the outcomes being measured
    finally:
        c.close()


def flood_ping(wan: str, c_yaml: str, stop: threading.Event) -> None:
    """PINGs without ever reading a PONG (200,000 at most)."""
    _flood_control(wan, c_yaml, stop, encode_frame(FrameType.PING, {"t": 1.0}), 2000, 100)


def flood_checkpoint(wan: str, c_yaml: str, stop: threading.Event) -> None:
    """20,000 CHECKPOINT frames, each of which would have A verify it and answer with a signed checkpoint of its own."""
    _flood_control(wan, c_yaml, stop, encode_frame(FrameType.CHECKPOINT, {"checkpoint": "{}"}), 1000, 20)


def flood_unidentified(wan: str, c_yaml: str, stop: threading.Event) -> None:
    """300 TLS connections that never send LINK_HELLO, held open."""
    cfg = yaml.safe_load(Path(c_yaml).read_text())
    base = Path(c_yaml).parent
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(str(base / cfg["tls"]["ca"]))
    ctx.load_cert_chain(str(base / cfg["tls"]["cert"]), str(base / cfg["tls"]["key"]))
    conns = []
    try:
        for _ in range(300):
            if stop.is_set():
                break
            try:
                raw = socket.create_connection(split_host_port(wan), timeout=5)
                conns.append(raw)
                conns[-1] = ctx.wrap_socket(raw)
            except (OSError, ssl.SSLError):
                continue
        stop.wait(30)
    finally:
        for s in conns:
            s.close()


def flood_pending(worker: str, stop: threading.Event) -> None:
    """A worker of account nebula sends 256 MiB to a rank of its own that never connects."""
    ep = Endpoint.connect(worker, job="j", rank=0)
    try:
        ch = ep.channel("A", 3, "flood")
        for _ in range(256):
            if stop.is_set():
                break
            ch.send(bytes(MIB), lane="bulk")
        stop.wait(30)
    finally:
        ep.close(flush_s=0)


def flood_ack_bomb(wan: str, c_yaml: str, victim_inc: int, stop: threading.Event) -> None:
    """10,000 ACKs of message 2^64-1 on the channel the probe's receiver at A sends on to C."""
    key = ChannelKey("legit", "ops", "A", 0, "C", 0, "bomb")
    c = RawPeer(wan, c_yaml)
    try:
        c.hello()
        for _ in range(10_000):
            if stop.is_set():
                break
            c.ack(key, 2**64 - 1, 0, inc=(1 << 32) | 1, to=victim_inc)
        stop.wait(30)
    except (ConnectionError, OSError):
        pass
    finally:
        c.close()


def flood_poison(wan: str, c_yaml: str, stop: threading.Event) -> None:
    """10,000 DATA frames to the probe's receiver at A naming incarnation 2^63-1 of C's rank 0."""
    key = ChannelKey("legit", "ops", "C", 0, "A", 0, "poison")
    c = RawPeer(wan, c_yaml)
    try:
        c.hello()
        for i in range(10_000):
            if stop.is_set():
                break
            c.data(key, b"p" * 1000, seq=i + 1, inc=2**63 - 1)
        stop.wait(30)
    except (ConnectionError, OSError):
        pass
    finally:
        c.close()


def flood_bye(worker: str, stop: threading.Event) -> None:
    """A worker connection of A sends 200,000 BYE frames."""
    import zmq

    wcfg = yaml.safe_load(Path(worker).read_text())
    public, secret = zmq.auth.load_certificate(Path(worker).parent / wcfg["curve_key"])
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.linger = 0
    s.curve_publickey, s.curve_secretkey = public, secret
    s.curve_serverkey = wcfg["switch_curve_public_key"].encode()
    s.connect(wcfg["endpoint"])
    bye = encode_frame(FrameType.BYE)
    try:
        for _ in range(200):
            if stop.is_set():
                break
            for _ in range(1000):
                s.send(bye)
            while s.poll(0):  # (answers read and thrown away)
                s.recv_multipart()
        stop.wait(30)
    finally:
        s.close(0)


def flood_peer_unconnected(worker: str, stop: threading.Event) -> None:
    """Account nebula on A sends 256 MiB to a rank of B that never connects (through A's link to B)."""
    ep = Endpoint.connect(worker, job="j", rank=0)
    try:
        ch = ep.channel("B", 3, "flood")
        for _ in range(256):
            if stop.is_set():
                break
            ch.send(bytes(MIB), lane="bulk")
        stop.wait(30)
    finally:
        ep.close(flush_s=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=300, help="probe messages per measurement")
    ap.add_argument("--bytes", type=int, default=64 * 1024, help="probe message size")
    ap.add_argument("--skip", default="", help="comma-separated words: floods whose name holds one are left out")
    args = ap.parse_args()
    skip = [w.strip().lower() for w in args.skip.split(",") if w.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="nebula-abuse-"))
    fed = provision("abuse", ["A", "B", "C"], tmp / "fed")
    for c in ("A", "B"):
        y = Path(fed["clusters"][c]["switch_yaml"])
        d = yaml.safe_load(y.read_text())
        d.setdefault("link", {})["memory_cap_bytes"] = CAP
        d["metrics"] = {"listen": None}
        y.write_text(yaml.safe_dump(d, sort_keys=False))
    ya = Path(fed["clusters"]["A"]["switch_yaml"])
    ops = {c: str(add_worker(fed, c, "opsworker", "ops")) for c in ("A", "B")}
    procs = Procs()
    try:
        a = start_switch(procs, ya, 60, args=("--log-level", "warning"))
        pa, wan = a.proc, a.wan
        pb = start_switch(procs, Path(fed["clusters"]["B"]["switch_yaml"]), 60, args=("--log-level", "warning")).proc
        c_yaml = fed["clusters"]["C"]["switch_yaml"]
        wa = fed["clusters"]["A"]["worker_yaml"]
        with Endpoint.connect(ops["A"], job="legit", rank=0) as oa, Endpoint.connect(ops["B"], job="legit", rank=0) as ob:
            inc = oa._io.inc
            bomb = oa.channel("C", 0, "bomb")  # (C runs no switch: these wait in A's link, and C may ACK them)
            for _ in range(3):
                bomb.send(b"x")
            floods = [  # (name, flood, probe direction)
                ("credit ignored (to an unconnected rank)", lambda s: flood_credit(wan, c_yaml, s), "BA"),
                ("PING flood, PONGs never read", lambda s: flood_ping(wan, c_yaml, s), "BA"),
                ("CHECKPOINT flood (20,000)", lambda s: flood_checkpoint(wan, c_yaml, s), "BA"),
                ("300 connections without LINK_HELLO", lambda s: flood_unidentified(wan, c_yaml, s), "BA"),
                ("account floods its unconnected ranks", lambda s: flood_pending(wa, s), "BA"),
                ("ACK bomb (seq 2^64-1) on the probe's worker", lambda s: flood_ack_bomb(wan, c_yaml, inc, s), "BA"),
                ("incarnation poison (inc 2^63-1)", lambda s: flood_poison(wan, c_yaml, s), "BA"),
                ("BYE flood (200,000 frames)", lambda s: flood_bye(wa, s), "BA"),
                ("account floods a peer's unconnected ranks", lambda s: flood_peer_unconnected(wa, s), "AB"),
            ]
            floods = [f for f in floods if not any(w in f[0].lower() for w in skip)]
            ends = {"BA": (ob, oa), "AB": (oa, ob)}
            base = {}
            for way, (tx, rx) in ends.items():
                probe(tx, rx, 20, args.bytes, way)  # warm-up
                base[way] = probe(tx, rx, args.messages, args.bytes, way)
            rows = []
            for name, flood, way in floods:
                stop = multiprocessing.Event()
                samplers = [Sampler(pa.pid), Sampler(pb.pid)]
                # the attacker is a process of its own, as it would be: it shares no interpreter with the probe
                t = multiprocessing.Process(target=flood, args=(stop,), daemon=True)
                t.start()
                time.sleep(1.0)  # the flood is under way
                try:
                    rate = probe(*ends[way], args.messages, args.bytes, way)
                except (TimeoutError, ChannelError):
                    rate = 0.0  # (the probe's worker stopped: what the attack was after)
                stop.set()
                t.join(60)
                if t.is_alive():
                    t.kill()
                rows.append((name, max(smp.growth() for smp in samplers), rate, base[way], way))
                time.sleep(2.0)  # the switch settles (and trims) before the next flood
                while True:  # (a peer cut for a flood is kept out a while: the next flood starts after that)
                    c = RawPeer(wan, c_yaml)
                    try:
                        c.hello()
                        break
                    except AssertionError:
                        time.sleep(1.0)
                    finally:
                        c.close()
            # after the poison: C's rank 0 speaks with the incarnation its switch could have given, and is heard
            c = RawPeer(wan, c_yaml)
            try:
                c.hello()
                c.data(ChannelKey("legit", "ops", "C", 0, "A", 0, "poison"), b"after", seq=1, inc=(1 << 32) | 1)
                heard = oa.channel("C", 0, "poison").recv(timeout_s=30) == b"after"
            except TimeoutError:
                heard = False
            finally:
                c.close()
    finally:
        procs.reap()
    print(f"\nswitches A and B: link.memory_cap_bytes = {CAP // MIB} MiB; legitimate probe: {args.messages} x "
          f"{args.bytes // 1024} KiB, account ops; unloaded B -> A {base['BA']:.1f} MB/s, A -> B {base['AB']:.1f} MB/s")
    print(f"{'flood':<46}{'probe':>6}{'RSS growth MiB':>16}{'/ cap':>8}{'probe MB/s':>12}{'/ unloaded':>12}  targets")
    for name, growth, rate, unloaded, way in rows:
        ok = "ok" if growth <= CAP and rate >= 0.5 * unloaded else "MISSED"
        print(f"{name:<46}{way[0] + '->' + way[1]:>6}{growth / MIB:>16.1f}{growth / CAP:>8.2f}{rate:>12.1f}"
              f"{rate / unloaded:>12.2f}  {ok}")
    print(f"after the incarnation poison, C's next message with a real incarnation reached A: {'yes' if heard else 'NO'}")


if __name__ == "__main__":
    main()
