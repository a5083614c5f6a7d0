"""`nebula launch` of the toy recipe, for real (paddle.distributed.launch and its ranks): paddle's launcher keeps its
log lines in <log_dir>/launch.log, the ranks' output and progress still reach the user (a plain line every tenth of
the run, the output being a pipe), a finished cluster prints its summary, a crashing rank's error still reaches the
terminal, and stopping a launch prints one line (no C++ traceback block)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from nebula.launch.quiet import STOPPED_CODES
from testbed.federation import wait_until
from testbed.procs import BIN
from tests.launch.failing_recipe import MESSAGE
from tests.pipeline.helpers import toy_job

LOCAL = [{"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "A"}]
NOISE = ("LAUNCH INFO", "No ccache found", "C++ Traceback", "Error Message Summary")


def _launch(procs, job: Path) -> subprocess.Popen:
    """`nebula launch JOB --cluster A` in the job's directory, stdout and stderr on pipes of their own."""
    return procs.start([str(BIN / "nebula"), "launch", str(job), "--cluster", "A"], cwd=str(job.parent),
                       stderr=subprocess.PIPE, env={"OMP_NUM_THREADS": "1"})


def test_launch_output_is_the_ranks_progress_and_a_summary_paddles_lines_go_to_its_log(procs, tmp_path):
    job = toy_job(tmp_path, clusters=[{"id": "A"}], stages=LOCAL, steps=40,
                  metrics={"dir": "metrics", "progress": True})
    p = _launch(procs, job)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, out + err
    for noise in NOISE:
        assert noise not in out and noise not in err, (noise, out, err)
    launch_log = tmp_path / "metrics" / "log" / "A" / "launch.log"
    text = launch_log.read_text()
    assert text.count("LAUNCH INFO") >= 10 and "Exit code 0" in text  # paddle's own lines: all of them, there
    named = [ln for ln in (out + err).splitlines() if "launch.log" in ln]
    assert len(named) == 1 and named[0].endswith(str(launch_log.resolve())), err  # one line names that file
    # rank 0's progress, streamed: a plain line every 4 steps (a tenth of 40), the last one 40/40
    progress = [ln for ln in out.splitlines() if ln.startswith("toy@A: ")]
    assert [int(re.match(r"toy@A: (\d+)/40 steps", ln).group(1)) for ln in progress] == list(range(4, 41, 4)), out
    assert "loss=" in progress[-1] and "\r" not in out
    assert "cluster A rank 0 finished steps 0..40" in out  # the rank's own log line
    summary = [ln for ln in err.splitlines() if ln.startswith("nebula launch: cluster A: steps 0..39 (40)")]
    assert len(summary) == 1 and "loss " in summary[0] and "steps/s" in summary[0], err
    assert len(out.splitlines()) + len(err.splitlines()) < 20, out + err


def test_a_crashing_rank_reaches_the_terminal_and_the_launch_fails(procs, tmp_path):
    job = toy_job(tmp_path, clusters=[{"id": "A"}], stages=LOCAL, steps=40)
    doc = job.read_text().replace("recipes.toy:ToyRecipe", "tests.launch.failing_recipe:FailingRecipe")
    job.write_text(doc)
    p = _launch(procs, job)
    out, err = p.communicate(timeout=300)
    assert p.returncode not in (0, *STOPPED_CODES), out + err
    assert MESSAGE in out and "RuntimeError" in out, out  # the rank's traceback, as paddle shows its log
    assert "LAUNCH INFO" not in out + err
    failed = [ln for ln in err.splitlines() if ln.startswith("nebula launch: cluster A failed (exit ")]
    assert len(failed) == 1 and "launch.log" in failed[0], err
    assert "Container failed" in (tmp_path / "metrics" / "log" / "A" / "launch.log").read_text()


@pytest.mark.parametrize("how", ["SIGTERM to its process group",
                                 pytest.param("SIGINT to nebula launch", marks=pytest.mark.slow)])
def test_stopping_a_launch_prints_one_line_and_stops_its_ranks(procs, tmp_path, how):
    job = toy_job(tmp_path, clusters=[{"id": "A"}], stages=LOCAL, steps=10**6)
    p = _launch(procs, job)
    metrics = tmp_path / "metrics" / "A.rank0.jsonl"
    wait_until(lambda: metrics.exists() and metrics.stat().st_size > 0 or p.poll() is not None, 120,
              "the rank did not start training")
    assert p.poll() is None, p.communicate()
    rank_pid = int((tmp_path / "metrics" / "log" / "A" / "ranks" / "rank0.pid").read_text())
    if how.startswith("SIGTERM"):
        os.killpg(p.pid, signal.SIGTERM)  # what a service manager or the test harness does
        sig = signal.SIGTERM
    else:
        os.kill(p.pid, signal.SIGINT)
        sig = signal.SIGINT
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, out + err
    lines = [ln for ln in (out + err).splitlines() if "stopped" in ln]
    assert lines == [f"nebula launch: cluster A stopped ({sig.name}); the ranks' logs are in "
                     f"{tmp_path.resolve() / 'metrics' / 'log' / 'A'}"], out + err
    for noise in (*NOISE, "Traceback", "KeyboardInterrupt"):
        assert noise not in out + err, (noise, out, err)
    assert "C++ Traceback" not in (tmp_path / "metrics" / "log" / "A" / "workerlog.0").read_text()
    wait_until(lambda: not Path(f"/proc/{rank_pid}").exists() or
              Path(f"/proc/{rank_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 30,
              "the rank still runs")


def test_a_launch_stopped_by_the_operator_is_not_launched_again(tmp_path):
    """--supervise (and --elastic) take 128 + SIGINT/SIGTERM as "stopped", not as a failure to recover from."""
    from nebula.launch.supervise import should_restart, supervise

    assert should_restart(1, set()) and not should_restart(130, set()) and not should_restart(143, set())
    job = toy_job(tmp_path, clusters=[{"id": "A"}], stages=LOCAL)
    codes, slept = iter([1, 143, 0]), []
    assert supervise(job, "A", run=lambda: next(codes), sleep=slept.append, report=lambda line: None) == 143
    assert slept == [2.0]  # one restart after the failure, none after the stop
