#!/usr/bin/env bash
# Start one cluster's part of an LLM recipe job (its switch server already serving): `nebula launch` over
# paddle.distributed.launch. Usage: launch_cluster.sh CLUSTER JOB_FILE  (run from the directory the job's paths
# are relative to; run_local.sh writes absolute ones).
set -euo pipefail
cluster="$1"; job="$2"
PY=${PY:-python}
exec "$(dirname "$PY")/nebula" launch "$job" --cluster "$cluster"
