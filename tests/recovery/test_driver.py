"""The recovery agreement over real switch servers and channels: three clusters' coordinators, each in its own
process, agree at launch; one is killed (SIGKILL) and launched again with its newest checkpoint gone, and all three
agree on the step before it; killed again and not brought back, the others exit 3 with today's message."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from testbed.federation import start_switches, wait_for_line
from tests.recovery import _driver

DRIVER = Path(_driver.__file__)
ABC = ["A", "B", "C"]


def _start(procs, workers: dict, tmp_path: Path, c: str, steps: str, timeout_s: float) -> subprocess.Popen:
    err = open(tmp_path / f"{c}.err", "a")  # (closed by the child's exit; the reaper ends the process)
    return procs.start([sys.executable, str(DRIVER), str(workers[c]), "recov", ",".join(ABC),
                        str(tmp_path / "state" / c), str(timeout_s), steps], stdin=subprocess.PIPE, stderr=err)


def _agreed(p: subprocess.Popen) -> dict:
    return json.loads(wait_for_line(p, '"step"', 120))


def test_three_clusters_agree_after_one_is_killed_and_launched_again_and_give_up_without_it(procs, tmp_path):
    workers = start_switches(procs, tmp_path / "fed", ABC)
    full = "10,20,30"
    drivers = {c: _start(procs, workers, tmp_path, c, full, 120) for c in ABC}
    first = {c: _agreed(p) for c, p in drivers.items()}
    assert {d["step"] for d in first.values()} == {30} and {d["launch"] for d in first.values()} == {1}

    os.killpg(drivers["C"].pid, signal.SIGKILL)  # every process of cluster C dies
    drivers["C"].wait(10)
    drivers["A"].stdin.write("lost C\n")  # A's runtime found C silent; B learns of the recovery from A
    drivers["A"].stdin.flush()
    drivers["C"] = _start(procs, workers, tmp_path, "C", "10,20", 120)  # launched again, its step 30 lost
    second = {c: _agreed(p) for c, p in drivers.items()}
    assert {d["step"] for d in second.values()} == {20}, second
    assert len({d["epoch"] for d in second.values()}) == 1 and second["C"]["launch"] == 2, second

    for c in ("A", "B"):  # (a short bound from here on, so the test does not wait long for the end)
        drivers[c].stdin.write("timeout 3\n")
        drivers[c].stdin.flush()
        wait_for_line(drivers[c], '"timeout"', 60)
    os.killpg(drivers["C"].pid, signal.SIGKILL)  # lost again, and this time nobody launches it
    drivers["C"].wait(10)
    drivers["B"].stdin.write("lost C\n")
    drivers["B"].stdin.flush()
    for c in ("A", "B"):
        assert drivers[c].wait(120) == 3
        err = (tmp_path / f"{c}.err").read_text()
        assert "nebula: peer cluster C lost: peer cluster C did not come back within recovery_timeout_s=3 s" in err
        assert "Restart all clusters of the job: they resume from the last common checkpoint" in err


def test_each_launch_counts_one_more_than_its_disk_records(tmp_path, caplog):
    from nebula.recovery.driver import launch_incarnation

    first, second = launch_incarnation(tmp_path, "A"), launch_incarnation(tmp_path, "A")
    assert (first.count, second.count) == (1, 2) and first.nonce != second.nonce
    assert launch_incarnation(tmp_path, "B").count == 1  # per cluster
    (tmp_path / "A.launches.json").write_text('{"launches": 7')  # torn (by a disk, not by a kill: it is renamed)
    with caplog.at_level("WARNING"):
        assert launch_incarnation(tmp_path, "A").count == 1
    assert any("unreadable" in r.getMessage() and "A.launches.json" in r.getMessage() for r in caplog.records)
