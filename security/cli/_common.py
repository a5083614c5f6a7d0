"""Helpers shared by nebula-admin commands: secrets from the environment or stdin, tables, JSON output."""
from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from typing import Any, Sequence

from security.errors import SecurityError


def add_passphrase(p: argparse.ArgumentParser, what: str = "the CA key") -> None:
    """Add --passphrase-env VAR."""
    p.add_argument("--passphrase-env", metavar="VAR", help=f"environment variable holding the passphrase of {what}")


def passphrase(args: argparse.Namespace) -> str | None:
    """The passphrase named by --passphrase-env, or None when not given."""
    var = getattr(args, "passphrase_env", None)
    if not var:
        return None
    value = os.environ.get(var)
    if value is None:
        raise SecurityError(f"environment variable {var} is not set; export it or drop --passphrase-env")
    return value


def add_password(p: argparse.ArgumentParser) -> None:
    """Add --password-stdin / --password-env."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    g.add_argument("--password-env", metavar="VAR", help="environment variable holding the password")


def password(args: argparse.Namespace, prompt: str, confirm: bool = False) -> str:
    """The password from stdin, an environment variable, or an interactive prompt (twice when `confirm`)."""
    if args.password_stdin:
        line = sys.stdin.readline()
        if not line:
            raise SecurityError("--password-stdin given but stdin is empty; pipe the password in")
        return line.rstrip("\r\n")
    if args.password_env:
        value = os.environ.get(args.password_env)
        if value is None:
            raise SecurityError(f"environment variable {args.password_env} is not set")
        return value
    first = getpass.getpass(prompt)
    if confirm and getpass.getpass("again: ") != first:
        raise SecurityError("the two passwords differ; try again")
    return first


def add_home(p: argparse.ArgumentParser) -> None:
    """Add --home D (the account store; default $NEBULA_HOME)."""
    p.add_argument("--home", default=os.environ.get("NEBULA_HOME"),
                   help="account home directory (accounts.db, users/, audit.log); default $NEBULA_HOME")


def home(args: argparse.Namespace) -> str:
    """The --home value, or an error saying how to give it."""
    if not args.home:
        raise SecurityError("no account home given; pass --home DIR or set NEBULA_HOME")
    return args.home


def emit(rows: Sequence[dict[str, Any]], columns: Sequence[str], as_json: bool) -> None:
    """Print `rows` as a fixed-width table, or as one JSON list."""
    if as_json:
        print(json.dumps(list(rows), indent=1, default=str))
        return
    cells = [[("-" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
