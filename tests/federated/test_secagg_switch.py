"""Secure aggregation end to end: controller, combiners and clients as processes talking through TLS switch servers.
Each combiner learns only its clients' sum; the reducer adds the sums."""
from __future__ import annotations

import json

import numpy as np

from tests.federated.harness import federation, run_job, write_job
from nebula.federated.trail import ModelTrail

SECURE = {"protocol": "secagg+", "clip_range": 1000.0, "max_weight": 1000}


def _audit(tmp_path, cluster: str, job_dir: str = "fl") -> list[dict]:
    return [json.loads(x) for x in (tmp_path / job_dir / f"combiner-{cluster}" / "audit.log").read_text().splitlines()]


def test_secagg_fedavg_equals_plain_fedavg_within_the_stated_quantisation_bound(procs, tmp_path):
    workers = federation(procs, tmp_path)
    n = {"A": 3, "B": 3}
    plain = write_job(tmp_path, workers, n, job="plain", rounds=1, validity={"min_updates": 6},
                      controller={"cluster": "A", "dir": str(tmp_path / "plain")})
    run_job(procs, plain)
    # a coarse fixed point (clip_range 1000: 2^19 steps per unit) so that the rounding is the visible difference
    secure = write_job(tmp_path, workers, n, job="secure", rounds=1, validity={"min_updates": 6},
                       secure_aggregation=SECURE, controller={"cluster": "A", "dir": str(tmp_path / "secure")})
    out = run_job(procs, secure)
    with ModelTrail(tmp_path / "plain" / "trail") as t:
        want, _ = t.load(2)
    with ModelTrail(tmp_path / "secure" / "trail") as t:
        got, _ = t.load(2)
        (r1,) = t.rounds()
    assert r1.status == "valid" and r1.num_updates == 6 and r1.num_examples == 1200, out
    bound = r1.detail["secure"]["error_bound"]
    # the stated bound: n/(2s) on each combiner's sum of 3 (s = 2^19), times W/C = 1000/600 on its mean
    assert bound == (3 / (2 * 2.0**19)) * 1000 / 600
    for k in want:
        diff = np.abs(got[k].astype(np.float64) - want[k])
        ulp = np.spacing(np.abs(want[k]).astype(np.float32)).astype(np.float64)
        assert (diff <= bound + 4 * ulp).all(), (k, diff.max(), bound)
        assert diff.max() > 0  # the rounding is there, and bounded
    for c in "AB":
        sums = [r for r in _audit(tmp_path, c, "secure") if r["action"] == "fl.secagg"]
        assert [r["outcome"] for r in sums] == ["summed"] and len(sums[0]["detail"]["survivors"]) == 3
        # the combiner never took an update in the clear
        assert all(r["detail"].get("masked") for r in _audit(tmp_path, c, "secure") if r["action"] == "fl.update")
