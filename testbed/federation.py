"""The one local federation of tests and benchmarks: provisioned clusters, a real switch server each, `nebula launch`.

`LocalFederation` provisions clusters (flags or a federation file), optionally shapes their links or edits their
switch.yaml, and starts one `nebula-switch serve` per cluster, each on loopback or, given `sites`
(`testbed.netns.Sites`), inside its cluster's own network namespace at its own address. Switch output goes
to `switch.log` beside its config; a switch that does not come up fails with the end of that log.
"""
from __future__ import annotations

__all__ = ["BIN", "LocalFederation", "Switch", "drain", "edit_yaml", "finish", "launch", "start_switch", "wait_until",
           "slot_bytes", "start_switches", "wait_audit", "wait_for_line"]

import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from testbed.procs import BIN, Procs

LISTENING = re.compile(r"^listening (wan=\S+ local=\S+)", re.M)


def wait_until(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """`pred()`'s first truthy value, polled every 0.1 s; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def edit_yaml(path: Path, fn: Callable[[dict], Any]) -> None:
    """Load YAML `path`, let `fn` change the dict in place, write it back."""
    data = yaml.safe_load(Path(path).read_text())
    fn(data)
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))


class Switch:
    """A running `nebula-switch serve` process and where it listens."""

    def __init__(self, proc: subprocess.Popen, cluster: str, config: Path, wan: str, local: str, log: Path,
                 prefix: tuple[str, ...] = ()) -> None:
        self.proc, self.cluster, self.config, self.wan, self.local, self.log = proc, cluster, config, wan, local, log
        self.prefix = prefix

    def kill9(self) -> None:
        """Kill the switch at once (no final audit record, no clean close of its links)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM and wait; its exit code."""
        os.killpg(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def hup(self) -> None:
        """Ask the switch to reload its configuration (what `nebula-switch reload` does)."""
        os.kill(self.proc.pid, signal.SIGHUP)

    def audit(self) -> list[dict]:
        """The records of its audit log written so far."""
        path = self.config.parent / "audit.log"
        if not path.exists():
            return []
        # the switch may be writing a record right now: only lines it has finished (newline-terminated) count
        done = path.read_text().rpartition("\n")[0]
        return [json.loads(line) for line in done.splitlines() if line.strip()]


def wait_audit(switch: Switch, pred: Callable[[dict], bool], timeout_s: float = 20.0) -> dict:
    """First audit record of `switch` matching `pred`, waiting for it to appear."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for rec in switch.audit():
            if pred(rec):
                return rec
        time.sleep(0.1)
    raise AssertionError(f"no matching audit record; have: {[(r['action'], r.get('detail')) for r in switch.audit()]}")


def slot_bytes(config: Path, used: int, timeout_s: float = 20.0) -> dict[str, int]:
    """The bytes workers put into their connections' slots and frames took from them (`nebula.wire.share`), as the
    switch of `config` reports them in a status written after this call began (one is written every second), once
    "used" reaches `used`; AssertionError if none does within `timeout_s`."""
    from nebula.config import load_switch_config
    from switch_server.status import status_path

    path = status_path(load_switch_config(config))
    since, deadline = time.time(), time.monotonic() + timeout_s
    got = None
    while time.monotonic() < deadline:
        try:
            st = json.loads(path.read_text())
        except (OSError, ValueError):  # (not written yet, or being written)
            st = {"time": 0}
        if st["time"] >= since:
            got = st["slot_bytes"]
            if got["used"] >= used:
                return got
        time.sleep(0.2)
    raise AssertionError(f"switch of {config}: slot bytes {got} after {timeout_s} s, expected {used} used")


def start_switch(procs: Procs, config: Path, timeout_s: float = 30.0, prefix: Sequence[str] = (),
                 args: Sequence[str] = ()) -> Switch:
    """Start a switch server on `config` (behind `prefix`, e.g. `ip netns exec NS`) and wait until it listens."""
    config = Path(config)
    log = config.parent / "switch.log"
    start = log.stat().st_size if log.exists() else 0
    with open(log, "ab") as out:
        proc = procs.start([*prefix, sys.executable, "-m", "switch_server.cli", "serve", "--config", str(config),
                            "--log-level", "info", *args], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(log, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        m = LISTENING.search(text)
        if m:
            fields = dict(kv.split("=", 1) for kv in m.group(1).split())
            cluster = yaml.safe_load(config.read_text())["cluster"]
            return Switch(proc, cluster, config, fields["wan"], fields["local"], log, tuple(prefix))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"switch {config} did not start: {log.read_text(errors='replace')[start:][-3000:]}")


class LocalFederation:
    """Clusters provisioned under `root` (or from `federation_file`), one switch server each, started.

    `shape` ({rate_mbit, delay_ms}) goes into every switch's `link.shape` (metrics off, as the benchmarks want);
    `edit(cluster, doc)` changes a switch.yaml before its start; with `sites` every switch runs in its cluster's
    namespace and listens on its site's address. `procs` reaps the processes; without one the federation has its
    own, reaped by `close()`.
    """

    def __init__(self, root: Path, clusters: Sequence[str], *, procs: Procs | None = None,
                 shape: dict | None = None, edit: Callable[[str, dict], None] | None = None,
                 sites: Any = None, name: str = "testfed", start: bool = True) -> None:
        from security.provision import provision

        self.root, self.clusters, self.sites = Path(root), list(clusters), sites
        self.own = procs is None
        self.procs = procs or Procs()
        self.switches: dict[str, Switch] = {}
        self.summary = provision(name, self.clusters, self.root)
        try:
            for c in self.clusters:
                if shape or edit or sites is not None:
                    edit_yaml(self.switch_yaml(c), lambda doc, c=c: self._edit(c, doc, shape, edit))
            if start:
                for c in self.clusters:
                    self.start(c)
        except BaseException:
            self.close()
            raise

    def _edit(self, cluster: str, doc: dict, shape: dict | None, edit: Callable[[str, dict], None] | None) -> None:
        if shape:
            doc.setdefault("link", {})["shape"] = dict(shape)
            doc["metrics"] = {"listen": None}
        if self.sites is not None:  # each switch on its site's address, the port as provisioned
            port = doc["listen"].rpartition(":")[2]
            doc["listen"] = f"{self.sites.address(cluster)}:{port}"
            ports = {p["cluster"]: p["address"].rpartition(":")[2] for p in doc["peers"]}
            doc["peers"] = [{**p, "address": f"{self.sites.address(p['cluster'])}:{ports[p['cluster']]}"}
                            for p in doc["peers"]]
        if edit:
            edit(cluster, doc)

    def switch_yaml(self, cluster: str) -> Path:
        """The switch.yaml of `cluster`."""
        return self.root / cluster / "switch.yaml"

    def worker(self, cluster: str) -> str:
        """The worker.yaml of `cluster`'s switch."""
        return str(self.root / cluster / "worker.yaml")

    @property
    def workers(self) -> dict[str, Path]:
        """Worker files by cluster."""
        return {c: Path(self.worker(c)) for c in self.clusters}

    def prefix(self, cluster: str) -> tuple[str, ...]:
        """What runs a command inside `cluster`'s site (nothing on loopback)."""
        return tuple(self.sites.argv(cluster, [])) if self.sites is not None else ()

    def start(self, cluster: str, timeout_s: float = 60.0) -> Switch:
        """Start (or restart) `cluster`'s switch server."""
        sw = self.switches[cluster] = start_switch(self.procs, self.switch_yaml(cluster), timeout_s,
                                                   self.prefix(cluster))
        return sw

    def close(self) -> None:
        """Stop the switch servers (every process, when the federation started its own)."""
        if self.own:
            self.procs.reap()
        else:
            for sw in self.switches.values():
                if sw.proc.poll() is None:
                    self.procs.stop(sw.proc)


def start_switches(procs: Procs, out: Path, clusters: list[str], shape: dict | None = None,
                   edit: Callable[[str, dict], None] | None = None) -> dict[str, Path]:
    """Provision `clusters` under `out` and start one switch server each; worker files by cluster."""
    return LocalFederation(out, clusters, procs=procs, shape=shape, edit=edit).workers


def drain(p: subprocess.Popen) -> None:
    """Read and drop `p`'s output until it exits (in a thread: a full pipe would stall it)."""
    def run() -> None:
        while p.stdout.readline():
            continue
    threading.Thread(target=run, daemon=True).start()


def wait_for_line(p: subprocess.Popen, needle: str, timeout_s: float) -> str:
    """Read `p`'s stdout until a line contains `needle`; fail with what it printed otherwise."""
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r, _, _ = select.select([p.stdout], [], [], 0.5)
        if r:
            line = p.stdout.readline()
            if not line:
                break
            seen.append(line)
            if needle in line:
                return line
        elif p.poll() is not None:
            break
    raise AssertionError(f"no {needle!r} within {timeout_s} s; output:\n{''.join(seen)}")


def launch(procs: Procs, job: Path, cluster: str, *extra: str, prefix: Sequence[str] = ()) -> subprocess.Popen:
    """Start `nebula launch job --cluster C` (which runs paddle.distributed.launch) in the job's directory."""
    return procs.start([*prefix, str(BIN / "nebula"), "launch", str(job), "--cluster", cluster, *extra],
                       cwd=str(job.parent))


def finish(p: subprocess.Popen, timeout_s: float) -> tuple[int, str]:
    """Wait for a process to exit; its exit code and output."""
    out, _ = p.communicate(timeout=timeout_s)
    return p.returncode, out
