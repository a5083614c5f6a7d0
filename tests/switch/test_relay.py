"""End to end through two real switch servers: ordered exactly-once channels, tensors, refusals, isolation."""
from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml
import zmq
import zmq.auth

from nebula.channel import ChannelError, Endpoint, SwitchRefused
from nebula.channel.connection import connect
from nebula.config import load_worker_config
from nebula.wire import ChannelKey, FrameType, decode_frame, encode_frame
from security.audit import peer_checkpoints_path, read_checkpoints, verify_checkpoint
from security.curve import write_curve_keypair
from testbed.federation import wait_audit
from tests.switch.conftest import TEST_CHUNK_BYTES, legit_transfer, worker_yaml, worker_yaml_as


def test_relay_both_directions_in_order(two_switches):
    fed, a, b = two_switches
    rng = random.Random(1)
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=1) as eb:
        ca, cb = ea.channel("B", 1, "act"), eb.channel("A", 0, "act")
        msgs = [rng.randbytes(rng.choice([0, 1, 100, 5000, 300_000, 700_000])) for _ in range(120)]
        # lanes reorder frames on the way; the channel still delivers in send order
        futs = [ca.send(m, lane=rng.choice(["activation", "gradient", "bulk", "control"])) for m in msgs]
        assert [cb.recv(timeout_s=60) for _ in msgs] == msgs
        for f in futs:
            assert f.result(timeout=10) is None
        cb.send([b"ab", b"", b"cde"], lane="gradient")
        assert [bytes(p) for p in ca.recv_parts(timeout_s=30)] == [b"ab", b"", b"cde"]
        x = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
        ca.send_tensor(x)
        np.testing.assert_array_equal(cb.recv_tensor(timeout_s=30), x)
        ca.send_tensor(x, codec="fp16")
        y = cb.recv_tensor(codec="fp16", timeout_s=30)
        assert y.dtype == np.float32 and y.shape == x.shape and np.allclose(y, x, atol=1e-2)
        with pytest.raises(TimeoutError):
            ca.recv(timeout_s=0.3)
    # the switches exchanged signed audit checkpoints when their links came up, and keep each other's
    for me, peer in ((a, "B"), (b, "A")):
        kept = read_checkpoints(peer_checkpoints_path(me.config.parent / "audit.log", peer))
        assert kept
        verify_checkpoint(kept[-1])


def test_refusals_reach_the_sender_and_jobs_are_isolated(two_switches):
    fed, a, b = two_switches
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=0) as eb, \
            Endpoint.connect(worker_yaml(fed, "B"), job="other", rank=0) as eo:
        nowhere = ea.channel("Z", 0, "x")
        nowhere.send(b"hello")
        with pytest.raises(ChannelError, match="unknown_destination.*'Z'"):
            nowhere.recv(timeout_s=20)
        ea.channel("B", 0, "x").send(b"for job j only")
        assert eb.channel("A", 0, "x").recv(timeout_s=30) == b"for job j only"
        with pytest.raises(TimeoutError):
            eo.channel("A", 0, "x").recv(timeout_s=1.0)
        # the other job's rank 0 cannot talk to job j's ranks either: it reaches only its own job
        eo.channel("A", 0, "x").send(b"from another job")
        with pytest.raises(TimeoutError):
            ea.channel("B", 0, "x").recv(timeout_s=1.0)
        eo.close(flush_s=0)  # (its message has no receiver: waiting for its acknowledgement would only pass time)


def _raw_worker(fed, cluster: str, wy: str | Path | None = None) -> zmq.Socket:
    """A DEALER socket speaking to `cluster`'s switch with the key of worker file `wy` (default: the cluster's)."""
    wy = Path(wy or worker_yaml(fed, cluster))
    wcfg = yaml.safe_load(wy.read_text())
    public, secret = zmq.auth.load_certificate(wy.parent / wcfg["curve_key"])
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.linger = 0
    s.curve_publickey, s.curve_secretkey = public, secret
    s.curve_serverkey = wcfg["switch_curve_public_key"].encode()
    s.rcvtimeo = 10000
    s.connect(wcfg["endpoint"])
    return s


def raw_hello(s: zmq.Socket, job: str = "j", rank: int = 5, account: str = "nebula", name: str = "worker") -> int:
    """Say HELLO on a raw worker socket and wait for the WELCOME; the incarnation the switch gave us."""
    s.send(encode_frame(FrameType.HELLO, {"job": job, "rank": rank, "account": account, "name": name}))
    while True:
        parts = s.recv_multipart()
        f = decode_frame(parts[0], parts[1] if len(parts) > 1 else b"")
        if f.type == FrameType.WELCOME:
            return f.meta["inc"]


def _next_error(s: zmq.Socket) -> dict:
    while True:
        parts = s.recv_multipart()
        f = decode_frame(parts[0], parts[1] if len(parts) > 1 else b"")
        if f.type == FrameType.ERROR:
            return f.meta


def test_malformed_and_oversized_frames_refused_with_reason(two_switches):
    fed, a, b = two_switches
    legit, got = legit_transfer(fed, 20, job="legit", src="A", dst="B")  # runs while the hostile worker sends
    s = _raw_worker(fed, "A")
    try:
        key = ChannelKey("j", "nebula", "A", 5, "B", 0, "raw")
        s.send(encode_frame(FrameType.DATA, key.to_meta(), b"x", channel_id=key.id), zmq.SNDMORE)
        s.send(b"x")
        assert _next_error(s)["code"] == "no_hello"
        inc = raw_hello(s)
        meta = {**key.to_meta(), "inc": inc}
        s.send(b"GET / HTTP/1.1\r\n\r\n" + b"\0" * 60)
        err = _next_error(s)
        assert err["code"] == "bad_magic" and "not a Nebula frame" in err["message"]
        huge = encode_frame(FrameType.DATA, meta, b"y" * 10, channel_id=key.id, chunk_count=1 << 20,
                            total_len=1 << 40)
        s.send_multipart([huge, b"y" * 10])
        err = _next_error(s)
        assert err["code"] == "too_large" and "max_message_bytes" in err["message"] and err["channel"]["name"] == "raw"
        over = TEST_CHUNK_BYTES + 1
        s.send_multipart([encode_frame(FrameType.DATA, meta, b"z" * over, channel_id=key.id), b"z" * over])
        assert _next_error(s)["code"] == "chunk_too_large"
        s.send_multipart([encode_frame(FrameType.DATA, meta, b"abc", channel_id=key.id), b"ab"])
        assert _next_error(s)["code"] == "truncated"
        other = ChannelKey("j", "nebula", "A", 6, "B", 0, "raw")  # pretends to be another rank
        s.send_multipart([encode_frame(FrameType.DATA, other.to_meta(), b"q", channel_id=other.id), b"q"])
        assert _next_error(s)["code"] == "not_attributed"
        rec = wait_audit(a, lambda r: r["action"] == "frame_refused" and r["detail"]["reason"] == "not_attributed")
        assert rec["target"] == "worker:worker" and rec["detail"]["account"] == "nebula"
        # a part far past the chunk size (ZMQ_MAXMSGSIZE) ends the connection before the switch holds it
        mon = s.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        huge = 8 * TEST_CHUNK_BYTES
        s.send_multipart([encode_frame(FrameType.DATA, meta, b"h" * huge, channel_id=key.id), b"h" * huge])
        assert mon.poll(10000), "the switch kept a connection that sent an oversized part"
        mon.close(0)
        # ... and leaves an audit record naming the transport, the peer and the reason
        rec = wait_audit(a, lambda r: r["action"] == "connection_dropped")
        assert rec["outcome"] == "denied" and rec["detail"]["reason"] == "part_too_large"
        assert rec["detail"]["transport"] == "tcp" and rec["detail"]["peer"].startswith("127.0.0.1:")
        assert rec["detail"]["limit_bytes"] < huge and "link.chunk_bytes" in rec["detail"]["detail"]
    finally:
        s.close(0)
    legit.join(90)
    assert [int.from_bytes(m[:4], "big") for m in got] == list(range(20))
    # the switch keeps serving everyone else
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=0) as eb:
        ea.channel("B", 0, "ok").send(b"still fine")
        assert eb.channel("A", 0, "ok").recv(timeout_s=30) == b"still fine"


def _absolute(worker_file: str) -> dict:
    """A worker file's contents with its TLS files' paths absolute (for a copy written elsewhere)."""
    data = yaml.safe_load(Path(worker_file).read_text())
    data["tls"] = {k: str(Path(worker_file).parent / v) for k, v in data["tls"].items()}
    return data


@pytest.mark.parametrize("transport", ["tcp", "ipc", "unix", "tls"])
def test_unknown_worker_key_refused_and_audited(two_switches, tmp_path, transport):
    fed, a, b = two_switches
    data = _absolute(worker_yaml(fed, "A"))
    data["curve_key"] = str(tmp_path / "stranger.key_secret")
    data["transport"] = transport
    stranger = write_curve_keypair(tmp_path / "stranger.key_secret")
    (tmp_path / "stranger.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(SwitchRefused, match="refused our key"):
        Endpoint.connect(tmp_path / "stranger.yaml", job="j", rank=0, timeout_s=15)
    rec = wait_audit(a, lambda r: r["action"] == "worker_rejected")
    assert rec["outcome"] == "denied" and rec["detail"]["curve_public_key"] == stranger
    time.sleep(1.5)  # an absence, nothing to wait on: an ended connection is judged within a second
    assert not [r for r in a.audit() if r["action"] == "connection_dropped"], "a refused key is no oversized part"


def test_same_host_workers_use_the_stream_socket_and_others_curve(two_switches, tmp_path):
    """Provisioned workers on the switch's host take its Unix stream socket; `transport: tcp` keeps CURVE over
    TCP. Both carry the same channels, and the audit log names the transport of every accepted worker."""
    fed, a, b = two_switches
    assert a.local == fed["clusters"]["A"]["endpoint"]  # `listening ... local=` names the TCP endpoint
    tcp_yaml = tmp_path / "tcp.yaml"
    data = yaml.safe_load(Path(worker_yaml(fed, "B")).read_text())
    tcp_yaml.write_text(yaml.safe_dump({**data, "curve_key": str(Path(worker_yaml(fed, "B")).parent / data["curve_key"]),
                                        "transport": "tcp"}))
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(tcp_yaml, job="j", rank=0) as eb:
        ea.channel("B", 0, "t").send(b"over the stream socket, then tls")
        assert eb.channel("A", 0, "t").recv(timeout_s=30) == b"over the stream socket, then tls"
        eb.channel("A", 0, "t").send(b"back over curve")
        assert ea.channel("B", 0, "t").recv(timeout_s=30) == b"back over curve"
    unix = wait_audit(a, lambda r: r["action"] == "worker_accepted")
    tcp = wait_audit(b, lambda r: r["action"] == "worker_accepted")
    assert unix["detail"]["transport"] == "unix" and unix["target"].startswith("unix:pid ")  # (SO_PEERCRED)
    assert tcp["detail"]["transport"] == "tcp" and tcp["target"].startswith("127.0.0.1")


@pytest.mark.parametrize("transport, where", [("ipc", "ipc://@nebula-nobody-here"),
                                              ("unix", "@nebula-nobody-here.stream")])
def test_ipc_endpoint_with_no_switch_behind_it_is_named(federation, tmp_path, transport, where):
    """A worker sent to an IPC endpoint (or the stream socket beside it) nobody listens on (e.g. the switch runs on
    another host) gets an error naming the endpoint and the way out, instead of waiting forever."""
    data = yaml.safe_load(Path(worker_yaml(federation, "A")).read_text())
    stray = {**data, "curve_key": str(Path(worker_yaml(federation, "A")).parent / data["curve_key"]),
             "ipc_endpoint": "ipc://@nebula-nobody-here", "transport": transport}
    (tmp_path / "stray.yaml").write_text(yaml.safe_dump(stray))
    with pytest.raises(ChannelError, match=rf"{where} did not answer.*transport: tcp"):
        Endpoint.connect(tmp_path / "stray.yaml", job="j", rank=0, timeout_s=1.5)


@pytest.mark.parametrize("transport", ["ipc", "unix", "tls"])
def test_ipc_password_must_come_from_the_switch_key(two_switches, tmp_path, transport):
    """A listed worker key whose password was derived for another switch is refused on IPC (and on the stream
    socket beside it), and audited."""
    fed, a, b = two_switches
    data = _absolute(worker_yaml(fed, "A"))
    other = yaml.safe_load(Path(worker_yaml(fed, "B")).read_text())["switch_curve_public_key"]
    bad = {**data, "curve_key": str(Path(worker_yaml(fed, "A")).parent / data["curve_key"]),
           "switch_curve_public_key": other, "transport": transport}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ChannelError, match="refused our key.*switch_curve_public_key"):
        Endpoint.connect(tmp_path / "bad.yaml", job="j", rank=0, timeout_s=15)
    rec = wait_audit(a, lambda r: r["action"] == "worker_rejected")
    assert rec["detail"]["reason"] == "bad_password" and rec["detail"]["transport"] == transport


def test_one_rank_one_process(two_switches):
    fed, a, b = two_switches
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=3):
        with pytest.raises(ChannelError, match="rank_taken.*rank 3 of job 'j'"):
            Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=3, timeout_s=2)
    # a closed endpoint frees its rank at once (BYE): connecting again succeeds well inside the switch's 3 s
    # hold of a rank whose process vanished without a word, which would answer rank_taken
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=4) as first:
        assert first.rank == 4
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=4, timeout_s=2) as again:
        assert again.rank == 4


def test_a_rank_killed_without_a_word_is_taken_by_its_relaunch_however_short_its_timeout(two_switches, procs):
    """A rank killed with SIGKILL holds its place at the switch for a few seconds (it said no BYE); the process
    launched in its place keeps asking and is welcomed, even with a connect timeout shorter than that hold."""
    fed, a, b = two_switches
    holder = ("import sys, time; from nebula.channel import Endpoint; "
              "ep = Endpoint.connect(sys.argv[1], job='j', rank=5); print('ready', flush=True); time.sleep(600)")
    p = procs.start([sys.executable, "-c", holder, str(worker_yaml(fed, "A"))], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    p.kill()
    p.wait(10)
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=5, timeout_s=1) as again:
        assert again.rank == 5


@pytest.mark.parametrize("transport", ["unix", "ipc", "tcp", "tls"])
def test_the_switch_answers_a_workers_bye(two_switches, federation, tmp_path, transport):
    """A closing worker waits for this answer before it closes its socket: it says the switch has read everything
    the worker sent before its BYE (its last acknowledgements among them)."""
    wy = worker_yaml_as(federation, "A", tmp_path / "w.yaml", transport=transport)
    ctx, s, mon, _, _ = connect(load_worker_config(wy))
    try:
        if ctx is not None:  # (a stream socket authenticates with its first message)
            assert mon.poll(20000) and mon.recv_multipart()  # the handshake
        else:  # (over TLS, once it has dialled: the TCP connect and the TLS handshake do not block)
            assert s.poll(20000, zmq.POLLOUT)
        s.send(encode_frame(FrameType.BYE))
        assert s.poll(10000), "no answer to BYE"
        assert decode_frame(s.recv_multipart()[0], b"").type == FrameType.BYE
    finally:
        s.close(0)
        if ctx is not None:
            mon.close(0)
            ctx.term()


def test_an_io_thread_that_ended_first_leaves_its_wake_pipe_open_for_stop(two_switches):
    """An I/O thread that leaves on its own (as after a failure) must not close the pipe that `stop` and the
    application's threads still write to: a descriptor closed there could be another file's by then."""
    fed = two_switches[0]
    ep = Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=0)
    io = ep._io
    io.running = False
    io._wake()
    io.thread.join(10)
    assert not io.thread.is_alive()
    os.fstat(io.wake_w)  # (raises EBADF if the thread closed it)
    ep.close(flush_s=1)  # stop() wakes the ended thread through it


def test_a_one_message_window_moves_on_each_consumption(two_switches):
    """A sender whose window holds one message sends the next only when the receiver's application has consumed
    the last: with acknowledgements coalesced and consumption counted by the application (nebula.channel.acks),
    each consumption still reaches the sender, without waiting for the resend timer (10 s)."""
    fed = two_switches[0]
    with Endpoint.connect(worker_yaml(fed, "A"), job="w", rank=0, window_bytes=1000) as ea, \
            Endpoint.connect(worker_yaml(fed, "B"), job="w", rank=0) as eb:
        tx, rx = ea.channel("B", 0, "win"), eb.channel("A", 0, "win")
        msgs = [bytes([i]) * 800 for i in range(30)]
        for m in msgs:
            tx.send(m)
        assert [rx.recv(timeout_s=5) for _ in msgs] == msgs
        assert ea.flush(timeout_s=30)


def _frames_out(switch, peer: str, lane: str) -> float:
    """Frames `switch` has sent to `peer` on `lane` (its Prometheus counter)."""
    st = json.loads((switch.config.parent / "state" / "status.json").read_text())
    text = urllib.request.urlopen(f"http://{st['metrics']}/metrics", timeout=10).read().decode()
    found = re.search(rf'^nebula_switch_frames_total\{{(?=[^}}]*direction="out")(?=[^}}]*lane="{lane}")'
                      rf'(?=[^}}]*peer="{peer}")[^}}]*\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_burst_of_small_messages_shares_frames_on_every_hop(two_switches):
    """Small messages queued together on one channel travel as batch frames (nebula.channel.sender.batches): the
    switches relay fewer frames than messages, and the receiver still gets each message once, in order, with the
    sender's window (20 messages) opening as they are consumed."""
    fed, a, _b = two_switches
    rng = random.Random(7)
    with Endpoint.connect(worker_yaml(fed, "A"), job="burst", rank=0, window_bytes=20 * 1000) as ea, \
            Endpoint.connect(worker_yaml(fed, "B"), job="burst", rank=0) as eb:
        tx, rx = ea.channel("B", 0, "small"), eb.channel("A", 0, "small")
        before = _frames_out(a, "B", "gradient")
        msgs = [rng.randbytes(rng.choice([0, 10, 1000])) for _ in range(400)]
        futs = [tx.send(m, lane="gradient") for m in msgs]
        assert [rx.recv(timeout_s=30) for _ in msgs] == msgs
        assert all(f.result(timeout=30) is None for f in futs) and ea.flush(timeout_s=30)
        frames = _frames_out(a, "B", "gradient") - before
        assert 0 < frames <= len(msgs) / 4, f"{frames:.0f} frames carried {len(msgs)} messages"


def test_an_io_thread_waiting_for_a_deadline_sleeps_until_it_instead_of_spinning(two_switches, monkeypatch):
    """ZeroMQ's poll takes whole milliseconds and truncates: an I/O thread waiting for an owed acknowledgement (due
    at most 2 ms after a consumption) must not poll with 0 in the last millisecond and spin until it passes. One
    message at a time, each consumed and then left alone for 20 ms: a few wake-ups each, not dozens."""
    fed = two_switches[0]
    polls: list[int] = []
    real_poll = zmq.Poller.poll

    def counted(self, timeout=None):
        polls.append(threading.get_native_id())
        return real_poll(self, timeout)

    with Endpoint.connect(worker_yaml(fed, "A"), job="spin", rank=0) as ea, \
            Endpoint.connect(worker_yaml(fed, "B"), job="spin", rank=0) as eb:
        tx, rx = ea.channel("B", 0, "one"), eb.channel("A", 0, "one")
        tx.send(b"first")
        assert rx.recv(timeout_s=10) == b"first"
        monkeypatch.setattr(zmq.Poller, "poll", counted)
        for i in range(20):
            tx.send(bytes([i]) * 100_000)
            assert rx.recv(timeout_s=10) == bytes([i]) * 100_000
            time.sleep(0.02)
        monkeypatch.undo()
        receiver = sum(1 for tid in polls if tid == eb._io.thread.native_id)
        assert receiver <= 20 * 5, f"the receiving I/O thread polled {receiver} times for 20 messages"
