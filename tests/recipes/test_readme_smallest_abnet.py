"""The ABNet commands README.md and recipes/abnet/README.md print, run as printed at their smallest size
(NEBULA_SMOKE=1: 10 two-cluster steps, bases pretrained 20 steps; the reference training capped at 20 steps):
the main job's script end to end, and the single-process reference sequence."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.recipes.smallest import REPO, run_smallest, scratch_checkout, start_smallest

MAIN = "make venv && bash recipes/abnet/run_local.sh"  # README.md
MAIN_INT8 = "bash recipes/abnet/run_local.sh runs/main-int8"
PREPARE = ("python -m recipes.abnet.prepare data --encoder-out D/A --decoder-out D/B --langs es --max-words 6 "
           "--vocab-top-k 300 --test-per-mille 100")
TRAIN = ("python -m recipes.abnet.train --encoder-data D/A --decoder-data D/B --work D/w --config "
         "recipes/abnet/configs/tiny.yaml --steps 6000")
PRINTED = [MAIN, MAIN_INT8, PREPARE, TRAIN]

pytestmark = [pytest.mark.slow, pytest.mark.readme, pytest.mark.timeout(1500)]


def _check_main_job(out: str, run: Path) -> None:
    """What the main job is for: BLEU scored over the switches, the summary table, the loss plot."""
    assert f"run directory {run}" in out
    summary = (run / "summary.md").read_text()
    assert "BLEU" in summary and "WAN bytes per step" in summary and "compression ratio forward" in summary
    assert (run / "loss.png").stat().st_size > 1000
    ev = json.loads((run / "B" / "eval.json").read_text())
    assert ev["step"] == 10 and ev["num_test"] == len(ev["hypotheses"]) > 0  # (the smallest size: 10 steps)


@pytest.mark.parametrize("command", [MAIN, MAIN_INT8])
def test_the_main_job_runs_as_printed(command, tmp_path):
    # in a view of the checkout with a runs/ of its own (a user's runs/main-int8 stays), but `make venv` in the
    # checkout itself: when setup.py is newer than the environment, it installs the checkout there
    checkout = REPO if command == MAIN else scratch_checkout(tmp_path / "checkout")
    job = start_smallest(command, tmp_path / "logs", cwd=checkout)
    try:
        out = job.wait(1200)
        run = Path(re.search(r"run directory (\S+)", out).group(1))
        assert run == checkout / "runs" / "main-int8" if command == MAIN_INT8 else run.parent == checkout / "runs"
        _check_main_job(out, run)
    finally:
        job.stop()
        if checkout == REPO and (made := re.search(r"run directory (\S+)", job.both())):
            shutil.rmtree(made.group(1), ignore_errors=True)  # (the run directory the script made, alone)


def test_the_reference_training_sequence_runs_as_printed(tmp_path):
    checkout = scratch_checkout(tmp_path / "checkout")  # (D/ written there, not in the checkout)
    out = run_smallest(PREPARE, tmp_path / "logs", cwd=checkout)
    assert (checkout / "D" / "A").is_dir() and (checkout / "D" / "B").is_dir()
    out = run_smallest(TRAIN, tmp_path / "logs", cwd=checkout)
    assert re.search(r"^BLEU before \d+\.\d\d after \d+\.\d\d; [\d.]+ steps/s$", out, re.M), out[-2000:]
    single = json.loads((checkout / "D" / "w" / "summary_single.json").read_text())
    assert single["steps"] == 20 and len(single["losses"]) == 20  # --steps 6000, capped at the smallest size
