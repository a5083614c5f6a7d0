#!/bin/sh
# Cluster B: its switch server, then its ranks (run launch_A.sh on cluster A).
set -e
cd "$(dirname "$0")"
nebula-switch serve --config fed/B/switch.yaml > switch_B.log 2>&1 &
trap 'kill $!' EXIT
sleep 2
nebula launch job.yaml --cluster B "$@"
