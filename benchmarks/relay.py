"""Relay benchmark: raw TLS vs raw ZeroMQ (TCP, CURVE, IPC) vs the full path worker -> switch A -> TLS -> switch B -> worker.

The full path is measured twice: as provisioned (workers on the switches' host pass payloads through shared
memory) and with `shared_memory: false` in the workers' files (payloads through the IPC socket).

Prints, measured side by side in one run on loopback: throughput and one-way latency (p50/p99) per message
size with the ratio full/TLS, the latency each switch hop adds, a 64 KiB activation's latency while a bulk
transfer runs on the same link, and goodput through the link shaper at 60 Mbit/s and (as root) through a
kernel-shaped link between two network namespaces.

    .venv/bin/python benchmarks/relay.py                 # default run (a few minutes at most)
    .venv/bin/python benchmarks/relay.py --bulk-mib 1024 # the 1 GiB bulk case of the issue
    .venv/bin/python benchmarks/relay.py --vs-tunnels    # only: Nebula against stunnel, socat and raw TLS
    .venv/bin/python benchmarks/relay.py --sustained 512 # only: long streams, the receiving switch's arena use

`--vs-tunnels` compares the full path with what a user could run instead: two stunnel relays and two socat relays
(sender -> relay -> mutual TLS -> relay -> receiver; `apt-get install stunnel4 socat`, else skipped with a message)
and one raw TLS stream, at 16 KiB, 64 KiB, 1 MiB and 16 MiB: MB/s, ratio to stunnel, CPU ms per MiB (every process
of the path), and the latency each relay hop adds (p50 at 64 KiB, over raw TLS); medians of `--reps` repetitions
in which the paths take turns (their order rotates), with the load average before and after. Every path's receiving
end runs in a process of its own, as at a real site (`_receiver.py` says why); `--receiver thread` keeps it in a
thread of the benchmark's process instead, as the comparison did before.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.queues
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nebula.channel import Endpoint
from testbed.netns import NetnsError, Sites as WanNamespaces
from _receiver import RemoteReceiver  # benchmarks/ is this script's directory
from _tunnels import PlainRelayPair, missing
from _relaypaths import (FullPath, Switches, TLSPair, ZMQPair, _pct, latency, switch_status,
                         throughput, without_shared_memory)

REPO = Path(__file__).resolve().parent.parent

KIB, MIB = 1024, 1024**2
SIZES = [KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]


def _plan(size: int, budget_bytes: int) -> tuple[int, int]:
    """(messages for throughput, samples for latency) for one size."""
    n = max(3, min(2000, budget_bytes // size))
    k = max(3, min(200, (16 * MIB) // size))
    return n, k


def _label(size: int) -> str:
    return f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"


def kernel_shaped_goodput(tmp: Path, mib: int) -> tuple[float, float] | str:
    """(goodput Mbit/s, seconds) of `mib` MiB through the full path when switches and workers sit in two network
    namespaces whose veth pair `tc tbf` shapes to 60 Mbit/s each way; a reason string where that cannot run."""
    try:
        wan = WanNamespaces(rate_mbit=60.0)
    except NetnsError as exc:
        return str(exc)
    switches = None
    try:
        switches = Switches(tmp / "fed-netns", sites=wan)  # each switch at its namespace's address
        fed = switches.fed
        count = mib * 4  # 256 KiB messages
        probe = [sys.executable, "-m", "switch_server.cli", "probe", "--timeout", "120"]
        recv = subprocess.Popen(wan.argv(1, [*probe, "--config", fed["clusters"]["B"]["switch_yaml"], "--recv",
                                             "--count", str(count)]), stdout=subprocess.PIPE, text=True, cwd=REPO)
        t0 = time.perf_counter()
        send = subprocess.run(wan.argv(0, [*probe, "--config", fed["clusters"]["A"]["switch_yaml"], "--send",
                                           "--to", "B", "--count", str(count), "--bytes", str(256 * KIB)]),
                              capture_output=True, text=True, cwd=REPO, timeout=300)
        out, _ = recv.communicate(timeout=300)
        seconds = time.perf_counter() - t0
        if send.returncode != 0 or recv.returncode != 0:
            return f"probe failed: {send.stderr.strip()[-300:]}"
        return json.loads(out.strip().splitlines()[-1])["mbit_s"], seconds
    finally:
        if switches is not None:
            switches.close()
        wan.close()


def _bulk_rank(worker_yaml: str, role: str, nbytes: int, events, go) -> None:
    """One bulk rank in its own process: `send` one message of `nbytes` (lane bulk) or `recv` it and report when."""
    ep = Endpoint.connect(worker_yaml, job="bench", rank=1)
    ch = ep.channel("B" if role == "send" else "A", 1, "bulk")
    events.put("ready")
    go.wait()
    if role == "send":
        ch.send(bytes(nbytes), lane="bulk")
        ep.close(flush_s=120)
    else:
        ch.recv(timeout_s=300)
        events.put(time.perf_counter())  # CLOCK_MONOTONIC: comparable across processes of this machine
        ep.close(flush_s=0)


TUNNEL_SIZES = [16 * KIB, 64 * KIB, MIB, 16 * MIB]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _ratio(a: float, b: float) -> str:
    """a / b to two places; "-" where b is 0 (a stream too short for one clock tick of CPU time)."""
    return f"{a / b:.2f}" if b > 0 else "-"


def vs_tunnels(fed: dict, switches: Switches, reps: int, budget_mib: int, receiver: str = "process") -> None:
    """Print the full path against stunnel, socat and raw TLS (see the module's docstring)."""
    load0 = _load()
    skipped = missing()
    remote = receiver == "process"
    paths = {"nebula": FullPath(fed, remote=remote), "tls": TLSPair(fed, remote=remote)}
    for kind in ("stunnel", "socat"):
        if kind not in skipped:
            paths[kind] = PlainRelayPair(kind, fed, RemoteReceiver("tcp") if remote else None)
    pids = {"nebula": [os.getpid()] + [p.pid for p in switches.procs] + paths["nebula"].pids,
            **{k: [os.getpid()] + paths[k].pids for k in ("tls", "stunnel", "socat") if k in paths}}
    latency(paths["nebula"], 1024, 20)
    names = list(paths)
    got: dict = {(n, s): {"mbs": [], "cpu": [], "each": []} for n in names for s in TUNNEL_SIZES}
    lat: dict = {n: [] for n in names}
    try:
        for rep in range(reps):
            order = names[rep % len(names):] + names[:rep % len(names)]  # each path goes first in turn
            for size in TUNNEL_SIZES:
                n = max(8, min(4000, budget_mib * MIB // size))
                for name in order:
                    cpu = {"pids": pids[name]}
                    try:
                        mbs = throughput(paths[name], size, n, cpu)
                    except OSError as exc:  # (a relay lost its connection: a fresh pair, the size measured again)
                        if name not in ("stunnel", "socat"):
                            raise
                        print(f"  {name} relay failed ({exc}); starting it again", file=sys.stderr, flush=True)
                        paths[name].close()
                        paths[name] = PlainRelayPair(name, fed, RemoteReceiver("tcp") if remote else None)
                        pids[name] = [os.getpid()] + paths[name].pids
                        cpu = {"pids": pids[name]}
                        mbs = throughput(paths[name], size, n, cpu)
                    got[(name, size)]["mbs"].append(mbs)
                    got[(name, size)]["cpu"].append(cpu["ms_per_mib"])
                    got[(name, size)]["each"].append(cpu["each"])
                    time.sleep(0.2)
            for name in order:
                lat[name].append(_pct(latency(paths[name], 64 * KIB, 60), 0.5) * 1e3)
            print(f"  repetition {rep + 1}/{reps} done (load average {_load()})", file=sys.stderr, flush=True)
    finally:
        for p in paths.values():
            p.close()
    med = {k: {m: statistics.median(v[m]) for m in ("mbs", "cpu")} for k, v in got.items()}
    p50 = {n: statistics.median(v) for n, v in lat.items()}
    cols = [n for n in ("nebula", "stunnel", "socat", "tls") if n in paths]
    where = "in a process of its own" if remote else "a thread of the sending process"
    print(f"\nNebula full path (worker -> switch -> TLS -> switch -> worker, shared memory as provisioned) against "
          f"stunnel, socat and raw TLS on loopback; the receiving end {where}; median of {reps} alternating "
          f"repetitions; load average {load0} before, {_load()} after")
    for why in skipped.values():
        print(f"  skipped: {why}")
    ref = "stunnel" if "stunnel" in paths else "tls"
    print(f"{'message':>9} " + " ".join(f"{c + ' MB/s':>13}" for c in cols) + f" {'nebula/' + ref:>15} "
          + " ".join(f"{c + ' ms/MiB':>15}" for c in cols) + f" {'CPU nebula/' + ref:>19}")
    for size in TUNNEL_SIZES:
        r = {c: med[(c, size)] for c in cols}
        print(f"{_label(size):>9} " + " ".join(f"{r[c]['mbs']:13.0f}" for c in cols)
              + f" {r['nebula']['mbs'] / r[ref]['mbs']:15.2f} " + " ".join(f"{r[c]['cpu']:15.2f}" for c in cols)
              + f" {_ratio(r['nebula']['cpu'], r[ref]['cpu']):>19}")
    hops = "   ".join(f"{c} {(p50[c] - p50['tls']) / 2:.3f} ms" for c in cols if c != "tls")
    print(f"added latency per relay hop, p50 at 64 KiB over raw TLS ({p50['tls']:.3f} ms): {hops}")
    print("targets: nebula/stunnel MB/s >= 1 at every size; CPU nebula/stunnel <= 1.5 at 64 KiB; nebula hop "
          "<= 0.5 ms")
    if remote:
        _by_process(got, [c for c in cols if c != "tls"])


def _by_process(got: dict, relayed: list[str]) -> None:
    """Each process's share of a relayed path's CPU per MiB (its pids: sender, relay A, relay B, receiver)."""
    print("\nCPU ms per MiB of each process, medians: the sender, the relay or switch on its side (A), the one on "
          "the receiver's side (B), the receiver")
    print(f"{'message':>9} " + " ".join(f"{c + ': sender, A, B, receiver':>34}" for c in relayed))
    for size in TUNNEL_SIZES:
        cells = [", ".join(f"{statistics.median(e[i] for e in got[(c, size)]['each']):.2f}" for i in range(4))
                 for c in relayed]
        print(f"{_label(size):>9} " + " ".join(f"{x:>34}" for x in cells))


def sustained(fed: dict, mib: int, reps: int) -> None:
    """Streams of `mib` MiB through the full path, `reps` times at 64 KiB and at 1 MiB: longer than the receiving
    worker's arena holds, so what the receiving switch decrypts straight into it (not into its own memory, to be
    copied again) shows whether the sender kept its receiver's pace."""
    full = FullPath(fed)
    latency(full, 1024, 20)
    mbs: dict[int, list[float]] = {64 * KIB: [], MIB: []}
    try:
        for rep in range(reps):
            for size in mbs:
                mbs[size].append(throughput(full, size, mib * MIB // size))
            print(f"  repetition {rep + 1}/{reps} done", file=sys.stderr, flush=True)
    finally:
        full.close()
    time.sleep(1.2)  # a status period
    shm = switch_status(fed, "B")["shm_bytes"]
    print(f"Nebula full path, {reps} streams of {mib} MiB per size (load average {_load()}), MB/s of each:")
    for size, got in mbs.items():
        print(f"  {_label(size):>8}: {', '.join(f'{x:.0f}' for x in got)}  (median {statistics.median(got):.0f})")
    print(f"receiving switch: {shm['placed'] / max(1, shm['out']):.1%} of the {shm['out'] / 1e6:.0f} MB it delivered "
          "through shared memory was decrypted straight into the worker's arena")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-mib", type=int, default=64, help="bytes streamed per size for throughput")
    ap.add_argument("--bulk-mib", type=int, default=256, help="bulk transfer behind which activations are timed")
    ap.add_argument("--shaped-mib", type=int, default=12, help="bytes sent through the 60 Mbit/s shaper")
    ap.add_argument("--max-size-mib", type=int, default=64)
    ap.add_argument("--chunk-kib", type=int, default=None, help="link.chunk_bytes of both switches (default: config)")
    ap.add_argument("--vs-tunnels", action="store_true", help="only the comparison with stunnel, socat, raw TLS")
    ap.add_argument("--reps", type=int, default=5, help="alternating repetitions of --vs-tunnels or --sustained")
    ap.add_argument("--receiver", choices=("process", "thread"), default="process",
                    help="--vs-tunnels: every path's receiving end in a process of its own (as at a real site), or "
                         "a thread of the benchmark's process (how stops up to 38 measured)")
    ap.add_argument("--sustained", type=int, default=0, metavar="MIB", help="only: streams of MIB MiB (see above)")
    args = ap.parse_args(argv)
    sizes = [s for s in SIZES if s <= args.max_size_mib * MIB]
    tmp = Path(tempfile.mkdtemp(prefix="nebula-relay-bench-"))
    chunk = (lambda c, d: d.setdefault("link", {}).update(chunk_bytes=args.chunk_kib * KIB)) if args.chunk_kib else None
    switches = Switches(tmp / "fed", edit=chunk)
    fed = switches.fed
    if args.vs_tunnels or args.sustained:
        try:
            if args.vs_tunnels:
                vs_tunnels(fed, switches, args.reps, args.budget_mib, args.receiver)
            else:
                sustained(fed, args.sustained, args.reps)
        finally:
            switches.close()
        return 0
    switch_pids = {c: p.pid for c, p in zip(("A", "B"), switches.procs)}
    rows = []
    try:
        tls, zmqp, curve, ipc, full = TLSPair(fed), ZMQPair(), ZMQPair(curve=True), ZMQPair(ipc=True), FullPath(fed)
        noshm = FullPath(fed, name="no-shm", rank=1, files=without_shared_memory(fed, tmp))
        latency(full, 1024, 20)  # warm up connections and the links
        latency(noshm, 1024, 20)
        for size in sizes:
            n, k = _plan(size, args.budget_mib * MIB)
            r = {"size": size}
            for name, pair in (("tls", tls), ("zmq", zmqp), ("curve", curve), ("ipc", ipc), ("noshm", noshm),
                               ("full", full)):
                # the full path's CPU includes both switch processes
                cpu = {"pids": [os.getpid()] + ([p.pid for p in switches.procs] if name in ("full", "noshm") else [])}
                r[f"{name}_mbs"] = throughput(pair, size, n, cpu)
                r[f"{name}_cpu"] = cpu["ms_per_mib"]
                r[f"{name}_each"] = cpu["each"]
                r[f"{name}_busiest"] = cpu["busiest"]
                time.sleep(0.3)  # the streaming test's last acknowledgements settle before single messages are timed
                lat = latency(pair, size, k)
                r[f"{name}_p50"], r[f"{name}_p99"] = _pct(lat, 0.5) * 1e3, _pct(lat, 0.99) * 1e3
            rows.append(r)
            print(f"  measured {size // KIB} KiB", file=sys.stderr, flush=True)
        tls.close()
        zmqp.close()
        curve.close()
        ipc.close()
        noshm.close()
        time.sleep(1.2)  # a status period
        shm_in, shm_out = switch_status(fed, "A")["shm_bytes"]["in"], switch_status(fed, "B")["shm_bytes"]["out"]
        # what the full path carried: the throughput messages and the latency samples of every size
        full_bytes = sum(sum(_plan(size, args.budget_mib * MIB)) * size for size in sizes)

        # a 64 KiB activation on its own channel while a bulk transfer runs; the bulk sender and receiver are
        # other ranks, so other processes (as in a real job), and do not share this process's interpreter lock
        act = FullPath(fed, name="act", lane="activation", rank=2)
        mp = multiprocessing.get_context("spawn")
        events: multiprocessing.queues.Queue = mp.Queue()
        go = mp.Event()
        ranks = [mp.Process(target=_bulk_rank, args=(fed["clusters"][c]["worker_yaml"], role, args.bulk_mib * MIB,
                                                      events, go), daemon=True)
                 for c, role in (("B", "recv"), ("A", "send"))]
        for p in ranks:
            p.start()
        for _ in ranks:
            if events.get(timeout=120) != "ready":
                raise RuntimeError("a bulk rank failed to connect")
        t0 = time.perf_counter()
        go.set()
        time.sleep(0.2)
        behind: list[float] = []
        done_at = None
        while done_at is None:
            behind += latency(act, 64 * KIB, 1)
            time.sleep(0.01)
            try:
                done_at = events.get_nowait()
            except queue.Empty:
                pass
        t_bulk = {"s": done_at - t0}
        for p in ranks:
            p.join(60)
        act.close()
        full.close()
    finally:
        switches.close()

    # the shaper: a fresh pair of switches with link.shape.rate_mbit = 60
    shaped = Switches(tmp / "fed-shaped", edit=lambda c, d: d.setdefault("link", {}).update(shape={"rate_mbit": 60.0}))
    fed2 = shaped.fed
    try:
        sp = FullPath(fed2, lane="bulk")
        latency(sp, 1024, 3)
        n = max(1, args.shaped_mib)
        t0 = time.perf_counter()
        mbs = throughput(sp, MIB, n)
        shaped_s = time.perf_counter() - t0
        sp.close()
    finally:
        shaped.close()
    goodput_mbit = mbs * 8
    kernel = kernel_shaped_goodput(tmp, args.shaped_mib)

    print("\nThroughput (MB/s) and one-way latency (ms), loopback; a = raw TLS, b = raw ZeroMQ over TCP, "
          "z = ZeroMQ with CURVE (a worker on another host of the cluster to its switch), i = ZeroMQ over IPC "
          "(a worker on the switch's host, as here), n = full path with payloads through the IPC socket "
          "(shared_memory: false), c = full path as provisioned (payloads through shared memory)")
    print(f"{'size':>9} {'a MB/s':>9} {'b MB/s':>9} {'z MB/s':>9} {'i MB/s':>9} {'n MB/s':>9} {'c MB/s':>9} {'n/a':>6} "
          f"{'c/a':>6} | {'a p50':>8} {'a p99':>8} {'i p50':>8} {'i p99':>8} {'n p50':>8} {'c p50':>8} {'c p99':>8}")
    for r in rows:
        print(f"{_label(r['size']):>9} {r['tls_mbs']:9.1f} {r['zmq_mbs']:9.1f} {r['curve_mbs']:9.1f} "
              f"{r['ipc_mbs']:9.1f} {r['noshm_mbs']:9.1f} {r['full_mbs']:9.1f} {r['noshm_mbs'] / r['tls_mbs']:6.2f} "
              f"{r['full_mbs'] / r['tls_mbs']:6.2f} | {r['tls_p50']:8.3f} {r['tls_p99']:8.3f} {r['ipc_p50']:8.3f} "
              f"{r['ipc_p99']:8.3f} {r['noshm_p50']:8.3f} {r['full_p50']:8.3f} {r['full_p99']:8.3f}")
    print(f"\nc: {shm_in / full_bytes * 100:.0f}% of the payload bytes went up through shared memory at switch A, "
          f"{shm_out / full_bytes * 100:.0f}% down at switch B (the rest: chunks under the threshold, or an arena full)")
    print("\nCPU time per MiB relayed (ms); for n and c split into the benchmark process (both workers), switch A "
          "and switch B")
    print(f"{'size':>9} {'a':>8} {'b':>8} {'z':>8} {'i':>8} {'n':>8} {'c':>8} {'c/a':>6} | "
          f"{'workers':>8} {'switch A':>8} {'switch B':>8} | {'n: wkrs':>8} {'sw A':>8} {'sw B':>8}")
    for r in rows:
        w, sa, sb = r["full_each"]
        nw, nsa, nsb = r["noshm_each"]
        print(f"{_label(r['size']):>9} {r['tls_cpu']:8.2f} {r['zmq_cpu']:8.2f} {r['curve_cpu']:8.2f} "
              f"{r['ipc_cpu']:8.2f} {r['noshm_cpu']:8.2f} {r['full_cpu']:8.2f} "
              f"{r['full_cpu'] / max(r['tls_cpu'], 1e-9):6.1f} | {w:8.2f} {sa:8.2f} {sb:8.2f} | "
              f"{nw:8.2f} {nsa:8.2f} {nsb:8.2f}")
    roles = {os.getpid(): "benchmark", **{p: f"switch {c}" for c, p in switch_pids.items()}}
    print("\nBusiest thread, CPU ms per MiB (with a core for every busy thread it would set the throughput; "
          "this machine has 2 cores)")
    print(f"{'size':>9} {'a':>8}  {'thread':<24} {'c':>8}  {'thread':<24} {'a/c':>6}")
    for r in rows:
        (ta, pa, na), (tc, pc, nc) = r["tls_busiest"], r["full_busiest"]
        print(f"{_label(r['size']):>9} {ta:8.2f}  {roles.get(pa, pa)}/{na:<14} {tc:8.2f}  {roles.get(pc, pc)}/{nc:<14} "
              f"{ta / max(tc, 1e-9):6.2f}")
    r64 = next((r for r in rows if r["size"] == 64 * KIB), None)
    if r64:
        # the full path has two switch hops on top of the one TLS hop of the baseline
        print(f"\nadded latency per switch hop at 64 KiB: p50 {(r64['full_p50'] - r64['tls_p50']) / 2:.3f} ms, "
              f"p99 {(r64['full_p99'] - r64['tls_p99']) / 2:.3f} ms   (targets 0.5 / 2 ms)")
    big = [r["full_mbs"] / r["tls_mbs"] for r in rows if r["size"] >= MIB]
    if big:
        nbig = [r["noshm_mbs"] / r["tls_mbs"] for r in rows if r["size"] >= MIB]
        print(f"c/a for messages >= 1 MiB: min {min(big):.2f}, mean {statistics.mean(big):.2f}   (target >= 0.9; "
              f"n/a: min {min(nbig):.2f}, mean {statistics.mean(nbig):.2f})")
    print(f"\n64 KiB activation behind a {args.bulk_mib} MiB bulk transfer ({len(behind)} samples; bulk took "
          f"{t_bulk['s']:.2f} s = {args.bulk_mib * MIB / t_bulk['s'] / 1e6:.0f} MB/s): "
          f"p50 {_pct(behind, 0.5) * 1e3:.2f} ms, p99 {_pct(behind, 0.99) * 1e3:.2f} ms   (target p99 <= 50 ms)")
    print(f"shaper at 60 Mbit/s: goodput {goodput_mbit:.1f} Mbit/s = {goodput_mbit / 60 * 100:.1f}% of the rate "
          f"({args.shaped_mib} MiB in {shaped_s:.1f} s; target >= 90%)")
    if isinstance(kernel, str):
        print(f"kernel-shaped link (tbf between two network namespaces): not measured: {kernel}")
    else:
        print(f"kernel-shaped link (tbf 60 Mbit/s between two network namespaces, switches and workers inside): "
              f"goodput {kernel[0]:.1f} Mbit/s = {kernel[0] / 60 * 100:.1f}% of the rate ({args.shaped_mib} MiB, "
              f"{kernel[1]:.1f} s with start-up)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
