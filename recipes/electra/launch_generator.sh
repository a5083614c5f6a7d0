#!/usr/bin/env bash
# A generator cluster's part of the ELECTRA job. Usage: launch_generator.sh RUN_DIR CLUSTER (G1, G2, ...)
set -euo pipefail
RUN=$(cd "${1:?usage: $0 RUN_DIR CLUSTER}" && pwd)
CLUSTER=${2:?usage: $0 RUN_DIR CLUSTER}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
echo "[$CLUSTER] generator: $(cat "$RUN/$CLUSTER/data/meta.json" | "$PY" -c 'import json,sys; m=json.load(sys.stdin); print(m["group_examples"])')"
"$(dirname "$PY")/nebula" launch "$RUN/job.yaml" --cluster "$CLUSTER"
