"""`nebula-admin audit verify|show|keygen`: check and read tamper-evident audit logs."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from security._time import iso, parse_time
from security.audit import (CHECKPOINT_ACTION, filter_records, generate_signing_key, read_checkpoints, read_records,
                            safe_text)
from security.audit_evidence import Evidence, find_evidence
from security.audit_verify import verify_log
from security.cli._common import emit

SHOW_LIMIT = 400  # characters of one cell of `audit show`'s table


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `audit` command."""
    p = sub.add_parser("audit", help="verify and show audit logs")
    s = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    ver = s.add_parser("verify", help="check the hash chain and signed checkpoints; name the first bad record",
                       description="Exit 0 when intact, 1 when tampered or suspicious. By default the key is pinned "
                                   "from the writer's config beside the log (switch.yaml audit.signing_key, or "
                                   "audit_signing.key) and from what peers pinned, and peers' copies of this log's "
                                   "checkpoints found beside it are used as witnesses.")
    ver.add_argument("--log", required=True)
    ver.add_argument("--key", help="public (or signing) key PEM the checkpoints must be signed with "
                                   "(default: pinned from the config beside the log)")
    ver.add_argument("--witness", action="append", default=[],
                     help="checkpoints file held elsewhere (e.g. a peer's copy); repeatable")
    ver.add_argument("--peer-dir", action="append", default=[],
                     help="a peer cluster's directory (its switch.yaml, audit log, state), e.g. copied from the "
                          "peer's host: its copies of this log's checkpoints and its pinned key are used; repeatable")
    ver.add_argument("--no-discover", action="store_true",
                     help="use only --key and --witness, not the config and peers' copies found beside the log")
    ver.set_defaults(handler=verify)
    show = s.add_parser("show", help="records filtered by user, action, time")
    show.add_argument("--log", required=True)
    show.add_argument("--user", help="records whose actor or target is this user")
    show.add_argument("--action", help="action, or prefix such as `cert` (the log's own signed checkpoints show "
                                       "only with --action audit)")
    show.add_argument("--since", help="ISO 8601 time or duration ago (30m, 12h, 7d)")
    show.add_argument("--until", help="ISO 8601 time or duration ago")
    show.add_argument("--outcome", help="ok, denied, failed, ...")
    show.add_argument("--json", action="store_true", help="one JSON object per line")
    show.set_defaults(handler=show_records)
    key = s.add_parser("keygen", help="create an Ed25519 checkpoint signing key")
    key.add_argument("--out", required=True)
    key.set_defaults(handler=keygen)


def verify(args: argparse.Namespace) -> int:
    """Handler of `audit verify`: exit 0 when intact, 1 when tampered or suspicious."""
    pem = Path(args.key).read_bytes() if args.key else None
    witnesses = [cp for w in args.witness for cp in read_checkpoints(w)]
    ev = Evidence() if args.no_discover or not Path(args.log).exists() else find_evidence(args.log, args.peer_dir)
    report = verify_log(args.log, pem, witnesses + list(ev.witnesses), signer=None if pem else ev.signer,
                        pin_source=f"--key {args.key}" if pem else ev.pin_source, has_run=ev.has_run)
    used = ([f"key pinned from {args.key if pem else ev.pin_source}"] if pem or ev.signer else
            ["no pinned key (pass --key)"]) + [f"witness checkpoints: {s}" for s in ev.witness_sources]
    for note in ev.notes:
        print(f"note: {note}")
    if report.ok and ev.conflict:
        print(f"SUSPICIOUS {args.log}: {ev.conflict}")
        return 1
    if report.ok:
        print(f"OK {args.log}: {report.reason}; {'; '.join(used)}")
        return 0
    first = f"first bad record {report.first_bad}: " if report.first_bad is not None else ""
    print(f"{report.kind.upper()} {args.log}: {first}{report.reason}; {'; '.join(used)}")
    return 1


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
