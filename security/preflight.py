"""Fail-closed start: what a switch checks about its own credentials before it listens (identity, key permissions)."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Iterable

from security.errors import TLSConfigError
from security.identity import Identity
from security.tls import check_own_identity

__all__ = ["check_key_file", "check_key_files", "check_switch_start", "private_key_files"]

_KEY_SUFFIXES = (".key", ".key_secret")


def check_key_file(path: str | os.PathLike, what: str = "key file") -> None:
    """Raise TLSConfigError if the private key file at `path` is accessible to group or others."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        raise TLSConfigError(f"{what} {path} does not exist; provision it with `nebula-admin provision`") from None
    if mode & 0o077:
        who = " and ".join(w for w, bits in (("group", 0o070), ("others", 0o007)) if mode & bits)
        raise TLSConfigError(f"{what} {path} has mode {mode:04o}: {who} can access it; it must be private to its "
                             f"owner: run `chmod 600 {path}`")


def check_key_files(paths: Iterable[tuple[str | os.PathLike, str]]) -> None:
    """`check_key_file` on each (path, what)."""
    for path, what in paths:
        check_key_file(path, what)


def private_key_files(directory: str | os.PathLike) -> list[Path]:
    """Private key files (`*.key`, `*.key_secret`) directly in `directory` and in its `workers/` subdirectory."""
    d = Path(directory)
    found = []
    for folder in (d, d / "workers"):
        if folder.is_dir():
            found += sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(_KEY_SUFFIXES))
    return found


def check_switch_start(cfg: Any, config_path: str | os.PathLike | None = None) -> Identity:
    """Refuse to start a switch on credentials it must not serve with; TLSConfigError naming the file and the fix.

    `cfg` is a loaded switch config (its `tls`, `audit`, `local`, `cluster` and `federation`). Checks that the
    own certificate is issued by `tls.ca`, valid now, not revoked in `tls.crl`, of role `switch`, of this cluster
    and federation; and that `tls.key`, `audit.signing_key`, `local.curve_secret_key` and the worker key files
    provisioned beside the config (`workers/`) are readable by their owner only.
    """
    keys: list[tuple[str | os.PathLike, str]] = [
        (cfg.tls.key, "TLS key (tls.key)"),
        (cfg.audit.signing_key, "audit signing key (audit.signing_key)"),
        (cfg.local.curve_secret_key, "CURVE secret key (local.curve_secret_key)"),
    ]
    named = {Path(p).resolve() for p, _ in keys}
    if config_path is not None:
        keys += [(p, "key file") for p in private_key_files(Path(config_path).resolve().parent)
                 if p.resolve() not in named]
    check_key_files(keys)
    return check_own_identity(cfg.tls.ca, cfg.tls.cert, cfg.tls.crl, role="switch", cluster=cfg.cluster,
                              federation=cfg.federation)
