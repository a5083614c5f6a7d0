"""`nebula-admin grant add|revoke|list`: owners let other accounts read their resources."""
from __future__ import annotations

import argparse
import dataclasses

from security._time import parse_time
from security.accounts import Accounts
from security.cli._common import add_home, emit, home


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `grant` command."""
    p = sub.add_parser("grant", help="read grants on resources: add, revoke, list")
    s = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = s.add_parser("add", help="let --to read --owner's --resource")
    add_home(add)
    add.add_argument("--owner", required=True)
    add.add_argument("--to", required=True)
    add.add_argument("--resource", required=True, help="path in the owner's namespace, e.g. data/corpus.txt")
    add.add_argument("--expires", help="ISO 8601 time or duration from now (30m, 12h, 7d); default never")
    add.set_defaults(handler=add_grant)
    rev = s.add_parser("revoke", help="withdraw a grant")
    add_home(rev)
    rev.add_argument("--id", type=int, required=True, help="grant id, as `grant list` prints it")
    rev.set_defaults(handler=revoke_grant)
    lst = s.add_parser("list", help="grants with their status")
    add_home(lst)
    lst.add_argument("--owner")
    lst.add_argument("--to")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(handler=list_grants)


def add_grant(args: argparse.Namespace) -> int:
    """Handler of `grant add`."""
    expires = parse_time(args.expires, direction=1, what="--expires") if args.expires else None
    with Accounts(home(args), create=False) as acc:
        g = acc.add_grant(args.owner, args.to, args.resource, expires)
    print(f"grant {g.id}: {g.grantee} may read {g.owner}:{g.resource} until {g.expires or 'revoked'}")
    return 0


def revoke_grant(args: argparse.Namespace) -> int:
    """Handler of `grant revoke`."""
    with Accounts(home(args), create=False) as acc:
        acc.revoke_grant(args.id)
    print(f"grant {args.id} revoked")
    return 0


def list_grants(args: argparse.Namespace) -> int:
    """Handler of `grant list`."""
    with Accounts(home(args), create=False) as acc:
        rows = [dict(dataclasses.asdict(g), status=g.status) for g in acc.list_grants(args.owner, args.to)]
    emit(rows, ("id", "owner", "grantee", "resource", "expires", "status"), args.json)
    return 0
