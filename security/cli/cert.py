"""`nebula-admin cert issue|csr|sign|renew|revoke|list`: certificate lifecycle."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from security.ca import REVOCATION_REASONS, CertificateAuthority, csr_from_key, format_serial, make_csr
from security.cli._common import add_passphrase, emit, passphrase
from security.identity import ROLES


def _ca(args: argparse.Namespace) -> CertificateAuthority:
    return CertificateAuthority.open(args.ca, passphrase(args))


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `cert` command."""
    p = sub.add_parser("cert", help="issue, sign, renew, revoke and list certificates")
    s = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    issue = s.add_parser("issue", help="generate a key and certificate in one step")
    issue.add_argument("--ca", required=True, help="CA directory")
    issue.add_argument("--name", required=True, help="the identity's name (also the files' stem)")
    issue.add_argument("--role", required=True, choices=ROLES, help="what the certificate may do")
    issue.add_argument("--cluster", help="the cluster it belongs to (switches and workers)")
    issue.add_argument("--days", type=float, help="lifetime (default 30, admin 1)")
    issue.add_argument("--dns", action="append", default=[], help="DNS SAN (repeatable; switch default localhost)")
    issue.add_argument("--ip", action="append", default=[], help="IP SAN (repeatable)")
    issue.add_argument("--out", required=True, help="directory for NAME.pem and NAME.key")
    add_passphrase(issue)
    issue.set_defaults(handler=issue_cert)

    csr = s.add_parser("csr", help="create a key and CSR on this host (the key never leaves it), or a CSR for an "
                                   "existing key (--key)")
    csr.add_argument("--name", required=True, help="the identity's name (the CSR's common name)")
    csr.add_argument("--out", required=True, help="directory for NAME.key and NAME.csr")
    csr.add_argument("--key", help="make the CSR for this existing private key (a renewal: no new key is written)")
    csr.add_argument("--uri", help="with --key: the identity URI to ask for, e.g. spiffe://acme/switch/A/switch")
    add_passphrase(csr, "the existing key (--key)")
    csr.set_defaults(handler=create_csr)

    sign = s.add_parser("sign", help="sign a CSR")
    sign.add_argument("--ca", required=True, help="CA directory")
    sign.add_argument("--csr", required=True, help="the certificate request (PEM) to sign")
    sign.add_argument("--role", required=True, choices=ROLES, help="what the certificate may do")
    sign.add_argument("--cluster", help="the cluster it belongs to (switches and workers)")
    sign.add_argument("--name", help="identity name (default: the CSR's CN)")
    sign.add_argument("--days", type=float, help="lifetime (default 30, admin 1)")
    sign.add_argument("--dns", action="append", default=[], help="DNS SAN (repeatable; switch default localhost)")
    sign.add_argument("--ip", action="append", default=[], help="IP SAN (repeatable)")
    sign.add_argument("--out", help="certificate path (default: CSR path with .pem)")
    add_passphrase(sign)
    sign.set_defaults(handler=sign_csr)

    renew = s.add_parser("renew", help="new certificate, same identity and key, fresh lifetime")
    renew.add_argument("--ca", required=True, help="CA directory")
    renew.add_argument("--serial", required=True, help="hex serial, as `cert list` prints it")
    renew.add_argument("--days", type=float, help="lifetime of the new certificate (default: the role's)")
    renew.add_argument("--out", help="certificate path (default: CA's certs/<serial>.pem)")
    renew.add_argument("--revoke-old", action="store_true", help="revoke the old certificate (superseded)")
    add_passphrase(renew)
    renew.set_defaults(handler=renew_cert)

    revoke = s.add_parser("revoke", help="revoke a certificate and rewrite the CA's crl.pem")
    revoke.add_argument("--ca", required=True, help="CA directory")
    revoke.add_argument("--serial", required=True, help="hex serial, as `cert list` prints it")
    revoke.add_argument("--reason", default="unspecified", choices=sorted(REVOCATION_REASONS),
                        help="the CRL's reason code (default unspecified)")
    add_passphrase(revoke)
    revoke.set_defaults(handler=revoke_cert)

    lst = s.add_parser("list", help="serial, identity, role, cluster, not-after, status")
    lst.add_argument("--ca", required=True, help="CA directory")
    lst.add_argument("--json", action="store_true", help="print JSON instead of a table")
    lst.set_defaults(handler=list_certs)


def issue_cert(args: argparse.Namespace) -> int:
    """Handler of `cert issue`."""
    issued = _ca(args).issue(args.name, args.role, args.cluster, args.days, args.dns, args.ip, out_dir=args.out)
    print(f"issued serial {format_serial(issued.serial)}: {issued.cert_path} (key {issued.key_path})")
    return 0


def create_csr(args: argparse.Namespace) -> int:
    """Handler of `cert csr`."""
    if args.key:
        out = Path(args.out) / f"{args.name}.csr"
        csr_from_key(args.key, args.name, out, uri=args.uri, key_passphrase=passphrase(args))
        print(f"wrote {out} for the key {args.key} (send the CSR to the CA; the key stays here)")
        return 0
    csr, key = make_csr(args.name, args.out)
    print(f"wrote {csr} (send it to the CA) and {key} (keep it here)")
    return 0


def sign_csr(args: argparse.Namespace) -> int:
    """Handler of `cert sign`."""
    path = _ca(args).sign_csr(args.csr, args.role, args.cluster, args.days, name=args.name, dns=args.dns,
                              ips=args.ip, out=args.out)
    print(f"signed {args.csr}: {path}")
    return 0


def renew_cert(args: argparse.Namespace) -> int:
    """Handler of `cert renew`."""
    issued = _ca(args).renew(args.serial, args.days, out=args.out, revoke_old=args.revoke_old)
    print(f"renewed {args.serial} as serial {format_serial(issued.serial)}: {issued.cert_path}")
    return 0


def revoke_cert(args: argparse.Namespace) -> int:
    """Handler of `cert revoke`."""
    ca = _ca(args)
    ca.revoke(args.serial, args.reason)
    print(f"revoked {args.serial} ({args.reason}); CRL rewritten: {ca.crl_path}")
    return 0


def list_certs(args: argparse.Namespace) -> int:
    """Handler of `cert list`."""
    rows = [dict(dataclasses.asdict(r), serial=format_serial(r.serial)) for r in _ca(args).list()]
    emit(rows, ("serial", "identity", "role", "cluster", "not_after", "status"), args.json)
    return 0
