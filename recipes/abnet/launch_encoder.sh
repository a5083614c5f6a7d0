#!/usr/bin/env bash
# Cluster A: the encoder (English base + adapters). Usage: launch_encoder.sh RUN_DIR [cluster id, default A] [peer, B]
SIDE=encoder CLUSTER=${2:-A} PEER=${3:-B}
source "$(dirname "${BASH_SOURCE[0]}")/_cluster.sh"
