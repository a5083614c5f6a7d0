"""`nebula-admin user add|passwd|lock|unlock|list|login`: accounts."""
from __future__ import annotations

import argparse
import dataclasses

from security.accounts import ACCOUNT_ROLES, SCRYPT_N, Accounts
from security.cli._common import add_home, add_password, emit, home, password


def _scrypt_n(text: str) -> int:
    n = int(text)
    if n < 1024 or n & (n - 1):
        raise argparse.ArgumentTypeError(f"--scrypt-n {n} must be a power of two >= 1024")
    return n


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `user` command."""
    p = sub.add_parser("user", help="accounts: add, passwd, lock, unlock, list, login")
    s = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, helptext, handler in (("add", "create an account and its namespace", add_user),
                                    ("passwd", "set a new password", set_password),
                                    ("lock", "lock an account", set_lock),
                                    ("unlock", "unlock an account and reset its failures", set_lock),
                                    ("login", "check a password (failures count towards lockout)", login)):
        q = s.add_parser(name, help=helptext)
        q.add_argument("name", help="account name")
        add_home(q)
        if name in ("add", "passwd", "login"):
            add_password(q)
        if name in ("add", "passwd"):
            q.add_argument("--scrypt-n", type=_scrypt_n, default=SCRYPT_N,
                           help=f"scrypt cost parameter N (default {SCRYPT_N})")
        if name == "add":
            q.add_argument("--role", default="user", choices=ACCOUNT_ROLES,
                           help="role recorded with the account (default user)")
        q.set_defaults(handler=handler)
    lst = s.add_parser("list", help="name, role, locked, failed attempts")
    add_home(lst)
    lst.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
    lst.set_defaults(handler=list_users)


def add_user(args: argparse.Namespace) -> int:
    """Handler of `user add`."""
    with Accounts(home(args), scrypt_n=args.scrypt_n) as acc:
        a = acc.add_user(args.name, password(args, f"password for {args.name}: ", confirm=True), args.role)
        print(f"added {a.role} {a.name}; namespace {acc.namespace(a.name)}")
    return 0


def set_password(args: argparse.Namespace) -> int:
    """Handler of `user passwd`."""
    with Accounts(home(args), scrypt_n=args.scrypt_n, create=False) as acc:
        acc.user(args.name)
        acc.set_password(args.name, password(args, f"new password for {args.name}: ", confirm=True))
    print(f"password of {args.name} changed")
    return 0


def set_lock(args: argparse.Namespace) -> int:
    """Handler of `user lock` and `user unlock`."""
    with Accounts(home(args), create=False) as acc:
        (acc.lock if args.action == "lock" else acc.unlock)(args.name)
    print(f"{args.action}ed {args.name}")
    return 0


def login(args: argparse.Namespace) -> int:
    """Handler of `user login`."""
    with Accounts(home(args), create=False) as acc:
        a = acc.authenticate(args.name, password(args, f"password for {args.name}: "))
    print(f"ok: {a.name} ({a.role})")
    return 0


def list_users(args: argparse.Namespace) -> int:
    """Handler of `user list`."""
    with Accounts(home(args), create=False) as acc:
        rows = [dataclasses.asdict(a) for a in acc.list_users()]
    emit(rows, ("name", "role", "locked", "failed_attempts", "created"), args.json)
    return 0
