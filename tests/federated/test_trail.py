"""Model trail: versions and parents, server state kept with the model, resume from the head, export."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.federated.controller.trail import ModelTrail, RoundRecord


def test_trail_keeps_lineage_state_and_survives_reopening(tmp_path):
    w1 = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    with ModelTrail(tmp_path) as t:
        assert t.head() is None
        v1 = t.commit(w1, parent=None, round=0, strategy={"name": "fedavg"}, clients=[])
        v2 = t.commit({"w": w1["w"] + 1}, parent=v1, round=1, strategy={"name": "fedadam", "eta": 0.1},
                      clients=["A/2", "B/3"], metrics={"accuracy": 0.5}, state={"m/w": np.ones((2, 3))})
        with pytest.raises(ValueError, match="not the trail's head"):
            t.commit(w1, parent=v1, round=2, strategy={}, clients=[])
        t.record_round(RoundRecord(round=1, status="valid", version=v2, num_updates=2, num_examples=30,
                                   rejected=[{"client": "B/4", "reason": "NaN"}], started=0.0, duration_s=1.5,
                                   detail={}))
    with ModelTrail(tmp_path) as t:  # a restarted controller
        head = t.head()
        assert (head.version, head.parent, head.round, head.clients) == (2, 1, 1, ["A/2", "B/3"])
        assert head.strategy["name"] == "fedadam" and head.metrics == {"accuracy": 0.5}
        w, state = t.load(head.version)
        np.testing.assert_array_equal(w["w"], w1["w"] + 1)
        np.testing.assert_array_equal(state["m/w"], np.ones((2, 3)))
        assert [m.version for m in t.models()] == [1, 2]
        assert t.rounds()[0].rejected[0]["reason"] == "NaN"
        out = t.export(1, tmp_path / "v1.npz")
        np.testing.assert_array_equal(np.load(out)["w"], w1["w"])
        with pytest.raises(KeyError, match="no model version 7"):
            t.load(7)


def test_the_head_a_trail_committed_is_not_read_back_and_cannot_be_changed(tmp_path):
    w = {"w": np.arange(4, dtype=np.float32)}
    with ModelTrail(tmp_path) as t:
        v1 = t.commit(w, parent=None, round=0, strategy={}, clients=[])
        v2 = t.commit({"w": w["w"] * 2}, parent=v1, round=1, strategy={}, clients=[], state={"m/w": np.ones(4)})
        for f in ("models", "state"):
            (tmp_path / f / f"{v2}.npz").unlink()  # (what the next round starts from is in memory)
        got, state = t.load(v2)
        np.testing.assert_array_equal(got["w"], w["w"] * 2)
        np.testing.assert_array_equal(state["m/w"], np.ones(4))
        with pytest.raises(ValueError, match="read-only"):
            got["w"][0] = 7  # (what the round starts from stays what the trail wrote)
        w["w"][0] = 5  # the caller's own arrays stay writable
        np.testing.assert_array_equal(t.load(v1)[0]["w"], [0, 1, 2, 3])  # (an older version: from its file)
    with ModelTrail(tmp_path) as t, pytest.raises(FileNotFoundError):
        t.load(v2)  # a restarted controller reads the head from disk
