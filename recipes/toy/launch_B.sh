#!/bin/sh
# Cluster B of the toy job (run launch_A.sh on cluster A).
exec "$(dirname "$0")/launch.sh" B "$@"
