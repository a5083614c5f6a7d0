"""Whole-job recovery with activation deltas: cluster B (the receiving end of the deltas) is killed mid-stream and
launched again; both ends drop their per-example caches (new boundaries, new codec instances), so the resumed steps
send every example with `first` again and the job finishes. Had cluster A kept its cache, B would refuse A's next
delta (a generation it does not hold) and the run would fail."""
from __future__ import annotations

from testbed.clusters import (EVERY, events, kill_cluster, metrics, recovery_job, start_rank, wait_steps)
from testbed.federation import start_switches

STEPS = 30
DELTA = "delta(int2_block, first=int8_block, cache_mb=4)"


def test_a_killed_cluster_with_activation_deltas_resumes_with_fresh_caches(procs, tmp_path):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    # 64 examples, 16 a step: every example comes again every 4 steps, so steps from 4 on send deltas
    job = recovery_job(tmp_path, "pipeline", workers, steps=STEPS, peer_timeout_s=3,
                       recipe_args={"num_examples": 64, "hidden": 512},
                       compression={"forward": DELTA, "backward": "int8"})
    a = start_rank(procs, job, "A", tmp_path / "A.log")
    b = start_rank(procs, job, "B", tmp_path / "B.log")
    wait_steps(tmp_path, "B", 2 * EVERY + 2, 120, [a, b])
    kill_cluster(b)  # mid-stream: A holds cache entries B's new process never got
    b = start_rank(procs, job, "B", tmp_path / "B.log")
    assert a.wait(180) == 0, (tmp_path / "A.log").read_text()[-3000:]
    assert b.wait(60) == 0, (tmp_path / "B.log").read_text()[-3000:]

    recovered = [e for e in events(tmp_path, "A") if e["event"] == "recovered"]
    assert len(recovered) == 1, events(tmp_path, "A")
    resumed = recovered[0]["step"]
    assert resumed >= 2 * EVERY
    recs_a = metrics(tmp_path, "A")
    assert sorted({r["step"] for r in recs_a}) == list(range(STEPS))
    # the resumed step went with `first` (8-bit) where its first run had sent 2-bit deltas
    before = [r["bytes_sent"] for r in recs_a if r["step"] == resumed and r["time"] < recovered[0]["time"]]
    after = [r["bytes_sent"] for r in recs_a if r["step"] == resumed and r["time"] > recovered[0]["time"]]
    if before:  # (A may have stopped before sending that step the first time)
        assert after[0] > 2 * before[0], (before, after)
    # 8 steps on (a whole epoch, 4 steps aligned on multiples of 4, lies in between): deltas again
    assert resumed + 8 < STEPS
    later = [r["bytes_sent"] for r in recs_a if r["step"] == resumed + 8 and r["time"] > recovered[0]["time"]]
    assert later[0] < after[0] / 2, (after, later)
    losses_b = {r["step"]: r["loss"] for r in metrics(tmp_path, "B") if r["loss"] is not None}
    assert sorted(losses_b) == list(range(STEPS))
    assert losses_b[STEPS - 1] < losses_b[0]  # it trained through the recovery
