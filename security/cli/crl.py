"""`nebula-admin crl`: write the CA's certificate revocation list."""
from __future__ import annotations

import argparse

from security.ca import CertificateAuthority
from security.cli._common import add_passphrase, passphrase


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `crl` command."""
    p = sub.add_parser("crl", help="write a fresh CRL (with next-update)")
    p.add_argument("--ca", required=True, help="CA directory")
    p.add_argument("--out", help="CRL path (default: the CA's crl.pem)")
    p.add_argument("--days", type=float, default=7, help="next update in this many days (default 7)")
    add_passphrase(p)
    p.set_defaults(handler=write_crl)


def write_crl(args: argparse.Namespace) -> int:
    """Handler of `crl`."""
    path = CertificateAuthority.open(args.ca, passphrase(args)).write_crl(args.out, days=args.days)
    print(f"wrote CRL {path} (next update in {args.days:g} days)")
    return 0
