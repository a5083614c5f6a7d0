"""Per-cluster launcher: validates the job, then starts the cluster's ranks with paddle.distributed.launch."""
from nebula.launch.launcher import build_command, launch, prepare
from nebula.launch.preflight import validate_job

__all__ = ["build_command", "launch", "prepare", "validate_job"]
