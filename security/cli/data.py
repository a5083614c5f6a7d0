"""`nebula-admin data read|write`: reach an account's resources through the audited access interface."""
from __future__ import annotations

import argparse
import shutil
import sys

from security.accounts import Accounts
from security.cli._common import add_home, home


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `data` command."""
    p = sub.add_parser("data", help="read or write resources through the grant-checked, audited interface")
    s = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, handler in (("read", read), ("write", write)):
        q = s.add_parser(name, help=f"{name} OWNER's RESOURCE as account --as (stdout/stdin)")
        add_home(q)
        q.add_argument("--as", dest="as_user", required=True, help="acting account")
        q.add_argument("--owner", required=True, help="account whose namespace holds the resource")
        q.add_argument("--resource", required=True, help="path in the owner's namespace, e.g. data/corpus.txt")
        q.set_defaults(handler=handler)


def read(args: argparse.Namespace) -> int:
    """Handler of `data read`: copy the resource to stdout."""
    with Accounts(home(args), create=False) as acc, acc.open_resource(args.as_user, args.owner, args.resource) as f:
        shutil.copyfileobj(f, sys.stdout.buffer)
    sys.stdout.flush()
    return 0


def write(args: argparse.Namespace) -> int:
    """Handler of `data write`: store stdin as the resource (owners only)."""
    with Accounts(home(args), create=False) as acc, \
            acc.open_resource(args.as_user, args.owner, args.resource, "wb") as f:
        shutil.copyfileobj(sys.stdin.buffer, f)
    return 0
