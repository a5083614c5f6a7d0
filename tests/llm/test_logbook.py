"""VisualDL scalars of a two-cluster run, read back with VisualDL's own LogReader: per cluster, the loss, steps/s,
WAN bytes and compression ratio of every step equal what the runtime measured."""
from __future__ import annotations

import importlib.util
import queue
import subprocess
import sys

import pytest

from nebula.config.job import load_job_config
from nebula.logbook import read_scalars, scalars_of, write_scalars
from nebula.pipeline import QueueLink, read_metrics
from tests.conftest import REPO
from tests.pipeline.helpers import TWO_STAGES, run_two_clusters, toy_job

pytestmark = pytest.mark.skipif(importlib.util.find_spec("visualdl") is None,
                                reason="needs VisualDL: pip install -e '.[visualdl]' (also in the formers extra)")


def _two_clusters_int8(tmp_path, steps: int = 8) -> None:
    """The toy model in clusters A and B of one process, joined by in-process links, int8 both ways."""
    job = toy_job(tmp_path, clusters=[{"id": "A"}, {"id": "B"}], stages=TWO_STAGES, steps=steps, global_batch=32,
                  recipe_args={"hidden": 256}, compression={"forward": "int8", "backward": "int8"})
    cfg = load_job_config(job)
    wa, wb = {}, {}
    for kind in ("act", "grad", "ctl"):
        ab, ba = queue.Queue(), queue.Queue()
        wa[kind], wb[kind] = QueueLink(ab, ba, peer_cluster="B"), QueueLink(ba, ab, peer_cluster="A")
    run_two_clusters(cfg, {"next": wa}, {"prev": wb}, tmp_path, timeout_s=120)


def test_scalars_per_cluster_read_back_with_visualdl_equal_the_runtime_metrics(tmp_path):
    _two_clusters_int8(tmp_path)
    out = subprocess.run([sys.executable, "-m", "nebula.logbook", str(tmp_path / "metrics"), str(tmp_path / "vdl")],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0 and "VisualDL scalars of A, B:" in out.stdout, out.stdout + out.stderr
    for cluster in ("A", "B"):
        recs = read_metrics(tmp_path / "metrics" / f"{cluster}.rank0.jsonl")
        got = read_scalars(tmp_path / "vdl" / cluster)
        steps = [r["step"] for r in recs]
        assert [s for s, _ in got["steps_per_s"]] == steps
        assert [v for _, v in got["steps_per_s"]] == pytest.approx([1 / r["step_s"] for r in recs], rel=1e-6)
        assert [v for _, v in got["wan_bytes"]] == [r["bytes_sent"] + r["bytes_recv"] for r in recs]
        ratio = dict(got["compression_ratio"])
        # int8 carries about a quarter of the float32 bytes of [16, 256] activations (plus scales and headers)
        assert all(3.5 < ratio[s] < 4.0 for s in steps[1:]), ratio  # every step after the first
        if cluster == "B":  # the loss lives on the last stage
            assert [v for _, v in got["loss"]] == pytest.approx([r["loss"] for r in recs], rel=1e-6)


def test_a_mode_that_records_no_raw_bytes_takes_them_from_the_recipe(tmp_path):
    recs = [{"step": 0, "loss": 2.0, "step_s": 0.5, "bytes_sent": 0},
            {"step": 1, "loss": 1.5, "step_s": 0.25, "bytes_sent": 250, "synced": True}]
    scalars = scalars_of(recs, raw_bytes=lambda r: 1000.0 if r.get("synced") else None)
    run_dir = write_scalars(tmp_path, {"diloco": scalars})["diloco"]
    got = read_scalars(run_dir)
    assert got["compression_ratio"] == [(1, 4.0)] and got["steps_per_s"] == [(0, 2.0), (1, 4.0)]
    assert got["loss"] == [(0, 2.0), (1, 1.5)] and got["wan_bytes"] == [(0, 0.0), (1, 250.0)]
