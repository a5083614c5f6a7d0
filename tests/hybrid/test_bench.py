"""Device benchmark through the real runtime: `nebula bench` on real ranks writes sane DeviceProfiles."""
from __future__ import annotations

import math

import pytest

from nebula.hybrid.bench import read_profiles
from nebula.hybrid.probe import RankProbe
from tests.hybrid.helpers import hybrid_job
from testbed.federation import BIN, finish


@pytest.mark.slow  # (~9 s of profiling real ranks: the allocator's tests use profiles without it)
def test_bench_profiles_two_ranks_and_sees_the_slowed_one(procs, tmp_path):
    """2 ranks, rank 1 simulated 10x slower: both profiled, the slow one has the larger seconds per FLOP (a wide
    margin: load from other processes on a shared host changes the unslowed rank's time too)."""
    job = hybrid_job(tmp_path, ranks=2, pipeline={"num_stages": 2, "slowdown": [1.0, 10.0]})
    out = tmp_path / "profiles.yaml"
    p = procs.start([str(BIN / "nebula"), "bench", str(job), "--cluster", "A", "--out", str(out)],
                    cwd=str(tmp_path))
    code, text = finish(p, 180)
    assert code == 0, text[-3000:]
    assert "profiles of cluster A written" in text
    doc = read_profiles(out)
    assert doc["cluster"] == "A" and [r["rank"] for r in doc["ranks"]] == [0, 1]
    probes = [RankProbe(**{k: v for k, v in r.items() if k != "profile"}) for r in doc["ranks"]]
    profiles = [p.profile() for p in probes]
    for p in profiles:
        assert 0 < p.time_per_flop_s < 1e-6  # any CPU does far better than a microsecond per FLOP
        assert 0 < p.memory_bytes < math.inf
        assert 0 < p.latency_s < 1.0 and 0 < p.bandwidth_bytes_per_s < math.inf
    assert profiles[1].time_per_flop_s > 1.5 * profiles[0].time_per_flop_s
    # one ping-pong measured the link: both ends report the same pair
    assert probes[0].latency_s == probes[1].latency_s
    cluster = doc["profile"]
    assert cluster["time_per_flop_s"] == probes[1].time_per_flop_s / 2  # slowest rank, shared by 2 replicas
