"""Configuration: YAML files loaded into frozen, validated dataclasses.

Unknown keys are errors that name their full key path; every default is documented on its dataclass.
"""
from nebula.config._schema import ConfigError, from_dict, load_yaml, to_dict
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

__all__ = [
    "ConfigError",
    "from_dict",
    "load_yaml",
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
]
