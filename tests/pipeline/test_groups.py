"""Process groups over gloo under real paddle.distributed.launch: a failed connect is retried by every rank together,
and ranks that arrive past gloo's 30 s timeout meet in the TCP store instead of failing."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

WORKER = Path(__file__).with_name("_groups_worker.py")


def _run(procs, tmp_path: Path, mode: str, late_s: float = 0.0, timeout_s: float = 300,
         check: bool = True) -> list[dict]:
    out = tmp_path / "out"
    out.mkdir()
    p = procs.start([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
                     str(tmp_path / "log"), str(WORKER), mode, str(out), str(late_s)],
                    env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}, cwd=tmp_path)
    text, _ = p.communicate(timeout=timeout_s)
    logs = "".join(f.read_text(errors="replace")[-2000:] for f in sorted((tmp_path / "log").glob("workerlog.*")))
    assert p.returncode == 0 or not check, text[-2000:] + logs
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1) if (out / f"rank{r}.json").is_file()]


@pytest.mark.slow  # (~11 s: a group of every rank, below, keeps groups in the fast suite)
def test_a_group_that_fails_to_connect_on_one_rank_is_retried_by_both(procs, tmp_path):
    r0, r1 = _run(procs, tmp_path, "flaky")
    assert r0["sum"] == r1["sum"] == 3.0  # the retried group works: 1 + 2
    assert r0["calls"] == r1["calls"] == 2  # both ranks made the second attempt, not only the one that failed
    assert any("attempt 1 of 3 failed on 1 rank(s)" in line for line in r0["logs"]), r0["logs"]
    # the TCP store's connections answer without Nagle's delay (44 ms per store call with it), on both ranks
    assert r0["nodelay"] and r1["nodelay"] and all(r0["nodelay"] + r1["nodelay"]), (r0["nodelay"], r1["nodelay"])


def test_a_group_of_every_rank_is_the_jobs_own_and_needs_no_rendezvous(procs, tmp_path):
    r0, r1 = _run(procs, tmp_path, "whole")
    assert r0["sum"] == r1["sum"] == 3.0  # collectives on it reach both ranks


@pytest.mark.slow  # (~16 s: a group of every rank, above, keeps groups in the fast suite)
def test_groups_connect_while_one_rank_is_starved_of_cpu(procs, tmp_path):
    """Rank 1 runs 10 ms of every 110 (stopped and resumed by a throttle process, as on an overloaded machine) while
    six groups of both ranks are created with gloo's own rendezvous, one attempt each. Before each group had a store
    of its own, rank 0 read rank 1's address of an earlier group from the job store's bare keys and connected
    there, and rank 1 waited for a connection that never came: a hang until the 60 s bound."""
    r0, r1 = _run(procs, tmp_path, "starved", late_s=60, timeout_s=200)
    assert r0["sum"] == r1["sum"] == 3.0
    assert not r0["logs"] and not r1["logs"]  # no attempt failed


@pytest.mark.slow
def test_ranks_late_past_the_gloo_timeout_still_connect_and_scatter(procs, tmp_path):
    """Without the store barriers, the early rank fails after 30 s (gloo unbound_buffer TIMEOUT)."""
    r0, r1 = _run(procs, tmp_path, "late", late_s=35)
    assert r0["sum"] == r1["sum"] == 3.0
    assert (r0["scattered"], r1["scattered"]) == (["a"], ["b"])


@pytest.mark.slow
def test_gloo_alone_times_out_when_the_root_is_late_by_more_than_30_s(procs, tmp_path):
    """The cause: a rank that waits inside a gloo collective for a peer more than 30 s late fails."""
    results = _run(procs, tmp_path, "raw", late_s=35, check=False)
    early = [r for r in results if r["scattered"] is None and r["error"]]
    assert early and "TIMEOUT" in early[0]["error"], results
