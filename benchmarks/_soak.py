"""The runs of the soak benchmark (benchmarks/soak.py): a training job of the toy recipe over a `FaultyWan`, each
cluster under `nebula launch --supervise`, the faults on a schedule, and what its metrics say afterwards.

Every figure is read back from files the job wrote (per-step metrics, recovery events) or from /proc; the faults'
times from the schedule's log.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from testbed.clusters import MODES, events, metrics, rank_pids, toy_job
from testbed.faults import FaultyWan, Schedule, periodic
from testbed.federation import launch

EVERY = 20  # checkpoint interval of the soak's jobs (steps)


def rss_mib(pid: int) -> float:
    """Resident set size of `pid` in MiB (0 when it is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@dataclass(frozen=True)
class Faults:
    """What a faulty run suffers: the WAN's delay and loss all along, cuts of `cut_s` every `cut_every_s` (the
    sites in turn), one switch restart at `restart_at_s` and one whole cluster killed at `kill_at_s`."""

    delay_ms: float = 40.0
    jitter_ms: float = 10.0
    loss_per_mille: int = 5
    cut_every_s: float = 120.0
    cut_s: float = 10.0
    restart_at_s: float | None = None
    restart_site: str = "B"
    kill_at_s: float | None = None
    kill_cluster: str = "A"

    @staticmethod
    def over(duration_s: float, clusters: Sequence[str], kill: str, restart: str, cuts: bool = True,
             loss: bool = True) -> Faults:
        """The issue's faults for a run of `duration_s`: a cut every 2 minutes (every third of a shorter run), the
        switch restart at 15% of the run and the kill at 30%, each moved out of a cut."""
        every = min(120.0, duration_s / 3)
        cut = min(10.0, every / 6) if cuts else 0.0
        cut_times = periodic(every, duration_s - cut) if cuts else []

        def clear(t: float) -> float:
            for c in cut_times:
                if c - 2 <= t <= c + cut + 2:
                    return c + cut + 3
            return t

        return Faults(loss_per_mille=5 if loss else 0, cut_every_s=every, cut_s=cut,
                      restart_at_s=clear(0.15 * duration_s), restart_site=restart,
                      kill_at_s=clear(0.3 * duration_s), kill_cluster=kill)


@dataclass(eq=False)
class TrainingRun:
    """One job of `mode` (a key of testbed.clusters.MODES) over its own WAN under `root`."""

    root: Path
    mode: str
    clusters: Sequence[str]
    procs: Any
    faults: Faults | None  # None: the fault-free run (the same WAN delay, nothing else)
    namespaces: bool
    ranks: dict[str, int] = field(default_factory=dict)  # ranks by cluster (default 1)
    delay_ms: float = 40.0
    jitter_ms: float = 10.0
    wan: FaultyWan = field(init=False)
    job: Path = field(init=False)
    supervisors: dict[str, Any] = field(default_factory=dict)
    schedule: Schedule = field(default_factory=Schedule)
    killed_at: float | None = None  # wall clock of the kill
    rss: dict[str, list[tuple[int, float, float]]] = field(default_factory=dict)  # (pid, s, MiB) by switch

    def start(self) -> TrainingRun:
        f = self.faults
        self.root.mkdir(parents=True, exist_ok=True)
        self.wan = FaultyWan(self.root / "fed", self.clusters, self.procs, delay_ms=self.delay_ms,
                             jitter_ms=self.jitter_ms, loss_per_mille=f.loss_per_mille if f else 0,
                             name=("soakf" if f else "soakc") + self.mode[:3], namespaces=self.namespaces)
        spec = dict(MODES[self.mode])
        stages = spec.pop("stages")
        clusters = [{"id": c, "procs_per_node": self.ranks.get(c, 1), "worker": str(w)} for c, w in self.wan.workers().items()]
        # the job outlasts the soak (it is stopped at the end); peers wait out a 10 s cut, not a killed cluster
        self.job = toy_job(self.root, clusters=clusters, stages=stages, steps=10**6, peer_timeout_s=20,
                           recovery_timeout_s=300, startup_timeout_s=180,
                           checkpoint={"dir": "ckpt", "every": EVERY, "keep": 3}, **spec)
        if not stages:
            doc = yaml.safe_load(self.job.read_text())
            del doc["stages"]
            self.job.write_text(yaml.safe_dump(doc, sort_keys=False))
        for c in self.clusters:
            self.supervisors[c] = launch(self.procs, self.job, c, "--supervise", prefix=self.wan.prefix(c))
            _drain(self.supervisors[c], self.root / f"{c}.supervisor.log")
        return self

    def first_steps(self) -> bool:
        """Whether every cluster recorded a step (RuntimeError naming the log when a supervisor gave up)."""
        for c, p in self.supervisors.items():
            if p.poll() is not None:
                log = self.root / f"{c}.supervisor.log"
                time.sleep(0.5)  # (its last lines)
                tail = log.read_text()[-1500:] if log.exists() else ""
                raise RuntimeError(f"cluster {c} of {self.root.name} stopped (exit {p.returncode}):\n{tail}")
        return all(metrics(self.root, c) for c in self.clusters)

    def arm(self, duration_s: float) -> None:
        """Start the fault schedule now (nothing for the fault-free run) and take the switches' first RSS."""
        self.sample_rss()
        f = self.faults
        if f is None:
            return
        if f.cut_s and self.wan.sites is not None:
            for i, t in enumerate(periodic(f.cut_every_s, duration_s - f.cut_s)):
                site = self.clusters[i % len(self.clusters)]
                self.schedule.at(t, f"cut {site} {f.cut_s:.0f} s", lambda s=site: self.wan.cut(s, f.cut_s))
        if f.restart_at_s is not None:
            self.schedule.at(f.restart_at_s, f"restart switch {f.restart_site}",
                             lambda: self.wan.restart_switch(f.restart_site))
        if f.kill_at_s is not None:
            self.schedule.at(f.kill_at_s, f"kill cluster {f.kill_cluster}", self.kill)
        self.schedule.start()

    def rank_dir(self, cluster: str) -> Path:
        return self.root / "metrics" / "log" / cluster / "ranks"

    def kill(self) -> None:
        """SIGKILL every rank of the faulty cluster; its supervisor launches it again."""
        c = self.faults.kill_cluster
        self.killed_at = time.time()
        for pid in rank_pids(self.rank_dir(c)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def sample_rss(self) -> None:
        for c, sw in self.wan.fed.switches.items():
            if sw.proc.poll() is None:
                self.rss.setdefault(c, []).append((sw.proc.pid, time.monotonic(), rss_mib(sw.proc.pid)))

    def _last_process(self, cluster: str) -> list[tuple[float, float]]:
        """(s, MiB) samples of the switch process that ran last (a restarted switch: since its restart)."""
        pid = self.rss[cluster][-1][0]
        return [(t, m) for p, t, m in self.rss[cluster] if p == pid]

    def rss_span(self, cluster: str) -> tuple[float, float, float]:
        """(first, last, peak) RSS in MiB of the switch process that ran last (a restarted switch: since then)."""
        mine = [m for _, m in self._last_process(cluster)]
        return mine[0], mine[-1], max(mine)

    def rss_settled(self, cluster: str, settle_s: float) -> tuple[float, float, float, float, float] | None:
        """After `settle_s` of the last switch process's life: (minutes covered, MiB at the start, at the end, the
        least-squares slope in MiB per hour, max - min); None when the process did not live that long."""
        mine = self._last_process(cluster)
        t0 = mine[0][0]
        late = [(t - t0, m) for t, m in mine if t - t0 >= settle_s]
        if len(late) < 3:
            return None
        ts, ms = [t for t, _ in late], [m for _, m in late]
        mt, mm = sum(ts) / len(ts), sum(ms) / len(ms)
        var = sum((t - mt) ** 2 for t in ts)
        slope = sum((t - mt) * (m - mm) for t, m in late) / var if var else 0.0
        return (ts[-1] - ts[0]) / 60, ms[0], ms[-1], slope * 3600, max(ms) - min(ms)

    def write_rss(self, path: Path) -> None:
        """Every RSS sample as CSV (cluster, pid, seconds since the first sample, MiB): the soak's evidence."""
        t0 = min(t for samples in self.rss.values() for _, t, _ in samples)
        rows = [f"{c},{p},{t - t0:.1f},{m:.2f}" for c, samples in self.rss.items() for p, t, m in samples]
        path.write_text("cluster,pid,s,rss_mib\n" + "\n".join(rows) + "\n")

    def stop(self) -> None:
        """Stop the schedule, the supervisors (first: nothing is launched again) and the ranks; sample RSS."""
        self.schedule.stop()
        self.sample_rss()
        for p in self.supervisors.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        for c in self.clusters:
            for pid in rank_pids(self.rank_dir(c)) if self.rank_dir(c).exists() else []:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        self.wan.close()


def _drain(p: Any, log: Path) -> None:
    """Copy `p`'s output to `log` in a thread (a full pipe would stall it)."""
    import threading

    def run() -> None:
        with open(log, "a") as out:
            for line in p.stdout:
                out.write(line)
                out.flush()
    threading.Thread(target=run, daemon=True).start()


# ---- what the metrics say (pure functions of the records) ----
def last_records(records: list[dict]) -> dict[int, dict]:
    """Each step's last record (a step redone after a recovery: the time that counted)."""
    return {r["step"]: r for r in records}


def losses_of(records: list[dict], key: str = "loss") -> dict[int, float]:
    return {s: r[key] for s, r in last_records(records).items() if r.get(key) is not None}


def redone_twice(records: list[dict]) -> tuple[int, int]:
    """(steps recorded more than once, records whose loss differs from the step's first record)."""
    first: dict[int, float] = {}
    again, differ = set(), 0
    for r in records:
        if r["step"] in first:
            again.add(r["step"])
            differ += r.get("loss") is not None and r["loss"] != first[r["step"]]
        else:
            first[r["step"]] = r.get("loss")
    return len(again), differ


def pipeline_messages(up: list[dict], down: list[dict]) -> tuple[int, int, int]:
    """(messages, lost, duplicated) on the boundary of a two-stage pipeline, step by step over the steps both
    clusters recorded: what one side sent in a step, the other took in the same step; and what arrived twice."""
    a, b = last_records(up), last_records(down)
    total = lost = dup = 0
    for s in sorted(a.keys() & b.keys()):
        dup += a[s].get("messages_dup", 0) + b[s].get("messages_dup", 0)
        for sent, recv in ((a[s]["messages_sent"], b[s]["messages_recv"]),
                           (b[s]["messages_sent"], a[s]["messages_recv"])):
            total += sent
            lost += max(0, sent - recv)
            dup += max(0, recv - sent)
    return total, lost, dup


def recovery_summary(root: Path, clusters: Sequence[str], killed: str, killed_at: float | None) -> dict:
    """The recoveries the survivors agreed, the steps redone and the time from the kill to the killed cluster's
    first step after it."""
    survivors = [c for c in clusters if c != killed]
    rec = [e for e in events(root, survivors[0]) if e["event"] == "recovered"]
    out: dict[str, Any] = {"recoveries": len(rec), "redone": None, "back_s": None, "resumed": None}
    if killed_at is None or not rec:
        return out
    after = [r for r in metrics(root, killed) if r["time"] > killed_at]
    if after:
        out["back_s"] = after[0]["time"] - killed_at
    mine = next((e for e in rec if e["time"] > killed_at), None)
    if mine is not None:
        before = [r["step"] for c in clusters for r in metrics(root, c) if r["time"] < mine["time"]]
        out["resumed"] = mine["step"]
        out["redone"] = max(before) + 1 - mine["step"]
    return out
