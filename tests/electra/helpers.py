"""Job files of the ELECTRA tests."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

GEN_STAGES = ["gen_romance", "gen_slavic_cjk"]


def electra_job(tmp: Path, *, clusters: list[dict[str, Any]], stages: list[dict[str, str]], steps: int,
                data: str, name: str = "job.yaml", args: dict | None = None, **extra: Any) -> Path:
    """Write an ELECTRA job (tiny preset, the test corpus' two groups) into `tmp`; returns its path."""
    doc = {
        "job": "electra",
        "mode": "oneway",
        "recipe": {"factory": "recipes.electra:ElectraRecipe",
                   "args": {"data": data, "groups": ["romance", "slavic_cjk"], "warmup_steps": 3,
                            "decay_steps": 200, "gen_lr": 2e-3, "disc_lr": 2e-3, **(args or {})}},
        "clusters": clusters,
        "stages": stages,
        "train": {"steps": steps, "global_batch": 16, "micro_batches": 1, "seed": 5},
        "metrics": {"dir": "metrics", "progress": False},
        **extra,
    }
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def local_job(tmp: Path, data: str, steps: int, **extra: Any) -> Path:
    """Every stage on cluster L, one rank: the intra-cluster run with the hand-off local."""
    stages = [{"name": n, "cluster": "L"} for n in GEN_STAGES + ["disc"]]
    return electra_job(tmp, clusters=[{"id": "L"}], stages=stages, steps=steps, data=data, **extra)
