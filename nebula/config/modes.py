"""The names of the run modes, spelled once: what a job file's `mode:` (or a federated job's `algorithm:`) may say.

They are the job file's values, so configuration owns them (it validates `mode:`); the launcher and the runners
name modes from here too, and `nebula.modes` registers each name's entry point.
"""
from __future__ import annotations

from enum import StrEnum
from typing import Literal

__all__ = ["ModeName", "LAUNCHED", "LaunchedMode"]


class ModeName(StrEnum):
    """A run mode's name (a str: it compares equal to the job file's value)."""

    PIPELINE = "pipeline"  # stages in model order across clusters (Scenario II); the default
    ONEWAY = "oneway"  # sender clusters feed a receiver cluster (Scenario I)
    DATA_PARALLEL = "data_parallel"  # a replica per cluster, averaged over the WAN
    FEDERATED = "federated"  # FEDn's rounds (a federated job's `algorithm: rounds`)
    FEDOPTIMA = "fedoptima"
    OWL = "owl"


LAUNCHED: tuple[ModeName, ...] = (ModeName.PIPELINE, ModeName.ONEWAY, ModeName.DATA_PARALLEL)  # `nebula launch`
LaunchedMode = Literal[tuple(m.value for m in LAUNCHED)]  # type: ignore[valid-type]  # a job file's `mode:` values
