"""`nebula-admin grant add|revoke|list`: owners let other accounts read their resources; admins let accounts'
workers address clusters and stages (route grants: `--resource cluster:B`, `stage:NAME`, `cluster:*`)."""
from __future__ import annotations

import argparse

from security._time import parse_time
from security.accounts import Accounts
from security.cli._common import add_home, emit, home
from security.errors import AccountError
from security.routes import is_route_resource


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `grant` command."""
    p = sub.add_parser("grant", help="grants: read access to resources, and routes to clusters/stages")
    s = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = s.add_parser("add", help="let --to read --owner's --resource, or let --to's workers address a route")
    add_home(add)
    add.add_argument("--owner", help="owner of a namespace resource (not given for route grants)")
    add.add_argument("--to", required=True, help="account that receives the grant")
    add.add_argument("--resource", required=True,
                     help="path in the owner's namespace, e.g. data/corpus.txt; or a route: cluster:B, stage:NAME, "
                          "cluster:* (once any cluster: grant exists, accounts reach only the clusters granted)")
    add.add_argument("--expires", help="ISO 8601 time or duration from now (30m, 12h, 7d); default never")
    add.set_defaults(handler=add_grant)
    rev = s.add_parser("revoke", help="withdraw a grant")
    add_home(rev)
    rev.add_argument("--id", required=True, help="grant id as `grant list` prints it (rN for a route grant)")
    rev.set_defaults(handler=revoke_grant)
    lst = s.add_parser("list", help="grants with their status")
    add_home(lst)
    lst.add_argument("--owner", help="only grants on this account's resources")
    lst.add_argument("--to", help="only grants held by this account")
    lst.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
    lst.set_defaults(handler=list_grants)


def add_grant(args: argparse.Namespace) -> int:
    """Handler of `grant add`."""
    expires = parse_time(args.expires, direction=1, what="--expires") if args.expires else None
    route = is_route_resource(args.resource)
    if route and args.owner:
        raise AccountError(f"{args.resource} is a route grant, which has no owner; drop --owner")
    if not route and not args.owner:
        raise AccountError(f"--owner is needed for a grant on a namespace resource ({args.resource}); for a route "
                           "grant use --resource cluster:NAME or stage:NAME")
    with Accounts(home(args), create=False) as acc:
        if route:
            g = acc.add_route_grant(args.to, args.resource, expires)
            print(f"grant r{g.id}: {g.account}'s workers may address {g.resource} until {g.expires or 'revoked'}")
        else:
            d = acc.add_grant(args.owner, args.to, args.resource, expires)
            print(f"grant {d.id}: {d.grantee} may read {d.owner}:{d.resource} until {d.expires or 'revoked'}")
    return 0


def revoke_grant(args: argparse.Namespace) -> int:
    """Handler of `grant revoke`."""
    text = args.id.strip()
    route = text.startswith("r")
    try:
        gid = int(text[1:] if route else text)
    except ValueError:
        raise AccountError(f"--id {args.id!r} is not a grant id; use the id `grant list` prints (N or rN)") from None
    with Accounts(home(args), create=False) as acc:
        (acc.revoke_route_grant if route else acc.revoke_grant)(gid)
    print(f"grant {text} revoked")
    return 0


def list_grants(args: argparse.Namespace) -> int:
    """Handler of `grant list`: namespace grants, then route grants (ids rN, no owner)."""
    with Accounts(home(args), create=False) as acc:
        rows = [{"id": g.id, "owner": g.owner, "grantee": g.grantee, "resource": g.resource,
                 "expires": g.expires, "status": g.status} for g in acc.list_grants(args.owner, args.to)]
        if args.owner is None:
            rows += [{"id": f"r{g.id}", "owner": None, "grantee": g.account, "resource": g.resource,
                      "expires": g.expires, "status": g.status} for g in acc.list_route_grants(args.to)]
    emit(rows, ("id", "owner", "grantee", "resource", "expires", "status"), args.json)
    return 0
