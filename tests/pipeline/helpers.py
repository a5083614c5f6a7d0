"""Shared helpers of the pipeline tests: job files for the toy recipe."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def toy_job(tmp: Path, *, clusters: list[dict[str, Any]], stages: list[dict[str, str]], steps: int = 4,
            global_batch: int = 16, micro_batches: int = 2, name: str = "job.yaml", recipe_args: dict | None = None,
            **extra: Any) -> Path:
    """Write a toy job file into `tmp` and return its path."""
    doc = {
        "job": "toy",
        "recipe": {"factory": "recipes.toy:ToyRecipe", "args": recipe_args or {}},
        "clusters": clusters,
        "stages": stages,
        "train": {"steps": steps, "global_batch": global_batch, "micro_batches": micro_batches, "seed": 3},
        "metrics": {"dir": "metrics", "progress": False},
        **extra,
    }
    path = tmp / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


TWO_STAGES = [{"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "B"}]


def run_two_clusters(cfg: Any, wiring_a: dict, wiring_b: dict, workdir: Path, *,
                     a_ready: Any = None, timeout_s: float = 300) -> tuple[Any, Any]:
    """Cluster A in a thread and cluster B here, one process, joined by in-process links; their RunResults (A's
    error re-raised). `a_ready()`, polled before B starts, holds B back until A is ready (paddle's seed is
    process-wide: stages built at once in two threads would draw other initial weights than two processes)."""
    import threading
    import time

    from nebula.modes import run

    out: dict[str, Any] = {}

    def side_a() -> None:
        try:
            out["A"] = run(cfg, "A", wiring=wiring_a, workdir=workdir)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            out["A"] = exc

    t = threading.Thread(target=side_a, name="cluster-A")
    t.start()
    deadline = time.monotonic() + 60
    while a_ready is not None and not a_ready() and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        res_b = run(cfg, "B", wiring=wiring_b, workdir=workdir)
    finally:
        t.join(timeout=timeout_s)
    if isinstance(out.get("A"), BaseException):
        raise out["A"]
    return out.get("A"), res_b
