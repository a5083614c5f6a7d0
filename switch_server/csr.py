"""`nebula-switch csr`: a certificate request for this switch's own key, for a renewal by the federation's admin
(`nebula-admin provision renew --csr CLUSTER=req.pem`): the key never leaves the site, the CA key never leaves the
admin, and the renewed certificate comes back in the site's signed update."""
from __future__ import annotations

__all__ = ["add_csr_parser", "main", "run_csr", "switch_csr"]

import argparse
import os
import sys
from pathlib import Path

from cryptography import x509

from nebula.config import ConfigError
from nebula.config.switch import load_switch_config
from security.ca import csr_from_key
from security.errors import SecurityError
from security.identity import identity_of


def switch_csr(config: str | Path, out: str | Path) -> tuple[Path, str]:
    """Write to `out` a CSR for the key of the switch whose switch.yaml is `config`, asking for the identity its
    certificate holds now; (the CSR's path, that identity). SecurityError/ConfigError of one line otherwise."""
    cfg = load_switch_config(config)
    passphrase = None
    if cfg.tls.key_passphrase_env:
        passphrase = os.environ.get(cfg.tls.key_passphrase_env)
        if passphrase is None:
            raise SecurityError(f"tls.key_passphrase_env names {cfg.tls.key_passphrase_env}, which is not set; "
                                "export it")
    try:
        ident = identity_of(x509.load_pem_x509_certificate(Path(cfg.tls.cert).read_bytes()))
    except (OSError, ValueError) as exc:
        raise SecurityError(f"certificate {cfg.tls.cert} (tls.cert of {config}) cannot be read ({exc}); get the "
                            "kit again from the admin") from None
    if (ident.federation, ident.role, ident.cluster) != (cfg.federation, "switch", cfg.cluster):
        raise SecurityError(f"certificate {cfg.tls.cert} is {ident.uri}, not the switch of cluster {cfg.cluster}; "
                            "use the kit's own switch.pem")
    return csr_from_key(cfg.tls.key, ident.name, out, uri=ident.uri, key_passphrase=passphrase), ident.uri


def add_csr_parser(sub: argparse._SubParsersAction) -> None:
    """Add `csr` to `nebula-switch`'s subcommands."""
    c = sub.add_parser("csr", help="a certificate request for this switch's own key (a renewal the admin signs "
                                   "with `nebula-admin provision renew --csr CLUSTER=FILE`)")
    c.add_argument("--config", required=True, help="the switch's switch.yaml (its tls.key and tls.cert are used)")
    c.add_argument("--out", default="req.pem", help="where to write the CSR (default req.pem); send it to the admin")
    c.set_defaults(func=run_csr)


def run_csr(args: argparse.Namespace) -> int:
    """Handler of `nebula-switch csr`: 0, or 2 with one line on stderr."""
    try:
        path, uri = switch_csr(args.config, args.out)
    except (ConfigError, SecurityError) as exc:
        print(f"nebula-switch csr: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}: a request for {uri} with this switch's own key (it stays here); send it to the admin, "
          f"who runs `nebula-admin provision renew --csr CLUSTER={Path(path).name} --out DIR`, then apply the "
          "update it writes with `nebula-switch reload --update`")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m switch_server.csr --config switch.yaml --out req.pem` (what `nebula-switch csr` runs)."""
    parser = argparse.ArgumentParser(prog="nebula-switch")
    add_csr_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["csr", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
