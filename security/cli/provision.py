"""`nebula-admin provision`: a whole federation (CA, switch and worker credentials, configs) in one step."""
from __future__ import annotations

import argparse
import json

from security.cli._common import add_passphrase, passphrase
from security.provision import provision


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `provision` command."""
    p = sub.add_parser("provision", help="CA, switch certificates, worker credentials and switch configs")
    p.add_argument("--federation", required=True)
    p.add_argument("--clusters", required=True, help="comma-separated cluster names, e.g. A,B")
    p.add_argument("--out", required=True, help="output directory (D/ca, D/<cluster>/...)")
    p.add_argument("--host", default="127.0.0.1", help="address the switches listen on (default 127.0.0.1)")
    p.add_argument("--ca", help="use this existing CA directory instead of making D/ca")
    p.add_argument("--account", default="nebula", help="account the worker credentials act for")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_passphrase(p)
    p.set_defaults(handler=run_provision)


def run_provision(args: argparse.Namespace) -> int:
    """Handler of `provision`."""
    clusters = [c.strip() for c in args.clusters.split(",") if c.strip()]
    summary = provision(args.federation, clusters, args.out, host=args.host, ca_dir=args.ca, account=args.account,
                        ca_passphrase=passphrase(args))
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"federation {summary['federation']}: CA {summary['ca']}")
    for name, c in summary["clusters"].items():
        print(f"  cluster {name}: {c['switch_yaml']} (wan {c['listen']}, local {c['endpoint']}), "
              f"workers use {c['worker_yaml']}")
    return 0
