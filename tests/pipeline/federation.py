"""Test federation: a throwaway CA, real switch servers on loopback, and `nebula launch` per cluster."""
from __future__ import annotations

import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import yaml

BIN = Path(sys.executable).parent


def start_switches(procs, out: Path, clusters: list[str], shape: dict | None = None,
                   edit: Callable[[str, dict], None] | None = None) -> dict[str, Path]:
    """Provision `clusters` under `out`, start one switch server each (its switch.yaml changed by `edit(cluster,
    doc)` first, if given), wait until all listen; worker files."""
    from security.provision import provision

    provision("testfed", clusters, out)
    workers = {}
    for c in clusters:
        sw = out / c / "switch.yaml"
        if shape or edit:
            doc = yaml.safe_load(sw.read_text())
            if shape:
                doc.setdefault("link", {})["shape"] = shape
                doc["metrics"] = {"listen": None}
            if edit:
                edit(c, doc)
            sw.write_text(yaml.safe_dump(doc, sort_keys=False))
        p = procs.start([str(BIN / "nebula-switch"), "serve", "--config", str(sw)])
        wait_for_line(p, "listening wan=", 60)
        threading.Thread(target=_drain, args=(p,), daemon=True).start()  # a full pipe would stall the switch
        workers[c] = out / c / "worker.yaml"
    return workers


def _drain(p: subprocess.Popen) -> None:
    """Read and drop `p`'s output until it exits."""
    while p.stdout.readline():
        continue


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


def launch(procs, job: Path, cluster: str, *extra: str) -> subprocess.Popen:
    """Start `nebula launch job --cluster C` (which runs paddle.distributed.launch)."""
    return procs.start([str(BIN / "nebula"), "launch", str(job), "--cluster", cluster, *extra], cwd=str(job.parent))


def finish(p: subprocess.Popen, timeout_s: float) -> tuple[int, str]:
    """Wait for a launcher to exit; its exit code and output."""
    out, _ = p.communicate(timeout=timeout_s)
    return p.returncode, out
