"""Audit log throughput: append rate (one and several writers, checkpoint intervals) and verify rate.

Prints one table; rates are side by side in one run, ratios against a plain JSON-lines append (no hash
chain, no lock) on the same disk. Target: at least 10,000 records/s appended.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

from security.audit import AuditLog, generate_signing_key, read_records
from security.audit_verify import verify_log

DETAIL = {"job": "abnet", "rank": 3, "bytes": 1048576}


def plain_append(path: Path, n: int) -> None:
    """Baseline: one JSON line per record, os.write on an O_APPEND descriptor, nothing else."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        for i in range(n):
            os.write(fd, (json.dumps({"seq": i, "time": time.time(), "actor": "alice", "action": "data.open",
                                      "target": f"alice:data/{i}", "outcome": "ok", "detail": DETAIL}) + "\n").encode())
    finally:
        os.close(fd)


def audit_append(path: Path, key: Path, n: int, every: int, actor: str = "alice") -> None:
    """AuditLog appends: flock, catch-up, canonical JSON, sha256, one write; checkpoint every `every`."""
    with AuditLog(path, key, checkpoint_every=every) as audit:
        for i in range(n):
            audit.append(actor, "data.open", f"alice:data/{i}", "ok", DETAIL)


def _writer(path: str, key: str, n: int, every: int, name: str, start) -> None:
    start.wait()
    audit_append(Path(path), Path(key), n, every, name)


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--writers", type=int, default=2, help="processes in the concurrent-writer row")
    args = ap.parse_args(argv)
    n = args.records
    rows = []
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        key = d / "k.key"
        generate_signing_key(key)
        base = timed(plain_append, d / "plain.log", n)
        rows.append(("plain JSON lines (baseline)", n, base))
        for every in (1000, 100):
            t = timed(audit_append, d / f"audit{every}.log", key, n, every)
            rows.append((f"AuditLog append, checkpoint every {every}", n, t))
        per = n // args.writers
        ctx = mp.get_context("spawn")
        start = ctx.Event()
        procs = [ctx.Process(target=_writer, args=(str(d / "multi.log"), str(key), per, 1000, f"w{k}", start))
                 for k in range(args.writers)]
        for p in procs:
            p.start()
        time.sleep(1.0)  # let every child import before the clock starts
        t0 = time.perf_counter()
        start.set()
        for p in procs:
            p.join()
        rows.append((f"AuditLog append, {args.writers} writer processes", per * args.writers,
                     time.perf_counter() - t0))
        t = timed(verify_log, d / "audit1000.log")
        report = verify_log(d / "audit1000.log")
        multi = verify_log(d / "multi.log")
        appended = sum(r["action"] == "data.open" for r in read_records(d / "multi.log"))
        if not (report.ok and multi.ok and appended == per * args.writers):
            print(f"verification failed: {report} {multi}", file=sys.stderr)
            return 1
        rows.append(("verify_log (chain + signed checkpoints)", report.records, t))
    base_rate = n / base
    print(f"{'operation':<44} {'records':>8} {'seconds':>8} {'records/s':>11} {'vs baseline':>11}")
    for name, count, secs in rows:
        rate = count / secs
        print(f"{name:<44} {count:>8} {secs:>8.3f} {rate:>11,.0f} {rate / base_rate:>10.2f}x")
    append_rate = rows[1][1] / rows[1][2]
    print(f"\nappend target 10,000 records/s: {'met' if append_rate >= 10_000 else 'NOT met'} "
          f"({append_rate:,.0f} records/s with checkpoints every 1000)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
