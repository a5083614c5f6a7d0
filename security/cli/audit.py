"""`nebula-admin audit verify|show|keygen`: check and read tamper-evident audit logs."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from security._time import iso, parse_time
from security.audit import filter_records, generate_signing_key, read_checkpoints, read_records, verify_log
from security.cli._common import emit


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `audit` command."""
    p = sub.add_parser("audit", help="verify and show audit logs")
    s = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    ver = s.add_parser("verify", help="check the hash chain and signed checkpoints; name the first bad record")
    ver.add_argument("--log", required=True)
    ver.add_argument("--key", help="public (or signing) key PEM the checkpoints must be signed with")
    ver.add_argument("--witness", action="append", default=[],
                     help="checkpoints file held elsewhere (e.g. a peer's copy); repeatable")
    ver.set_defaults(handler=verify)
    show = s.add_parser("show", help="records filtered by user, action, time")
    show.add_argument("--log", required=True)
    show.add_argument("--user", help="records whose actor or target is this user")
    show.add_argument("--action", help="action, or prefix such as `cert`")
    show.add_argument("--since", help="ISO 8601 time or duration ago (30m, 12h, 7d)")
    show.add_argument("--until", help="ISO 8601 time or duration ago")
    show.add_argument("--outcome", help="ok, denied, failed, ...")
    show.add_argument("--json", action="store_true", help="one JSON object per line")
    show.set_defaults(handler=show_records)
    key = s.add_parser("keygen", help="create an Ed25519 checkpoint signing key")
    key.add_argument("--out", required=True)
    key.set_defaults(handler=keygen)


def verify(args: argparse.Namespace) -> int:
    """Handler of `audit verify`: exit 0 when intact, 1 when tampered."""
    pem = Path(args.key).read_bytes() if args.key else None
    witnesses = [cp for w in args.witness for cp in read_checkpoints(w)]
    report = verify_log(args.log, pem, witnesses)
    if report.ok:
        print(f"OK {args.log}: {report.reason}")
        return 0
    print(f"TAMPERED {args.log}: first bad record {report.first_bad}: {report.reason}")
    return 1


def show_records(args: argparse.Namespace) -> int:
    """Handler of `audit show`."""
    since = parse_time(args.since, direction=-1, what="--since").timestamp() if args.since else None
    until = parse_time(args.until, direction=-1, what="--until").timestamp() if args.until else None
    recs = filter_records(read_records(args.log), user=args.user, action=args.action, since=since, until=until,
                          outcome=args.outcome)
    if args.json:
        for r in recs:
            print(json.dumps(r, sort_keys=True))
        return 0
    rows = [dict(r, time=iso(r["time"]), detail=json.dumps(r["detail"], sort_keys=True) if r["detail"] else None)
            for r in recs]
    emit(rows, ("seq", "time", "actor", "action", "target", "outcome", "detail"), False)
    return 0


def keygen(args: argparse.Namespace) -> int:
    """Handler of `audit keygen`: writes the key (0600) and prints its public key."""
    if Path(args.out).exists():
        raise FileExistsError(f"{args.out} exists; pick another --out (an existing key is never overwritten)")
    print(generate_signing_key(args.out).decode(), end="")
    return 0
