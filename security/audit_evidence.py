"""Evidence about an audit log held outside it: the key pinned by its writer's config and by peers, peers' witnesses.

`find_evidence(log)` looks where a provisioned federation keeps things: a `switch.yaml` beside the log whose
`audit.log` is this log gives the signing key (its public half is the pin), the state directory (a boot epoch
there means the switch has run) and the peers; each peer's directory beside it (`<federation>/<peer>/`, as
`nebula-admin provision` lays them out on one host, or as copied from the peer's host) gives the checkpoints
of this log the peer received (`<peer log>.peers/<cluster>.checkpoints` and the `audit.peer_checkpoint`
records of the peer's own log) and the key the peer pinned for this cluster (`state/peer_audit_keys.json`).
Without a switch.yaml, an `audit_signing.key` beside the log (account home, CA directory) gives the pin.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from security.audit import (PEER_CHECKPOINT_ACTION, Checkpoint, checkpoint_of_record, peer_checkpoints_path,
                            public_key_pem, read_checkpoints, read_records, signer_of)
from security.errors import AuditError

__all__ = ["Evidence", "find_evidence"]


@dataclass(frozen=True, slots=True)
class Evidence:
    """What `find_evidence` found: the pinned signer and where from, witnesses, why the writer must have run."""

    signer: str | None = None  # base64 raw Ed25519 public key the log's checkpoints must carry
    pin_source: str | None = None
    conflict: str | None = None  # pins from different places disagree (the key was replaced)
    witnesses: tuple[Checkpoint, ...] = ()
    witness_sources: tuple[str, ...] = ()
    has_run: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


def _load_yaml(path: Path) -> dict[str, Any] | None:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _at(base: Path, value: Any) -> Path | None:
    if not isinstance(value, str) or not value:
        return None
    p = Path(value)
    return (p if p.is_absolute() else base / p).resolve()


def _switch_files(cfg_path: Path) -> tuple[dict[str, Any], Path | None, Path | None, Path] | None:
    """(config, audit log, signing key, state dir) of a switch.yaml, or None if it is not one."""
    cfg = _load_yaml(cfg_path)
    if cfg is None or not isinstance(cfg.get("audit"), dict):
        return None
    base = cfg_path.resolve().parent
    log = _at(base, cfg["audit"].get("log"))
    key = _at(base, cfg["audit"].get("signing_key"))
    state = _at(base, cfg.get("state_dir")) or ((log.parent if log else base) / "state")
    return cfg, log, key, state


def find_evidence(log: str | os.PathLike, peer_dirs: Iterable[str | os.PathLike] = ()) -> Evidence:
    """Pins, witnesses and signs of use for the audit log at `log`, from the files around it (see the module doc).

    `peer_dirs` are further peer cluster directories (each with its switch.yaml, audit log and state, e.g. copied
    from the peer's host) to take witnesses and pins from.
    """
    log = Path(log).resolve()
    cfg_path = log.parent / "switch.yaml"
    found = _switch_files(cfg_path) if cfg_path.exists() else None
    if found is None or found[1] != log:
        return _plain_evidence(log)
    cfg, _, key, state = found
    cluster = str(cfg.get("cluster", ""))
    notes: list[str] = []
    pins: list[tuple[str, str]] = []
    if key is not None and key.exists():
        try:
            pins.append((signer_of(public_key_pem(key)), f"{cfg_path} audit.signing_key {key}"))
        except AuditError as exc:
            notes.append(f"cannot read the signing key named by {cfg_path}: {exc}")
    has_run = None
    epoch_file = state / "epoch"
    if epoch_file.exists():
        has_run = f"switch {cluster} has started ({epoch_file} holds boot epoch {epoch_file.read_text().strip()})"
    witnesses: list[Checkpoint] = []
    sources: list[str] = []
    peers = cfg.get("peers") if isinstance(cfg.get("peers"), list) else []
    names = [p.get("cluster") for p in peers if isinstance(p, dict) and isinstance(p.get("cluster"), str)]
    dirs = [log.parent.parent / name for name in names] + [Path(d).resolve() for d in peer_dirs]
    seen: set[Path] = set()
    for peer_dir in dirs:
        peer_cfg = peer_dir / "switch.yaml"
        pf = _switch_files(peer_cfg) if peer_cfg.exists() and peer_dir not in seen else None
        seen.add(peer_dir)
        if pf is None or pf[1] is None:
            continue
        peer_conf, peer_log, _, peer_state = pf
        name = str(peer_conf.get("cluster", peer_dir.name))
        got = _peer_witnesses(peer_log, cluster, notes)
        if got:
            witnesses += got
            sources.append(f"{len(got)} from peer {name} ({peer_log.parent})")
        pinned = _peer_pin(peer_state / "peer_audit_keys.json", cluster, notes)
        if pinned is not None:
            pins.append((pinned, f"the key peer {name} pinned for cluster {cluster} "
                                 f"({peer_state / 'peer_audit_keys.json'})"))
            has_run = has_run or f"peer {name} has seen checkpoints of it"
    return _settle(pins, witnesses, sources, has_run, notes)


def _plain_evidence(log: Path) -> Evidence:
    """Evidence for a log that no switch.yaml names: its directory's signing key (account home, CA directory)."""
    notes: list[str] = []
    pins = []
    key = log.parent / "audit_signing.key"
    if key.exists():
        try:
            pins.append((signer_of(public_key_pem(key)), str(key)))
        except AuditError as exc:
            notes.append(f"cannot read {key}: {exc}")
    has_run = None
    for marker, what in (("accounts.db", "an account store"), ("ca.pem", "a certificate authority")):
        if (log.parent / marker).exists():
            has_run = f"{log.parent} holds {what} ({marker}), whose every change is audited"
    return _settle(pins, [], [], has_run, notes)


def _settle(pins: list[tuple[str, str]], witnesses: list[Checkpoint], sources: list[str], has_run: str | None,
            notes: list[str]) -> Evidence:
    conflict = None
    if pins and any(s != pins[0][0] for s, _ in pins):
        conflict = "; ".join(f"{src}: {s[:12]}..." for s, src in pins)
        conflict = f"the pinned keys disagree (the signing key was replaced): {conflict}"
    return Evidence(signer=pins[0][0] if pins else None, pin_source=pins[0][1] if pins else None,
                    conflict=conflict, witnesses=tuple(witnesses), witness_sources=tuple(sources),
                    has_run=has_run, notes=tuple(notes))


def _peer_witnesses(peer_log: Path, cluster: str, notes: list[str]) -> list[Checkpoint]:
    """Checkpoints of `cluster`'s log a peer kept: its `.peers` copy and the records in its own log."""
    out: list[Checkpoint] = []
    try:
        out += read_checkpoints(peer_checkpoints_path(peer_log, cluster))
    except AuditError as exc:
        notes.append(f"{peer_checkpoints_path(peer_log, cluster)}: {exc}")
    if peer_log.exists():
        try:
            for rec in read_records(peer_log):
                if rec.get("action") == PEER_CHECKPOINT_ACTION and rec.get("target") == cluster:
                    cp = checkpoint_of_record(rec)
                    if cp is not None and cp not in out:
                        out.append(cp)
        except (AuditError, OSError) as exc:
            notes.append(f"{peer_log}: {exc}")
    return out


def _peer_pin(path: Path, cluster: str, notes: list[str]) -> str | None:
    if not path.exists():
        return None
    try:
        entry = json.loads(path.read_text()).get(cluster)
    except (OSError, ValueError, AttributeError) as exc:
        notes.append(f"{path}: unreadable ({exc})")
        return None
    return entry.get("signer") if isinstance(entry, dict) and isinstance(entry.get("signer"), str) else None
