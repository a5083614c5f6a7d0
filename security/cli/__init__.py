"""`nebula-admin`: CA, certificates, CRL, provisioning, accounts, grants, resource access, audit and federation
commands."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from security.cli import audit, ca, cert, crl, data, federation, grant, provision, user
from security.errors import SecurityError

__all__ = ["main", "build_parser"]

_COMMANDS = (ca, cert, crl, provision, user, grant, data, audit, federation)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, one sub-command per module."""
    parser = argparse.ArgumentParser(prog="nebula-admin", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    parser.add_argument("--actor", help="name recorded as the actor in audit records (default: $NEBULA_ACTOR "
                                        "or the OS user)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _COMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run nebula-admin with `argv`; return the exit code (0 ok, 1 failed, 2 usage)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    previous = os.environ.get("NEBULA_ACTOR")
    if args.actor:
        os.environ["NEBULA_ACTOR"] = args.actor  # read by every library call that writes an audit record
    try:
        code = args.handler(args)
    except (SecurityError, ValueError, OSError) as exc:
        print(f"nebula-admin {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        # main() is also called in-process (tests, embedding tools): the actor of one call must not stick.
        if args.actor:
            if previous is None:
                os.environ.pop("NEBULA_ACTOR", None)
            else:
                os.environ["NEBULA_ACTOR"] = previous
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
