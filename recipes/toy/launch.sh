#!/bin/sh
# Start one cluster of the toy job: its switch server, then its ranks.  Usage: launch.sh CLUSTER [nebula launch args]
set -e
cd "$(dirname "$0")"
cluster="$1"; shift
nebula-switch serve --config "fed/$cluster/switch.yaml" > "switch_$cluster.log" 2>&1 &
trap 'kill $!' EXIT
sleep 2
nebula launch job.yaml --cluster "$cluster" "$@"
python -m nebula.logbook metrics vdl   # VisualDL scalars of the clusters whose metrics are here
