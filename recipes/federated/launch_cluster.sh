#!/usr/bin/env bash
# Start one cluster's part of the federated job: its combiner (plus the controller, in the job's controller
# cluster) and its clients, each client its own process (under FedOptima or OWL, one process runs them all).
# Logs go to LOG_DIR; waits for all of them.
# Usage: bash recipes/federated/launch_cluster.sh JOB CLUSTER NUM_CLIENTS LOG_DIR
set -euo pipefail
JOB=$1 CLUSTER=$2 NUM=$3 LOGS=$4
NEBULA=${NEBULA:-nebula}
mkdir -p "$LOGS"
pids=()
"$NEBULA" fl start "$JOB" --cluster "$CLUSTER" > "$LOGS/cluster_$CLUSTER.log" 2>&1 &
pids+=($!)
# under `algorithm: fedoptima | owl` that one process also runs the cluster's clients (a thread each)
grep -Eq '^algorithm: *"?(fedoptima|owl)' "$JOB" && NUM=0
for i in $(seq 0 $((NUM - 1))); do
    "$NEBULA" fl start "$JOB" --cluster "$CLUSTER" --role client --index "$i" \
        > "$LOGS/client_${CLUSTER}_$i.log" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
