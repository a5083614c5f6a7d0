"""Configuration: YAML files loaded into frozen, validated dataclasses.

Unknown keys are errors that name their full key path; every default is documented on its dataclass. Every
config file is read by `read_yaml` (size, nesting and numbers bounded, aliases refused; see security._yaml).
"""
from security._yaml import read_yaml
from nebula.config.schema import ConfigError, from_dict, load_yaml, to_dict
from nebula.config.switch import (
    AuditConfig,
    LinkConfig,
    LimitsConfig,
    LocalConfig,
    MetricsConfig,
    PeerConfig,
    ShapeConfig,
    SwitchConfig,
    TLSFiles,
    WorkerIdentity,
    load_switch_config,
    split_host_port,
)
from nebula.config.worker import WorkerConfig, load_worker_config, local_endpoint, stream_path
from nebula.config.job import JobConfig, load_job_config

__all__ = [
    "ConfigError",
    "from_dict",
    "load_yaml",
    "read_yaml",
    "to_dict",
    "AuditConfig",
    "LinkConfig",
    "LimitsConfig",
    "LocalConfig",
    "MetricsConfig",
    "PeerConfig",
    "ShapeConfig",
    "SwitchConfig",
    "TLSFiles",
    "WorkerIdentity",
    "load_switch_config",
    "split_host_port",
    "WorkerConfig",
    "load_worker_config",
    "local_endpoint",
    "stream_path",
    "JobConfig",
    "load_job_config",
]
