#!/bin/sh
# Cluster A: its switch server, then its ranks (run launch_B.sh on cluster B).
set -e
cd "$(dirname "$0")"
nebula-switch serve --config fed/A/switch.yaml > switch_A.log 2>&1 &
trap 'kill $!' EXIT
sleep 2
nebula launch job.yaml --cluster A "$@"
