"""Worker connection file (`D/<cluster>/worker.yaml`): how a worker reaches its cluster's switch server.

Relative paths (the CURVE key file) are resolved against the YAML file's directory by `load_worker_config`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from nebula.config._schema import ConfigError, load_yaml


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerConfig:
    """One cluster's worker credential and the switch's local endpoint."""

    federation: str
    cluster: str  # the worker's own cluster
    endpoint: str  # the switch's local ZeroMQ endpoint, e.g. tcp://127.0.0.1:7101
    switch_curve_public_key: str  # Z85, 40 characters; pins the switch the worker talks to
    curve_key: str  # the worker's CURVE key pair file (ZeroMQ certificate format)
    account: str  # account the switch attributes this worker's messages to
    name: str = "worker"  # credential name as listed under the switch's local.workers

    def __post_init__(self) -> None:
        if len(self.switch_curve_public_key) != 40:
            raise ValueError(
                f"switch_curve_public_key {self.switch_curve_public_key!r} must be 40 Z85 characters; "
                "copy it from the switch's CURVE certificate"
            )
        if not self.endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"endpoint {self.endpoint!r} must be a ZeroMQ endpoint such as tcp://127.0.0.1:7101")
        for name in ("federation", "cluster", "account", "name"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")


def load_worker_config(file: str | Path) -> WorkerConfig:
    """Load and validate a worker YAML file; `curve_key` is taken relative to the file's directory."""
    file = Path(file)
    cfg = load_yaml(WorkerConfig, file)
    key = Path(cfg.curve_key)
    if not key.is_absolute():
        key = (file.resolve().parent / key).resolve()
    return dataclasses.replace(cfg, curve_key=str(key))


__all__ = ["WorkerConfig", "load_worker_config", "ConfigError"]
