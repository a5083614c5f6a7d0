"""Switch-server configuration (`D/<cluster>/switch.yaml` as written by `nebula-admin provision`).

Relative file paths inside the YAML are resolved against the YAML file's own directory by
`load_switch_config`, so a provisioned directory can be moved as a whole.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from nebula.config.schema import ConfigError, load_yaml, resolve_path

LANES = ("control", "activation", "gradient", "bulk")


def split_host_port(address: str, what: str = "address") -> tuple[str, int]:
    """Parse `host:port` (IPv6 as `[::1]:port`); raise ValueError naming `what` and the fix."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what} {address!r} is not host:port (e.g. 127.0.0.1:7000)")
    return host.strip("[]"), int(port)


@dataclass(frozen=True, kw_only=True, slots=True)
class TLSFiles:
    """PEM files of this switch's TLS identity; all are required (there is no plaintext WAN mode)."""

    ca: str  # federation CA certificate
    cert: str  # this switch's certificate (role `switch`)
    key: str  # its private key
    crl: str  # the federation CRL; re-read on reload
    key_passphrase_env: str | None = None  # environment variable holding the key's passphrase, if encrypted
    # warn (log, status file, metrics) this many days before the certificate or the CA expires; the CRL warns at the
    # lesser of this and a third of its lifetime (`switch_server.expiry`)
    expiry_warning_days: float = 7.0

    def __post_init__(self) -> None:
        days = self.expiry_warning_days
        if isinstance(days, bool) or not isinstance(days, (int, float)) or not 0 <= days <= 3650:
            raise ValueError(f"tls.expiry_warning_days={days!r} must be a number of days from 0 to 3650 (default 7)")


@dataclass(frozen=True, kw_only=True, slots=True)
class PeerConfig:
    """One peer cluster's switch server."""

    cluster: str
    address: str  # host:port of its WAN listener
    # accounts of this cluster the peer's workers may address ("*": every account with a worker here); the jobs
    # are those the account's workers here may join
    accounts: tuple[str, ...] = ("*",)

    def __post_init__(self) -> None:
        split_host_port(self.address, f"peer {self.cluster!r} address")
        if not self.accounts:
            raise ValueError(f"peer {self.cluster!r}: accounts is empty; list the accounts it may address, or '*'")


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerIdentity:
    """A worker credential the switch accepts on its local ZeroMQ side (CURVE public key)."""

    name: str
    account: str  # account every message of this worker is attributed to
    curve_public_key: str  # Z85, 40 characters
    jobs: tuple[str, ...] = ("*",)  # jobs this worker may join; "*" = any job of its account

    def __post_init__(self) -> None:
        if len(self.curve_public_key) != 40:
            raise ValueError(f"worker {self.name!r}: curve_public_key must be 40 Z85 characters")


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalConfig:
    """Cluster-private side: where workers reach the switch, and how they authenticate."""

    endpoint: str  # ZeroMQ endpoint the switch binds, e.g. tcp://127.0.0.1:7101
    curve_secret_key: str  # file holding the switch's CURVE key pair (ZeroMQ certificate format)
    workers: tuple[WorkerIdentity, ...] = ()
    # Optional second endpoint for workers on the switch's own host, e.g. ipc://@nebula-A (Linux abstract socket)
    # or ipc:///run/nebula/A.sock. The kernel carries its bytes, so it skips CURVE's encryption; workers still
    # authenticate (ZeroMQ PLAIN with a password derived from their CURVE key pair, see security.curve).
    # "" = TCP with CURVE only.
    ipc_endpoint: str = ""
    # Shared memory offered to each worker on the IPC endpoint, per direction (nebula.wire.shm): payloads go
    # through it instead of through the socket. Pages are touched only as traffic needs them. 0 = off.
    shm_bytes: int = 64 * 1024**2
    # Optional host:port where workers on other hosts reach the switch over mutual TLS (the switch's certificate,
    # theirs of role `worker`, the federation CA and CRL; then the same key and derived password as over IPC),
    # instead of CURVE: AES-GCM in OpenSSL costs a fraction of CURVE's CPU per byte. "" = not offered.
    tls_endpoint: str = ""

    def __post_init__(self) -> None:
        if self.tls_endpoint:
            split_host_port(self.tls_endpoint, "local.tls_endpoint")
        if self.ipc_endpoint and not self.ipc_endpoint.startswith("ipc://"):
            raise ValueError(f"local.ipc_endpoint {self.ipc_endpoint!r} must start with ipc:// "
                             "(e.g. ipc://@nebula-A), or be left out")
        if self.shm_bytes and not 1024**2 <= self.shm_bytes <= 1 << 40:
            raise ValueError(f"local.shm_bytes={self.shm_bytes} must be 0 (off) or between 1 MiB and 1 TiB")


@dataclass(frozen=True, kw_only=True, slots=True)
class ShapeConfig:
    """User-space WAN emulation on outgoing peer links; None/0 = unshaped."""

    rate_mbit: float | None = None
    delay_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.rate_mbit is not None and self.rate_mbit <= 0:
            raise ValueError(f"link.shape.rate_mbit={self.rate_mbit} must be > 0 (or omit it for no limit)")
        if self.delay_ms < 0:
            raise ValueError(f"link.shape.delay_ms={self.delay_ms} must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkConfig:
    """Peer-link framing, buffering and flow control."""

    chunk_bytes: int = 1024 * 1024  # a message larger than this travels as several frames
    max_message_bytes: int = 4 * 1024**3  # larger messages are refused with an error to the sender
    retransmit_buffer_bytes: int = 256 * 1024**2  # unacknowledged bytes kept per peer for resume
    memory_cap_bytes: int = 512 * 1024**2  # queued bytes per switch before senders are held back
    reconnect_initial_s: float = 0.2
    reconnect_max_s: float = 5.0
    shape: ShapeConfig = field(default_factory=ShapeConfig)

    def __post_init__(self) -> None:
        for name in ("chunk_bytes", "max_message_bytes", "retransmit_buffer_bytes", "memory_cap_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"link.{name}={getattr(self, name)} must be > 0")
        if self.chunk_bytes > self.retransmit_buffer_bytes:
            raise ValueError("link.chunk_bytes must not exceed link.retransmit_buffer_bytes")


@dataclass(frozen=True, kw_only=True, slots=True)
class LimitsConfig:
    """Rate limits; None = unlimited."""

    peer_rate_mbit: float | None = None
    account_rate_mbit: float | None = None
    # memory budgets within link.memory_cap_bytes (None: derived from it by nebula.config.budgets.resolve): one
    # peer's frames queued here (its credit window), one local account's queued frames while other accounts are
    # active, frames held for one account's ranks that have not connected yet
    peer_memory_bytes: int | None = None
    account_memory_bytes: int | None = None
    pending_bytes: int | None = None
    # WAN connections at once that have not yet identified themselves (TLS, then LINK_HELLO); beyond, the oldest
    # is closed
    max_unauthenticated: int = 64

    def __post_init__(self) -> None:
        for name in ("peer_memory_bytes", "account_memory_bytes", "pending_bytes"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v <= 0):
                raise ValueError(f"limits.{name}={v!r} must be a positive number of bytes, or left out")
        if not isinstance(self.max_unauthenticated, int) or self.max_unauthenticated < 1:
            raise ValueError(f"limits.max_unauthenticated={self.max_unauthenticated!r} must be at least 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditConfig:
    """Where the switch writes its tamper-evident audit log and with which Ed25519 key it signs checkpoints."""

    log: str
    signing_key: str
    checkpoint_every: int = 1000


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricsConfig:
    """Prometheus endpoint; listen None disables it. It has no authentication, so it listens on loopback by default:
    another address needs `public: true`. Accounts are opaque ids in its labels unless `account_names: true`."""

    listen: str | None = "127.0.0.1:0"
    public: bool = False  # serve it on a non-loopback address (anyone who reaches it reads it)
    account_names: bool = False  # label accounts by name instead of by opaque id

    def __post_init__(self) -> None:
        if self.listen:
            host, _ = split_host_port(self.listen, "metrics.listen")
            if not self.public and host not in ("localhost", "::1") and not host.startswith("127."):
                raise ValueError(f"metrics.listen {self.listen!r} is not a loopback address: the metrics endpoint has "
                                 "no authentication, so anyone who reaches it reads it; keep 127.0.0.1:PORT (the "
                                 "default) and scrape it on this host or through a tunnel, or set metrics.public: "
                                 "true to serve it there")


@dataclass(frozen=True, kw_only=True, slots=True)
class SwitchConfig:
    """One cluster's switch server."""

    federation: str
    cluster: str
    listen: str  # host:port of the WAN (TLS) listener; port 0 picks a free one
    tls: TLSFiles
    local: LocalConfig
    audit: AuditConfig
    peers: tuple[PeerConfig, ...] = ()
    link: LinkConfig = field(default_factory=LinkConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    state_dir: str | None = None  # durable sequence/ack state for resume across restarts
    # account home (its accounts.db) whose route grants this switch enforces on its workers' frames to other
    # clusters (`nebula-admin grant add --to ACCOUNT --resource cluster:B`); None = no route restriction
    accounts_home: str | None = None

    def __post_init__(self) -> None:
        split_host_port(self.listen, "listen")
        seen = set()
        for peer in self.peers:
            if peer.cluster == self.cluster:
                raise ValueError(f"peer cluster {peer.cluster!r} is this switch's own cluster; remove it from peers")
            if peer.cluster in seen:
                raise ValueError(f"peer cluster {peer.cluster!r} is listed twice under peers")
            seen.add(peer.cluster)

    def peer(self, cluster: str) -> PeerConfig:
        """The peer entry for `cluster`, or KeyError naming the known ones."""
        for p in self.peers:
            if p.cluster == cluster:
                return p
        raise KeyError(f"no peer for cluster {cluster!r}; known: {', '.join(p.cluster for p in self.peers) or 'none'}")


_PATH_FIELDS = {
    "tls": ("ca", "cert", "key", "crl"),
    "local": ("curve_secret_key",),
    "audit": ("log", "signing_key"),
}


def resolve_paths(cfg: SwitchConfig, base: Path) -> SwitchConfig:
    """Return `cfg` with relative file paths made absolute against `base`."""
    changes = {}
    for section, names in _PATH_FIELDS.items():
        sub = getattr(cfg, section)
        changes[section] = dataclasses.replace(sub, **{n: resolve_path(getattr(sub, n), base) for n in names})
    changes["state_dir"] = resolve_path(cfg.state_dir, base)
    changes["accounts_home"] = resolve_path(cfg.accounts_home, base)
    return dataclasses.replace(cfg, **changes)


def load_switch_config(file: str | Path) -> SwitchConfig:
    """Load and validate a switch YAML file; relative paths are taken from the file's directory."""
    file = Path(file)
    cfg = load_yaml(SwitchConfig, file)
    try:
        return resolve_paths(cfg, file.resolve().parent)
    except ValueError as exc:  # pragma: no cover - resolve only joins paths
        raise ConfigError(f"{file}: {exc}") from exc
