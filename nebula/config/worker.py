"""Worker connection file (`D/<cluster>/worker.yaml`): how a worker reaches its cluster's switch server.

Relative paths (the CURVE key file, the TLS files) are resolved against the YAML file's directory by
`load_worker_config`.
"""
from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass
from pathlib import Path

from nebula.config.schema import ConfigError, load_yaml, resolve_path
from nebula.config.switch import split_host_port

TRANSPORTS = ("auto", "tcp", "tls", "ipc", "unix")


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerTLS:
    """PEM files of the worker's TLS identity (role `worker`, issued with its kit) and the federation's CA and CRL,
    which the switch's certificate is checked against."""

    ca: str
    cert: str
    key: str
    crl: str


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
    ipc_endpoint: str = ""  # the switch's local.ipc_endpoint, for workers on the switch's own host
    # the switch's local.tls_endpoint (host:port): workers on other hosts reach it over mutual TLS, with `tls`
    tls_endpoint: str = ""
    tls: WorkerTLS | None = None
    # auto: when there is an IPC endpoint and `endpoint`'s host is an address of this machine, the switch's Unix
    # stream socket beside it (`stream_path`: the IPC credentials, no ZeroMQ), else mutual TLS when tls_endpoint
    # is given, else CURVE over TCP; tcp / tls / unix / ipc (ZeroMQ over the IPC endpoint) force one (unix and ipc
    # fail when the switch is not on this host)
    transport: str = "auto"
    # over IPC, take the switch's offer of shared memory for payloads (nebula.wire.shm); false = through the socket
    shared_memory: bool = True

    def __post_init__(self) -> None:
        if len(self.switch_curve_public_key) != 40:
            raise ValueError(
                f"switch_curve_public_key {self.switch_curve_public_key!r} must be 40 Z85 characters; "
                "copy it from the switch's CURVE certificate"
            )
        if not self.endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"endpoint {self.endpoint!r} must be a ZeroMQ endpoint such as tcp://127.0.0.1:7101")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport {self.transport!r} is not one of {', '.join(TRANSPORTS)}")
        if self.ipc_endpoint and not self.ipc_endpoint.startswith("ipc://"):
            raise ValueError(f"ipc_endpoint {self.ipc_endpoint!r} must start with ipc://, or be left out")
        if self.transport in ("ipc", "unix") and not self.ipc_endpoint:
            raise ValueError(f"transport: {self.transport} needs ipc_endpoint (the switch's local.ipc_endpoint)")
        if self.tls_endpoint:
            split_host_port(self.tls_endpoint, "tls_endpoint")
        if (self.tls_endpoint or self.transport == "tls") and self.tls is None:
            raise ValueError("tls_endpoint needs tls: {ca, cert, key, crl} (the worker's certificate from its kit)")
        if self.transport == "tls" and not self.tls_endpoint:
            raise ValueError("transport: tls needs tls_endpoint (the switch's local.tls_endpoint, host:port)")
        for name in ("federation", "cluster", "account", "name"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")


def is_local_host(host: str) -> bool:
    """True when `host` names an address of this machine (a socket can bind to it)."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, addr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind(addr[:2] if family == socket.AF_INET else addr)
            return True
        except OSError:
            continue
    return False


def stream_path(ipc_endpoint: str) -> str:
    """The Unix stream socket a switch listens on beside its `local.ipc_endpoint` (ipc://@name -> @name.stream,
    an abstract socket as well; ipc:///path -> /path.stream)."""
    return ipc_endpoint.removeprefix("ipc://") + ".stream"


def local_endpoint(cfg: WorkerConfig) -> tuple[str, str]:
    """(endpoint, "tcp", "tls", "ipc" or "unix"): where this worker should reach its switch from this host."""
    if cfg.transport == "ipc":
        return cfg.ipc_endpoint, "ipc"
    if cfg.transport == "unix" or (cfg.transport == "auto" and cfg.ipc_endpoint and cfg.endpoint.startswith("tcp://")
                                   and is_local_host(cfg.endpoint[6:].rpartition(":")[0].strip("[]"))):
        return stream_path(cfg.ipc_endpoint), "unix"
    if cfg.transport == "tls" or (cfg.transport == "auto" and cfg.tls_endpoint):
        return cfg.tls_endpoint, "tls"
    return cfg.endpoint, "tcp"


def load_worker_config(file: str | Path) -> WorkerConfig:
    """Load and validate a worker YAML file; `curve_key` and the TLS files are taken relative to its directory."""
    file = Path(file)
    cfg = load_yaml(WorkerConfig, file)
    base = file.resolve().parent
    tls = cfg.tls and WorkerTLS(**{k: resolve_path(getattr(cfg.tls, k), base) for k in ("ca", "cert", "key", "crl")})
    return dataclasses.replace(cfg, curve_key=resolve_path(cfg.curve_key, base), tls=tls)


__all__ = ["WorkerConfig", "WorkerTLS", "load_worker_config", "local_endpoint", "is_local_host", "ConfigError"]
