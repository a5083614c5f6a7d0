"""Soak: a job that outlives its failures. Over the WAN fault harness (testbed/faults.py: one network
namespace per site, delay and jitter by a proxy, loss by nftables, link cuts by `ip link`), with each cluster under
`nebula launch --supervise`:

1. a two-cluster toy pipeline for `--minutes` (default 20) with 40 ms +- 10 ms delay, 0.5% packet loss, each
   site's link down 10 s every 2 minutes in turn, one switch restart and one whole cluster killed (SIGKILL, every
   rank; its supervisor launches it again), side by side with the same job on a WAN with the same delay and no
   faults;
2. a three-cluster one-way run (two sender clusters, one receiver) for `--oneway-minutes` (default a quarter of
   `--minutes`) with the same faults, a sender cluster killed, side by side with its fault-free twin;
3. a federated run of `--rounds` rounds (toy clients, two clusters) where 30% of the clients are killed and start
   again in every round.

Prints one table: steps/s with and without faults, boundary messages lost and duplicated, the loss at the faulty
run's last step against the fault-free run's at the same step (and every step both did), the time from the kill
to the killed cluster's first step, steps redone, switch RSS at start and end; for the federated run, updates
averaged twice and the slowest round against its deadline.

    .venv/bin/python benchmarks/soak.py                  # 20 + 5 minutes of training, a few of federated rounds
    .venv/bin/python benchmarks/soak.py --minutes 2 --rounds 3

Without root (no namespaces) the WAN runs on loopback with the delay proxy: packet loss and link cuts are left out
and the table says so; switch restart, cluster kill and client churn still run.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from _soak import (Faults, TrainingRun, last_records, losses_of, pipeline_messages,  # benchmarks/: this script's
                   recovery_summary, redone_twice)
from _soak_fed import federated_churn
from testbed.clusters import MODES, metrics
from testbed.procs import Procs

REPO = Path(__file__).resolve().parent.parent

STAGE_KEYS = {"pipeline": "loss", "oneway3": "loss"}


def _wait(pred, timeout_s: float, what: str, runs: list[TrainingRun]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    logs = "\n".join(f"  {r.root}/*.supervisor.log" for r in runs)
    raise RuntimeError(f"{what} within {timeout_s:.0f} s; see\n{logs}")


def training(tmp: Path, procs: Procs, mode: str, clusters: list[str], minutes: float, kill: str, restart: str,
             namespaces: bool, ranks: dict[str, int] | None = None, settle_minutes: float = 20.0) -> dict:
    """The faulty run and its fault-free twin side by side for `minutes`; the rows of the table."""
    duration = minutes * 60
    faults = Faults.over(duration, clusters, kill=kill, restart=restart, cuts=namespaces, loss=namespaces)
    runs = [TrainingRun(tmp / f"{mode}-faulty", mode, clusters, procs, faults, namespaces, dict(ranks or {})),
            TrainingRun(tmp / f"{mode}-clean", mode, clusters, procs, None, namespaces, dict(ranks or {}))]
    try:
        for r in runs:
            r.start()
        _wait(lambda: all(r.first_steps() for r in runs), 600, "the runs did not start", runs)
        t0 = time.monotonic()
        for r in runs:
            r.arm(duration)
        while time.monotonic() - t0 < duration:
            time.sleep(min(5.0, max(0.0, duration - (time.monotonic() - t0))))
            for r in runs:
                r.sample_rss()
        elapsed = time.monotonic() - t0
        for r in runs:
            r.stop()
        runs[0].write_rss(tmp / f"{mode}-rss.csv")
        row = _rows(runs, mode, clusters, faults, elapsed)
        row["settled"] = {c: runs[0].rss_settled(c, settle_minutes * 60) for c in clusters}
        row["settle_minutes"], row["rss_csv"] = settle_minutes, str(tmp / f"{mode}-rss.csv")
        return row
    finally:
        for r in runs:
            r.close()


def _rows(runs: list[TrainingRun], mode: str, clusters: list[str], faults: Faults, elapsed: float) -> dict:
    faulty, clean = runs
    recs = {r: {c: metrics(r.root, c) for c in clusters} for r in runs}
    last = clusters[-1]  # the cluster that computes the loss (pipeline head, one-way receiver)
    done = {r: len(losses_of(recs[r][last])) for r in runs}
    lf, lc = losses_of(recs[faulty][last]), losses_of(recs[clean][last])
    common = sorted(lf.keys() & lc.keys())
    differ = [s for s in common if abs(lf[s] - lc[s]) > 1e-5 * max(1.0, abs(lc[s]))]
    end = common[-1] if common else None
    rec = recovery_summary(faulty.root, clusters, faults.kill_cluster, faulty.killed_at)
    if mode == "pipeline":
        total, lost, dup = pipeline_messages(recs[faulty][clusters[0]], recs[faulty][last])
    else:
        total, lost, dup = _oneway_messages(faulty.root, clusters, faulty.ranks, rec.get("resumed"))
    again = [redone_twice(recs[faulty][c]) for c in clusters]
    return {
        "mode": mode, "clusters": len(clusters), "elapsed_s": elapsed,
        "steps_faulty": done[faulty], "steps_clean": done[clean],
        "rate_faulty": done[faulty] / elapsed, "rate_clean": done[clean] / elapsed,
        "messages": total, "lost": lost, "duplicated": dup,
        "loss_end": (end, lf.get(end), lc.get(end)), "common": len(common), "differ": len(differ),
        "redone_differ": sum(d for _, d in again), **rec, "every": 20,
        "rss": {c: faulty.rss_span(c) for c in clusters}, "restarted": faults.restart_site,
        "faults": [e for e in faulty.schedule.log],
    }


def _per_step(rank_records: list[list[dict]]) -> dict[int, tuple[int, int, int]]:
    """(sent, taken, arrived twice) boundary messages of each step, summed over a cluster's ranks (their last
    records)."""
    lasts = [last_records(r) for r in rank_records]
    steps = set.intersection(*(set(x) for x in lasts)) if lasts else set()
    return {s: tuple(sum(x[s].get(k, 0) for x in lasts) for k in ("messages_sent", "messages_recv", "messages_dup"))
            for s in steps}


def _oneway_messages(root: Path, clusters: list[str], ranks: dict[str, int],
                     resumed: int | None) -> tuple[int, int, int]:
    """Activations: what the senders sent in a step, the receivers received in that step. Sync tensors: what the
    receivers sent in step s the senders take in step s + sync_lag + 1; those of the steps just before a resume
    point belong to the abandoned round (the checkpoint stands in for them) and are not paired. The first step of
    a round (0, the resume step) also carries the start-up exchange, sent and taken in that step."""
    lag = MODES["oneway3"]["oneway"]["sync_lag"]
    per = {c: _per_step([metrics(root, c, k) for k in range(ranks.get(c, 1))]) for c in clusters}
    senders, recv = [per[c] for c in clusters[:-1]], per[clusters[-1]]
    total = lost = dup = 0

    def pair(sent: int, got: int) -> None:
        nonlocal total, lost, dup
        total, lost, dup = total + sent, lost + max(0, sent - got), dup + max(0, got - sent)

    for s, (r_sent, r_recv, r_dup) in sorted(recv.items()):
        dup += r_dup + sum(x[s][2] for x in senders if s in x)
        if all(s in x for x in senders):
            pair(sum(x[s][0] for x in senders), r_recv)
        t = s + lag + 1
        if not (resumed is not None and s < resumed <= t) and all(t in x for x in senders):
            start_up = sum(x[s][1] for x in senders) if s in (0, resumed) else 0
            pair(r_sent, sum(x[t][1] for x in senders) + start_up)
    return total, lost, dup


def _fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _settled(settled: dict) -> str:
    """Whether RSS levelled off: each switch's first and last MiB after the settling time, its slope and range."""
    return "; ".join(f"{c} -" if v is None else
                     f"{c} {v[1]:.1f} -> {v[2]:.1f} over {v[0]:.0f} min (slope {v[3]:+.2f} MiB/h, range {v[4]:.1f})"
                     for c, v in settled.items()) + " (a switch that lived less than that: -)"


def table(rows: list[dict], fed: dict | None, note: str) -> str:
    out = [note, ""]
    for r in rows:
        end, lf, lc = r["loss_end"]
        rss = ", ".join(f"{c} {a:.0f} -> {b:.0f} (peak {p:.0f}" + (", since its restart)" if c == r["restarted"]
                                                                   else ")") for c, (a, b, p) in r["rss"].items())
        out += [f"{r['mode']} ({r['clusters']} clusters, {r['elapsed_s'] / 60:.1f} min)",
                f"  steps/s with faults / without        {r['rate_faulty']:.2f} / {r['rate_clean']:.2f} "
                f"({r['rate_faulty'] / max(r['rate_clean'], 1e-9):.0%})",
                f"  boundary messages lost / duplicated  {r['lost']} / {r['duplicated']} of {r['messages']}",
                f"  loss at step {end}: faulty / clean    {_fmt(lf, '.6f')} / {_fmt(lc, '.6f')}; steps that differ: "
                f"{r['differ']} of {r['common']} (redone steps with a new loss: {r['redone_differ']})",
                f"  recoveries / kill -> first step      {r['recoveries']} / {_fmt(r['back_s'], '.1f')} s",
                f"  steps redone (checkpoint every {r['every']})   {_fmt(r['redone'], 'd')} (resumed at "
                f"{_fmt(r['resumed'], 'd')})",
                f"  switch RSS start -> end (MiB)        {rss}",
                f"  switch RSS after {r['settle_minutes']:.0f} min (MiB)         " + _settled(r["settled"]),
                "  faults: " + "; ".join(f"{e['name']} @{e['start']:.0f}s" + (f" FAILED {e['error']}" if e["error"]
                                                                               else "") for e in r["faults"]), ""]
    if fed:
        out += [f"federated ({fed['clients']} clients, {fed['churn']} leave and rejoin every round)",
                f"  rounds valid / run                   {fed['valid']} / {fed['rounds']}",
                f"  updates averaged twice               {fed['twice']}",
                f"  slowest round / deadline + 5 s       {fed['slowest_s']:.1f} / {fed['deadline_s'] + 5:.0f} s",
                f"  clients restarted                    {fed['restarts']}", ""]
    return "\n".join(out)


def smallest(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with the one-way run's default filled in (a quarter of `--minutes`), capped under NEBULA_SMOKE
    (nebula/smoke.py: how CI runs the printed soaks) at the smallest soak that still runs every fault: 1.25 minutes
    of each training run (the kill at 30% leaves 50 s for the 20 s peer timeout, the relaunch and the agreement:
    about 21 s here) and 3 federated rounds with churn."""
    from nebula import smoke

    oneway = args.minutes / 4 if args.oneway_minutes is None else args.oneway_minutes
    return argparse.Namespace(**{**vars(args), "minutes": smoke.cap(args.minutes, 1.25),
                                 "oneway_minutes": smoke.cap(oneway, 1.25), "rounds": smoke.cap(args.rounds, 3)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=20.0, help="two-cluster pipeline run (default 20)")
    ap.add_argument("--oneway-minutes", type=float, default=None, help="three-cluster one-way run (default "
                                                                       "--minutes / 4; 0 leaves it out)")
    ap.add_argument("--rounds", type=int, default=10, help="federated rounds with churn (0 leaves them out)")
    ap.add_argument("--settle-minutes", type=float, default=20.0,
                    help="RSS is judged flat over what follows this many minutes of a switch's life (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fault schedule's choices")
    ap.add_argument("--dir", type=Path, default=None, help="keep the runs' files here (default: a temporary "
                                                             "directory, removed at the end)")
    args = smallest(ap.parse_args(argv))
    oneway = args.oneway_minutes
    namespaces = os.geteuid() == 0
    note = (f"load average at start {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)"
            + ("" if namespaces else "\nnot root: no network namespaces, so packet loss and link cuts are left "
               "out (run as root for them); delay, switch restart, cluster kill and churn run on loopback"))
    random.seed(args.seed)
    procs = Procs()
    rows, fed = [], None
    with tempfile.TemporaryDirectory(prefix="soak-") as scratch:
        tmp = args.dir or scratch
        try:
            if args.minutes > 0:
                rows.append(training(Path(tmp), procs, "pipeline", ["A", "B"], args.minutes, "A", "B", namespaces,
                                     settle_minutes=args.settle_minutes))
            if oneway > 0:
                rows.append(training(Path(tmp), procs, "oneway3", ["A", "B", "C"], oneway, "B", "C", namespaces,
                                     ranks={"C": 2}))  # a receiver rank per sender rank
            if args.rounds > 0:
                fed = federated_churn(Path(tmp) / "fed", procs, args.rounds, namespaces, args.seed)
        finally:
            procs.reap()
    note += f"; at end {os.getloadavg()[0]:.2f}"
    print(table(rows, fed, note))
    bad = [r["mode"] for r in rows if r["lost"] or r["duplicated"] or r["differ"] or r["redone_differ"]]
    if fed and fed["twice"]:
        bad.append("federated")
    if bad:
        print(f"soak: {', '.join(bad)}: messages lost or duplicated, or losses off the fault-free run's",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
