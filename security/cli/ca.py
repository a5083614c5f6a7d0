"""`nebula-admin ca init`: create a federation's certificate authority."""
from __future__ import annotations

import argparse

from security.ca import CertificateAuthority
from security.cli._common import add_passphrase, passphrase


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `ca` command."""
    p = sub.add_parser("ca", help="certificate authority")
    s = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = s.add_parser("init", help="create a CA (ECDSA P-256 root, key 0600)")
    init.add_argument("--dir", required=True, help="directory to create the CA in")
    init.add_argument("--federation", default="nebula", help="federation name (default: nebula)")
    init.add_argument("--days", type=int, default=3650, help="root certificate lifetime (default 3650)")
    add_passphrase(init, "the new CA key (encrypts it)")
    init.set_defaults(handler=init_ca)


def init_ca(args: argparse.Namespace) -> int:
    """Handler of `ca init`."""
    ca = CertificateAuthority.init(args.dir, args.federation, passphrase(args), days=args.days)
    print(f"created CA for federation {ca.federation} in {ca.dir} (serial {ca.cert.serial_number:x})")
    return 0
