"""`nebula-admin provision`: a federation's kits from a federation file (or, the quick case, from flags), and
clusters added to or removed from it later (`add-cluster`, `remove-cluster`) with peers updates for the others."""
from __future__ import annotations

import argparse
import json

from security.cli._common import add_passphrase, passphrase
from security.errors import SecurityError
from security.federation import AccountSpec, load_federation
from security.provision import add_cluster, provision, provision_spec, remove_cluster


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `provision` command and its `add-cluster` and `remove-cluster` actions."""
    p = sub.add_parser("provision", help="a federation's per-site kits (CA, certificates, keys, configs)",
                       description="`provision --from federation.yaml --out DIR` (one kit per site), or the quick "
                                   "case `provision --federation F --clusters A,B --out DIR` (every switch on one "
                                   "host); `provision add-cluster|remove-cluster` change a provisioned federation.")
    p.add_argument("--from", dest="spec", metavar="FILE", help="federation file: name, CA, clusters with host/port")
    p.add_argument("--federation", help="(quick case) federation name")
    p.add_argument("--clusters", help="(quick case) comma-separated cluster names, e.g. A,B")
    p.add_argument("--host", default="127.0.0.1", help="(quick case) address every switch listens on")
    p.add_argument("--ca", help="(quick case) use this existing CA directory instead of making DIR/ca")
    p.add_argument("--account", default="nebula", help="(quick case) account the worker credentials act for")
    _common(p, "output directory: DIR/ca, DIR/<cluster>/ (kits), DIR/kits/*.tar.gz, DIR/updates/", required=False)
    p.set_defaults(handler=run_provision)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    add = actions.add_parser("add-cluster", help="add a cluster: its kit, and a peers update for every other site")
    add.add_argument("cluster")
    add.add_argument("--host", dest="add_host", required=True, help="the address its peers dial")
    add.add_argument("--port", type=int, default=0,
                     help="its WAN port (left out: a free port of this machine, for a cluster on its loopback)")
    add.add_argument("--listen", help="what its switch binds (default HOST:PORT, or 0.0.0.0:PORT for a name)")
    add.add_argument("--local", help="where its workers reach its switch (default tcp://127.0.0.1:PORT+1)")
    add.add_argument("--account", dest="add_account", default="nebula", help="account of its worker credential")
    _common(add, "the provisioned federation's directory")
    add.set_defaults(handler=run_add)
    rm = actions.add_parser("remove-cluster", help="revoke a cluster (CRL) and send every other site a peers update")
    rm.add_argument("cluster")
    _common(rm, "the provisioned federation's directory")
    rm.set_defaults(handler=run_remove)


def _common(p: argparse.ArgumentParser, out_help: str, required: bool = True) -> None:
    p.add_argument("--out", required=required, help=out_help)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_passphrase(p)


def run_provision(args: argparse.Namespace) -> int:
    """Handler of `provision` (from a federation file, or the quick case)."""
    if not args.out:
        raise SecurityError("no output directory given; pass --out DIR")
    if args.spec:
        if args.clusters or args.federation:
            raise SecurityError("--from takes the clusters and the federation's name from its file; drop "
                                "--clusters and --federation")
        summary = provision_spec(load_federation(args.spec), args.out, args.ca, passphrase(args))
    elif args.clusters and args.federation:
        clusters = [c.strip() for c in args.clusters.split(",") if c.strip()]
        summary = provision(args.federation, clusters, args.out, host=args.host, ca_dir=args.ca,
                            account=args.account, ca_passphrase=passphrase(args))
    else:
        raise SecurityError("give --from federation.yaml, or --federation NAME --clusters A,B (the quick case)")
    return _report(summary, args.json)


def run_add(args: argparse.Namespace) -> int:
    """Handler of `provision add-cluster`."""
    return _report(add_cluster(args.out, args.cluster, args.add_host, args.port, listen=args.listen, local=args.local,
                               accounts=(AccountSpec(args.add_account),), ca_passphrase=passphrase(args)), args.json)


def run_remove(args: argparse.Namespace) -> int:
    """Handler of `provision remove-cluster`."""
    return _report(remove_cluster(args.out, args.cluster, passphrase(args)), args.json)


def _report(summary: dict, as_json: bool) -> int:
    if as_json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"federation {summary['federation']} revision {summary['revision']}: CA {summary['ca']} (kits and "
          f"updates signed by its key {summary['signer']})")
    for name, c in summary["clusters"].items():
        print(f"  cluster {name}: wan {c['listen']}, workers {c['endpoint']}; kit {c['kit']} "
              f"(run `./start` in it on {name}'s gateway; workers use {c['worker_yaml']})")
    for name, path in summary["updates"].items():
        print(f"  peers update for {name}: {path} (on {name}: `nebula-switch reload --config switch.yaml "
              f"--update {path.rsplit('/', 1)[-1]}`)")
    for name in summary["removed"]:
        print(f"  cluster {name}: removed (certificates revoked)")
    return 0
