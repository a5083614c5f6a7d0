#!/bin/sh
# One cluster of the toy job: its switch server (unless one runs already), then its ranks, then VisualDL scalars.
# Usage: launch.sh CLUSTER [nebula launch args]. It works in the current directory when that holds the cluster's
# kit as fed/CLUSTER (a site of its own: "On real clusters" in README.md; job.yaml is copied here if missing),
# else in this recipe's directory (both clusters on one machine, provisioned into fed/ there).
set -e
here="$(cd "$(dirname "$0")" && pwd)"
cluster="$1"; shift
[ -f "fed/$cluster/switch.yaml" ] || cd "$here"
[ -f job.yaml ] || cp "$here/job.yaml" job.yaml
if ! nebula-switch status --config "fed/$cluster/switch.yaml" > /dev/null 2>&1; then
    nebula-switch serve --config "fed/$cluster/switch.yaml" > "switch_$cluster.log" 2>&1 &
    trap 'kill $!' EXIT
fi
nebula launch job.yaml --cluster "$cluster" "$@"
python -m nebula.logbook metrics vdl   # VisualDL scalars of the clusters whose metrics are here
