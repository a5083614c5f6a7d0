"""Central differential privacy's clip holds at the combiner through a real round over TLS switch servers: a hostile
client that skips its own clipping (it runs without the job's `differential_privacy`) and sends a change of norm
~3900 (7700 times clip_norm), moves the model no further than an honest one can; its update is clipped, audited and
counted, raw or compressed; the sampler run (Poisson) is named in the round's record."""
from __future__ import annotations

import pytest

from testbed.fedruns import CLIP, clip_round


@pytest.mark.parametrize("codec", ["none", "topk(0.5)"])
def test_a_hostile_clients_huge_update_is_clipped_at_the_combiner(procs, tmp_path, codec):
    run = clip_round(procs, tmp_path, codec)
    rnd, models, change, out = run.round, run.models, run.change, run.out
    assert rnd.status == "valid" and rnd.num_updates == 3 and models[1].clients == ["A/2", "A/3", "B/2"], out
    assert (rnd.detail["privacy"]["sampler"], rnd.detail["privacy"]["sampled"]) == ("poisson", 3)
    # the released change: (Σ of 3 clipped changes + noise) / 3, so at most CLIP plus the noise's share (std
    # 0.01·0.5/3 on each of 15 values, a norm of about 0.006); unclipped, the hostile update alone would move it
    # by about 1291
    assert 0 < change < CLIP + 0.05, change
    audit_b = run.audit["B"]
    (acc,) = [r for r in audit_b if r["action"] == "fl.update" and r["outcome"] == "accepted"]
    # as decoded: what is aggregated (topk(0.5) keeps 8 of the 15 values: 1000·√8 ≈ 2828)
    assert acc["target"] == "B/2" and acc["detail"]["clipped"] is True and acc["detail"]["norm"] > 2500
    assert [r["detail"]["clipped"] for r in audit_b if r["action"] == "fl.dp"] == [1]
    audit_a = run.audit["A"]
    honest = [r["detail"]["norm"] for r in audit_a if r["action"] == "fl.update" and r["outcome"] == "accepted"]
    assert len(honest) == 2 and all(n <= CLIP * 1.05 for n in honest)  # they clipped themselves
