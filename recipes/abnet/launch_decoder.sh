#!/usr/bin/env bash
# Cluster B: the decoder (target base + cross-attention adapters, CMLM). Usage: launch_decoder.sh RUN_DIR [B] [A]
SIDE=decoder CLUSTER=${2:-B} PEER=${3:-A}
source "$(dirname "${BASH_SOURCE[0]}")/_cluster.sh"
