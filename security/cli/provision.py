"""`nebula-admin provision`: a federation's kits from a federation file (or, the quick case, from flags), clusters
added to or removed from it later (`add-cluster`, `remove-cluster`) with peers updates for the others, and the
lifetimes kept (`renew`: a fresh CRL and renewed switch and worker certificates, as signed updates for every
site)."""
from __future__ import annotations

import argparse
import json
import sys

from security.cli._common import add_passphrase, passphrase
from security.errors import CAError, SecurityError
from security.federation import AccountSpec, FederationError, load_federation
from security.provision import add_cluster, provision, provision_spec, remove_cluster, renew


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `provision` command and its `add-cluster` and `remove-cluster` actions."""
    p = sub.add_parser("provision", help="a federation's per-site kits (CA, certificates, keys, configs)",
                       description="`provision --from federation.yaml --out DIR` (one kit per site), or the quick "
                                   "case `provision --federation F --clusters A,B --out DIR` (every switch on one "
                                   "host); `provision add-cluster|remove-cluster` change a provisioned federation; "
                                   "`provision renew` (daily from cron) keeps its CRL and certificates fresh.")
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
    add.add_argument("cluster", help="the new cluster's name")
    add.add_argument("--host", dest="add_host", required=True, help="the address its peers dial")
    add.add_argument("--port", type=int, default=0,
                     help="its WAN port (required unless --host is this machine's loopback: then a free port here)")
    add.add_argument("--listen", help="what its switch binds (default HOST:PORT, or 0.0.0.0:PORT for a name)")
    add.add_argument("--local", help="where its workers reach its switch (default tcp://127.0.0.1:PORT+1)")
    add.add_argument("--account", dest="add_account", default="nebula", help="account of its worker credential")
    _common(add, "the provisioned federation's directory")
    add.set_defaults(handler=run_add)
    rm = actions.add_parser("remove-cluster", help="revoke a cluster (CRL) and send every other site a peers update")
    rm.add_argument("cluster", help="the cluster to take out")
    _common(rm, "the provisioned federation's directory")
    rm.set_defaults(handler=run_remove)
    rn = actions.add_parser("renew", help="a fresh CRL and the switch and worker certificates near expiry renewed, "
                                          "as a signed update for every site (nothing due: writes nothing; run it "
                                          "from cron)")
    rn.add_argument("--margin-days", type=float,
                    help="renew a switch or worker certificate with fewer days left than this (default a third of "
                         "its lifetime)")
    rn.add_argument("--crl-margin-days", type=float,
                    help="refresh the CRL when its next update is fewer days away (default half its lifetime)")
    rn.add_argument("--all", dest="renew_all", action="store_true",
                    help="renew every switch and worker certificate now")
    rn.add_argument("--csr", action="append", default=[], metavar="CLUSTER=FILE",
                    help="renew CLUSTER's certificate from the CSR its site made with its own key (`nebula-switch "
                         "csr`); repeatable")
    _common(rn, "the provisioned federation's directory")
    rn.set_defaults(handler=run_renew)


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
    """Handler of `provision add-cluster` (exit 2: the cluster given is unusable, e.g. no --port for a remote host)."""
    try:
        summary = add_cluster(args.out, args.cluster, args.add_host, args.port, listen=args.listen, local=args.local,
                              accounts=(AccountSpec(args.add_account),), ca_passphrase=passphrase(args))
    except FederationError as exc:
        print(f"nebula-admin provision add-cluster: error: {exc}", file=sys.stderr)
        return 2
    return _report(summary, args.json)


def run_remove(args: argparse.Namespace) -> int:
    """Handler of `provision remove-cluster`."""
    return _report(remove_cluster(args.out, args.cluster, passphrase(args)), args.json)


def run_renew(args: argparse.Namespace) -> int:
    """Handler of `provision renew` (exit 2: an option or a CSR is unusable; nothing is written then)."""
    csrs = {}
    try:
        for item in args.csr:
            cluster, sep, path = item.partition("=")
            if not sep or not cluster or not path:
                raise FederationError(f"--csr {item!r} is not CLUSTER=FILE; pass e.g. --csr A=req.pem")
            csrs[cluster] = path
        summary = renew(args.out, margin_days=args.margin_days, renew_all=args.renew_all, csrs=csrs,
                        crl_margin_days=args.crl_margin_days, ca_passphrase=passphrase(args))
    except (FederationError, CAError) as exc:
        print(f"nebula-admin provision renew: error: {exc}", file=sys.stderr)
        return 2
    if summary["nothing_due"]:
        if args.json:
            print(json.dumps(summary, indent=1))
            return 0
        soonest = min(summary["next_expiry"].items(), key=lambda kv: kv[1])
        print(f"federation {summary['federation']}: nothing due (CRL next update {summary['crl_next_update']}, "
              f"soonest certificate expiry {soonest[1]} ({soonest[0]}); margins {summary['margin_days']:g} and "
              f"{summary['crl_margin_days']:g} days); nothing written")
        return 0
    if not args.json:
        for name, r in summary["renewed"].items():
            print(f"  cluster {name}: certificate renewed as serial {r['serial']} until {r['not_after']}"
                  f"{' (from ' + r['csr'] + ')' if r['csr'] else ''}")
        for name, ws in summary["renewed_workers"].items():
            for worker, r in ws.items():
                print(f"  cluster {name}: worker {worker}'s certificate renewed as serial {r['serial']} until "
                      f"{r['not_after']}")
        print(f"  CRL refreshed: next update {summary['crl_next_update']}")
    return _report(summary, args.json)


def _report(summary: dict, as_json: bool) -> int:
    if as_json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"federation {summary['federation']} revision {summary['revision']}: CA {summary['ca']} (kits and "
          f"updates signed by its key {summary['signer']})")
    for name, c in summary["clusters"].items():
        print(f"  cluster {name}: wan {c['listen']}, workers {c['endpoint']}; kit {c['kit']} "
              f"(unpack it on {name}'s gateway and run `./start` in {name}/; its workers use "
              f"{c['site_worker_yaml']} there)")
    for name, path in summary["updates"].items():
        print(f"  peers update for {name}: {path} (on {name}: `nebula-switch reload --config switch.yaml "
              f"--update {path.rsplit('/', 1)[-1]}`)")
    for name in summary["removed"]:
        print(f"  cluster {name}: removed (certificates revoked)")
    return 0
