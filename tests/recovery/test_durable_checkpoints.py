"""Checkpoints a kill cannot leave loading wrong: a real writer process killed (SIGKILL) at random points while it
saves, again and again, and the loader never loads a step whose contents are not the ones its marker names; damaged
files and markers are refused with one line and the previous good step is used."""
from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from nebula.hybrid import checkpoint as hck
from nebula.pipeline import checkpoint as pck
from nebula.recovery.durable import CheckpointError
from tests.recovery import _ckpt_writer as writer

WRITER = Path(writer.__file__)
NAMES = [f"s{i}" for i in range(writer.LAYERS)]


def _steps(kind: str, root: Path) -> list[int]:
    if kind == "pipeline":
        return pck.local_steps(root, writer.CLUSTER, NAMES, extra=True)
    return hck.committed_steps(root, writer.CLUSTER, writer.LAYERS)


def _load_and_check(kind: str, root: Path, step: int) -> None:
    """Load `step` through the loaders the runtimes use and check every weight is the writer's for that step and
    the generation its marker names."""
    layers, opts = writer.make_model(kind)
    if kind == "pipeline":
        d = pck.step_dir(root, step)
        assert pck.load(d, dict(zip(NAMES, zip(layers, opts)))) == step
        gen = json.loads((d / f"{writer.CLUSTER}.json").read_text())["gen"]
        extra = pck.load_extra(d, writer.CLUSTER)
        assert extra is not None and np.all(extra["v"] == writer.value(step, gen))
    else:
        hck.load_layers(root, step, 0, layers, opts[0])
        gen = pck.read_step_marker(root, step, writer.CLUSTER)["gen"]
    want = writer.value(step, gen)
    for layer in layers:
        for p in layer.parameters():
            assert np.all(p.numpy() == want), (step, gen, float(p.numpy().flat[0]))


def _partial(root: Path) -> bool:
    """Whether the kill left a save half done (temporary files, or a step directory without its marker)."""
    if any(root.rglob("*.tmp")):
        return True
    return any(d.is_dir() and not list(d.glob(f"{writer.CLUSTER}*.json")) for d in root.glob("step_*"))


def _kill_repeatedly(procs, root: Path, kind: str, rounds: int, seed: int) -> tuple[int, int]:
    """Kill the writer `rounds` times; returns (kills that left a save half done, steps loaded and checked)."""
    rng = random.Random(seed)
    errors = root.parent / "writer.err"
    with open(errors, "w") as err:
        zygote = procs.start([sys.executable, str(WRITER), kind, str(root)], stdin=subprocess.PIPE, stderr=err,
                             env={"OMP_NUM_THREADS": "1"})
    assert zygote.stdout.readline().strip() == "ready", errors.read_text()[-2000:]
    partial, committed, loaded = 0, False, 0
    for gen in range(1, rounds + 1):
        zygote.stdin.write(f"run {gen}\n")
        zygote.stdin.flush()
        pid = int(zygote.stdout.readline())
        assert zygote.stdout.readline().strip() == "saved"  # one save done: the kill below lands in a later one
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(pid, signal.SIGKILL)
        line = zygote.stdout.readline().strip()
        while line == "saved":  # saves the writer finished before the kill landed
            line = zygote.stdout.readline().strip()
        assert line == "reaped", line
        partial += _partial(root)
        steps = _steps(kind, root)
        assert steps or not committed, f"round {gen}: no step verifies any more"  # (a step is uncommitted only
        committed |= bool(steps)  # while another one verifies)
        for step in steps:
            _load_and_check(kind, root, step)
        loaded += len(steps)
    zygote.stdin.write("quit\n")
    zygote.stdin.flush()
    zygote.wait(30)
    return partial, loaded


@pytest.mark.parametrize("kind", ["pipeline", "hybrid"])
def test_a_writer_killed_at_random_points_never_leaves_a_checkpoint_that_loads_wrong(procs, tmp_path, kind):
    """Each round kills the writer while it saves steps it already saved in an earlier round, with other contents;
    every step the loader then lists loads exactly what its marker names. Before writes were atomic and verified,
    a kill mid-save left the old marker beside a new or torn file (wrong weights, or an unpickling error)."""
    partial, loaded = _kill_repeatedly(procs, tmp_path / "ckpt", kind, rounds=8, seed=26)
    assert partial >= 2 and loaded >= 8  # the kills did land inside saves, and steps were there to load


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pipeline", "hybrid"])
def test_many_kills_never_leave_a_checkpoint_that_loads_wrong(procs, tmp_path, kind):
    partial, loaded = _kill_repeatedly(procs, tmp_path / "ckpt", kind, rounds=60, seed=2026)
    assert partial >= 20 and loaded >= 60


# ---- damage on disk: refused with one line, the previous step used ---------------------------------------------

def _save_pipeline(root: Path, steps: list[int]) -> None:
    layers, opts = writer.make_model("pipeline")
    for step in steps:
        writer._fill(layers, writer.value(step, 0))
        pck.save(root, step, writer.CLUSTER, dict(zip(NAMES, zip(layers, opts))), {"gen": 0},
                 extra={"v": np.full(64, writer.value(step, 0))})


def test_a_truncated_file_is_refused_with_one_line_and_the_previous_step_used(tmp_path, caplog):
    _save_pipeline(tmp_path, [10, 20])
    f = pck.step_dir(tmp_path, 20) / "s2" / "model.pdparams"
    f.write_bytes(f.read_bytes()[:-100])
    with caplog.at_level(logging.WARNING):
        assert _steps("pipeline", tmp_path) == [10]
        assert _steps("pipeline", tmp_path) == [10]  # listed again (every start-up does): logged once
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1 and "step_00000020" in lines[0] and "s2/model.pdparams" in lines[0], lines
    _load_and_check("pipeline", tmp_path, 10)
    with pytest.raises(CheckpointError, match="s2/model.pdparams"):  # loading it anyway (init_from) is refused
        _load_and_check("pipeline", tmp_path, 20)


def test_a_torn_marker_or_an_unlisted_file_is_refused(tmp_path):
    _save_pipeline(tmp_path, [10, 20, 30])
    m20 = pck.step_dir(tmp_path, 20) / f"{writer.CLUSTER}.json"
    m20.write_text(m20.read_text()[:40])  # torn
    m30 = pck.step_dir(tmp_path, 30) / f"{writer.CLUSTER}.json"
    doc = json.loads(m30.read_text())
    doc["gen"] = 7  # edited after it was written: no longer matches its own digest
    m30.write_text(json.dumps(doc))
    assert _steps("pipeline", tmp_path) == [10]
    with pytest.raises(FileNotFoundError, match="no readable"):
        pck.checkpoint_step(pck.step_dir(tmp_path, 20))


def test_a_marker_written_before_digests_is_taken_as_it_is(tmp_path):
    _save_pipeline(tmp_path, [10])
    m = pck.step_dir(tmp_path, 10) / f"{writer.CLUSTER}.json"
    doc = json.loads(m.read_text())
    m.write_text(json.dumps({k: v for k, v in doc.items() if k not in ("files", "digest")}))
    assert _steps("pipeline", tmp_path) == [10]
    _load_and_check("pipeline", tmp_path, 10)


def test_hybrid_commit_refuses_a_layer_whose_save_did_not_finish(tmp_path):
    layers, opts = writer.make_model("hybrid")
    hck.save_layers(tmp_path, 5, 0, layers[:2], opts[0])  # the other stage's rank died before saving layers 2, 3
    with pytest.raises(CheckpointError, match="layer_0002 has no files.json"):
        hck.commit(tmp_path, 5, writer.CLUSTER, {"num_layers": writer.LAYERS})
    assert hck.committed_steps(tmp_path, writer.CLUSTER, writer.LAYERS) == []
