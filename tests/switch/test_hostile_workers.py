"""Attacks by a worker of one account on its own switch: the account is held to its budgets, audited in aggregate,
and another account's transfer through the same switch completes with nothing lost."""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path

import yaml
import zmq

from nebula.channel import Endpoint
from nebula.channel.connection import connect
from nebula.config import load_worker_config
from testbed.attackers import add_worker, rss_bytes
from testbed.federation import edit_yaml, start_switch, wait_audit, wait_until
from tests.switch.conftest import TEST_CHUNK_BYTES, worker_yaml, worker_yaml_as

MIB = 1024**2
FLOOD_MIB = 80
RSS_SLACK = 24 * MIB  # what the switch may keep after a flood of FLOOD_MIB


def test_account_flooding_unconnected_ranks_is_bounded_and_stalls_no_other(procs, federation):
    """Account nebula sends 48 MiB to a rank of its own that never connects: A holds at most limits.pending_bytes
    of it (the rest is dropped, audited in aggregate), and account ops's 20 messages A->B all arrive meanwhile."""
    ya = Path(federation["clusters"]["A"]["switch_yaml"])
    pending = 4 * MIB
    edit_yaml(ya, lambda d: (d.setdefault("link", {}).update(memory_cap_bytes=32 * MIB),
                             d.setdefault("limits", {}).update(pending_bytes=pending)))
    ops_a = add_worker(federation, "A", "opsworker", "ops")
    ops_b = add_worker(federation, "B", "opsworker", "ops")
    a = start_switch(procs, ya)
    start_switch(procs, Path(federation["clusters"]["B"]["switch_yaml"]))
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError, ValueError):  # the status file is being rewritten
                st = json.loads((ya.parent / "state" / "status.json").read_text())
                peak[0] = max(peak[0], st["queued_bytes"])
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        flooder = Endpoint.connect(worker_yaml(federation, "A"), job="j", rank=0)
        with Endpoint.connect(ops_a, job="legit", rank=0) as oa, Endpoint.connect(ops_b, job="legit", rank=0) as ob:
            flood = flooder.channel("A", 3, "flood")
            for _ in range(48):
                flood.send(bytes(MIB), lane="bulk")
            tx, rx = oa.channel("B", 0, "legit"), ob.channel("A", 0, "legit")
            for i in range(20):
                tx.send(i.to_bytes(4, "big") * 1000)
            got = [int.from_bytes(rx.recv(timeout_s=60)[:4], "big") for _ in range(20)]
            assert got == list(range(20))
            rec = wait_audit(a, lambda r: r["action"] == "frame_dropped"
                             and r["detail"]["reason"] == "pending_over_budget")
            assert rec["target"] == "nebula" and "limits.pending_bytes" in rec["detail"]["detail"]
            wait_until(lambda: peak[0] > 0, 30, "a status of A with the flood held")
        flooder.close(flush_s=0)  # (its messages are never acknowledged: the rank never connects)
    finally:
        stop.set()
        watcher.join()
    assert 0 < peak[0] <= pending + MIB, peak[0]


def test_account_over_its_share_is_dropped_not_every_worker_held(procs, federation):
    """With B's switch down, account nebula's frames for B pile up in A's link queue: past its share
    (limits.account_memory_bytes) they are dropped and audited, while account ops keeps talking inside A."""
    ya = Path(federation["clusters"]["A"]["switch_yaml"])
    edit_yaml(ya, lambda d: (d.setdefault("link", {}).update(memory_cap_bytes=16 * MIB),
                             d.setdefault("limits", {}).update(account_memory_bytes=4 * MIB)))
    ops_a = add_worker(federation, "A", "opsworker", "ops")
    a = start_switch(procs, ya)  # (B never starts: its link stays down)
    flooder = Endpoint.connect(worker_yaml(federation, "A"), job="j", rank=0)
    try:
        with Endpoint.connect(ops_a, job="legit", rank=0) as o0, Endpoint.connect(ops_a, job="legit", rank=1) as o1:
            flood = flooder.channel("B", 0, "flood")
            for _ in range(24):
                flood.send(bytes(MIB), lane="bulk")
            rec = wait_audit(a, lambda r: r["action"] == "frame_dropped"
                             and r["detail"]["reason"] == "account_over_budget")
            assert rec["target"] == "nebula" and "limits.account_memory_bytes" in rec["detail"]["detail"]
            tx, rx = o0.channel("A", 1, "legit"), o1.channel("A", 0, "legit")
            for i in range(20):
                tx.send(i.to_bytes(4, "big") * 1000)
            assert [int.from_bytes(rx.recv(timeout_s=30)[:4], "big") for _ in range(20)] == list(range(20))
    finally:
        flooder.close(flush_s=0)


def test_part_over_the_socket_limit_on_ipc_ends_the_connection_audited(procs, federation, tmp_path):
    """A worker on the switch's host sends a part far over the local socket's ZMQ_MAXMSGSIZE on the IPC endpoint:
    ZeroMQ ends the connection before the switch reads it, the audit names transport, process and reason; workers
    that close normally leave no such record, and a transfer between two other workers completes meanwhile."""
    a = start_switch(procs, Path(federation["clusters"]["A"]["switch_yaml"]))
    with Endpoint.connect(worker_yaml(federation, "A"), job="legit", rank=0) as e0, \
            Endpoint.connect(worker_yaml(federation, "A"), job="legit", rank=1) as e1:
        tx, rx = e0.channel("A", 1, "legit"), e1.channel("A", 0, "legit")
        ipc = worker_yaml_as(federation, "A", tmp_path / "ipc.yaml", transport="ipc")  # (ZeroMQ's IPC endpoint)
        ctx, s, mon, _, transport = connect(load_worker_config(ipc))
        try:
            assert transport == "ipc"
            assert mon.poll(20000) and mon.recv_multipart()
            s.disable_monitor()
            mon.close(0)
            ended = s.get_monitor_socket(zmq.EVENT_DISCONNECTED, "inproc://test-ended")  # (a fresh address)
            for i in range(10):
                tx.send(i.to_bytes(4, "big") * 1000)
            s.send_multipart([b"h", bytes(8 * TEST_CHUNK_BYTES)])
            for i in range(10, 20):
                tx.send(i.to_bytes(4, "big") * 1000)
            assert ended.poll(10000), "the switch kept a connection that sent an oversized part"
            ended.close(0)
            assert [int.from_bytes(rx.recv(timeout_s=30)[:4], "big") for _ in range(20)] == list(range(20))
        finally:
            s.close(0)
            ctx.term()
    rec = wait_audit(a, lambda r: r["action"] == "connection_dropped")
    assert rec["detail"]["transport"] == "ipc" and rec["detail"]["peer"] == f"pid {os.getpid()} uid {os.getuid()}"
    assert rec["detail"]["reason"] == "part_too_large" and rec["target"].startswith("worker@ipc:")
    time.sleep(1.0)  # an absence (no second record): the normal closes above have had a second to be misjudged
    assert sum(r["action"] == "connection_dropped" for r in a.audit()) == 1


def _settled_rss(pid: int, timeout_s: float = 30.0) -> int:
    """Process `pid`'s RSS once it holds still (two readings half a second apart within 1 MiB): the baseline."""
    last = [rss_bytes(pid)]

    def still() -> int | None:
        time.sleep(0.5)  # (the interval the two readings span)
        now, before = rss_bytes(pid), last[0]
        last[0] = now
        return now if abs(now - before) < MIB else None

    return wait_until(still, timeout_s, f"the RSS of {pid} to hold still")


def test_memory_is_returned_to_the_system_after_a_flood(procs, federation):
    """Account nebula queues 80 MiB for a rank of its own that has not connected; when that rank connects and
    takes it all, switch A's resident size falls back to within RSS_SLACK of where it was before the flood (the
    switch keeps freed memory for reuse, so without switch_server.memtrim it would stay near its peak)."""
    ya = Path(federation["clusters"]["A"]["switch_yaml"])
    edit_yaml(ya, lambda d: (d.setdefault("link", {}).update(memory_cap_bytes=128 * MIB),
                             d.setdefault("limits", {}).update(pending_bytes=96 * MIB)))
    a = start_switch(procs, ya)
    status = ya.parent / "state" / "status.json"
    # over TCP, as from another host: the payloads land in the switch's heap (over IPC they would sit in the
    # worker's shared-memory arena)
    tcp = ya.parent / "worker-tcp.yaml"
    edit = yaml.safe_load(Path(worker_yaml(federation, "A")).read_text())
    tcp.write_text(yaml.safe_dump({**edit, "curve_key": str(Path(worker_yaml(federation, "A")).parent
                                                            / edit["curve_key"]), "transport": "tcp"}))
    # (a flooder keeps no bound of its own on what is on its way: the switch's limits must hold without one)
    with Endpoint.connect(tcp, job="j", rank=0, transit_bytes=1 << 30) as flooder:
        flooder.channel("A", 4, "warm-up").send(bytes(MIB))  # (the flood's code paths have run before the baseline)
        with Endpoint.connect(worker_yaml(federation, "A"), job="j", rank=4) as e4:
            assert len(e4.channel("A", 0, "warm-up").recv(timeout_s=30)) == MIB
        flood = flooder.channel("A", 3, "flood")
        before = _settled_rss(a.proc.pid)
        for _ in range(FLOOD_MIB):
            flood.send(bytes(MIB), lane="bulk")
        deadline = time.monotonic() + 60
        while json.loads(status.read_text())["queued_bytes"] < (FLOOD_MIB - 8) * MIB:
            assert time.monotonic() < deadline, "the flood never queued at the switch"
            time.sleep(0.2)
        peak = rss_bytes(a.proc.pid)
        assert peak - before > FLOOD_MIB * MIB // 2, (before, peak)  # the flood did take memory
        with Endpoint.connect(worker_yaml(federation, "A"), job="j", rank=3) as e3:
            rx = e3.channel("A", 0, "flood")
            for _ in range(FLOOD_MIB):
                assert len(rx.recv(timeout_s=60)) == MIB
        deadline = time.monotonic() + 20
        while (after := rss_bytes(a.proc.pid)) > before + RSS_SLACK and time.monotonic() < deadline:
            time.sleep(0.5)
    assert after <= before + RSS_SLACK, f"RSS {before / MIB:.0f} MiB before the flood, {peak / MIB:.0f} at its " \
                                        f"peak, {after / MIB:.0f} after"
