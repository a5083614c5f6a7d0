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
