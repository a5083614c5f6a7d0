"""Evidence about an audit log held outside it: keys pinned for it, peers' copies of its checkpoints (witnesses), and
why its writer must have written something.

Discovery is monotone: every source adds evidence and none can remove any, so deleting or editing a file beside
the log (its `switch.yaml`, `peers: []`) hides nothing, and planting one can only add a conflict. Where it looks:
- the log's names, under which others keep its checkpoints: the `cluster` of a `switch.yaml` beside it that names
  it, its directory's name (`<federation>/<cluster>/` as `nebula-admin provision` lays them out, `combiner-<cluster>`
  in a federated job's directory), and the writer its own records name (`switch:A`, `acct@A/0:combiner`);
- peer directories: each one passed (a peer cluster's directory or a federated controller's workdir, e.g. copied
  from its host, or a directory of several), and unless `discover=False` the directories beside the log's own that
  hold a `switch.yaml`, are a federated job's `controller`/`combiner-*` workdir or are named as its peers, whatever
  the log's config says. In each: its log (`switch.yaml`'s `audit.log`, else `audit.log`), the checkpoints
  of this log it kept (`<its log>.peers/<name>.checkpoints` and its `audit.peer_checkpoint` records for `<name>`)
  and the key it pinned for `<name>` (`state/peer_audit_keys.json`);
- beside the log (unless `discover=False`): the signing key its config names (or `audit_signing.key`), and what says
  its writer has run (`state/epoch`, `accounts.db`, `ca.key`) or has peers (a switch's or federated actor's files).
What lies beside the log, or in directories on the same host, is only as trustworthy as that host: evidence an
attacker of the host cannot touch comes from `--peer-dir` copies taken from the peers' hosts, or `--key`.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator


from security._yaml import YamlError, read_yaml
from security.audit import (PEER_CHECKPOINT_ACTION, Checkpoint, checkpoint_of_record, peer_checkpoints_path,
                            public_key_pem, read_checkpoints, signer_of, verify_checkpoint)
from security.errors import AuditError

__all__ = ["Pin", "Evidence", "find_evidence", "cluster_dirs", "PINNED_KEYS_FILE"]

PINNED_KEYS_FILE = "peer_audit_keys.json"  # in a switch's state directory: the audit key it pinned per peer
MAX_DIRS = 256  # peer directories looked at (a hostile tree cannot make discovery unbounded)
MAX_NAMES = 32  # names and peers taken from a log's records
_HEAD_RECORDS = 64  # records read for the writer's identity
_ACTOR = re.compile(r"[^@\s]{1,63}@([A-Za-z0-9][A-Za-z0-9._-]{0,62})/\d{1,9}:(combiner|controller)")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_SWITCH_FILES = ("switch.pem", "switch_curve.key_secret", "worker.yaml")


@dataclass(frozen=True, slots=True)
class Pin:
    """A key the log's checkpoints must be signed with, and where that is said."""

    signer: str  # base64 raw Ed25519 public key, as checkpoints carry it
    source: str
    outside: bool  # said outside the log's own directory (a peer, or the admin): not replaceable with the log


@dataclass(frozen=True, slots=True)
class Evidence:
    """What `find_evidence` found, plus what the admin gave (`with_given`)."""

    names: tuple[str, ...] = ()
    pins: tuple[Pin, ...] = ()
    witnesses: tuple[Checkpoint, ...] = ()
    witness_sources: tuple[str, ...] = ()
    has_run: str | None = None  # why the log cannot rightly be empty
    federated: str | None = None  # why its writer has peers, so that its own directory cannot vouch for its key
    peers: tuple[str, ...] = ()  # peers its config or records name (for the fix)
    peer_dirs: tuple[str, ...] = ()  # directories searched for peers' evidence
    notes: tuple[str, ...] = field(default_factory=tuple)

    def with_given(self, pins: Iterable[Pin] = (), witnesses: Iterable[Checkpoint] = (),
                   sources: Iterable[str] = ()) -> "Evidence":
        """This evidence with the admin's own (`--key`, `--witness`) put first."""
        return replace(self, pins=(*pins, *self.pins), witnesses=(*witnesses, *self.witnesses),
                       witness_sources=(*sources, *self.witness_sources))


class _Found:
    """Mutable collector behind `find_evidence`."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.pins: list[Pin] = []
        self.witnesses: list[Checkpoint] = []
        self.sources: list[str] = []
        self.has_run: str | None = None
        self.federated: str | None = None
        self.peers: list[str] = []
        self.dirs: list[str] = []
        self.notes: list[str] = []

    def name(self, value: Any, into: list[str] | None = None) -> None:
        into = self.names if into is None else into
        if isinstance(value, str) and _NAME.fullmatch(value) and value not in into and len(into) < MAX_NAMES:
            into.append(value)

    def why_federated(self, why: str) -> None:
        self.federated = self.federated or why

    def evidence(self) -> Evidence:
        return Evidence(tuple(self.names), tuple(self.pins), tuple(self.witnesses), tuple(self.sources),
                        self.has_run, self.federated, tuple(self.peers), tuple(self.dirs), tuple(self.notes))


def _load_yaml(path: Path) -> dict[str, Any] | None:
    """A mapping read from `path` with the one hardened reader; None for anything unreadable (evidence, not input)."""
    try:
        data = read_yaml(path)
    except YamlError:
        return None
    return data if isinstance(data, dict) else None


def _at(base: Path, value: Any) -> Path | None:
    if not isinstance(value, str) or not value:
        return None
    p = Path(value)
    return (p if p.is_absolute() else base / p).resolve()


def _switch_files(directory: Path) -> tuple[dict[str, Any], Path | None, Path | None, Path] | None:
    """(config, audit log, signing key, state dir) of the switch.yaml in `directory`, or None if there is none."""
    cfg = _load_yaml(directory / "switch.yaml") if (directory / "switch.yaml").is_file() else None
    if cfg is None or not isinstance(cfg.get("audit"), dict):
        return None
    base = directory.resolve()
    log = _at(base, cfg["audit"].get("log"))
    state = _at(base, cfg.get("state_dir")) or ((log.parent if log else base) / "state")
    return cfg, log, _at(base, cfg["audit"].get("signing_key")), state


def cluster_dirs(path: str | os.PathLike) -> list[Path]:
    """`path` if it holds an audit log or a switch.yaml, else those of its sub-directories that do (a directory of
    several peers' copies); empty if neither."""
    path = Path(path).resolve()
    if _is_cluster_dir(path):
        return [path]
    return [d for d in _subdirs(path) if _is_cluster_dir(d)]


def _is_cluster_dir(d: Path) -> bool:
    return (d / "switch.yaml").is_file() or (d / "audit.log").is_file()


def _subdirs(path: Path) -> list[Path]:
    try:
        entries = sorted(e for e in path.iterdir() if not e.name.startswith("."))
    except OSError:
        return []
    return [e.resolve() for e in entries[:MAX_DIRS] if e.is_dir()]


def _lines(path: Path, needle: bytes) -> Iterator[dict]:
    """The records of the log at `path` whose line contains `needle` (others are not parsed); bad lines skipped."""
    try:
        with open(path, "rb") as f:
            for line in f:
                if needle in line:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(rec, dict):
                        yield rec
    except OSError:
        return


def _records_identity(log: Path, found: _Found) -> None:
    """Names, peers and role of the writer, as the log's own records tell them (what a rewrite keeps or drops)."""
    try:
        with open(log, "rb") as f:
            head = [f.readline() for _ in range(_HEAD_RECORDS)]
    except OSError:
        return
    for line in head:
        try:
            actor = json.loads(line).get("actor") if line.strip() else None
        except (ValueError, AttributeError):
            continue
        if not isinstance(actor, str):
            continue
        if actor.startswith("switch:"):
            found.name(actor[len("switch:"):])
            found.why_federated(f"its records are switch {actor[len('switch:'):][:63]}'s")
        elif (m := _ACTOR.fullmatch(actor)) is not None:
            found.name(f"combiner-{m[1]}" if m[2] == "combiner" else "controller")
            found.why_federated(f"its records are federated {m[2]} {actor}'s")
    for rec in _lines(log, b'"switch_started"'):
        detail = rec.get("detail") if rec.get("action") == "switch_started" else None
        peers = detail.get("peers") if isinstance(detail, dict) else None
        for peer in peers if isinstance(peers, list) else []:
            found.name(peer, found.peers)
    for rec in _lines(log, PEER_CHECKPOINT_ACTION.encode()):
        if rec.get("action") == PEER_CHECKPOINT_ACTION:
            found.name(rec.get("target"), found.peers)
    if found.peers:
        found.why_federated(f"its records name peers {', '.join(found.peers)}")


def _beside(log: Path, found: _Found) -> None:
    """The writer's files beside the log: config, key (a pin only as good as this directory), signs of use."""
    d = log.parent
    sw = _switch_files(d)
    key = None
    if sw is not None and sw[1] == log:
        cfg, _, key, state = sw
        cluster = cfg.get("cluster")
        found.name(cluster)
        found.why_federated(f"{d / 'switch.yaml'} names it as switch {str(cluster)[:63]}'s log")
        peers = cfg.get("peers")
        for p in peers if isinstance(peers, list) else []:
            found.name(p.get("cluster") if isinstance(p, dict) else None, found.peers)
        source = f"{d / 'switch.yaml'} audit.signing_key {key}"
        epoch = state / "epoch"
        if epoch.is_file():
            found.has_run = f"switch {str(cluster)[:63]} has started ({epoch} holds boot epoch " \
                            f"{epoch.read_text(errors='replace').strip()[:20]})"
    elif (d / "switch.yaml").exists():
        found.notes.append(f"{d / 'switch.yaml'} does not name this log (or is no switch config); ignored")
    if key is None:
        key, source = d / "audit_signing.key", str(d / "audit_signing.key")
    if key.is_file():
        try:
            found.pins.append(Pin(signer_of(public_key_pem(key)), source, outside=False))
        except AuditError as exc:
            found.notes.append(f"cannot read the signing key {key}: {exc}")
    for marker in _SWITCH_FILES:
        if (d / marker).exists():
            found.why_federated(f"{d} holds a switch's files ({marker})")
    if (d / "state" / "epoch").is_file():
        found.why_federated(f"{d} holds a switch's state (state/epoch)")
        found.has_run = found.has_run or f"{d / 'state' / 'epoch'} says its switch has started"
    if d.name.startswith("combiner-"):
        found.why_federated(f"it is in a federated combiner's directory ({d.name})")
    # (a CA's directory holds its key; a site's kit holds only the CA's certificate, ca.pem)
    for marker, what in (("accounts.db", "an account store"), ("ca.key", "a certificate authority")):
        if (d / marker).exists():
            found.has_run = found.has_run or f"{d} holds {what} ({marker}), whose every change is audited"


def find_evidence(log: str | os.PathLike, peer_dirs: Iterable[str | os.PathLike] = (), *,
                  discover: bool = True) -> Evidence:
    """Pins, witnesses and signs of use for the audit log at `log` (see the module doc). `peer_dirs` are always
    searched; with `discover` also the log's own directory and every directory beside it."""
    log = Path(log).resolve()
    found = _Found()
    if discover:
        _beside(log, found)
        found.name(log.parent.name)
    _records_identity(log, found)
    dirs: list[Path] = []
    for given in peer_dirs:
        dirs += cluster_dirs(given)
    if discover:  # the directories next to the log's own that a federation lays out, whatever its config says
        parent = log.parent.parent
        dirs += [parent / p for p in found.peers if _is_cluster_dir(parent / p)]
        dirs += [d for d in _subdirs(parent) if (d / "switch.yaml").is_file() or (
            (d / "audit.log").is_file() and (d.name == "controller" or d.name.startswith("combiner-")))]
    seen = {log.parent}
    for d in dirs:
        if d not in seen and len(seen) <= MAX_DIRS:
            seen.add(d)
            _from_peer(d, log, found)
    return found.evidence()


def _from_peer(d: Path, log: Path, found: _Found) -> None:
    """What the peer in directory `d` kept about this log under any of its names."""
    sw = _switch_files(d)
    peer_log = sw[1] if sw is not None and sw[1] is not None else d / "audit.log"
    state = sw[3] if sw is not None else d / "state"
    peer = str(sw[0].get("cluster", d.name)) if sw is not None else d.name
    if peer_log == log:
        return
    found.dirs.append(str(d))
    names = set(found.names)
    pinned = _peer_pins(state / PINNED_KEYS_FILE, found)
    for name in found.names:
        if name in pinned:
            found.pins.append(Pin(pinned[name], f"the key peer {peer[:63]} pinned for {name} "
                                                f"({state / PINNED_KEYS_FILE})", outside=True))
            found.has_run = found.has_run or f"peer {peer[:63]} has seen checkpoints of it"
    got: list[Checkpoint] = []
    for name in found.names:
        try:
            got += read_checkpoints(peer_checkpoints_path(peer_log, name))
        except AuditError as exc:
            found.notes.append(f"{peer_checkpoints_path(peer_log, name)}: {exc}")
    for rec in _lines(peer_log, PEER_CHECKPOINT_ACTION.encode()):
        if rec.get("action") == PEER_CHECKPOINT_ACTION and rec.get("target") in names:
            try:
                cp = checkpoint_of_record(rec)
            except AuditError as exc:
                found.notes.append(f"{peer_log} record {rec.get('seq')}: {exc}")
                continue
            if cp is not None and cp not in got:
                got.append(cp)
    if got:
        found.witnesses += got
        found.sources.append(f"{len(got)} from peer {peer[:63]} ({d})")
        signers = []
        for cp in got:
            try:
                verify_checkpoint(cp)
            except AuditError:
                continue  # verify_log names it; an unsigned claim pins nothing
            if cp.signer not in signers:
                signers.append(cp.signer)
        found.pins += [Pin(s, f"the signer of the checkpoints peer {peer[:63]} kept ({d})", outside=True)
                       for s in signers]


def _peer_pins(path: Path, found: _Found) -> dict[str, str]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        found.notes.append(f"{path}: unreadable ({exc})")
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v["signer"] for k, v in data.items()
            if isinstance(v, dict) and isinstance(v.get("signer"), str)}
