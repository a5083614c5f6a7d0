#!/bin/sh
# Cluster A of the toy job (run launch_B.sh on cluster B).
exec "$(dirname "$0")/launch.sh" A "$@"
