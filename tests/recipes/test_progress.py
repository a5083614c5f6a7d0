"""nebula.progress: a redrawn line on a terminal, a plain line every tenth of the run (or N steps) elsewhere; and the
ABNet recipe's single-process training entry point, run with its output on a pipe, prints tens of lines, not one a
step."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nebula.progress import EVERY_ENV, Progress, format_line, plain_every

REPO = Path(__file__).resolve().parents[2]


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_plain_every_is_a_tenth_of_the_run_unless_set():
    assert plain_every(2000) == 200 and plain_every(7) == 1 and plain_every(None) == 1
    assert plain_every(2000, 50) == 50 and plain_every(2000, None, "25") == 25 and plain_every(2000, 0) == 0
    with pytest.raises(ValueError, match=f"{EVERY_ENV}='ten' is not a whole number"):
        plain_every(2000, None, "ten")


def test_format_line_counts_rate_and_time_left():
    assert format_line("job@A", 50, 200, 10.0, 50, {"loss": "0.5"}) == \
        "job@A: 50/200 steps (25%), 5 step/s, elapsed 0:10, left 0:30, loss=0.5"
    # a hot start at step 100: the rate is of the steps this process ran
    assert format_line("job@A", 150, 200, 25.0, 50).startswith("job@A: 150/200 steps (75%), 2 step/s")
    assert format_line("x", 1, 10, 4.0, 1) == "x: 1/10 steps (10%), 4 s/step, elapsed 0:04, left 0:36"


def test_off_a_terminal_a_plain_line_every_tenth_and_the_last_once(monkeypatch):
    monkeypatch.delenv(EVERY_ENV, raising=False)
    out, clock = io.StringIO(), _Clock()
    with Progress(95, "run", stream=out, tty=False, clock=clock) as bar:
        for _ in range(95):
            clock.t += 0.5
            bar.update(1, loss="1.0")
    lines = out.getvalue().splitlines()
    assert [int(ln.split()[1].split("/")[0]) for ln in lines] == [10, 20, 30, 40, 50, 60, 70, 80, 90, 95]
    assert "\r" not in out.getvalue() and lines[-1].startswith("run: 95/95 steps (100%), 2 step/s")


def test_a_run_taken_back_by_a_recovery_prints_from_where_it_resumes(monkeypatch):
    monkeypatch.setenv(EVERY_ENV, "5")
    out = io.StringIO()
    bar = Progress(20, "run", stream=out, tty=False, start=3)
    for n in range(4, 13):
        bar.set_to(n)
    bar.set_to(5)  # back to a checkpoint
    for n in range(6, 21):
        bar.set_to(n)
    bar.close()
    assert [int(ln.split()[1].split("/")[0]) for ln in out.getvalue().splitlines()] == [8, 5, 10, 15, 20]


def test_on_a_terminal_one_line_redrawn_then_ended():
    out, clock = io.StringIO(), _Clock()
    bar = Progress(1000, "run", stream=out, tty=True, clock=clock)
    for _ in range(1000):
        clock.t += 0.001  # 1000 steps in a second: about ten redraws, not a thousand
        bar.update(1)
    bar.close()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n") and 5 <= text.count("\r") <= 15, text
    assert text.rstrip("\n").rsplit("\r", 1)[1].startswith("run: 1000/1000 steps (100%)")


@pytest.mark.parametrize("tty", [False, True])
def test_nothing_done_prints_nothing(tty):
    """(A base already pretrained: its loop never runs.)"""
    out = io.StringIO()
    Progress(10, "run", stream=out, tty=tty).close()
    assert out.getvalue() == ""


@pytest.mark.slow
def test_abnet_single_process_training_prints_tens_of_lines_on_a_pipe(locale_dir, tmp_path):
    """The recipe's training entry point (both halves in one process, 60 steps) with its output on a pipe."""
    from recipes.text.catalogs import DataConfig, prepare_data

    prepare_data(tmp_path / "A", tmp_path / "B", ["es"], locale_dir, DataConfig(test_per_mille=100,
                                                                                  dev_per_mille=100))
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({"preset": "tiny", "steps": 60, "batch_size": 16, "lr": 0.005, "warmup_steps": 5,
                                   "max_len": 12, "pretrain_steps": 20, "pretrain_vocab": 60, "eval_batch": 64}))
    env = {k: v for k, v in os.environ.items() if k not in ("NEBULA_SMOKE", EVERY_ENV)}
    p = subprocess.run([sys.executable, "-m", "recipes.abnet.train", "--encoder-data", str(tmp_path / "A"),
                        "--decoder-data", str(tmp_path / "B"), "--work", str(tmp_path / "work"), "--config",
                        str(cfg)], capture_output=True, text=True, timeout=600, cwd=REPO,
                       env={**env, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    train = [ln for ln in p.stderr.splitlines() if ln.startswith("train: ")]
    assert [ln.split()[1] for ln in train] == [f"{n}/60" for n in range(6, 61, 6)], p.stderr
    assert "\r" not in p.stderr and len((p.stdout + p.stderr).splitlines()) < 60, p.stdout + p.stderr
