"""The federated recipe's commands recipes/federated/README.md prints, run as printed at their smallest size
(NEBULA_SMOKE=1: 2 rounds, at most 500 messages per language): the recipe's script under FedAvg and under FedOptima,
and the cross-cluster DiLoCo sequence, both clusters' lines at once as two sites would run them."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.recipes.smallest import REPO, fresh_paths, run_smallest, start_smallest

FEDAVG = "bash recipes/federated/run_local.sh /tmp/flrun3"
FEDOPTIMA = "ALGORITHM=fedoptima bash recipes/federated/run_local.sh /tmp/flmodes-rfo"
CD = "cd recipes/federated/configs"
PROVISION = "nebula-admin provision --federation dp --clusters A,B --out fed"
DATA = "python -c \"from recipes.federated.data import prepare; prepare('langid.npz')\""
SITE = {c: f"nebula-switch serve --config fed/{c}/switch.yaml & nebula launch data_parallel.yaml --cluster {c}"
        for c in "AB"}
REPLICA = "python -m recipes.federated.replica ckpt/A/step_00000600 --data langid.npz"
BENCH = ("PYTHONPATH=. .venv/bin/python benchmarks/federated.py --only accuracy,robust --rounds 3 --clients 10 --data "
         "/tmp/flrun3/data/langid.npz")  # (on the data the recipe's run prepared)
PRINTED = [FEDAVG, FEDOPTIMA, CD, PROVISION, DATA, SITE["A"], SITE["B"], REPLICA, BENCH]

pytestmark = [pytest.mark.slow, pytest.mark.readme, pytest.mark.timeout(1200)]


def test_the_recipe_runs_as_printed_beside_its_central_baseline(tmp_path):
    with fresh_paths(Path("/tmp/flrun3")):
        out = run_smallest(FEDAVG, tmp_path / "logs")
        # every round valid, the global models' held-out accuracy beside the central model's, the plot
        rounds = re.findall(r"^ +(\d+) valid +\d+ +6 ", out, re.M)
        assert rounds == ["1", "2"], out[-3000:]
        table = re.findall(r"^ +(\d) +\d+ +(0\.\d{4}) +(0\.\d{4}|-)$", out, re.M)
        assert [r[0] for r in table] == ["0", "1", "2"] and table[1][2] != "-", out[-3000:]
        assert Path("/tmp/flrun3/accuracy.png").stat().st_size > 1000
        bench = run_smallest(BENCH, tmp_path / "bench")  # the benchmark the README prints next, on that data
        # (at its smallest: 7 clients, the fewest Krum with 2 byzantine takes, and 2 rounds)
        assert "## Accuracy: 7 non-IID clients" in bench and "after 2 rounds under attack" in bench, bench[-3000:]
        assert re.search(r"^\| scale \| \d+% \| (0\.\d{3} \| ){4}0\.\d{3} \|$", bench, re.M), bench[-3000:]


def test_the_recipe_runs_as_printed_under_fedoptima(tmp_path):
    with fresh_paths(Path("/tmp/flmodes-rfo")):
        out = run_smallest(FEDOPTIMA, tmp_path / "logs")
        assert "job langid (fedoptima): finished, round 2" in out, out[-3000:]
        assert re.search(r'^result: \{"rounds": 2, "accuracy": 0\.\d+', out, re.M), out[-3000:]


def test_the_diloco_sequence_runs_as_printed_both_sites_at_once(tmp_path):
    logs = tmp_path / "logs"
    run_smallest(CD, logs)  # (what the rest runs in)
    here = REPO / "recipes" / "federated" / "configs"
    with fresh_paths(*(here / p for p in ("fed", "langid.npz", "ckpt", "metrics"))):
        run_smallest(PROVISION, logs, cwd=here)
        run_smallest(DATA, logs, cwd=here)
        sites = {c: start_smallest(SITE[c], logs, cwd=here) for c in "AB"}
        try:
            for s in sites.values():
                s.wait(900)  # each cluster's training, its switch behind it
            outs = {c: s.both() for c, s in sites.items()}
        finally:
            for s in sites.values():
                s.stop()  # (the switch servers, started with `&`)
        for c, out in outs.items():
            assert re.search(rf"cluster {c}: steps 0\.\.599 \(600\), .*WAN bytes per step: [\d,]+ sent", out), out
        out = run_smallest(REPLICA, logs, cwd=here)
        loss, accuracy = map(float, re.fullmatch(r"held-out loss (\S+) accuracy (\S+)\n", out).groups())
        assert accuracy > 1 / 6  # (six languages: better than chance after 600 steps)
