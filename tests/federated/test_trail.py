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


_KILLED_WRITER = """
import sys
import numpy as np
from nebula.federated.controller.trail import ModelTrail, RoundRecord

t = ModelTrail(sys.argv[1])
v = t.commit({"w": np.arange(3, dtype=np.float32)}, parent=None, round=0, strategy={}, clients=[])
v = t.commit({"w": np.ones(3, np.float32)}, parent=v, round=1, strategy={"name": "fedadam"}, clients=["B/2"],
             state={"m/w": np.full(3, 0.5)})
for r, status, version in ((1, "valid", v), (2, "invalid", None)):
    t.record_round(RoundRecord(round=r, status=status, version=version, num_updates=1, num_examples=10, rejected=[],
                               started=0.0, duration_s=0.1, detail={"why": None if version else "too few"}))
print("recorded", flush=True)
sys.stdin.read()  # (held open, never closed: the test kills it)
"""


def test_a_killed_writer_loses_no_committed_model_and_no_round_record(tmp_path):
    """Round records are committed without waiting for the disk, models with it: a controller killed (SIGKILL,
    the trail never closed) right after both leaves them to the next opener, and a reader saw them at once."""
    import os
    import sqlite3
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH")) if p))
    p = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(tmp_path)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "recorded"
        with ModelTrail(tmp_path) as reader:  # another process's reader, while the writer holds the trail
            assert [(r.round, r.status) for r in reader.rounds()] == [(1, "valid"), (2, "invalid")]
        p.kill()
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
    with ModelTrail(tmp_path) as t:
        head = t.head()
        assert (head.version, head.round, head.clients) == (2, 1, ["B/2"])
        w, state = t.load(2)
        np.testing.assert_array_equal(w["w"], np.ones(3, np.float32))
        np.testing.assert_array_equal(state["m/w"], np.full(3, 0.5))
        assert [(r.round, r.version, r.detail["why"]) for r in t.rounds()] == [(1, 2, None), (2, None, "too few")]
    # (the index's write-ahead log: a commit flushes one file)
    assert sqlite3.connect(tmp_path / "trail.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    for d in ("models", "state"):
        assert sorted(f.name for f in (tmp_path / d).iterdir()) == ["1.npz", "2.npz"]  # no temporary file left
