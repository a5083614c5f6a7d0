"""The two texts of a kit: its `start` script and its README (what to run on the site's gateway host)."""
from __future__ import annotations

from security.federation import SiteSpec, FederationSpec

__all__ = ["kit_readme", "start_script"]


def start_script(federation: str, cluster: str) -> str:
    """`start`: the switch server of the kit, run from the kit's directory wherever it was unpacked."""
    return f"""#!/bin/sh
# Cluster {cluster} of federation {federation}: its switch server, from this kit (extra arguments go to
# `nebula-switch serve`, e.g. --log-level debug). Stop it with Ctrl-C or SIGTERM.
cd "$(dirname "$0")" || exit 1
if ! command -v nebula-switch >/dev/null 2>&1; then
    echo "start: nebula-switch not found on PATH; install Nebula on this host and activate its environment" \\
         "(. NEBULA/.venv/bin/activate)" >&2
    exit 127
fi
exec nebula-switch serve --config switch.yaml "$@"
"""


def kit_readme(spec: FederationSpec, cluster: SiteSpec, revision: int) -> str:
    """README.md of `cluster`'s kit at `revision`."""
    c = cluster.name
    peers = "; ".join(f"{p.name} at {p.address}" for p in spec.clusters if p.name != c) or "none yet"
    workers = ", ".join(f"`{'worker.yaml' if w == 'worker' else f'worker-{w}.yaml'}` (account {a})"
                        for a, w in cluster.worker_names())
    tls = (f", and from other hosts over mutual TLS at {cluster.local_tls} with their own certificates "
           "(`workers/`; open that port to the cluster's hosts only)" if cluster.local_tls else "")
    return f"""# Cluster {c} of federation {spec.federation} (kit revision {revision})

This directory is cluster {c}'s switch server: its certificate and keys (only {c}'s: keep the private files at
mode 600), the federation's CA certificate and CRL, `switch.yaml`, and its workers' credentials. `kit.sig` is the
admin's signature (the CA key's) over its files: the switch refuses to start from a kit whose files were altered.
Peers reach {c} at {cluster.address} (it binds {cluster.listen}): open that port to them. Its peers: {peers}.
Workers of {c} reach the switch at {cluster.local} (or over its IPC socket on this host){tls}.

On {c}'s gateway host, in this directory, with Nebula installed and its commands on PATH:

    ./start                                                     # the switch server (stop: Ctrl-C or SIGTERM)
    nebula-switch status --config switch.yaml                   # its links to the peers
    nebula-switch reload --config switch.yaml --update {c}-r{revision + 1}.tar.gz  # a peers update, applied live
    nebula-admin audit verify --log audit.log --peer-dir PEER   # tamper check; PEER: a copy of a peer's kit
                                                                #   directory from its own host

Workers: {workers}.
A job file names it as this cluster's `clusters[].worker`; `nebula launch job.yaml --cluster {c}` starts the
cluster's part of the job.
"""
