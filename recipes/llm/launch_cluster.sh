#!/usr/bin/env bash
# Start one cluster's part of an LLM recipe job (its switch server already serving): `nebula launch` over
# paddle.distributed.launch. Usage: launch_cluster.sh CLUSTER JOB_FILE  (run from the directory the job's recipe
# paths are relative to: "On real clusters" in README.md; run_local.sh writes absolute ones). The `nebula` of PY's
# environment when PY is set, else the one on PATH.
set -euo pipefail
cluster="${1:?usage: $0 CLUSTER JOB_FILE}"; job="${2:?usage: $0 CLUSTER JOB_FILE}"
NEBULA=nebula
[ -z "${PY:-}" ] || NEBULA="$(dirname "$PY")/nebula"
command -v "$NEBULA" > /dev/null || { echo "error: $NEBULA not found; activate Nebula's environment (. .venv/bin/activate) or set PY=/path/to/.venv/bin/python" >&2; exit 2; }
exec "$NEBULA" launch "$job" --cluster "$cluster"
