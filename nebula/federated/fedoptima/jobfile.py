"""Selecting FedOptima or OWL in a federated job file: `algorithm:` plus its block, beside the FEDn keys.

Example (the rest of the file is a `mode: federated` job as `nebula.federated.config` describes it)::

    algorithm: fedoptima         # rounds (default: the controller's FEDn rounds) | fedoptima | owl
    task: "recipes.federated.modes:LangIdTask"  # fedoptima/owl: "module:factory" of the Task, called with
                                 # num_clients={cluster: n}, seed=<job seed> and the client's args
    fedoptima: {omega: 8, local_iterations: 5, max_rounds: 10}
    owl: {distribution: owl, rounds: 5}

`nebula fl start JOB --cluster C` runs the selected algorithm (`nebula.federated.modes`).
`load_federated_modes` takes these keys out, checks them (unknown keys are errors with their full path), and
loads the rest with the federated mode's own loader.
"""
from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nebula.config.schema import ConfigError, from_dict
from nebula.federated.fedoptima.config import FedOptimaSpec
from nebula.federated.owl.config import OwlSpec

__all__ = ["ModeSpec", "ALGORITHMS", "MODE_KEYS", "split_mode_keys", "load_federated_modes"]

ALGORITHMS = ("rounds", "fedoptima", "owl")
MODE_KEYS = ("algorithm", "task", "fedoptima", "owl")  # the job-file keys this module reads


@dataclass(frozen=True, kw_only=True, slots=True)
class ModeSpec:
    """Which training algorithm a federated job runs, and the options of FedOptima and OWL."""

    algorithm: str = "rounds"
    task: str = ""
    fedoptima: FedOptimaSpec = field(default_factory=FedOptimaSpec)
    owl: OwlSpec = field(default_factory=OwlSpec)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm={self.algorithm!r} must be one of {', '.join(ALGORITHMS)} (rounds: FEDn's "
                             "synchronous or asynchronous rounds)")
        if self.algorithm != "rounds" and ":" not in self.task:
            raise ValueError(f"task={self.task!r}: algorithm {self.algorithm} needs `task: module:factory` naming "
                             "what it trains (e.g. recipes.federated.modes:LangIdTask)")


def split_mode_keys(raw: dict[str, Any]) -> tuple[dict[str, Any], ModeSpec]:
    """(the job without `algorithm`/`fedoptima`/`owl`, the checked ModeSpec)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"<top>: expected a mapping for the job, got {type(raw).__name__}")
    rest = {k: v for k, v in raw.items() if k not in MODE_KEYS}
    mine = {k: raw[k] for k in MODE_KEYS if k in raw}
    for k in ("fedoptima", "owl"):
        if mine.get(k) is None:
            mine.pop(k, None)
    if "fedoptima" in mine and isinstance(mine["fedoptima"].get("slowdown"), list):
        mine["fedoptima"] = {**mine["fedoptima"], "slowdown": tuple(mine["fedoptima"]["slowdown"])}
    return rest, from_dict(ModeSpec, mine)


def load_federated_modes(file: str | Path):
    """(FederatedJob, ModeSpec) of a federated job file that may select FedOptima or OWL."""
    import yaml

    from nebula.config import read_yaml
    from nebula.federated.config import load_federated_job

    file = Path(file)
    raw = read_yaml(file) or {}  # (bounded: nebula.config._safeyaml; errors name the file and key)
    try:
        rest, mode = split_mode_keys(raw)
    except ConfigError as exc:
        raise ConfigError(f"{file}: {exc}") from None
    # the federated loader resolves paths against the file's directory: hand it the rest from beside the file
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=file.resolve().parent, delete=True) as tmp:
        yaml.safe_dump(rest, tmp, sort_keys=False)
        tmp.flush()
        try:
            job = load_federated_job(tmp.name)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(tmp.name, str(file))) from None
    return job, mode


def to_yaml_block(mode: ModeSpec) -> dict[str, Any]:
    """The ModeSpec as job-file keys (for writing a job)."""
    d = dataclasses.asdict(mode)
    d["fedoptima"]["slowdown"] = list(d["fedoptima"]["slowdown"])
    return d
