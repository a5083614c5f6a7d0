"""`nebula-admin audit verify|show|keygen`: check and read tamper-evident audit logs."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from security._time import iso, parse_time
from security.audit import (CHECKPOINT_ACTION, Checkpoint, filter_records, generate_signing_key, read_checkpoints,
                            read_records, safe_text, signer_of)
from security.audit_evidence import Pin, cluster_dirs, find_evidence
from security.audit_verdict import EXIT_HELP, USAGE_EXIT, judge
from security.cli._common import emit
from security.errors import AuditError

SHOW_LIMIT = 400  # characters of one cell of `audit show`'s table
LINE_LIMIT = 4000  # characters of one line of `audit verify`


VERIFY_HELP = """\
Prints one line: the verdict, the log, the reason, the evidence used and the fix. Exit codes:
""" + EXIT_HELP + """\n\
Evidence is searched for, whatever the files beside the log say (a deleted switch.yaml or `peers: []` hides
nothing): the key named by the switch.yaml beside the log (or audit_signing.key), the directories next to the
log's own (a provisioned federation's other clusters, a federated job's controller), each --peer-dir, and the
log's own records (which writer, which peers). Directories on the log's own host are only as trustworthy as that
host: take --peer-dir copies from the peers' hosts, or pass --key, for evidence its attacker cannot touch.
"""


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `audit` command."""
    p = sub.add_parser("audit", help="verify and show audit logs")
    s = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    ver = s.add_parser("verify", help="check the hash chain and signed checkpoints; name the first bad record",
                       formatter_class=argparse.RawDescriptionHelpFormatter, description=VERIFY_HELP)
    ver.add_argument("--log", required=True, help="the audit log file to verify (e.g. STATE_DIR/audit.log)")
    ver.add_argument("--key", help="public (or signing) key PEM the checkpoints must be signed with, kept apart "
                                   "from the log's host (counts as evidence from outside the log)")
    ver.add_argument("--witness", action="append", default=[],
                     help="checkpoints file held elsewhere (e.g. a peer's copy); repeatable")
    ver.add_argument("--peer-dir", action="append", default=[],
                     help="a peer's directory (a cluster's: switch.yaml, audit log, state; or a federated "
                          "controller's workdir), e.g. copied from the peer's host, or a directory of several: its "
                          "copies of this log's checkpoints and its pinned key are used; always searched; repeatable")
    ver.add_argument("--no-discover", action="store_true",
                     help="use only --key, --witness and --peer-dir, not the files beside the log or the "
                          "directories next to its own")
    ver.set_defaults(handler=verify)
    show = s.add_parser("show", help="records filtered by user, action, time")
    show.add_argument("--log", required=True, help="the audit log file to read")
    show.add_argument("--user", help="records whose actor or target is this user")
    show.add_argument("--action", help="action, or prefix such as `cert` (the log's own signed checkpoints show "
                                       "only with --action audit)")
    show.add_argument("--since", help="ISO 8601 time or duration ago (30m, 12h, 7d)")
    show.add_argument("--until", help="ISO 8601 time or duration ago")
    show.add_argument("--outcome", help="ok, denied, failed, ...")
    show.add_argument("--json", action="store_true", help="one JSON object per line")
    show.set_defaults(handler=show_records)
    key = s.add_parser("keygen", help="create an Ed25519 checkpoint signing key")
    key.add_argument("--out", required=True, help="file to write the private key PEM to (0600, never overwritten); "
                                                  "the public key is printed")
    key.set_defaults(handler=keygen)


def verify(args: argparse.Namespace) -> int:
    """Handler of `audit verify`: one line with the verdict; exit code by verdict (VERIFY_HELP)."""
    try:
        pins, witnesses, sources = _given(args)
    except _Usage as exc:
        print(safe_text(f"nebula-admin audit verify: error: {exc}", LINE_LIMIT), file=sys.stderr)
        return USAGE_EXIT
    ev = find_evidence(args.log, args.peer_dir, discover=not args.no_discover).with_given(pins, witnesses, sources)
    for note in ev.notes:
        print(safe_text(f"note: {note}", LINE_LIMIT), file=sys.stderr)
    try:
        verdict = judge(args.log, ev)
    except (AuditError, OSError) as exc:  # e.g. the log vanished meanwhile: nothing was judged
        print(safe_text(f"nebula-admin audit verify: error: {exc}", LINE_LIMIT), file=sys.stderr)
        return USAGE_EXIT
    print(safe_text(verdict.line(args.log), LINE_LIMIT))
    return verdict.code


_PEER_DIR_FIX = "pass a peer cluster's directory (or a federated controller's workdir) copied from its host"


class _Usage(Exception):
    """The command line cannot run as given (exit 2)."""


def _given(args: argparse.Namespace) -> tuple[list[Pin], list[Checkpoint], list[str]]:
    """The admin's own evidence (--key, --witness) after checking every path given; _Usage naming the fix."""
    log = Path(args.log)
    if not log.is_file():
        raise _Usage(f"audit log {log} {'is not a file' if log.exists() else 'does not exist'}; pass --log with the "
                     f"path of an audit log (e.g. a cluster's audit.log beside its switch.yaml)")
    try:
        open(log, "rb").close()
    except OSError as exc:
        raise _Usage(f"audit log {log} cannot be read ({exc.strerror}); run as its owner or fix its permissions")
    pins = []
    if args.key:
        try:
            pins.append(Pin(signer_of(Path(args.key).read_bytes()), f"--key {args.key}", outside=True))
        except (OSError, AuditError) as exc:
            raise _Usage(f"--key {args.key}: {getattr(exc, 'strerror', None) or exc}; pass the writer's public key "
                         "PEM (as `nebula-admin audit keygen` prints it) or its signing key") from None
    witnesses, sources = [], []
    for w in args.witness:
        if not Path(w).is_file():
            raise _Usage(f"--witness {w} does not exist; pass a checkpoints file (a peer's <log>.peers/<name>"
                         ".checkpoints, or a copy of <log>.checkpoints kept elsewhere)")
        try:
            got = read_checkpoints(w)
        except (OSError, AuditError) as exc:
            raise _Usage(f"--witness {w}: {exc}; pass a checkpoints file as the audit log writes them") from None
        witnesses += got
        sources.append(f"{len(got)} from --witness {w}")
        pins += [Pin(s, f"the signer of --witness {w}", outside=True) for s in dict.fromkeys(c.signer for c in got)]
    for d in args.peer_dir:
        if not Path(d).is_dir():
            raise _Usage(f"--peer-dir {d} {'is not a directory' if Path(d).exists() else 'does not exist'}; "
                         f"{_PEER_DIR_FIX}")
        if not cluster_dirs(d):
            raise _Usage(f"--peer-dir {d} holds no audit.log or switch.yaml (nor do its sub-directories); "
                         f"{_PEER_DIR_FIX}")
    return pins, witnesses, sources


def show_records(args: argparse.Namespace) -> int:
    """Handler of `audit show`."""
    since = parse_time(args.since, direction=-1, what="--since").timestamp() if args.since else None
    until = parse_time(args.until, direction=-1, what="--until").timestamp() if args.until else None
    recs = filter_records(read_records(args.log), user=args.user, action=args.action, since=since, until=until,
                          outcome=args.outcome)
    if not (args.action or "").startswith("audit"):
        recs = (r for r in recs if r.get("action") != CHECKPOINT_ACTION)
    if args.json:
        for r in recs:
            print(json.dumps(r, sort_keys=True))
        return 0
    # every cell may hold text a peer, worker or client chose: shown escaped and bounded, so no record can print
    # as several lines or move the cursor (--json escapes it the JSON way)
    rows = [{k: None if v is None else safe_text(v, SHOW_LIMIT) for k, v in dict(
        r, time=iso(r["time"]), detail=json.dumps(r["detail"], sort_keys=True) if r["detail"] else None).items()}
        for r in recs]
    emit(rows, ("seq", "time", "actor", "action", "target", "outcome", "detail"), False)
    return 0


def keygen(args: argparse.Namespace) -> int:
    """Handler of `audit keygen`: writes the key (0600) and prints its public key."""
    if Path(args.out).exists():
        raise FileExistsError(f"{args.out} exists; pick another --out (an existing key is never overwritten)")
    print(generate_signing_key(args.out).decode(), end="")
    return 0
