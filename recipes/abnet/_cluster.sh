#!/usr/bin/env bash
# One cluster's part of the ABNet job (sourced by launch_encoder.sh / launch_decoder.sh with SIDE, CLUSTER, PEER set):
# load or pretrain this side's frozen base, check the peer cluster is reachable and holds the same split, train with
# `nebula launch`, then evaluate BLEU over the switches. Usage: launch_<side>.sh RUN_DIR
set -euo pipefail
RUN=$(cd "${1:?usage: $0 RUN_DIR (made by run_local.sh: job.yaml, train.yaml, fed/, A/, B/)}" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=python3
BIN=$(dirname "$PY")
DATA=$RUN/$CLUSTER/data
WORK=$RUN/$CLUSTER/work
WORKER=$RUN/fed/$CLUSTER/worker.yaml
CODEC_EVAL=${CODEC_EVAL:-none}
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
echo "[$CLUSTER] $SIDE base"
"$PY" -m recipes.abnet.prepare base --side "$SIDE" --data "$DATA" --work "$WORK" --config "$RUN/train.yaml"
echo "[$CLUSTER] checking that cluster $PEER is reachable"
"$PY" -m recipes.abnet.remote reach --side "$SIDE" --worker "$WORKER" --peer "$PEER" --data "$DATA" \
    --config "$RUN/train.yaml" --timeout "${REACH_TIMEOUT:-300}"
echo "[$CLUSTER] training the $SIDE stage"
"$BIN/nebula" launch "$RUN/job.yaml" --cluster "$CLUSTER"
echo "[$CLUSTER] evaluating"
"$PY" -m recipes.abnet.remote eval --side "$SIDE" --worker "$WORKER" --peer "$PEER" --data "$DATA" --work "$WORK" \
    --ckpt "$RUN/ckpt" --config "$RUN/train.yaml" --codec "$CODEC_EVAL" --out "$RUN/$CLUSTER/eval.json"
